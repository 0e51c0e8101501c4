"""A job's life (``cli.lifecycle``): ``launch`` (and ``dry_run``: ``launch --dry-run``, ``validate``),
attaching to it, ``stop``, ``resume``, ``forget``, and ``supervise`` (the ``_supervise`` command of the release
before).

Each takes a request (plain values), its dependencies (``connect``, ``spawn``, a progress callback) and returns an
outcome value; none prints or exits (``cli/`` maps flags to a request and an outcome to text and an exit code). The
"already active" rule is ``Store.active_job`` (the same rule ``create_job`` applies atomically); the rest of the
"before we start" policy is ``usecases.context``. ``supervise.controller`` keeps the mechanics these use cases
drive: the state dir, the detached supervisor process and its liveness, the log copy, and the ``ClusterOps`` built
from a job record."""
from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence, Union

from clusterctl.config import inventory as inventory_mod
from clusterctl.config.inventory import Host
from clusterctl.config.spec import JobSpec
from clusterctl.errors import ClusterctlError, InputError, UserError
from clusterctl.launch.plan import LaunchPlan, build_plan
from clusterctl.model.events import EventKind
from clusterctl.model.record import JobRecord
from clusterctl.model.verdicts import NodeError
from clusterctl.store.ledger import Ledger
from clusterctl.store.state import JobState, Store
from clusterctl.supervise import controller
from clusterctl.transport import ConnectOptions
from clusterctl.transport import connect as default_connect
from clusterctl.usecases.base import Connect, Progress, Spawn, Workspace, state_root
from clusterctl.usecases.context import (
    JobContext,
    check_environment,
    check_key_files,
    launch_problems,
    load_context,
    quick_preflight,
    verify_host_keys,
)
from clusterctl.usecases.views import Watchdog
from clusterctl.views import nodes as nodehealth


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


@dataclass(frozen=True)
class Ended:
    state: JobState
    view: dict                                   # status.job_view of the ended job


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
    state: JobState | None = None                # the job's state when resume returned


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
        return Resumed(action, message, pid, job_id, job.name, tuple(excluded), store.get_job(job_id).state)

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
            found = reconcile(store, job_id, ops, deadline_s=options.connect_timeout + 5, root=root,
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


def supervise(state_dir: str | None, job_id: str, options: ConnectOptions, *, adopt: bool = False,
              echo: Callable[[str], None] = print) -> JobState:
    """The supervisor's body in this process (the ``_supervise`` command line of the release before; today's is
    ``python -m clusterctl.supervise``)."""
    return controller.supervise(state_root(state_dir), job_id, options, adopt=adopt, echo=echo)
