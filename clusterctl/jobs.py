"""The job lifecycle, one use case per command: ``launch``, ``dry_run``, ``resume``, ``stop``, ``status``, ``attach``.

Each takes a request (plain values), its dependencies (``connect``, ``spawn``, a progress callback) and returns an
outcome value; none prints or exits (``cli.py`` maps flags to a request and an outcome to text and an exit code).
The "before we start" policy lives here once: the job's hosts (cordons left out), the environment it needs, the
"already active" rule (``Store.active_job``, the same rule ``create_job`` applies atomically), usable key files,
host keys that are known and unchanged, and the quick preflight.

``controller.py`` keeps the mechanics these use cases drive: the state dir, the detached supervisor process and
its liveness, the log copy, and the ``ClusterOps`` built from a job record.
"""
from __future__ import annotations

import difflib
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

from clusterctl.config import inventory as inventory_mod
from clusterctl.config import yamlfile
from clusterctl.config.inventory import Host, Inventory
from clusterctl.config.spec import JobSpec, webhook_problem
from clusterctl.config.yamlfile import line_of
from clusterctl.errors import AuthError, ClusterctlError, HostKeyError, InputError, UserError, raise_all
from clusterctl.launch.plan import LaunchPlan, build_plan
from clusterctl.model.events import EventKind
from clusterctl.model.record import JobRecord
from clusterctl.model.verdicts import NodeError
from clusterctl.slurm import allocation
from clusterctl.store.ledger import Ledger
from clusterctl.store.state import JobState, Store
from clusterctl.supervise import controller
from clusterctl.transport import ConnectOptions, Transport
from clusterctl.transport import connect as default_connect
from clusterctl.views import nodes as nodehealth

Connect = Callable[[Host, ConnectOptions], Transport]
Spawn = Callable[..., int]                 # controller.spawn_supervisor(root, job_id, *, accept_new, adopt=False)
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Workspace:
    """The state dir and its store."""
    root: Path
    store: Store


def open_workspace(state_dir: str | None) -> Workspace:
    return Workspace(*controller.open_store(state_dir))


# ---------------------------------------------------------------------------------------------- the job's hosts
@dataclass(frozen=True)
class JobContext:
    spec: JobSpec
    inventory: Inventory
    hosts: list[Host]
    excluded: tuple[tuple[str, str], ...] = ()     # (cordoned host, reason), left out of hosts
    recorded: tuple[Host, ...] = ()                # the job's hosts with the cordoned ones (usable once uncordoned)
    data: Any = None                               # the job file as read (with lines): read once per command


def with_overrides(data: Any, overrides: Mapping[str, Any]) -> Any:
    """The job file's data with `launch --name/--nodes/--env K=V -- ARGS` applied (``env`` entries merged, ARGS
    after the file's ``args``; the others replace the file's value), validated as if the file said so."""
    if not overrides or not isinstance(data, dict):
        return data
    out = yamlfile.LineDict(data)
    out.line, out.lines, out.texts = data.line, dict(data.lines), dict(getattr(data, "texts", {}))
    # an error in an overridden value names its flag, not the job file's line (spec.parse_job)
    out.overrides = {("env", k): f"--env {k}" for k in overrides.get("env", {})}
    out.overrides.update({(k,): f"--{k}" for k in overrides if k not in ("env", "args")})
    for key, value in overrides.items():
        if key == "args":     # `launch job.yaml -- ARGS`: after the file's own args (kept at their lines)
            old = data.get("args")
            args = yamlfile.LineList([*(old if isinstance(old, list) else []), *value])
            args.line, args.lines = getattr(old, "line", 0), dict(getattr(old, "lines", {}))
            args.texts = dict(getattr(old, "texts", {}))
            first = len(args) - len(value)
            out.overrides.update({("args", first + i): f"script argument {a!r} (after --)" for i, a in enumerate(value)})
            out["args"] = args if isinstance(old, list) or old is None else old
        elif key == "env":
            env = yamlfile.LineDict(data.get("env") or {})
            old = data.get("env")
            env.line, env.lines = getattr(old, "line", 0), dict(getattr(old, "lines", {}))
            env.texts = dict(getattr(old, "texts", {}))
            env.update(value)
            out["env"] = env
        else:
            out[key] = value
    return out


def load_context(job_path: str, inventory_path: str | None, cordons: Mapping[str, Any] | None = None,
                 overrides: Mapping[str, Any] | None = None) -> JobContext:
    """The job and the hosts it will use, checked against each other (errors at the job file's line).
    ``cordons``: host -> cordon (``Store.cordons()``); those hosts are left out (``excluded``). ``overrides``:
    `launch --name/--nodes/--env` (``with_overrides``). The job file is read once."""
    from clusterctl.config.spec import parse_job

    data = with_overrides(yamlfile.load_yaml_with_lines(job_path), overrides or {})
    spec = parse_job(data, job_path)
    inv = allocation.load_hosts(inventory_path)

    def bad(key: str, message: str) -> InputError:
        flag = getattr(data, "overrides", {}).get((key,))      # `launch --nodes 9`: the flag, not the file's line
        return InputError(flag, None, message) if flag else InputError(job_path, line_of(data, key), message, key=key)

    everyone = _job_hosts(spec, inv, data, job_path) if spec.hosts else list(inv.hosts)
    hosts, excluded = nodehealth.split(everyone, cordons or {})
    if len(hosts) < spec.min_nodes:
        if excluded:
            raise nodehealth.too_few(spec.min_nodes, len(hosts), excluded)
        raise bad("nodes", f"the job needs at least {spec.min_nodes} node(s) but the inventory {inv.source} "
                           f"offers {len(hosts)}: {', '.join(h.name for h in hosts)}")
    for h in hosts:
        if spec.nproc_per_node == "gpu" and not h.gpus:
            raise bad("nproc_per_node", f"\"gpu\" but {h.name} has no GPUs (clusterctl_gpus)")
        if isinstance(spec.nproc_per_node, int) and h.gpus and spec.nproc_per_node > h.gpus:
            raise bad("nproc_per_node", f"{spec.nproc_per_node} > {h.gpus} GPUs on {h.name}")
    chosen = hosts if spec.hosts is not None or inv.allocation else hosts[: spec.max_nodes]
    rdzv = spec.rendezvous.host
    if rdzv is not None and rdzv not in [h.name for h in chosen[: spec.max_nodes]]:
        why = (" (it is cordoned)" if rdzv in dict(excluded) else " (it is a spare: beyond nodes' MAX)"
               if rdzv in [h.name for h in chosen] else "")
        rdzv_node = data.get("rendezvous") if isinstance(data, dict) else None
        raise InputError(job_path, line_of(rdzv_node, "host"),
                         f"{rdzv!r} is not one of the job's hosts{why}: "
                         f"{', '.join(h.name for h in chosen[: spec.max_nodes])}; pick one of them or leave it "
                         "out (the first node holds the rendezvous)", key="rendezvous.host")
    cordoned = dict(excluded)
    recorded = tuple(h for h in everyone if h in chosen or h.name in cordoned)
    return JobContext(spec, inv, chosen, tuple(excluded), recorded, data)


