"""What the supervisor asks besides a probe round, over a ``ClusterOps``'s plumbing: an attempt's start-up, NCCL's
network choice, the GPU checks a node left out for a GPU error passes again, and on a hang every rank's stack and
flight-recorder dump. Each is a diagnosis: bounded, and never in the way of the job (the loop survives its errors).
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Sequence

from clusterctl.errors import TransportError
from clusterctl.launch import runtimes
from clusterctl.model import causes
from clusterctl.store import paths
from clusterctl.supervise import rankwatch
from clusterctl.supervise.observe import rendezvous_peers, startup as startup_of
from clusterctl.transport import fan_out

if TYPE_CHECKING:
    from clusterctl.supervise.cluster_ops import ClusterOps


def socket_fallback(ops: ClusterOps, attempt: int) -> list[tuple[str, str]]:
    """(node, line) for each node of ``attempt`` with InfiniBand on (the plan) whose NCCL said it uses sockets
    (``causes.nccl_network`` over the lines a grep of its log finds; one bounded command per such node)."""
    plan = ops.plan
    if plan is None or plan.attempt != attempt:
        return []

    def look(host) -> tuple[str, str] | None:
        argv = ops.runtime(host.name).logs_argv(ops.ref(host.name, attempt))
        r = ops.run(host.name, ["sh", "-c", '"$@" 2>&1 | grep -m 50 -E "NCCL INFO (Using network|NET/)"',
                                "clusterctl-net", *argv], timeout=ops.probe_timeout_s)
        got = causes.nccl_network(causes.node_lines(r.stdout, host.name))
        return (host.name, got[1]) if got and got[0].lower() == "socket" else None

    ib = [ops.hosts[n.host] for n in plan.nodes if n.infiniband]
    return [r.value for r in fan_out(ib, look, host_timeout=ops.probe_timeout_s + 5) if r.ok and r.value]


def startup(ops: ClusterOps, attempt: int) -> tuple[str, str] | None:
    """Where ``attempt``'s start-up stands (``observe.startup``): the nodes whose torchrun agent reached the
    rendezvous (distinct peers connected to the c10d store's port on the rendezvous host: one bounded ``ss``
    there, asked only until a rank printed), the ranks that printed (the log copy), its first ``step N``."""
    plan = ops.plan
    if plan is None or plan.attempt != attempt:
        return None
    ranks = sum(ops.sink.ranks(n.host) for n in plan.nodes)
    world = sum(n.nproc for n in plan.nodes)
    step = ops.first_step(attempt) if ops.first_step is not None else None
    joined = None
    if not ranks and step is None:
        rdzv = next(n.host for n in plan.nodes if n.is_rdzv_host)
        port = plan.rdzv_endpoint.rsplit(":", 1)[-1]
        try:
            r = ops.run(rdzv, ["ss", "-Htn", "state", "established", f"( sport = :{port} )"],
                        timeout=ops.probe_timeout_s)
            joined = rendezvous_peers(r.stdout) if r.ok else None
        except TransportError:
            pass
    return startup_of(len(plan.nodes), joined, ranks, world, step)


def gpu_check(ops: ClusterOps, nodes: Sequence[str]) -> dict[str, str]:
    """{node: why} for each of ``nodes`` that fails the GPU part of launch's quick preflight (gpu_driver,
    gpu_count, gpu_health: ``checks.registry.GPU_CHECKS``, one probe per node over a fresh connection); a node
    that passes is absent. What a node left out for a GPU error passes before it is used again."""
    from clusterctl.checks.job import PreflightJob
    from clusterctl.checks.preflight import run_preflight
    from clusterctl.checks.registry import GPU_CHECKS

    report = run_preflight([ops.hosts[n] for n in nodes], connect=lambda h: ops.connect(h, ops.options),
                           job=PreflightJob.from_spec(ops.spec), only=GPU_CHECKS)
    return {h.host: "; ".join(f"{c.id}: {c.detail}" + (f" (fix: {c.hint})" if c.hint else "")
                              for c in h.checks if c.status == "fail")
            for h in report.hosts if any(c.status == "fail" for c in h.checks)}


def dump_ranks(ops: ClusterOps, attempt: int, nodes: Sequence[str], dest_dir: str) -> dict[str, str]:
    """Every rank's flight-recorder dump and stack copied into ``dest_dir`` (``rankwatch.dump_ranks``, one
    bounded command per node); node -> why not, for the nodes that sent less."""
    views = {n: runtimes.view_dir(ops.ref(n, attempt).node_dir) for n in nodes}
    return rankwatch.dump_ranks(lambda n, argv, timeout: ops.run(n, argv, timeout=timeout), views,
                                ops.hosts, dest_dir, connect_timeout_s=ops.options.connect_timeout)


def stacks(ops: ClusterOps, attempt: int, nodes: Sequence[str]) -> str:
    """Where every rank waits (py-spy, see ``launch.stacks``): one line per group of ranks; the full stacks are
    kept as JSON in the job's directory (``stacks-<attempt>.json``)."""
    from clusterctl.launch import stacks as py_spy

    found, errors = py_spy.collect(nodes, lambda n: lambda argv, **kw: ops.run(n, argv, **kw),
                                   ops.job_id, attempt, host_timeout=60)
    try:
        paths.write_private(ops.sink.path.parent / f"stacks-{attempt}.json", py_spy.dump_json(found, errors))
    except OSError:
        pass
    return py_spy.hang_record(found, errors)
