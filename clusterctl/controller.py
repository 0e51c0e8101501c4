"""The controller side of a job: create it, run its supervisor (in a background process), follow it, stop it.

``launch`` records the job and starts ``clusterctl _supervise JOB_ID`` as a detached process (its own session,
log and pid file in the state dir), so training never depends on the terminal: an attached ``launch`` only
follows the job's log copy and state, and Ctrl-C detaches.
"""
from __future__ import annotations

import difflib
import os
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from clusterctl import inventory as inventory_mod
from clusterctl import nodehealth, paths
from clusterctl import record as record_mod
from clusterctl import yamlfile
from clusterctl.errors import InputError, UserError
from clusterctl.yamlfile import line_of
from clusterctl.inventory import Host, Inventory
from clusterctl.launcher import ClusterOps, LogSink
from clusterctl.plan import build_plan, read_secrets
from clusterctl.reconcile import Reconciled, reconcile
from clusterctl.record import JobRecord
from clusterctl.spec import JobSpec, load_job
from clusterctl.state import JobState, Store, pid_alive, redact
from clusterctl.supervisor import Policy, Supervisor
from clusterctl.transport import ConnectOptions
from clusterctl.transport.ssh import check_key_files


@dataclass(frozen=True)
class JobContext:
    spec: JobSpec
    inventory: Inventory
    hosts: list[Host]
    excluded: tuple[tuple[str, str], ...] = ()     # (cordoned host, reason), left out of hosts
    recorded: tuple[Host, ...] = ()                # the job's hosts with the cordoned ones (usable once uncordoned)


def load_context(job_path: str, inventory_path: str | None, cordons: Mapping[str, Any] | None = None) -> JobContext:
    """The job and the hosts it will use, checked against each other (errors at the job file's line).
    ``cordons``: host -> cordon (``Store.cordons()``); those hosts are left out (``excluded``)."""
    spec = load_job(job_path)
    inv = inventory_mod.load(inventory_path)
    data = yamlfile.load_yaml_with_lines(job_path)

    def bad(key: str, message: str) -> InputError:
        return InputError(job_path, line_of(data, key), message, key=key)

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
    chosen = hosts[: spec.max_nodes] if spec.hosts is None else hosts
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
    return JobContext(spec, inv, chosen, tuple(excluded), recorded)


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


def check_environment(job_path: str, spec: JobSpec, environ: Mapping[str, str]) -> None:
    """Every ``secret_env`` name and ``notify[].webhook_env`` set in clusterctl's environment, else an error at its
    line (a launch needs them; ``--dry-run`` does not: it shows ***)."""
    data = yamlfile.load_yaml_with_lines(job_path)
    for i, name in enumerate(spec.secret_env):
        if name not in environ:
            raise InputError(job_path, line_of(data.get("secret_env"), i),
                             f"{name} is not set in clusterctl's environment: `export {name}=...` before the "
                             "launch (the value is sent to the nodes on stdin, never printed or stored)",
                             key=f"secret_env[{i}]")
    for i, t in enumerate(spec.notify):
        if t.webhook_env is not None and not environ.get(t.webhook_env):
            entry = data["notify"][i]
            raise InputError(job_path, line_of(entry, "webhook_env"),
                             f"{t.webhook_env} is not set in clusterctl's environment: `export "
                             f"{t.webhook_env}=https://...` before the launch", key=f"notify[{i}].webhook_env")


def dry_run_plan(ctx: JobContext, interfaces: dict[str, str] | None = None):
    hosts = ctx.hosts[: ctx.spec.max_nodes]
    return build_plan(ctx.spec, hosts, job_id=f"{ctx.spec.name}-DRYRUN", attempt=1, interfaces=interfaces,
                      spares=[h.name for h in ctx.hosts[ctx.spec.max_nodes:]], excluded=ctx.excluded)


def open_store(state_dir: str | None, secrets: Sequence[str] = ()) -> tuple[Path, Store]:
    root = paths.ensure_state_dir(paths.state_dir(state_dir))
    return root, Store(paths.db_path(root), secrets=secrets)