def _job_hosts(spec: JobSpec, inv: Inventory, data: Any, job_path: str) -> list[Host]:
    """The job's ``hosts:`` resolved; an unknown name is an error at its line with the nearest name."""
    known = [*inv.groups, *(h.name for h in inv.hosts)]
    for i, p in enumerate(spec.hosts or ()):
        if p not in known:
            hint = difflib.get_close_matches(p, known, 1)
            raise InputError(job_path, line_of(data.get("hosts"), i),
                             f"no host or group {p!r} in the inventory {inv.source}"
                             + (f" (did you mean {hint[0]!r}?)" if hint else
                                f"; it has {', '.join(h.name for h in inv.hosts[:8])}"), key=f"hosts[{i}]")
    return inv.select(spec.hosts or ())


def check_environment(job_path: str, spec: JobSpec, environ: Mapping[str, str], data: Any = None) -> None:
    """Every ``secret_env`` name and ``notify[].webhook_env`` set in clusterctl's environment, else an error at its
    line, all of them at once (a launch needs them; ``--dry-run`` warns: it shows ***)."""
    raise_all(environment_problems(job_path, spec, environ, data))


def environment_problems(job_path: str, spec: JobSpec, environ: Mapping[str, str],
                         data: Any = None) -> list[InputError]:
    """The ``secret_env`` / ``notify[].webhook_env`` variables missing from ``environ``, each at its line (the
    names only: a value is never printed). ``data``: the job file as ``load_context`` read it (else read here)."""
    data = yamlfile.load_yaml_with_lines(job_path) if data is None else data
    problems = []
    for i, name in enumerate(spec.secret_env):
        if name not in environ:
            problems.append(InputError(job_path, line_of(data.get("secret_env"), i),
                                       f"{name} is not set in clusterctl's environment: `export {name}=...` before "
                                       "the launch (the value is sent to the nodes on stdin, never printed or "
                                       "stored)", key=f"secret_env[{i}]"))
    for i, t in enumerate(spec.notify):
        if t.webhook_env is not None and not environ.get(t.webhook_env):
            entry = data["notify"][i]
            problems.append(InputError(job_path, line_of(entry, "webhook_env"),
                                       f"{t.webhook_env} is not set in clusterctl's environment: `export "
                                       f"{t.webhook_env}=https://...` before the launch",
                                       key=f"notify[{i}].webhook_env"))
        elif t.webhook_env is not None and webhook_problem(environ[t.webhook_env], t.allow_http):
            problems.append(InputError(job_path, line_of(data["notify"][i], "webhook_env"),
                                       f"${t.webhook_env} {webhook_problem(environ[t.webhook_env], t.allow_http)}",
                                       key=f"notify[{i}].webhook_env"))
    return problems


def launch_problems(job_path: str, spec: JobSpec, hosts: Sequence[Host],
                    environ: Mapping[str, str], data: Any = None) -> list[InputError]:
    """What ``launch`` would refuse before contacting any host: unset secret/webhook variables (or a plain-http
    webhook), unusable SSH key files. ``launch --dry-run`` prints each as a warning (exit 2 with ``--strict``)."""
    from clusterctl.transport.ssh import key_file_problems

    return (environment_problems(job_path, spec, environ, data) + local_torchrun_problems(job_path, spec, hosts, data)
            + key_file_problems(hosts))


def local_torchrun_problems(job_path: str, spec: JobSpec, hosts: Sequence[Host], data: Any = None) -> list[InputError]:
    """The check launch's preflight makes of a ``local`` bare host's torchrun, made here without a preflight
    (``validate``, ``--dry-run``): found on PATH or beside clusterctl's interpreter (``transport.local``)."""
    from clusterctl.launch import runtimes
    from clusterctl.transport.local import local_path, which_local

    name = spec.torchrun[0]
    for h in hosts:
        if h.connection == "local" and not runtimes.containerized(h.runtime) and not which_local(name):
            return [InputError(job_path, line_of(data, "torchrun") if isinstance(data, dict) else None,
                               f"{name} not found on {h.name}'s PATH ({local_path()}, then clusterctl's interpreter's "
                               "directory): activate the venv that has torch, install torch beside clusterctl "
                               "(`make install`), or set `torchrun:` to its full path", key="torchrun")]
    return []


def check_key_files(hosts: Sequence[Host]) -> None:
    """Unusable ansible_ssh_private_key_file -> exit 2 at its inventory line, before anything connects."""
    from clusterctl.transport.ssh import check_key_files as check

    check(hosts)


def verify_host_keys(hosts: Sequence[Host], options: ConnectOptions, connect: Connect = default_connect) -> None:
    """Connect to every host once. A changed/unknown host key or a refused login is an error now (with the
    transport's message: fingerprints, known_hosts file:line, the fix), not a node the supervisor waits for.
    Unreachable hosts are left to the supervisor (they may come back)."""
    from clusterctl.transport import fan_out

    def probe(h: Host) -> None:
        t = connect(h, options)
        try:
            t.run(["true"], timeout=options.command_timeout)
        finally:
            t.close()

    results = fan_out(list(hosts), probe, host_timeout=options.connect_timeout * 3 + options.command_timeout)
    bad = [r.error for r in results if isinstance(r.error, (HostKeyError, AuthError))]
    if bad:
        raise ClusterctlError("cannot connect safely:\n" + "\n".join(f"  {e}" for e in bad))


def quick_preflight(hosts: Sequence[Host], spec: JobSpec, options: ConnectOptions, *,
                    connect: Connect = default_connect, on_progress: Progress | None = None):
    """The launch subset of preflight (``LAUNCH_CHECKS``: one round trip per host) -> ``PreflightReport``."""
    from clusterctl.checks.job import PreflightJob
    from clusterctl.checks.preflight import run_preflight
    from clusterctl.checks.registry import LAUNCH_CHECKS

    return run_preflight(hosts, connect=lambda h: connect(h, options), job=PreflightJob.from_spec(spec),
                         only=LAUNCH_CHECKS, progress=on_progress)


# ---------------------------------------------------------------------------------------------- launch
@dataclass(frozen=True)
class LaunchRequest:
    job_path: str
    inventory_path: str | None = None
    options: ConnectOptions = field(default_factory=ConnectOptions)   # accept_new_host_keys: for this launch only
    skip_preflight: bool = False
    environ: Mapping[str, str] = field(default_factory=dict)         # where secret_env / webhook_env are read
    overrides: Mapping[str, Any] = field(default_factory=dict)       # launch --name/--nodes/--env K=V


