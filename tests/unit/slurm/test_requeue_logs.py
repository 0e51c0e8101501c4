"""What `resume` (and so every requeued `sbatch` run) does first: complete the controller's copy of the nodes'
logs. It read each node's whole log with one ``run`` (held in memory whole over srun; only the last 8 MiB over
SSH); it streams it now, in pieces (issue 34 item 4). The srun transport with a real subprocess in srun's place
(tests/unit/transport/test_srun.py's stub), a bare node log of 40 MB."""
from __future__ import annotations

import contextlib
import tracemalloc
from types import SimpleNamespace

from clusterctl.config.inventory import Host
from clusterctl.config.spec import loads_job
from clusterctl.launch import runtimes
from clusterctl.store.logcopy import LogSink
from clusterctl.supervise import controller
from clusterctl.supervise.cluster_ops import ClusterOps
from clusterctl.transport import connect, srun
from tests.unit.transport.test_srun import STUB

JOB = "name: j\nnodes: 1\nnproc_per_node: 1\nscript: train.py\n"
HOSTS = {"n1": Host(name="n1", address="127.0.0.1", connection="srun", runtime="bare", gpus=0)}
LINES = 500_000             # ~40 MB (the copy rotates at 64 MiB)


class Store:
    def attempts(self, job_id):
        return [SimpleNamespace(attempt=1, nodes=("n1",))]

    def transaction(self):
        return contextlib.nullcontext()


def test_resume_completes_the_log_copy_in_bounded_pieces(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))            # the node dir's `~/` (expanded on the "node")
    stub = tmp_path / "srun"
    stub.write_text(STUB)
    stub.chmod(0o755)
    monkeypatch.setattr(srun, "SRUN", str(stub))
    node_dir = runtimes.node_dir_of("n1", "j-1", 1).replace("~", str(tmp_path), 1)
    log = tmp_path / node_dir.removeprefix(str(tmp_path) + "/") / "node.log"
    log.parent.mkdir(parents=True)
    with open(log, "w") as f:
        for i in range(0, LINES, 10_000):
            f.write("".join(f"[rank0]: step {k} loss 0.{k:07d} {'x' * 50}\n" for k in range(i, i + 10_000)))
    copy = tmp_path / "output.log"
    sink = LogSink(copy)
    sink.begin("n1", 1)
    sink.feed("n1", "".join(f"[rank0]: step {k} loss 0.{k:07d} {'x' * 50}\n" for k in range(3)).encode())
    ops = ClusterOps(spec=loads_job(JOB, "job.yaml"), hosts=HOSTS, job_id="j-1", store=Store(), sink=sink,
                     connect=connect)
    tracemalloc.start()
    try:
        errors = controller.complete_logs(ops, Store(), "j-1", 1, deadline_s=120)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        ops.close()
    assert errors == {}
    assert peak < 16 << 20, f"peak {peak / 2**20:.0f} MiB"         # the log is ~40 MB
    with open(copy, "rb") as f:
        n, last = 0, b""
        for line in f:
            if b"step " in line:
                n, last = n + 1, line
    assert n == LINES, n                                            # every line once: the 3 held ones not again
    assert last.endswith(f"step {LINES - 1} loss 0.{LINES - 1:07d} {'x' * 50}\n".encode())