HEARTBEAT_S = 1.0           # the supervisor's heartbeat period (status: unsupervised after STALE_S without one)
STALE_S = 10.0


def record_job(store: Store, ctx: JobContext, job_path: str, inventory_path: str | None,
               interfaces: dict[str, str], gpu_flags: dict[str, str] | None = None) -> str:
    rec = JobRecord(spec=ctx.spec, source=os.path.abspath(job_path), hosts=ctx.recorded or tuple(ctx.hosts),
                    interfaces=dict(interfaces), gpu_flags=dict(gpu_flags or {}))
    inv = ctx.inventory.source
    return store.create_job(ctx.spec.name, rec.to_json(),
                            None if inv == inventory_mod.EMBEDDED_DEFAULT else os.path.abspath(inv),
                            os.path.abspath(job_path))


def spawn_supervisor(root: Path, job_id: str, *, accept_new: bool, adopt: bool = False) -> int:
    """Start ``clusterctl _supervise`` detached: own session, stdin closed, output to its log file."""
    log = paths.supervisor_log_path(root, job_id)
    paths.ensure_job_dir(root, job_id)
    fd = paths.open_private(log)
    argv = [sys.executable, "-m", "clusterctl.cli", "--state-dir", str(root)]
    # never --accept-new-host-keys (issue 11): launch/resume recorded the keys before; a reconnect must not accept
    argv += ["_supervise", job_id] + (["--adopt"] if adopt else [])
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
                         close_fds=True)
    os.close(fd)
    pid_fd = paths.open_private(paths.supervisor_pid_path(root, job_id), append=False)
    os.write(pid_fd, f"{p.pid}\n".encode())
    os.close(pid_fd)
    return p.pid


def build_ops(root: Path, store: Store, job_id: str, options: ConnectOptions,
              *, starts: bool = True) -> tuple[ClusterOps, Policy, list[str]]:
    """The job's ClusterOps. ``starts``: it may start attempts, so the secret_env values must be present."""
    rec = record_mod.load(store, store.get_job(job_id))
    spec = rec.spec
    hosts = rec.hosts_by_name
    check_key_files(list(hosts.values()))
    secrets = read_secrets(spec.secret_env, os.environ) if starts else {}
    store.add_secrets(secrets.values())
    sink = LogSink(paths.job_dir(root, job_id) / "output.log")
    ops = ClusterOps(spec=spec, hosts=hosts, job_id=job_id, store=store, sink=sink, options=options,
                     secrets=secrets, interfaces=dict(rec.interfaces), gpu_flags=dict(rec.gpu_flags),
                     probe_timeout_s=max(3.0, spec.supervisor.probe_interval_s * 2),
                     heartbeat_timeout_s=max(2.0, spec.supervisor.probe_interval_s * 2),
                     checkpoint_override=rec.checkpoint_override)
    s, r = spec.supervisor, spec.restarts
    policy = Policy(min_nodes=spec.min_nodes, max_nodes=spec.max_nodes, max_failures=r.max_failures,
                    max_node_failures=r.max_node_failures, backoff_s=r.backoff_s, backoff_max_s=r.backoff_max_s,
                    window_s=r.window_s, progress_after_s=r.progress_after_s,
                    probe_interval_s=s.probe_interval_s, probe_failures=s.probe_failures,
                    hang_timeout_s=s.hang_timeout_s, wait_for_nodes_s=float(spec.rendezvous.join_timeout),
                    checkpoint_dir=spec.checkpoint.dir, cordon_after=s.cordon_after)
    return ops, policy, rec.host_names


def _heartbeat(store: Store, job_id: str, stop: threading.Event) -> None:
    pid = os.getpid()
    while not stop.wait(HEARTBEAT_S):
        try:
            store.heartbeat(job_id, pid)
        except Exception:  # noqa: BLE001 - a busy DB now and then must not end the heartbeat
            pass