@dataclass(frozen=True)
class Launched:
    job_id: str
    name: str
    supervisor_pid: int
    nodes: tuple[str, ...]                       # the first attempt's hosts
    spares: tuple[str, ...] = ()                 # hosts beyond nodes' MAX
    excluded: tuple[tuple[str, str], ...] = ()   # (cordoned host, reason)
    warnings: tuple[tuple[str, str | None], ...] = ()   # (detail, hint): preflight warnings the user must see


@dataclass(frozen=True)
class PreflightFailed:
    report: Any                                  # checks.results.PreflightReport


@dataclass(frozen=True)
class DryRun:
    plan: LaunchPlan
    problems: tuple[InputError, ...] = ()        # what `launch` would refuse (launch_problems)


def dry_run(ws: Workspace, request: LaunchRequest) -> DryRun:
    """The plan ``launch`` would run (cordoned hosts left out) and every problem ``launch`` would refuse before
    contacting a host; needs no secret values: they show as ***."""
    ctx = load_context(request.job_path, request.inventory_path, cordons=ws.store.cordons(),
                       overrides=request.overrides)
    hosts = ctx.hosts[: ctx.spec.max_nodes]
    plan = build_plan(ctx.spec, hosts, job_id=f"{ctx.spec.name}-DRYRUN", attempt=1, interfaces=None,
                      spares=[h.name for h in ctx.hosts[ctx.spec.max_nodes:]], excluded=ctx.excluded)
    return DryRun(plan, tuple(launch_problems(request.job_path, ctx.spec, ctx.hosts, request.environ, ctx.data)))


def launch(ws: Workspace, request: LaunchRequest, *, connect: Connect = default_connect,
           on_progress: Progress | None = None,
           spawn: Spawn = controller.spawn_supervisor) -> Union[Launched, PreflightFailed]:
    """Check, record and start a job; its detached supervisor does the rest. ``PreflightFailed``: nothing was
    recorded or started. Input errors (exit 2) and unsafe hosts are raised."""
    ctx = load_context(request.job_path, request.inventory_path, cordons=ws.store.cordons(),
                       overrides=request.overrides)
    spec = ctx.spec
    check_environment(request.job_path, spec, request.environ, ctx.data)
    active = ws.store.active_job(spec.name)
    if active is not None:     # before the preflight, whose port check would trip over the running job
        from clusterctl.store.state import JobActive

        raise JobActive(active)
    check_key_files(ctx.hosts)
    interfaces: dict[str, str] = {}
    gpu_flags: dict[str, str] = {}
    warnings: list[tuple[str, str | None]] = []
    if request.skip_preflight:   # the supervisor would see a bad host key only as an unreachable node
        verify_host_keys(ctx.hosts, request.options, connect)
    else:
        report = quick_preflight(ctx.hosts, spec, request.options, connect=connect, on_progress=on_progress)
        if not report.ok:
            return PreflightFailed(report)
        interfaces = report.interfaces()
        gpu_flags = report.gpu_flags()
        warnings = launch_warnings(report, spec)
    job_id = record_job(ws.store, ctx, request.job_path, interfaces, gpu_flags)
    pid = spawn(ws.root, job_id, accept_new=request.options.accept_new_host_keys)
    return Launched(job_id, spec.name, pid, tuple(h.name for h in ctx.hosts[: spec.max_nodes]),
                    tuple(h.name for h in ctx.hosts[spec.max_nodes:]), ctx.excluded, tuple(warnings))


def launch_warnings(report: Any, spec: JobSpec) -> list[tuple[str, str | None]]:
    """What ``launch`` warns of from its quick preflight: the rendezvous port listening on addresses outside the
    cluster network (c10d's TCPStore binds every address; torch has no way to bind one), unless the job file
    acknowledges it (``rendezvous.exposure_ok: true``: firewalled, or a machine of one's own)."""
    if spec.rendezvous.exposure_ok:
        return []
    return [(c.detail, f"{c.hint}; once it is (or on a machine of your own), `rendezvous: {{exposure_ok: true}}` "
                       "in the job file stops this warning")
            for c in report.cluster if c.id == "rendezvous_exposure" and c.status == "warn"]


def record_job(store: Store, ctx: JobContext, job_path: str, interfaces: Mapping[str, str],
               gpu_flags: Mapping[str, str] | None = None) -> str:
    """Store the job (PENDING) with its typed record; ``JobActive`` (atomic) if one of that name is active.
    ``gpu_flags``: host -> "gpus" | "cdi", preflight's choice for the containers' GPUs."""
    rec = JobRecord(spec=ctx.spec, source=os.path.abspath(job_path), hosts=ctx.recorded or tuple(ctx.hosts),
                    interfaces=dict(interfaces), gpu_flags=dict(gpu_flags or {}))
    inv = ctx.inventory.source
    return Ledger(store).job_recorded(ctx.spec.name, rec.to_json(),
                                      None if inv == inventory_mod.EMBEDDED_DEFAULT else os.path.abspath(inv),
                                      os.path.abspath(job_path))


# ---------------------------------------------------------------------------------------------- attach
@dataclass(frozen=True)
class Ended:
    state: JobState
    view: dict                                   # status.job_view of the ended job


class Watchdog:
    """What a follower (`logs -f`, `events -f`, an attached `launch`/`resume`) does when the job's supervisor is
    gone, called every round: it says so at once with the line `status` prints (``UNSUPERVISED: ... Run:
    clusterctl resume JOB``; again if a supervisor came back and went), and while nobody supervises the active job
    it asks the nodes every ``every_s`` as `status` does: ``fill`` completes the log copy from the nodes' own logs
    (the follower prints what they printed since), and the job is reconciled (it ends when its nodes ended, and
    the follower with it). It never raises: a node that does not answer is asked again next time."""

    def __init__(self, ws: Workspace, job_id: str, say: Callable[[str], None], *,
                 options: ConnectOptions | None = None, fill: bool = False, every_s: float = 5.0,
                 connect: Connect = default_connect, clock: Callable[[], float] = time.monotonic):
        self.ws, self.job_id, self.say, self.fill, self.every_s = ws, job_id, say, fill, every_s
        self.options, self.connect, self.clock = options or ConnectOptions(), connect, clock
        self.said = self.said_error = False
        self.asked = -float("inf")

    def __call__(self) -> None:
        from clusterctl.views import status as status_mod

        job = self.ws.store.get_job(self.job_id)
        sup = controller.supervision(self.ws.root, job)
        if job.terminal or sup["supervised"]:
            self.said = False
            return
        if not self.said:
            self.said = True
            self.say(status_mod.unsupervised_line(status_mod.job_view(self.ws.store, job, supervision=sup)))
        if self.clock() - self.asked < self.every_s:
            return
        self.asked = self.clock()
        try:
            if self.fill:
                controller.fill_logs(self.ws.root, self.ws.store, self.job_id, self.options, connect=self.connect)
            controller.reconcile_job(self.ws.root, self.ws.store, self.job_id, self.options, connect=self.connect)
        except Exception as e:  # noqa: BLE001 - a follower goes on; the next look asks again
            if not self.said_error:
                self.say(f"clusterctl: could not ask the nodes: {e}")
            self.said_error = True


