"""One probe round over a ``ClusterOps``'s plumbing (the I/O around ``observe``, which decides what it means).

Each node's watch answers for the common cases; a node whose process ended (or whose watch has no line yet) is
probed: the runtime's listing, and for a failure the tail of the node's own log, the OOM killer and the kernel's
GPU Xid say why. ``ClusterOps.observe`` calls ``observe`` here and keeps the nodes' health for its reachability.
"""
from __future__ import annotations

import sys
import time
import traceback
from typing import TYPE_CHECKING, Callable, Sequence

from clusterctl.errors import CommandTimeout, TransportError
from clusterctl.launch import runtimes
from clusterctl.model import causes
from clusterctl.model.verdicts import Observation
from clusterctl.supervise.observe import Confirm, Explain, interpret
from clusterctl.transport import fan_out
from clusterctl.transport.base import readable
from clusterctl.transport.streams import open_stream

if TYPE_CHECKING:
    from clusterctl.supervise.cluster_ops import ClusterOps

TAIL_LINES = 200          # lines of a node's own log read to explain its end


def observe(ops: ClusterOps, attempt: int, nodes: Sequence[str], *, watch: bool = True,
            deadline_s: float | None = None) -> list[Observation]:
    """One probe round. Each node's watch (a line a second over its persistent connection) answers for
    the common cases without a remote command: silent for ``heartbeat_timeout_s`` -> unreachable (a probe
    would only hang until its timeout); fresh and alive -> running. Otherwise (the process ended, no watch
    line yet) the node is probed: the runtime's listing gives the state and exit code, and for a failure the
    tail of the node's own log says why. ``watch=False``: probe only (``status``/``resume`` of a job whose
    supervisor is gone). ``deadline_s``: the whole round's bound (default: three probe timeouts)."""
    known: dict[str, Observation] = {}
    for n in nodes if watch else ():
        ops.watch(attempt, n)
        o = ops.watches.heard(n)
        if o is not None:
            known[n] = o

    def probe(host) -> Observation:
        rt = ops.runtime(host.name)
        r = ops.run(host.name, rt.list_argv(ops.job_id, jobs_root=ops.jobs_root(host.name)),
                    timeout=ops.probe_timeout_s)
        if not r.ok:
            raise TransportError(host.name, f"status probe failed: {r.stderr.strip()[-200:]}")
        instances = rt.parse_list(r.stdout)
        progress = ops.watches.progress(host.name)
        got = interpret(host.name, instances, attempt, runtime=rt, job_id=ops.job_id,
                        watch=ops.watches.get(host.name), now=ops.clock(), progress=progress)
        if isinstance(got, Confirm):
            return got.gone if init_gone(ops, host.name, got.argv) else got.running
        if isinstance(got, Explain):
            return ended(ops, host.name, attempt, got.instance, progress)
        return got

    out = dict(known)
    for r in fan_out([ops.hosts[n] for n in nodes if n not in known], probe,
                     host_timeout=deadline_s or ops.probe_timeout_s * 3 + 2):
        out[r.host.name] = r.value if r.ok else probe_failed(r.host.name, r.error)
    return [out[n] for n in nodes]


def probe_failed(node: str, error: BaseException) -> Observation:
    """A probe that raised: the node did not answer (a transport error or a deadline: ``unreachable``,
    which counts towards a lost node), or a bug on this side (a parser, a runtime listing we do not
    understand: ``probe_error``, logged with its traceback in the supervisor's log, never a verdict)."""
    if isinstance(error, TransportError):
        return Observation(node, "unreachable", error_tail=str(error))
    text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
    print(f"clusterctl: probe error on {node} (not a node failure):\n{text}", file=sys.stderr, flush=True)
    return Observation(node, "probe_error", error_tail=f"probe error: {error.__class__.__name__}: {error}")


def ended(ops: ClusterOps, node: str, attempt: int, inst, progress: bool) -> Observation:
    """A node that exited with a failure (``observe.Explain``; a clean exit is decided without the node):
    exit code, signal, the failing rank and its last lines (from the node's own log), a configuration error
    no retry can fix, and whether the OOM killer did it."""
    code = inst.exit_code
    sig = causes.signal_of(code)
    lines = node_log(ops, node, ops.ref(node, attempt, inst.name))
    text = "\n".join(lines)
    cause = causes.root_cause_of(text)
    rank = cause.rank if cause else None
    if cause and cause.signal:     # torchrun reports a rank killed by signal N as exit code -N
        sig = cause.signal
    spec = ops.spec
    cfg = causes.config_error(code, text, script=spec.script, module=spec.module, torchrun=spec.torchrun[0])
    oom = sig == "SIGKILL" and (causes.warm_oom(lines, node, rank)      # a warm rank: its zygote saw it
                                or oom_killed(ops, node, inst.name, cause.pid if cause else None))
    tail = causes.error_tail(lines, node, rank)
    message = causes.error_file_in(text)   # torchrun's own error file (bare), when it wrote one
    if message:
        tail = f"{tail}\n[{node}/-] root cause (torchelastic error file): {message.splitlines()[0]}".lstrip()
    gpu = None if cfg or oom else (causes.gpu_error(lines) or xid(ops, node, attempt))
    return Observation(node, "exited", exit_code=code, signal=sig, progress=progress,
                       error_tail=tail, rank=rank,
                       config_error=f"{cfg.message}. Fix: {cfg.fix}" if cfg else None, oom=oom, gpu_error=gpu)


