"""Issue 35 on the supervisor's side of ``ClusterOps`` (fake transports): InfiniBand asked of the nodes once
(``clusterctl_infiniband: auto``), and the kernel's Xid of a node whose rank failed as GPU evidence."""
from __future__ import annotations

from types import SimpleNamespace

from clusterctl.config.inventory import Host
from clusterctl.config.spec import loads_job
from clusterctl.model import causes
from clusterctl.store.logcopy import LogSink
from clusterctl.supervise.cluster_ops import ClusterOps
from clusterctl.supervise.probe import HAS_INFINIBAND
from clusterctl.supervise.probe import xid
from clusterctl.transport.base import CommandResult
from tests.unit.supervise.test_cluster_ops import JOB, Mux, Store

FIX = __import__("pathlib").Path(__file__).resolve().parents[2] / "fixtures" / "causes"


class Node:
    """Answers HAS_INFINIBAND with ``ib`` (exit 0/1) and causes.XID_PROBE with ``kernel``; everything else: 0."""

    def __init__(self, ib=False, kernel=""):
        self.ib, self.kernel, self.runs = ib, kernel, []

    def run(self, argv, *, timeout, stdin=None) -> CommandResult:
        self.runs.append(list(argv))
        if list(argv) == ["sh", "-c", HAS_INFINIBAND]:
            return CommandResult(tuple(argv), 0 if self.ib else 1, "", "", 0.01)
        if list(argv) == ["sh", "-c", causes.XID_PROBE]:
            return CommandResult(tuple(argv), 0, self.kernel, "", 0.01)
        return CommandResult(tuple(argv), 0, "[]", "", 0.01)

    def close(self):
        pass


def _ops(tmp_path, hosts, nodes, store=None) -> ClusterOps:
    return ClusterOps(spec=loads_job(JOB, "job.yaml"), hosts=hosts, job_id="j-1", store=store or Store(),
                      sink=LogSink(tmp_path / "o.log"), connect=lambda host, options: nodes[host.name], mux=Mux)


def test_infiniband_auto_is_asked_of_each_gpu_node_once_and_passed_to_its_container(tmp_path):
    hosts = {"ib": Host("ib", "10.0.0.1", runtime="podman", gpus=8),
             "eth": Host("eth", "10.0.0.2", runtime="podman", gpus=8),
             "off": Host("off", "10.0.0.3", runtime="podman", gpus=8, infiniband=False)}
    nodes = {"ib": Node(ib=True), "eth": Node(), "off": Node(ib=True)}
    ops = _ops(tmp_path, hosts, nodes)
    try:
        assert ops.start(1, list(hosts), "ib", ("", 0)).errors == {}
        argv = {n: ops.plan.node(n).runtime_argv for n in hosts}
        assert "--device=/dev/infiniband" in argv["ib"] and "--cap-add=IPC_LOCK" in argv["ib"]
        assert "--ulimit=memlock=-1" in argv["ib"]
        assert not any("infiniband" in a for a in argv["eth"] + argv["off"])
        asked = {n: sum(r == ["sh", "-c", HAS_INFINIBAND] for r in nodes[n].runs) for n in hosts}
        assert asked == {"ib": 1, "eth": 1, "off": 0}          # `false` in the inventory: never asked
        ops.start(2, list(hosts), "ib", ("", 0))
        assert sum(r == ["sh", "-c", HAS_INFINIBAND] for r in nodes["ib"].runs) == 1     # once per node
        assert "--device=/dev/infiniband" in ops.plan.node("ib").runtime_argv
    finally:
        ops.close()


def test_a_failed_node_whose_kernel_logged_a_gpu_xid_since_the_attempt_started_has_gpu_evidence(tmp_path):
    kernel = (FIX / "dmesg_xid.txt").read_text()       # uptime 61234 s; Xid 94 at 61212 s, Xid 79 at 5702 s
    attempts = [SimpleNamespace(attempt=1, started_at=1000.0)]
    store = Store()
    store.attempts, store.now = (lambda job_id: attempts), (lambda: 1100.0)    # the attempt ran 100 s
    hosts = {"g": Host("g", "10.0.0.1", runtime="podman", gpus=8), "cpu": Host("cpu", "10.0.0.2", runtime="podman",
                                                                                gpus=0)}
    nodes = {"g": Node(kernel=kernel), "cpu": Node(kernel=kernel)}
    ops = _ops(tmp_path, hosts, nodes, store)
    try:
        got = xid(ops, "g", 1)
        assert got.startswith("kernel: Xid 94 on PCI:0000:af:00:") and "Contained" in got
        assert xid(ops, "cpu", 1) is None and nodes["cpu"].runs == []           # a CPU host: not asked
        nodes["g"].kernel = kernel.replace("[61212.550087]", "[50000.000000]")  # logged before the attempt
        assert xid(ops, "g", 1) is None
        nodes["g"].kernel = kernel.replace("): 94,", "): 13,")                 # Xid 13: the job's own fault
        assert xid(ops, "g", 1) is None
    finally:
        ops.close()


def test_progress_is_the_ranks_output_not_torchruns_own_lines(tmp_path):
    sink = LogSink(tmp_path / "o.log")
    sink.begin("n1", 1)
    sink.feed("n1", b"INFO:torch.distributed.elastic.agent.server.api:[default] Starting worker group\n")
    assert sink.lines("n1") == 0
    sink.feed("n1", b"[0]:step 1\n[1]:step 1\n")
    assert sink.lines("n1") == 2


def test_socket_fallback_reads_nccls_choice_on_the_infiniband_nodes_only(tmp_path):
    class LogNode(Node):
        def __init__(self, log, **kw):
            super().__init__(**kw)
            self.log = log

        def run(self, argv, *, timeout, stdin=None):
            if argv[:2] == ["sh", "-c"] and "clusterctl-net" in argv:
                self.runs.append(list(argv))
                return CommandResult(tuple(argv), 0, self.log, "", 0.01)
            return super().run(argv, timeout=timeout, stdin=stdin)

    hosts = {"ib": Host("ib", "10.0.0.1", runtime="podman", gpus=8, infiniband=True),
             "ok": Host("ok", "10.0.0.2", runtime="podman", gpus=8, infiniband=True),
             "eth": Host("eth", "10.0.0.3", runtime="podman", gpus=8, infiniband=False)}
    nodes = {"ib": LogNode("[0]:ib:42:42 [0] NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>\n"
                           "[0]:ib:42:42 [0] NCCL INFO Using network Socket\n"),
             "ok": LogNode("[1]:ok:42:42 [0] NCCL INFO Using network IB\n"),
             "eth": LogNode("[2]:eth:42:42 [0] NCCL INFO Using network Socket\n")}
    ops = _ops(tmp_path, hosts, nodes)
    try:
        assert ops.socket_fallback(1) == []                     # nothing started: nothing to read
        ops.start(1, list(hosts), "ib", ("", 0))
        assert ops.socket_fallback(1) == [("ib", "[ib/0] ib:42:42 [0] NCCL INFO Using network Socket")]
        assert not any("clusterctl-net" in r for r in nodes["eth"].runs)       # no IB expected there
    finally:
        ops.close()