def attach(ws: Workspace, job_id: str, echo: Callable[[str], None], *, from_start: bool = True,
           options: ConnectOptions | None = None) -> Ended:
    """Print the job's output and events as they come (``from_start``: from its first line) until it ends; when
    its supervisor is gone, say so and go on from the nodes' own logs (``Watchdog``). Ctrl-C
    (``KeyboardInterrupt``) is the caller's: the job runs on."""
    from clusterctl.views import status as status_mod

    state = controller.follow(ws.root, ws.store, job_id, echo, from_start=from_start,
                              tick=Watchdog(ws, job_id, echo, options=options, fill=True))
    job = ws.store.get_job(job_id)
    return Ended(state, status_mod.job_view(ws.store, job, supervision=controller.supervision(ws.root, job)))


# ---------------------------------------------------------------------------------------------- status
def status(ws: Workspace, job_ref: str, options: ConnectOptions, *, connect: Connect = default_connect) -> dict:
    """``status JOB``: the job's view; an active job that no supervisor watches is first reconciled with what its
    nodes say (bounded by the connect timeout + 5 s)."""
    from clusterctl.views import status as status_mod

    j = ws.store.get_job(job_ref)
    found = None
    if not j.terminal and not controller.supervision(ws.root, j)["supervised"]:
        found = controller.reconcile_job(ws.root, ws.store, j.job_id, options, connect=connect)
        j = ws.store.get_job(j.job_id)
    view = status_mod.job_view(ws.store, j, supervision=controller.supervision(ws.root, j))
    if found is not None and found.decision is not None:     # this look ended the job: say so first, loudly
        view["reconciled"] = {"attempt": found.attempt, "verdict": found.decision.verdict.value,
                              "message": found.decision.message, "state": found.state.value}
    return view


# ---------------------------------------------------------------------------------------------- stop
@dataclass(frozen=True)
class Stopped:
    job_id: str
    state: JobState
    errors: Mapping[str, NodeError]              # node -> why it could not be cleaned up


def stop(ws: Workspace, job_ref: str, options: ConnectOptions, *, grace_s: float = 10.0,
         connect: Connect = default_connect) -> Stopped:
    """SIGTERM to torchrun everywhere, kill after the grace period, remove exactly this job's containers; the
    nodes' end is recorded (``stopped``, or how they had ended before)."""
    store = ws.store
    job_id = store.get_job(job_ref).job_id
    job = store.get_job(job_id)
    ledger = Ledger(store)
    # the nodes that had ended before this stop keep how they ended; the others read stopped, whatever their
    # processes made of the SIGTERM meanwhile (a supervisor may record torchrun's exit 1 before this ends)
    attempts = store.attempts(job_id)
    ended = {n.node: n.state for n in store.nodes(job_id, attempts[-1].attempt)} if attempts else {}
    if not job.terminal:
        ledger.stop_requested(job_id)
    ops, _, nodes = controller.build_ops(ws.root, store, job_id, options, starts=False,   # stopping needs no secrets
                                         connect=connect)
    try:
        if attempts:
            a = attempts[-1]
            ops.adopt(a.attempt, list(a.nodes), a.rdzv_host)
        errors = ops.stop(None, nodes, grace_s=grace_s)
        if attempts:
            a = attempts[-1]
            rows = {node: {"state": "stopped"} for node in a.nodes
                    if node not in errors and ended.get(node) not in ("exited", "killed", "gone")}
            # the attempt's result is recorded once: a supervisor that saw the stop first wrote it already
            ledger.attempt_ended(job_id, a.attempt, "stopped", nodes=rows)
    finally:
        ops.close()
    return Stopped(job_id, store.get_job(job_id).state, dict(errors))


# ---------------------------------------------------------------------------------------------- resume
def elsewhere_refused(root: Path, job, command: str, now: float | None = None) -> None:
    """``UserError`` (exit 2) when ``job`` is supervised on another host (a shared state dir, its heartbeat
    fresh): only that supervisor may reconcile, stop its processes or relaunch the job."""
    sup = controller.supervision(root, job, now)
    if sup["elsewhere"] and sup["alive"]:
        ago = max(0, int((time.time() if now is None else now) - (sup["last_seen"] or 0)))
        raise UserError(f"job {job.name} ({job.job_id}) is supervised elsewhere: supervisor pid {sup['pid']} on "
                        f"{sup['host']}, last heartbeat {ago}s ago (the state dir is shared); `{command}` did "
                        f"nothing. Run it on {sup['host']}, or `clusterctl stop {job.name}` first; a supervisor "
                        f"counts as gone once its heartbeat is older than {controller.STALE_S:g}s")


@dataclass(frozen=True)
class ResumeRequest:
    job_ref: str
    options: ConnectOptions = field(default_factory=ConnectOptions)
    exclude: tuple[str, ...] = ()
    checkpoint: str | None = None
    cleaned: tuple[str, ...] = ()      # hosts whose cleanup is recorded already (a Slurm guard's): not asked again


@dataclass(frozen=True)
class Resumed:
    action: str          # already_supervised | succeeded | reattached | relaunched
    message: str         # one line for the user
    pid: int | None = None
    job_id: str = ""
    name: str = ""
    excluded: tuple[tuple[str, str], ...] = ()   # cordoned hosts a relaunch leaves out


