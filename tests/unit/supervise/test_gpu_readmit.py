"""Issue 35 item 5, the last part: a node left out of a job for a GPU error is used again (when MIN needs it) only
after it passes the GPU part of launch's quick preflight (gpu_driver, gpu_count, gpu_health), not on reachability
alone. The supervisor with a scripted fake; ``ClusterOps.gpu_check`` over the preflight's fake transports."""
from __future__ import annotations

from clusterctl.checks.registry import GPU_CHECKS, LAUNCH_CHECKS
from clusterctl.config.inventory import Host
from clusterctl.config.spec import loads_job
from clusterctl.model.events import EventKind
from clusterctl.model.verdicts import Observation, Started
from clusterctl.store.logcopy import LogSink
from clusterctl.store.state import JobState, Store
from clusterctl.supervise.cluster_ops import ClusterOps
from clusterctl.supervise.supervisor import GPU_RECHECK_S, Policy, Supervisor
from tests.fakes.ops import QuietOps
from tests.fakes.checks import FakeHost, FakeTransport, sections_for, smi_rows
from tests.unit.supervise.test_cluster_ops import JOB, Mux
from tests.unit.supervise.test_cluster_ops import Store as FakeStore

ECC = "RuntimeError: CUDA error: uncorrectable ECC error encountered"


class Ops(QuietOps):
    """Three nodes; attempt 1: c's rank dies of a GPU error; every later attempt succeeds. ``gpu``: c's answers to
    the GPU check, one per call (the last repeats)."""

    def __init__(self, gpu):
        self.gpu, self.checks, self.started = list(gpu), [], []

    def start(self, attempt, nodes, rdzv_host, resume):
        self.started.append((attempt, tuple(nodes)))
        return Started()

    def observe(self, attempt, nodes):
        if attempt == 1:
            return [Observation(n, "exited", exit_code=1, rank=2, error_tail=ECC, gpu_error=ECC) if n == "c"
                    else Observation(n, "running") for n in nodes]
        return [Observation(n, "exited", exit_code=0) for n in nodes]

    def gpu_check(self, nodes):
        self.checks.append(tuple(nodes))
        why = self.gpu.pop(0) if len(self.gpu) > 1 else self.gpu[0]
        return {"c": why} if why else {}


def _run(tmp_path, ops, **policy):
    store = Store(tmp_path / "state.db")
    job_id = store.create_job("demo", "{}", None, None)
    pol = Policy(**{"min_nodes": 3, "max_nodes": 3, "backoff_s": 0, "wait_for_nodes_s": 100, **policy})
    sup = Supervisor(job_id, store, ops, pol, ["a", "b", "c"], clock=iter(range(10**6)).__next__,
                     sleep=lambda s: None)
    return store, job_id, sup.run()


def test_a_node_left_out_for_a_gpu_error_is_used_again_only_once_it_passes_the_gpu_check(tmp_path):
    bad = "gpu_health: uncorrectable ECC errors (GPU 3: 2)"
    ops = Ops([bad, bad, ""])
    store, job_id, state = _run(tmp_path, ops)
    assert state == JobState.SUCCEEDED
    assert ops.started == [(1, ("a", "b", "c")), (2, ("a", "b", "c"))]
    assert ops.checks == [("c",)] * 3               # reachable at once, but not used before the third check passed
    waits = [e for e in store.events(job_id) if e.kind == EventKind.WAITING and e.klass == "gpu_error"]
    assert [e.node for e in waits] == ["c", "c"]   # the failure said once (the same reason), then the pass
    assert "c stays out" in waits[0].message and bad in waits[0].message
    assert "passed the GPU check" in waits[1].message
    store.close()


def test_a_node_whose_gpus_still_fail_stays_out_and_the_wait_for_min_ends_the_job(tmp_path):
    bad = "gpu_driver: nvidia-smi: Unable to determine the device handle for GPU0000:3B:00.0: Unknown Error"
    ops = Ops([bad])
    store, job_id, state = _run(tmp_path, ops, wait_for_nodes_s=60)
    assert state == JobState.FAILED
    assert ops.started == [(1, ("a", "b", "c"))]    # never started again on c
    assert 2 <= len(ops.checks) <= 60 / GPU_RECHECK_S + 1     # checked again, at most every GPU_RECHECK_S
    said = [e.message for e in store.events(job_id) if e.kind == EventKind.WAITING and e.klass == "gpu_error"]
    assert len(said) == 1 and bad in said[0]
    assert "fewer than 3 healthy nodes" in store.get_job(job_id).reason
    store.close()


def test_the_gpu_check_is_launchs_quick_preflight_gpu_part():
    assert GPU_CHECKS == {"gpu_driver", "gpu_count", "gpu_health"} and GPU_CHECKS <= LAUNCH_CHECKS


def test_cluster_ops_gpu_check_runs_the_gpu_checks_and_names_what_fails(tmp_path):
    hosts = {n: Host(n, f"10.0.0.{i}", runtime="podman", gpus=8) for i, n in enumerate(("ok", "ecc", "gone"), 1)}
    fakes = {"ok": FakeHost(sections_for("10.0.0.1", "ok")),
             "ecc": FakeHost(sections_for("10.0.0.2", "ecc", nvidia_smi=(smi_rows(ecc=[0, 0, 0, 2, 0, 0, 0, 0]), 0))),
             "gone": FakeHost(sections_for("10.0.0.3", "gone", nvidia_smi=(smi_rows(7), 0)))}
    ops = ClusterOps(spec=loads_job(JOB.replace("nproc_per_node: 1", "nproc_per_node: 8"), "job.yaml"),
                     hosts=hosts, job_id="j-1", store=FakeStore(), sink=LogSink(tmp_path / "o.log"),
                     connect=lambda h, o: FakeTransport(h, fakes[h.name], {}, lambda: 0.0), mux=Mux)
    try:
        got = ops.gpu_check(list(hosts))
    finally:
        ops.close()
    assert set(got) == {"ecc", "gone"}
    assert got["ecc"].startswith("gpu_health: uncorrectable ECC errors (GPU 3: 2)") and "fix:" in got["ecc"]
    assert got["gone"].startswith("gpu_count: 7 GPUs visible, inventory says 8")
    probe = fakes["ok"].calls[0][-1]
    assert "nvidia-smi" in probe and "podman" not in probe      # the GPU probes only: not the runtime's or the image's