def supervise(root: Path, job_id: str, options: ConnectOptions, *, adopt: bool = False,
              echo: Callable[[str], None] = print) -> JobState:
    """The body of ``clusterctl _supervise``: claim the job, beat, run the loop, release."""
    store = Store(paths.db_path(root))
    if not store.claim_supervisor(job_id, os.getpid()):
        raise UserError(f"job {job_id} already has a live supervisor (pid {store.get_job(job_id).supervisor_pid})")
    beating = threading.Event()
    threading.Thread(target=_heartbeat, args=(store, job_id, beating), daemon=True, name="heartbeat").start()
    ops, policy, nodes = build_ops(root, store, job_id, options)
    from clusterctl import notify

    notifier = notify.for_job(store, job_id, ops.spec)    # webhooks/commands on state changes, on its own thread
    try:
        sup = Supervisor(job_id, store, ops, policy, nodes, wait=ops.wait_for_change,
                         on_event=lambda m: echo(f"clusterctl: {redact(m, ops.secrets.values())}"))
        job = store.get_job(job_id)
        attempt = job.attempt if adopt and job.attempt else None
        if attempt:
            last = store.attempts(job_id)[-1]
            ops.adopt(attempt, list(last.nodes), last.rdzv_host)
            ops.attach(attempt)
        return sup.run(adopt_attempt=attempt)
    finally:
        beating.set()
        ops.close()
        notifier.close()
        store.release_supervisor(job_id, os.getpid())


def follow(root: Path, store: Store, job_id: str, echo: Callable[[str], None], *, from_start: bool = True,
           poll_s: float = 0.3, stop_when_done: bool = True) -> JobState:
    """Print the job's log copy and its events as they grow (``from_start=False``: only what comes after this
    call); return the job's state once it is terminal."""
    path = paths.job_dir(root, job_id) / "output.log"
    offset = 0 if from_start else (path.stat().st_size if path.exists() else 0)
    seen = store.events(job_id)
    printed_events = 0 if from_start or not seen else seen[-1].id
    while True:
        if path.exists():
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            offset += len(complete)
            for line in complete.decode(errors="replace").splitlines():
                echo(line)
        events = store.events(job_id, after_id=printed_events)
        for e in events:
            printed_events = e.id
            echo(f"clusterctl: {e.message}")
        job = store.get_job(job_id)
        if stop_when_done and job.terminal:
            sup = job.supervisor_pid
            if not sup or not pid_alive(sup):
                return job.state
        time.sleep(poll_s)


def stop_job(root: Path, store: Store, job_id: str, options: ConnectOptions, grace_s: float = 10.0) -> dict[str, str]:
    """SIGTERM to torchrun everywhere, kill after the grace period, remove exactly this job's containers; the
    nodes' end is recorded (``stopped``, or how they had ended before)."""
    job = store.get_job(job_id)
    if not job.terminal:
        store.set_state(job_id, JobState.STOPPED, "stopped by user")
        store.add_event(job_id, "stop", "stop requested by user")
    ops, _, nodes = build_ops(root, store, job_id, options, starts=False)   # stopping needs no secrets
    try:
        attempts = store.attempts(job_id)
        if attempts:
            a = attempts[-1]
            ops.adopt(a.attempt, list(a.nodes), a.rdzv_host)
        errors = ops.stop(None, nodes, grace_s=grace_s)
        if attempts:
            a = attempts[-1]
            ended = {n.node: n.state for n in store.nodes(job_id, a.attempt)}
            for node in a.nodes:
                if node not in errors and ended.get(node) not in ("exited", "killed", "gone"):
                    store.set_node(job_id, a.attempt, node, state="stopped")
            if a.ended_at is None:
                store.end_attempt(job_id, a.attempt, "stopped")
        return errors
    finally:
        ops.close()


def live_supervisor(root: Path, job) -> int | None:
    """The pid of a live supervisor of ``job`` (from the DB claim or the pid file of one being started)."""
    pid_file = paths.supervisor_pid_path(root, job.job_id)
    candidates = [job.supervisor_pid]
    if pid_file.exists():
        try:
            candidates.append(int(pid_file.read_text().strip()))
        except ValueError:
            pass
    for pid in candidates:
        if pid and pid_alive(pid) and _is_supervisor(pid, job.job_id):
            return pid
    return None