def resume(ws: Workspace, request: ResumeRequest, *, connect: Connect = default_connect,
           spawn: Spawn = controller.spawn_supervisor, wait: Callable[[float], None] = time.sleep) -> Resumed:
    """Bring a job back. Idempotent: with a live supervisor it only reports it. An active job whose nodes all
    still run is re-attached; one whose attempt finished well while nobody watched becomes SUCCEEDED; otherwise
    the cause is recorded, the last attempt cleaned up, and the job relaunched from its latest valid checkpoint."""
    from clusterctl.supervise.reconcile import reconcile, unsupervised_span

    store, root, options = ws.store, ws.root, request.options
    exclude, checkpoint = tuple(request.exclude), request.checkpoint
    if checkpoint is not None and not os.path.isabs(checkpoint):
        raise UserError(f"--checkpoint {checkpoint}: not an absolute path; give the checkpoint's path as the nodes "
                        "see it (on their shared storage), e.g. /shared/ckpt/step-000001000; nothing was stopped or "
                        "relaunched")
    job = store.get_job(request.job_ref)
    job_id = job.job_id

    def done(action: str, message: str, pid: int | None = None, excluded=()) -> Resumed:
        return Resumed(action, message, pid, job_id, job.name, tuple(excluded))

    elsewhere_refused(root, job, "resume")
    pid = controller.live_supervisor(root, job)
    if pid:
        return done("already_supervised", f"already supervised (supervisor pid {pid}); nothing to do", pid)
    excluded = _cordoned(store, job, exclude)      # a relaunch is coming: cordoned hosts must leave >= MIN
    if job.state == JobState.SUCCEEDED:
        return done("succeeded", "the job already SUCCEEDED; nothing relaunched (launch it again to start over)",
                    excluded=excluded)
    rec = Ledger(store).record(job)
    unknown = [h for h in exclude if h not in rec.host_names]
    if unknown:
        raise UserError(f"--exclude: {', '.join(unknown)} not among the job's hosts {', '.join(rec.host_names)}")
    attempts = store.attempts(job_id)
    found = None
    ops, _, nodes = controller.build_ops(root, store, job_id, options, connect=connect)
    accept_new = options.accept_new_host_keys
    try:
        verify_host_keys([ops.hosts[n] for n in nodes if n not in exclude], options, connect)
        if checkpoint is not None:
            _check_checkpoint(checkpoint, [ops.hosts[n] for n in nodes if n not in exclude], options, connect)
        if attempts and not job.terminal:
            a = attempts[-1]
            found = reconcile(store, job_id, ops, deadline_s=options.connect_timeout + 5,
                              keep_logs=lambda attempt: controller.complete_logs(ops, store, job_id, attempt))
            if found is not None and found.state == JobState.SUCCEEDED:
                return done("succeeded", f"attempt {a.attempt} had finished with exit code 0 on every node while "
                                         "unsupervised: the job is SUCCEEDED, nothing relaunched", excluded=excluded)
            if found is not None and found.decision is None and not found.state.terminal and not exclude \
                    and not checkpoint:
                # a second look a moment later: a container whose processes were just killed can still be listed
                # as running for a second, and re-attaching to a dead attempt would wait for nothing
                wait(2.0)
                again = ops.observe(a.attempt, list(a.nodes), watch=False, deadline_s=options.connect_timeout + 5)
                if again and all(o.state == "running" for o in again):
                    pid = spawn(root, job_id, accept_new=accept_new, adopt=True)
                    return done("reattached", f"attempt {a.attempt} still runs on {', '.join(a.nodes)}: "
                                              f"re-attached (supervisor pid {pid})", pid, excluded)
        if attempts and not (found is not None and found.state.terminal):    # else completed before the cleanup
            controller.complete_logs(ops, store, job_id, attempts[-1].attempt)
        if found is not None and found.state.terminal:     # its reconcile ended the job and cleaned up: the rest
            errors = ops.stop(None, list(found.leftovers)) if found.leftovers else {}
        else:
            errors = ops.stop(None, [n for n in nodes if n not in request.cleaned])
        for node, e in errors.items():
            Ledger(store).event(job_id, EventKind.CLEANUP_PENDING, f"could not clean up {node}: {e.message}",
                                node=node)
        keep = [n for n in nodes if n not in exclude]
        latest = ops.latest_checkpoint([n for n in keep if n not in errors]) if not checkpoint else None
    finally:
        ops.close()
    rec = rec.replace(hosts=tuple(h for h in rec.hosts if h.name not in exclude), checkpoint_override=checkpoint)
    start = (f"checkpoint {checkpoint}" if checkpoint else
             f"checkpoint step {latest[1]} ({latest[0]})" if latest and latest[0] else
             "the start (no valid checkpoint)" if latest else "the latest valid checkpoint")
    Ledger(store).resumed(job_id, f"resumed by user from {start}"
                          + (f", excluding {', '.join(exclude)}" if exclude else "")
                          + ("" if job.terminal else unsupervised_span(job, time.time())), rec)
    pid = spawn(root, job_id, accept_new=accept_new)
    return done("relaunched", f"relaunching attempt {store.get_job(job_id).attempt + 1} from {start}"
                + (f" without {', '.join(exclude)}" if exclude else "") + f" (supervisor pid {pid})", pid, excluded)


def _cordoned(store: Store, job, exclude: Sequence[str]) -> list[tuple[str, str]]:
    """The job's cordoned hosts (host, reason); ``UserError`` naming them when the job's MIN cannot be met
    without them."""
    rec = Ledger(store).record(job)
    usable, excluded = nodehealth.split([h for h in rec.host_names if h not in exclude], store.cordons())
    if excluded and len(usable) < rec.spec.min_nodes:
        raise nodehealth.too_few(rec.spec.min_nodes, len(usable), excluded)
    left = [h for h in rec.host_names if h not in exclude]
    if exclude and len(left) < rec.spec.min_nodes:     # as `launch` refuses a job with every host cordoned
        raise UserError(f"--exclude {' '.join(exclude)}: the job needs at least {rec.spec.min_nodes} node(s) but "
                        f"only {len(left)} of its hosts would remain"
                        + (f" ({', '.join(left)})" if left else "") + f" (hosts: {', '.join(rec.host_names)}); "
                        "nothing was stopped or relaunched")
    return excluded


def _check_checkpoint(path: str, hosts: Sequence[Host], options: ConnectOptions, connect: Connect) -> None:
    """`resume --checkpoint PATH`: a path that exists on the nodes' storage (asked of the job's hosts in
    parallel, ``test -e``), else ``UserError`` (exit 2) before anything is stopped: a path the nodes cannot read
    would relaunch from step 0. A node that cannot be asked says nothing; only a "no" from every node that
    answered refuses."""
    from clusterctl.transport import fan_out

    def exists(h: Host) -> bool:
        t = connect(h, options)
        try:
            r = t.run(["test", "-e", path], timeout=options.command_timeout)
        finally:
            t.close()
        if r.exit_code not in (0, 1):
            raise RuntimeError(r.stderr.strip()[-200:] or f"exit code {r.exit_code}")
        return r.exit_code == 0

    results = fan_out(list(hosts), exists, host_timeout=options.connect_timeout * 3 + options.command_timeout)
    said = [r.value for r in results if r.error is None]
    if said and not any(said):
        raise UserError(f"--checkpoint {path}: no such file or directory on "
                        f"{', '.join(r.host.name for r in results if r.error is None)}; nothing was stopped or "
                        "relaunched (`clusterctl resume` without --checkpoint takes the latest valid one)")


# ---------------------------------------------------------------------------------------------- forget, cordon
@dataclass(frozen=True)
class Forgotten:
    job_id: str
    name: str
    checkpoint_dir_kept: str | None       # never deleted
    nodes_cleaned: tuple[str, ...] = ()   # with nodes=True: the nodes whose job directory is gone
    node_errors: Mapping[str, str] = field(default_factory=dict)   # node -> why its directory may remain