def xid(ops: ClusterOps, node: str, attempt: int) -> str | None:
    """The kernel's GPU-failure Xid on ``node`` since ``attempt`` started (``causes.recent_xid``), as
    evidence ("kernel: NVRM: Xid ..."), or None (none, a host without GPUs, or the log cannot be read)."""
    if ops.hosts[node].gpus == 0:
        return None
    started = next((a.started_at for a in ops.store.attempts(ops.job_id) if a.attempt == attempt), None)
    if started is None:
        return None
    try:
        r = ops.run(node, ["sh", "-c", causes.XID_PROBE], timeout=ops.probe_timeout_s)
    except TransportError:
        return None
    found = causes.recent_xid(r.stdout, ops.store.now() - started)
    return f"kernel: Xid {found.code} on {found.pci}: {found.line}" if found else None


def node_log(ops: ClusterOps, node: str, ref: runtimes.Ref, lines: int = TAIL_LINES) -> list[str]:
    """The last ``lines`` lines of the node's own log (stdout and stderr), as ``[node/rank] text``."""
    argv = ops.runtime(node).logs_argv(ref, tail=lines)
    try:
        r = ops.run(node, ["sh", "-c", f'"$@" 2>&1 | tail -c {causes.MAX_TEXT}', "clusterctl-tail", *argv],
                    timeout=ops.probe_timeout_s)   # at most MAX_TEXT bytes: lines have no length limit
    except TransportError:
        return []
    return causes.node_lines(r.stdout, node)


def oom_killed(ops: ClusterOps, node: str, name: str, pid: int | None) -> bool:
    """Did the OOM killer do it? bare: the kernel log names the rank's pid; containers: the runtime's
    OOMKilled flag (the rank's pid is the container's own)."""
    rt = ops.runtime(node)
    try:
        r = ops.run(node, rt.oom_argv(runtimes.Ref(name, "", None, ops.job_id)),   # selected by label
                    timeout=ops.probe_timeout_s)
    except TransportError:
        return False
    return rt.oom_killed(r.stdout, pid)


def init_gone(ops: ClusterOps, node: str, argv: list[str]) -> bool:
    """``observe.Confirm``: is the init process of a container the runtime lists as running gone? (one
    command, the runtime's ``init_gone_argv``: exit 3)."""
    return ops.run(node, argv, timeout=ops.probe_timeout_s).exit_code == 3


# exit 0 when the node has InfiniBand verbs devices (clusterctl_infiniband: auto); a glob, no process per file
HAS_INFINIBAND = 'for f in /dev/infiniband/uverbs*; do [ -e "$f" ] && exit 0; done; exit 1'


def infiniband(ops: ClusterOps, nodes: Sequence[str]) -> dict[str, bool]:
    """``clusterctl_infiniband: auto``: node -> has /dev/infiniband/uverbs*, for each container node of ``nodes``.
    One short command per node (one that does not answer is absent: asked again at its next start). Not asked of
    CPU hosts (``clusterctl_gpus: 0``): gloo does not use the verbs devices."""
    todo = [ops.hosts[n] for n in nodes if ops.hosts[n].infiniband is None and ops.hosts[n].gpus != 0
            and ops.runtime(n).containerized]
    if not todo:
        return {}

    def ask(host) -> bool:
        return ops.run(host.name, ["sh", "-c", HAS_INFINIBAND], timeout=ops.probe_timeout_s).exit_code == 0

    return {r.host.name: r.value for r in fan_out(todo, ask, host_timeout=ops.options.connect_timeout
                                                  + ops.probe_timeout_s + 5) if r.ok}


def read_log(ops: ClusterOps, node: str, attempt: int, timeout: float, on_data: Callable[[bytes], None]) -> None:
    """The node's own log of ``attempt``, whole (stdout and stderr), passed to ``on_data`` in pieces as it comes
    (a stream: at most 64 KiB at a time in memory; ``run`` held it whole, or over SSH only its last 8 MiB):
    what ``logs`` and ``resume`` complete the controller's copy from. ``CommandTimeout`` after ``timeout``."""
    argv = ops.runtime(node).logs_argv(ops.ref(node, attempt))
    stream = open_stream(ops.transport(node), ["sh", "-c", '"$@" 2>&1', "clusterctl-logs", *argv])
    deadline = time.monotonic() + timeout
    try:
        while (data := stream.read()) != b"":
            if data:
                on_data(data)
            elif (left := deadline - time.monotonic()) <= 0:
                raise CommandTimeout(node, f"reading its log took over {timeout:g}s")
            else:
                readable(stream.fileno(), min(left, 0.5))
    finally:
        stream.close()