def _is_supervisor(pid: int, job_id: str) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True   # no /proc (macOS): trust the pid
    return b"_supervise" in cmd and job_id.encode() in cmd


def verify_host_keys(hosts: Sequence[Host], options: ConnectOptions) -> None:
    """Connect to every host once. A changed/unknown host key or a refused login is an error now (with the
    transport's message: fingerprints, known_hosts file:line, the fix), not a node the supervisor waits for.
    Unreachable hosts are left to the supervisor (they may come back)."""
    from clusterctl.errors import AuthError, ClusterctlError, HostKeyError
    from clusterctl.transport import connect, fan_out

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


def supervision(root: Path, job, now: float | None = None) -> dict:
    """Is clusterctl's own supervisor of ``job`` alive? ``{"pid", "alive", "last_seen", "supervised"}``.
    An active job is supervised when a live process is its supervisor and its heartbeat is at most ``STALE_S``
    old (a supervisor still starting up has a pid file but no heartbeat yet: it counts as alive)."""
    now = time.time() if now is None else now
    live = live_supervisor(root, job)
    seen = job.supervisor_seen_at
    fresh = seen is None or now - seen <= STALE_S
    alive = bool(live) and (fresh or job.supervisor_pid != live)
    return {"pid": live or job.supervisor_pid, "alive": alive, "last_seen": seen,
            "supervised": alive if not job.terminal else False}


def reconcile_job(root: Path, store: Store, job_id: str, options: ConnectOptions) -> Reconciled | None:
    """``status JOB`` of an active job whose supervisor is gone: ask the nodes (bounded by the connect timeout
    + 5 s) and record what they say."""
    ops, _, _ = build_ops(root, store, job_id, options, starts=False)
    try:
        return reconcile(store, job_id, ops, deadline_s=options.connect_timeout + 5)
    finally:
        ops.close()


def complete_logs(ops: ClusterOps, store: Store, job_id: str, attempt: int | None = None,
                  deadline_s: float = 30.0) -> dict[str, str]:
    """Copy into the controller's log whatever the nodes printed that it lacks (a stretch no supervisor
    followed). Only lines after those already copied, so nothing is held twice. Returns {node: error}."""
    attempts = [a for a in store.attempts(job_id) if attempt is None or a.attempt == attempt]
    if not attempts:
        return {}
    a = attempts[-1]

    def fetch(host) -> None:
        rt = ops._runtime(host.name)
        argv = rt.logs_argv(ops._ref(host.name, a.attempt))
        r = ops._run(host.name, ["sh", "-c", '"$@" 2>&1', "clusterctl-logs", *argv], timeout=deadline_s)
        if not r.ok and not r.stdout:
            raise RuntimeError(r.stderr.strip()[-200:] or f"exit code {r.exit_code}")
        ops.sink.begin(host.name, a.attempt)
        ops.sink.feed(host.name, r.stdout.encode() if isinstance(r.stdout, str) else r.stdout)

    from clusterctl.transport import fan_out

    results = fan_out([ops.hosts[n] for n in a.nodes if n in ops.hosts], fetch, host_timeout=deadline_s + 5)
    return {r.host.name: str(r.error) for r in results if r.error is not None}


def fill_logs(root: Path, store: Store, job_id: str, options: ConnectOptions,
              attempt: int | None = None) -> dict[str, str]:
    """``logs`` of a job no supervisor follows: complete the controller's copy from the nodes first."""
    ops, _, _ = build_ops(root, store, job_id, options, starts=False)
    try:
        return complete_logs(ops, store, job_id, attempt, deadline_s=options.connect_timeout + 10)
    finally:
        ops.close()


@dataclass(frozen=True)
class Resumed:
    action: str          # already_supervised | succeeded | reattached | relaunched
    message: str         # one line for the user
    pid: int | None = None