def forget(ws: Workspace, refs: Sequence[str], *, nodes: bool = False, options: ConnectOptions | None = None,
           connect: Connect = default_connect) -> list[Forgotten]:
    """Delete finished jobs' records and controller-side logs; ``UserError`` (and nothing deleted) when one of
    them is active or still has a live supervisor. Checkpoints are never touched. ``nodes``: first remove each
    job's directory on every node it ran on (``~/.clusterctl/nodes/<node>/jobs/<job_id>``: its node logs, exit
    files, env dir), a node that cannot be reached said in ``node_errors`` (the record is forgotten anyway)."""
    import shutil

    from clusterctl.store import paths

    found = list({j.job_id: j for j in (ws.store.get_job(ref) for ref in refs)}.values())
    active = [j for j in found if not j.terminal or controller.live_supervisor(ws.root, j)]
    if active:
        raise UserError("not forgetting active job(s) " + ", ".join(f"{j.job_id} ({j.state})" for j in active)
                        + ": stop them first (`clusterctl stop JOB`); nothing was deleted")
    done = []
    for j in found:
        ckpt = (json.loads(j.spec_json).get("spec") or {}).get("checkpoint", {}).get("dir")
        cleaned, errors = _remove_node_dirs(ws, j, options or ConnectOptions(), connect) if nodes else ((), {})
        Ledger(ws.store).forgotten(j.job_id)
        shutil.rmtree(paths.job_dir(ws.root, j.job_id), ignore_errors=True)
        done.append(Forgotten(j.job_id, j.name, ckpt, cleaned, errors))
    return done


# `forget --nodes`: a finished job's directory on a node ($1, `~/` expanded there), nothing else
_RM_JOB_DIR = 'd=$1; case $d in "~/"*) d=$HOME/${d#"~/"};; esac; rm -rf -- "$d"'


def _remove_node_dirs(ws: Workspace, job: Any, options: ConnectOptions,
                      connect: Connect) -> tuple[tuple[str, ...], dict[str, str]]:
    from clusterctl.launch import runtimes
    from clusterctl.transport import fan_out

    hosts = list(Ledger(ws.store).record(job).hosts)

    def remove(h: Host) -> None:
        t = connect(h, options)
        try:
            root = runtimes.jobs_root_for(runtimes.DEFAULT_JOBS_ROOT, h.name)
            r = t.run(["sh", "-c", _RM_JOB_DIR, "clusterctl-forget", f"{root.rstrip('/')}/{job.job_id}"],
                      timeout=options.command_timeout)
            if r.exit_code != 0:
                raise ClusterctlError(r.stderr.strip() or f"exit {r.exit_code}")
        finally:
            t.close()

    results = fan_out(hosts, remove, host_timeout=options.connect_timeout * 3 + options.command_timeout)
    return (tuple(r.host.name for r in results if r.ok),
            {r.host.name: str(r.error) for r in results if not r.ok})


@dataclass(frozen=True)
class Cordoned:
    cordons: list                                  # state.Cordon per host, in the order asked
    unknown: list[str]                             # in no inventory clusterctl knows, nor any job's nodes
    replaced: dict[str, str]                       # host -> the reason its new one replaced
    drain_refused: tuple[str, str] | None = None   # (host, Slurm's message) with --slurm-drain


def cordon(ws: Workspace, hosts: Sequence[str], reason: str, inventory: Inventory, *,
           slurm_drain: bool = False) -> Cordoned:
    """Keep ``hosts`` out of every launch, resume and relaunch (and, ``slurm_drain``, drain them in Slurm)."""
    known = {h.name for h in inventory.hosts} | {n for a in ws.store.all_attempts() for n in a.nodes}
    before = ws.store.cordons()
    ledger = Ledger(ws.store)
    done = [ledger.host_cordoned(h, reason, by="user") for h in hosts]
    refused = None
    if slurm_drain:
        for c in done:
            ok, message = allocation.drain(c.host, c.reason)
            if not ok:
                refused = (c.host, message)
                break
    return Cordoned(done, [h for h in hosts if h not in known],
                    {h: before[h].reason for h in hosts if h in before}, refused)


def uncordon(ws: Workspace, hosts: Sequence[str]) -> dict[str, bool]:
    """host -> whether it was cordoned; its earlier failures no longer count toward an automatic cordon."""
    ledger = Ledger(ws.store)
    return {h: ledger.host_uncordoned(h) for h in hosts}


# ---------------------------------------------------------------------------------------------- what is kept
def job_node_names(state_dir: str | None, job_ref: str | None) -> list[str]:
    """Shell completion of --node: the nodes of ``job_ref``'s latest attempt, or (None: the shell's words did not
    say which job) of every job's, newest first; none without a database."""
    from clusterctl.store.paths import db_path
    from clusterctl.store.paths import state_dir as resolve

    root = resolve(state_dir)
    if not db_path(root).exists():
        return []
    with Store(db_path(root)) as store:
        found = store.find_job(job_ref) if job_ref else None
        chosen = [found] if found is not None else [] if job_ref else store.list_jobs()
        attempts = [store.attempts(j.job_id) for j in chosen]
    return list(dict.fromkeys(n for a in attempts if a for n in a[-1].nodes))


def job_names(state_dir: str | None) -> list[str]:
    """Every job's name and id in the state dir (shell completion); none when it has no database yet."""
    from clusterctl.store.paths import db_path
    from clusterctl.store.paths import state_dir as resolve

    root = resolve(state_dir)
    if not db_path(root).exists():
        return []
    with Store(db_path(root)) as store:
        jobs = store.list_jobs()
    return list(dict.fromkeys([j.name for j in jobs] + [j.job_id for j in jobs]))


def job_list(ws: Workspace, *, states: Sequence[str] = (), since: str | None = None, show_all: bool = False,
             now: float | None = None, options: ConnectOptions | None = None,
             connect: Connect = default_connect) -> list[tuple[dict, dict]]:
    """``status`` without JOB: (view, row) of the active jobs, then the newest finished ones (``views.history``).
    With ``options``, an active job that no supervisor watches is reconciled first, as ``status JOB`` does (a job
    that ended while unsupervised is listed as it ended, not as RUNNING); a job whose nodes cannot be asked is
    listed as recorded."""
    from clusterctl.views import history
    from clusterctl.views import status as status_mod

    now = time.time() if now is None else now
    if options is not None:
        for j in ws.store.list_jobs():
            if not j.terminal and not controller.supervision(ws.root, j)["supervised"]:
                try:
                    controller.reconcile_job(ws.root, ws.store, j.job_id, options, connect=connect)
                except (ClusterctlError, OSError):    # a key file gone, a node unreadable: listed as recorded
                    pass
    chosen = history.select(ws.store, ws.store.list_jobs(), states=history.parse_states(states),
                            since=history.parse_since(since, now) if since else None, show_all=show_all)
    return [(status_mod.job_view(ws.store, j, now, supervision=controller.supervision(ws.root, j)),
             history.row(ws.store, j, now)) for j in chosen]


def events_view(ws: Workspace, job_ref: str) -> dict:
    """``events JOB -o json``: the job's timeline as one object."""
    from clusterctl.views import status as status_mod

    return status_mod.events_view(ws.store, ws.store.get_job(job_ref))


def follow_events(ws: Workspace, job_ref: str, show: Callable, *, follow: bool = False,
                  poll_s: float = 0.5, sleep: Callable[[float], None] = time.sleep,
                  say: Callable[[str], None] | None = None, options: ConnectOptions | None = None,
                  connect: Connect = default_connect) -> None:
    """``events JOB [-f]``: ``show(event)`` for every event in order; with ``follow``, new ones as they come
    until the job has ended and its supervisor is gone (what it wrote while it ended included). ``say``: when the
    supervisor is gone, the UNSUPERVISED line goes there and the job is reconciled now and then (``Watchdog``)."""
    j = ws.store.get_job(job_ref)
    last = 0
    watchdog = Watchdog(ws, j.job_id, say, options=options, connect=connect) if follow and say else None
    while True:
        if watchdog is not None:
            watchdog()
        for e in ws.store.events(j.job_id, after_id=last):
            show(e)
            last = e.id
        if not follow:
            return
        current = ws.store.get_job(j.job_id)
        if current.terminal and not controller.live_supervisor(ws.root, current):
            for e in ws.store.events(j.job_id, after_id=last):
                show(e)
            return
        sleep(poll_s)


@dataclass(frozen=True)
class Logs:
    lines: list[str]                    # the selected lines of the controller's copy
    missing: dict[str, str]             # node -> why its own log could not complete the copy
    follow: Callable[[Callable[[str], None]], None]    # follow(echo): new lines (and events) until the job ends


def logs(ws: Workspace, job_ref: str, options: ConnectOptions, *, node: str | None = None, rank: int | None = None,
         attempt: int | None = None, tail: int | None = None) -> Logs:
    """``logs JOB``: the controller's copy of every rank's output, completed from the nodes' own logs for any
    stretch no supervisor followed; ``UserError`` for a node/rank/attempt the job never had."""
    from clusterctl.views import logs as logs_mod

    j = ws.store.get_job(job_ref)
    sel = logs_mod.Selection.check(ws.store, j, node=node, rank=rank, attempt=attempt)
    missing = {}
    if not controller.live_supervisor(ws.root, j) and ws.store.attempts(j.job_id):
        missing = controller.fill_logs(ws.root, ws.store, j.job_id, options, attempt=attempt)
    lines = logs_mod.read(logs_mod.path(ws.root, j.job_id), sel, tail)
    stopped = [e for e in ws.store.events(j.job_id) if e.kind == EventKind.STOP]
    note = logs_mod.stop_note(ws.store.get_job(j.job_id), lines, time.strftime(
        "%Y-%m-%d %H:%M:%S UTC", time.gmtime(stopped[-1].time)) if stopped else None)
    if note and tail != 0:
        lines = [*lines[1:], note] if tail is not None and len(lines) >= tail else [*lines, note]

    def follow(echo: Callable[[str], None]) -> None:
        controller.follow(ws.root, ws.store, j.job_id,
                          lambda ln: (sel.keeps(ln) or ln.startswith("clusterctl: ")) and echo(ln), from_start=False,
                          tick=Watchdog(ws, j.job_id, echo, options=options, fill=True))
    return Logs(list(lines), dict(missing), follow)


def node_rows(ws: Workspace, inventory: Inventory, now: float | None = None) -> list[dict]:
    """``nodes``: per host, ok or cordoned, jobs run, failures by class in the last 7 days, the last one."""
    now = time.time() if now is None else now
    return nodehealth.node_rows([h.name for h in inventory.hosts], ws.store.cordons(), ws.store.all_attempts(),
                                ws.store.node_events(), now)


def job_nodes(ws: Workspace, job_ref: str):
    """Where ``job_ref`` runs now (``oncall.jobnodes.JobNodes``: exec --job, shell, stacks)."""
    from clusterctl.oncall import jobnodes

    return jobnodes.load(ws.store, job_ref)


def doctor(state_dir: str | None, environ: Mapping[str, str], home: Path) -> list:
    """``doctor``: this machine as clusterctl needs it (``views.doctor.Finding`` per check)."""
    from clusterctl.store import paths
    from clusterctl.views import doctor as doctor_mod

    return doctor_mod.diagnose(paths.state_dir(state_dir), environ, home)


def state_root(state_dir: str | None) -> Path:
    """The state dir ``--state-dir`` (or its default) names."""
    from clusterctl.store import paths

    return paths.state_dir(state_dir)


def job_id_of(ws: Workspace, job_ref: str) -> str:
    """The id of the job ``job_ref`` names (an id, or the newest job of that name); ``JobNotFound`` else."""
    return ws.store.get_job(job_ref).job_id


def state_of(ws: Workspace, job_ref: str) -> JobState:
    return ws.store.get_job(job_ref).state


def supervise(state_dir: str | None, job_id: str, options: ConnectOptions, *, adopt: bool = False,
              echo: Callable[[str], None] = print) -> JobState:
    """The supervisor's body in this process (the ``_supervise`` command line of the release before; today's is
    ``python -m clusterctl.supervise``)."""
    return controller.supervise(state_root(state_dir), job_id, options, adopt=adopt, echo=echo)


# ---------------------------------------------------------------------------------------------- Slurm
@dataclass(frozen=True)
class SlurmRun:
    action: str                          # launch (the first run of this Slurm job) | resume | succeeded
    job_id: str | None = None
    name: str | None = None
    leaving: tuple[str, ...] = ()        # the last allocation's hosts this one lacks (resume --exclude)