def resume(root: Path, store: Store, job_id: str, options: ConnectOptions, *, accept_new: bool,
           exclude: Sequence[str] = (), checkpoint: str | None = None,
           wait: Callable[[float], None] = time.sleep) -> Resumed:
    """Bring a job back. Idempotent: with a live supervisor it only reports it. An active job whose nodes all
    still run is re-attached; one whose attempt finished well while nobody watched becomes SUCCEEDED; otherwise
    the cause is recorded, the last attempt cleaned up, and the job relaunched from its latest valid checkpoint."""
    job = store.get_job(job_id)
    pid = live_supervisor(root, job)
    if pid:
        return Resumed("already_supervised", f"already supervised (supervisor pid {pid}); nothing to do", pid)
    if job.state == JobState.SUCCEEDED:
        return Resumed("succeeded", "the job already SUCCEEDED; nothing relaunched (launch it again to start over)")
    rec = record_mod.load(store, job)
    unknown = [h for h in exclude if h not in rec.host_names]
    if unknown:
        raise UserError(f"--exclude: {', '.join(unknown)} not among the job's hosts {', '.join(rec.host_names)}")
    attempts = store.attempts(job_id)
    ops, _, nodes = build_ops(root, store, job_id, options)
    verify_host_keys([ops.hosts[n] for n in nodes if n not in exclude], options)
    try:
        if attempts and not job.terminal:
            a = attempts[-1]
            found = reconcile(store, job_id, ops, deadline_s=options.connect_timeout + 5)
            if found is not None and found.state == JobState.SUCCEEDED:
                complete_logs(ops, store, job_id, a.attempt)
                return Resumed("succeeded", f"attempt {a.attempt} had finished with exit code 0 on every node while "
                                            "unsupervised: the job is SUCCEEDED, nothing relaunched")
            if found is not None and found.decision is None and not exclude and not checkpoint:
                # a second look a moment later: a container whose processes were just killed can still be listed
                # as running for a second, and re-attaching to a dead attempt would wait for nothing
                wait(2.0)
                again = ops.observe(a.attempt, list(a.nodes), watch=False, deadline_s=options.connect_timeout + 5)
                if again and all(o.state == "running" for o in again):
                    pid = spawn_supervisor(root, job_id, accept_new=accept_new, adopt=True)
                    return Resumed("reattached", f"attempt {a.attempt} still runs on {', '.join(a.nodes)}: "
                                                 f"re-attached (supervisor pid {pid})", pid)
        if attempts:
            complete_logs(ops, store, job_id, attempts[-1].attempt)
        errors = ops.stop(None, nodes)
        for node, msg in errors.items():
            store.add_event(job_id, "cleanup_pending", f"could not clean up {node}: {msg}", node=node)
        keep = [n for n in nodes if n not in exclude]
        latest = ops.latest_checkpoint([n for n in keep if n not in errors]) if not checkpoint else None
    finally:
        ops.close()
    rec = rec.replace(hosts=tuple(h for h in rec.hosts if h.name not in exclude), checkpoint_override=checkpoint)
    record_mod.save(store, job_id, rec)
    store.update_job(job_id, failures_used=0, node_failures_used=0)
    store.set_state(job_id, JobState.RECOVERING, "resumed by user")
    start = (f"checkpoint {checkpoint}" if checkpoint else
             f"checkpoint step {latest[1]} ({latest[0]})" if latest and latest[0] else
             "the start (no valid checkpoint)" if latest else "the latest valid checkpoint")
    store.add_event(job_id, "resume", f"resumed by user from {start}"
                    + (f", excluding {', '.join(exclude)}" if exclude else ""))
    pid = spawn_supervisor(root, job_id, accept_new=accept_new)
    return Resumed("relaunched", f"relaunching attempt {store.get_job(job_id).attempt + 1} from {start}"
                   + (f" without {', '.join(exclude)}" if exclude else "") + f" (supervisor pid {pid})", pid)