def slurm_run(ws: Workspace, job_path: str, inventory: str | None, slurm_job_id: str, where: str,
              restart: int = 0) -> SlurmRun:
    """One run of the sbatch script: the first run of a Slurm job marks it ``launching`` and launches; a requeued
    one (its marker names the clusterctl job, or the job of that name recorded since it was marked) resumes that
    job on this allocation's hosts, or does nothing when it already SUCCEEDED. The hosts of the last run that this
    allocation lacks leave with it (``leaving``: ``resume --exclude``; ``srun`` cannot reach them now, so resume
    does not try to clean them): their Slurm guards (``slurm.guard``) removed the job from them when that run
    ended (a ``cleanup`` event each), or ``cleanup_pending`` says why not."""
    from clusterctl.config.spec import load_job
    from clusterctl.slurm import guard, sbatch

    path = sbatch.marker(ws.root, slurm_job_id)
    m = sbatch.read_marker(path)
    if m is None:          # the first run: marked before anything is launched (a requeue from here on finds it)
        sbatch.write_marker(path, sbatch.launching(load_job(job_path).name, ws.store.now()))
        return SlurmRun("launch")
    if m.job_id is None:   # a run was launching: the job of that name it recorded since, if it got that far
        since = sorted((j for j in ws.store.list_jobs(name=m.name) if j.created_at >= m.since),
                       key=lambda j: j.created_at)
        if not since:
            return SlurmRun("launch")
        sbatch.write_marker(path, since[0].job_id)
    ledger = Ledger(ws.store)
    j = ws.store.get_job(m.job_id or since[0].job_id)
    if j.state == JobState.SUCCEEDED:
        ledger.event(j.job_id, EventKind.SLURM_RUN, f"{where}: the job already SUCCEEDED; nothing to do")
        return SlurmRun("succeeded", j.job_id, j.name)
    hosts = load_context(job_path, inventory).hosts        # the hosts of this (new) allocation
    rec = ledger.record(j)
    names = {h.name for h in hosts}
    gone = tuple(h.name for h in rec.hosts if h.name not in names)
    # the old hosts stay in the record for one step (the last attempt's nodes are observed by name); resume
    # drops them (--exclude) and relaunches on this allocation's hosts
    ledger.record_changed(j.job_id, rec.replace(hosts=tuple(hosts) + tuple(h for h in rec.hosts if h.name in gone)))
    ledger.event(j.job_id, EventKind.SLURM_RUN, f"{where}: requeued run, resuming on "
                                                f"{', '.join(h.name for h in hosts)}"
                                                + (f" (leaving {', '.join(gone)})" if gone else ""))
    for node in gone:
        report = guard.read_report(ws.root, slurm_job_id, node)
        if report is not None and (report.get("restart") != restart - 1 or report.get("job_id") != j.job_id):
            report = None                        # another run's, or from before the job was launched
        if report is not None and report.get("ok"):
            ledger.event(j.job_id, EventKind.CLEANUP, f"{node} left the allocation: its Slurm guard removed the "
                                                      f"job's processes there when the last run ended", node=node)
        else:
            why = (f"its Slurm guard could not remove them: {report.get('detail')}" if report is not None else
                   "its Slurm guard did not report (the node went down with the allocation?)")
            ledger.event(j.job_id, EventKind.CLEANUP_PENDING, f"could not clean up {node}: it left the allocation "
                                                              f"and {why}", node=node)
    slurm_guard_plan(ws, slurm_job_id, j.job_id)
    return SlurmRun("resume", j.job_id, j.name, gone)


def slurm_guard_plan(ws: Workspace, slurm_job_id: str, job_id: str) -> None:
    """What each node's Slurm guard runs when this allocation ends (``slurm.guard``): the job's removal commands,
    as ``stop`` runs them (its containers or bare runners, and its zygotes)."""
    from clusterctl.launch import runtimes
    from clusterctl.slurm import guard

    commands = {}
    for h in Ledger(ws.store).record(ws.store.get_job(job_id)).hosts:
        rt = runtimes.get(h.runtime)
        commands[h.name] = [rt.remove_job_argv(job_id, jobs_root=runtimes.jobs_root_for(runtimes.DEFAULT_JOBS_ROOT,
                                                                                       h.name)),
                            rt.zygote_remove_argv(job_id)]
    guard.write_plan(ws.root, slurm_job_id, job_id, commands)


def slurm_launched(ws: Workspace, slurm_job_id: str, launched: "Launched", where: str) -> None:
    """The first run launched ``launched``: the marker a requeued run finds, and the ``slurm_run`` event."""
    from clusterctl.slurm import sbatch

    sbatch.write_marker(sbatch.marker(ws.root, slurm_job_id), launched.job_id)
    slurm_guard_plan(ws, slurm_job_id, launched.job_id)
    Ledger(ws.store).event(launched.job_id, EventKind.SLURM_RUN, f"{where}: launched on {', '.join(launched.nodes)}")


def watch_status(ws: Workspace, job_ref: str, options: ConnectOptions, on_view: Callable[[dict], None], *,
                 interval_s: float = 2.0, sleep: Callable[[float], None] = time.sleep) -> dict:
    """``status JOB --watch``: ``on_view(view)`` every ``interval_s`` until the job has ended; its last view.
    Each look is a ``status`` (an active job nobody supervises is reconciled: the view says it is unsupervised,
    and it ends when its nodes ended)."""
    from clusterctl.views import status as status_mod

    job_id = job_id_of(ws, job_ref)
    while True:
        v = status(ws, job_id, options)
        on_view(v)
        if v["state"] in status_mod.ENDED:
            return v
        sleep(interval_s)


# ---------------------------------------------------------------------------------------------- top (issue 37)
def top(ws: Workspace, job_ref: str, now: float | None = None) -> dict:
    """``top JOB``: the rank view the job's running supervisor writes each round (``<job dir>/ranks.json``), as
    ``{"job_id", "state", "attempt", "supervised", "doc", "stale"}``; never a connection of its own. A job that is
    not running, or that nobody supervises, is an error naming what to run instead (exit 1)."""
    from clusterctl.store import paths
    from clusterctl.supervise import jobdir
    from clusterctl.views import top as top_view

    now = time.time() if now is None else now
    job = ws.store.get_job(job_ref)
    if job.terminal:
        raise ClusterctlError(f"job {job.job_id} is {job.state.value}: no rank runs (`clusterctl status "
                              f"{job.name}` says how it ended)")
    if not controller.supervision(ws.root, job, now)["supervised"]:
        raise ClusterctlError(f"job {job.job_id} has no live supervisor: `top` shows what it sees of the ranks "
                              f"(`clusterctl status {job.name}`; `clusterctl resume {job.name}` supervises it again)")
    doc = jobdir.read_ranks(paths.job_dir(ws.root, job.job_id))
    if doc is not None and doc.get("attempt") != job.attempt:
        doc = None                        # an earlier attempt's view
    return {"job_id": job.job_id, "state": job.state.value, "attempt": job.attempt, "supervised": True,
            "doc": doc or {"ranks": [], "stragglers": []}, "stale": top_view.stale(doc, now)}


def watch_top(ws: Workspace, job_ref: str, on_view: Callable[[dict], None], *, interval_s: float = 2.0,
              sleep: Callable[[float], None] = time.sleep) -> dict:
    """``top JOB`` refreshing: ``on_view(view)`` every ``interval_s`` until the job ends (its end: ``top``'s
    error, raised)."""
    job_id = job_id_of(ws, job_ref)
    while True:
        on_view(top(ws, job_id))
        sleep(interval_s)
