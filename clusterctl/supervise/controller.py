"""The mechanics under the job use cases (``usecases/``): the state dir, the detached supervisor process (spawn,
its body, liveness), following a job's log copy, and the ``ClusterOps`` built from a job record.

``usecases.lifecycle.launch`` records the job and starts ``python -m clusterctl.supervise JOB_ID`` here as a detached
process (its own session, log and pid file in the state dir), so training never depends on the terminal: an attached
``launch`` only follows the job's log copy and state, and Ctrl-C detaches.
"""
from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from clusterctl.config.inventory import Host
from clusterctl.errors import UserError
from clusterctl.launch.plan import read_secrets
from clusterctl.store import paths
from clusterctl.store.ledger import Ledger
from clusterctl.store.state import (
    ACTIVE_STATES,
    SUPERVISOR_STALE_S,
    InvalidTransition,
    JobState,
    Store,
    pid_alive,
    redact,
    this_host,
)
from clusterctl.store.logcopy import LogSink
from clusterctl.supervise.cluster_ops import ClusterOps
from clusterctl.supervise.reconcile import Reconciled, reconcile, unsupervised_span
from clusterctl.supervise.supervisor import Policy, Supervisor
from clusterctl.transport import ConnectOptions, Transport, connect


def open_store(state_dir: str | None, secrets: Sequence[str] = ()) -> tuple[Path, Store]:
    root = paths.ensure_state_dir(paths.state_dir(state_dir))
    return root, Store(paths.db_path(root), secrets=secrets)


# the supervisor's heartbeat period: status calls a job unsupervised after STALE_S without one (3 beats). Each beat is
# a wake and a SQLite write: at 1 s it was 0.5 ms of CPU a second, a sixth of a 3-node supervisor's (issue 15).
HEARTBEAT_S = 3.0
STALE_S = SUPERVISOR_STALE_S


def spawn_supervisor(root: Path, job_id: str, *, accept_new: bool, adopt: bool = False) -> int:
    """Start ``python -m clusterctl.supervise`` detached: own session, stdin closed, output to its log file."""
    log = paths.supervisor_log_path(root, job_id)
    paths.ensure_job_dir(root, job_id)
    fd = paths.open_private(log)
    argv = [sys.executable, "-m", "clusterctl.supervise", "--state-dir", str(root)]
    # never --accept-new-host-keys (issue 11): launch/resume recorded the keys before; a reconnect must not accept
    argv += [job_id] + (["--adopt"] if adopt else [])
    p = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=fd, stderr=fd, start_new_session=True,
                         close_fds=True)
    os.close(fd)
    pid_fd = paths.open_private(paths.supervisor_pid_path(root, job_id), append=False)
    os.write(pid_fd, f"{p.pid}\n".encode())
    os.close(pid_fd)
    return p.pid


def build_ops(root: Path, store: Store, job_id: str, options: ConnectOptions, *, starts: bool = True,
              connect: Callable[[Host, ConnectOptions], Transport] = connect) -> tuple[ClusterOps, Policy, list[str]]:
    """The job's ClusterOps. ``starts``: it may start attempts, so the secret_env values must be present."""
    rec = Ledger(store).record(store.get_job(job_id))
    spec = rec.spec
    hosts = rec.hosts_by_name
    from clusterctl.transport.ssh import check_key_files  # paramiko: imported when a job is supervised, not
                                                           # by every `status` (an on-call look stays quick)
    check_key_files(list(hosts.values()))
    secrets = read_secrets(spec.secret_env, os.environ) if starts else {}
    # what a node prints is redacted before the store keeps it: without a start (status), with the values this
    # shell has (reconcile_job withholds the tails when some are missing)
    store.add_secrets(secrets.values() if starts else [os.environ[n] for n in spec.secret_env if n in os.environ])
    sink = LogSink(paths.output_log(root, job_id))
    ops = ClusterOps(spec=spec, hosts=hosts, job_id=job_id, store=store, sink=sink, options=options,
                     secrets=secrets, interfaces=dict(rec.interfaces), gpu_flags=dict(rec.gpu_flags),
                     probe_timeout_s=max(3.0, spec.supervisor.probe_interval_s * 2),
                     heartbeat_timeout_s=max(2.0, spec.supervisor.probe_interval_s * 2),
                     checkpoint_override=rec.checkpoint_override, connect=connect)
    s, r = spec.supervisor, spec.restarts
    policy = Policy(min_nodes=spec.min_nodes, max_nodes=spec.max_nodes, max_failures=r.max_failures,
                    max_node_failures=r.max_node_failures, backoff_s=r.backoff_s, backoff_max_s=r.backoff_max_s,
                    window_s=r.window_s, progress_after_s=r.progress_after_s,
                    probe_interval_s=s.probe_interval_s, probe_failures=s.probe_failures,
                    hang_timeout_s=s.hang_timeout_s, first_progress_timeout_s=s.first_progress_timeout_s,
                    wait_for_nodes_s=float(spec.rendezvous.join_timeout),
                    checkpoint_dir=spec.checkpoint.dir, cordon_after=s.cordon_after, slurm_drain=s.slurm_drain,
                    stuck_timeout_s=s.stuck_timeout_s, stragglers=s.stragglers)
    return ops, policy, rec.host_names


def _heartbeat(store: Store, job_id: str, stop: threading.Event) -> None:
    pid = os.getpid()
    while not stop.wait(HEARTBEAT_S):
        try:
            Ledger(store).supervisor_beat(job_id, pid)
        except Exception:  # noqa: BLE001 - a busy DB now and then must not end the heartbeat
            pass


def supervise(root: Path, job_id: str, options: ConnectOptions, *, adopt: bool = False,
              echo: Callable[[str], None] = print) -> JobState:
    """The supervisor's body (``python -m clusterctl.supervise``): claim the job, beat, run the loop, release."""
    store = Store(paths.db_path(root))
    ledger = Ledger(store)
    before = store.get_job(job_id)          # the last supervisor's claim: since when nobody supervised the job
    if not ledger.supervisor_claimed(job_id, os.getpid(), is_live=lambda pid: is_live_supervisor(pid, job_id)):
        raise UserError(f"job {job_id} already has a live supervisor (pid {store.get_job(job_id).supervisor_pid})")
    beating = threading.Event()
    threading.Thread(target=_heartbeat, args=(store, job_id, beating), daemon=True, name="heartbeat").start()
    ops, policy, nodes = build_ops(root, store, job_id, options)
    from clusterctl.supervise import jobdir, notify

    notifier = notify.for_job(store, job_id, ops.spec)    # webhooks/commands on state changes, on its own thread
    # the job dir's events.jsonl (after each state change), steps.jsonl (the ranks' `step N` lines), goodput.json
    mirror = jobdir.EventMirror(store, job_id, paths.job_dir(root, job_id) / jobdir.EVENTS)
    store.on_state = mirror.chain(store.on_state)
    tap = jobdir.StepTap(paths.job_dir(root, job_id) / jobdir.STEPS, store.get_job(job_id).attempt)
    if ops.sink is not None:
        ops.sink.echo = tap
        ops.first_step = tap.first_step     # an attempt's start-up ends at its first step (ClusterOps.startup)
    try:
        sup = Supervisor(job_id, store, ops, policy, nodes, wait=ops.wait_for_change, sleep=ops.sleep_unless_stopped,
                         on_event=lambda m: echo(f"clusterctl: {redact(m, ops.secrets.values())}"),
                         job_dir=paths.job_dir(root, job_id))
        job = store.get_job(job_id)
        attempt = job.attempt if adopt and job.attempt else None
        if attempt:
            last = store.attempts(job_id)[-1]
            ops.adopt(attempt, list(last.nodes), last.rdzv_host)
            ops.attach(attempt)
        return sup.run(adopt_attempt=attempt, adopt_note=unsupervised_span(before, time.time()) if attempt else "")
    except Exception as e:  # noqa: BLE001 - the supervisor never dies silently: the job ends, loudly
        return _end_on_error(store, ops, notifier, job_id, nodes, e)
    finally:
        beating.set()
        ops.close()
        notifier.close()
        tap.close()
        jobdir.keep(store, root, job_id, mirror, time.time())
        try:
            ledger.supervisor_released(job_id, os.getpid())
        except Exception:  # noqa: BLE001 - a full disk: the pid dies with us, `status` sees it gone
            pass


def _end_on_error(store: Store, ops, notifier, job_id: str, nodes, error: Exception) -> JobState:
    """The supervisor cannot go on (a state database that refuses writes, a bug): its traceback goes to its log,
    the job's processes are stopped (nothing runs unsupervised), the job ends FAILED with an ``end`` event when
    the database takes it, and the ``failed`` notification goes out either way."""
    import traceback

    traceback.print_exception(type(error), error, error.__traceback__, file=sys.stderr)
    reason = (f"the supervisor failed: {error.__class__.__name__}: {error}; the job's processes were stopped "
              f"(fix it, then `clusterctl resume {job_id}`)")
    try:
        ops.stop(None, list(nodes))
    except Exception as e:  # noqa: BLE001 - best effort: the reason says what happened
        print(f"clusterctl: could not stop the job's processes: {e}", file=sys.stderr, flush=True)
    try:
        Ledger(store).job_ended(job_id, JobState.FAILED, reason, expect=ACTIVE_STATES)
    except InvalidTransition:
        return store.get_job(job_id).state
    except Exception as e:  # noqa: BLE001 - the database is the trouble: notify without it
        print(f"clusterctl: could not record the job's end: {e}", file=sys.stderr, flush=True)
        try:
            notifier.on_state(job_id, store.get_job(job_id).state, JobState.FAILED)
        except Exception:  # noqa: BLE001
            pass
        return JobState.FAILED
    return JobState.FAILED


LOG_LAG_S = 1.5      # how far the controller's log copy may lag a node (polled followers: once a second)


def follow(root: Path, store: Store, job_id: str, echo: Callable[[str], None], *, from_start: bool = True,
           poll_s: float = 0.3, stop_when_done: bool = True, tick: Callable[[], None] | None = None) -> JobState:
    """Print the job's log copy and its events as they grow (``from_start=False``: only what comes after this
    call); return the job's state once it is terminal. ``tick()`` every round, first (``usecases.views.Watchdog``:
    when the supervisor is gone, it says so and completes the copy from the nodes)."""
    path = paths.output_log(root, job_id)
    offset = 0 if from_start else (path.stat().st_size if path.exists() else 0)
    seen = store.events(job_id)
    printed_events = 0 if from_start or not seen else seen[-1].id
    while True:
        if tick is not None:
            tick()
        if path.exists():
            if path.stat().st_size < offset:     # the copy was rotated (logcopy.MAX_LOG_BYTES): a new file
                offset = 0
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            complete = data[: data.rfind(b"\n") + 1]
            offset += len(complete)
            for line in complete.decode(errors="replace").splitlines():
                echo(line)
        job = store.get_job(job_id)
        done = stop_when_done and job.terminal and not live_supervisor(root, job)
        # an event waits until the log copy has caught up with it (the followers read each node once a second), so
        # "latest valid checkpoint ..." comes after the rank's own "checkpoint" line, not before it
        ripe = time.time() - LOG_LAG_S
        for e in store.events(job_id, after_id=printed_events):
            if not done and e.time > ripe:
                break
            printed_events = e.id
            echo(f"clusterctl: {e.message}")
        if done:
            return job.state
        time.sleep(poll_s)


def elsewhere(job, here: tuple[str, str] | None = None) -> str | None:
    """The host of ``job``'s recorded supervisor when that is not this machine (another hostname, or this
    hostname after a reboot: another boot id), else None. Its pid means nothing in this machine's /proc."""
    if job.supervisor_pid is None or job.supervisor_host is None:
        return None
    if (job.supervisor_host, job.supervisor_boot) == (here or this_host()):
        return None
    return job.supervisor_host


def beating(job, now: float | None = None) -> bool:
    """The supervisor's last heartbeat is at most ``STALE_S`` old."""
    now = time.time() if now is None else now
    return job.supervisor_seen_at is not None and now - job.supervisor_seen_at <= STALE_S


def live_supervisor(root: Path, job, now: float | None = None) -> int | None:
    """The pid of a live supervisor of ``job``: a supervisor on another host with a fresh heartbeat (a shared
    state dir), or a process here (from the DB claim or the pid file of one being started: also when the last
    claim was another host's, as when a requeued sbatch run resumes on a new batch host)."""
    other = elsewhere(job)
    if other and beating(job, now):
        return job.supervisor_pid
    pid_file = paths.supervisor_pid_path(root, job.job_id)
    candidates = [] if other else [job.supervisor_pid]      # another host's pid means nothing in this /proc
    if pid_file.exists():
        try:
            candidates.append(int(pid_file.read_text().strip()))
        except ValueError:
            pass
    for pid in candidates:
        if pid and is_live_supervisor(pid, job.job_id):
            return pid
    return None


def is_live_supervisor(pid: int, job_id: str) -> bool:
    """``pid`` is alive and is a supervisor of ``job_id`` (after a reboot the recorded pid may be another
    process's: its command line tells)."""
    return pid_alive(pid) and _is_supervisor(pid, job_id)


def _is_supervisor(pid: int, job_id: str) -> bool:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    except OSError:
        return True   # no /proc (macOS): trust the pid
    # `python -m clusterctl.supervise JOB_ID`, or `clusterctl _supervise JOB_ID` (started before issue 25)
    return bool({b"clusterctl.supervise", b"_supervise"} & set(cmd)) and job_id.encode() in cmd


def supervision(root: Path, job, now: float | None = None) -> dict:
    """Is clusterctl's own supervisor of ``job`` alive? ``{"pid", "host", "elsewhere", "alive", "last_seen",
    "supervised"}``. An active job is supervised when a live process is its supervisor and its heartbeat is at
    most ``STALE_S`` old (a supervisor still starting up has a pid file but no heartbeat yet: it counts as alive).
    A supervisor on another host (``elsewhere``: the state dir is shared) is alive while its heartbeat is fresh:
    this machine's process table says nothing about it."""
    now = time.time() if now is None else now
    other = elsewhere(job)
    seen = job.supervisor_seen_at
    if other:       # beating there, or one being started here (its pid file)
        live = live_supervisor(root, job, now)
        alive = bool(live)
    else:
        live = live_supervisor(root, job)
        fresh = seen is None or now - seen <= STALE_S
        alive = bool(live) and (fresh or job.supervisor_pid != live)
    return {"pid": live or job.supervisor_pid, "host": job.supervisor_host, "elsewhere": bool(other),
            "alive": alive, "last_seen": seen, "supervised": alive if not job.terminal else False}


def reconcile_job(root: Path, store: Store, job_id: str, options: ConnectOptions, *,
                  connect: Callable[[Host, ConnectOptions], Transport] = connect) -> Reconciled | None:
    """``status JOB`` of an active job whose supervisor is gone: ask the nodes (bounded by the connect timeout
    + 5 s) and record what they say."""
    ops, _, _ = build_ops(root, store, job_id, options, starts=False, connect=connect)
    missing = [n for n in ops.spec.secret_env if not os.environ.get(n)]
    withheld = (f"(error tail withheld: it could not be redacted, as secret_env {', '.join(missing)} is not set in "
                f"the environment of this `status`; see `clusterctl logs`)") if missing else None
    try:
        return reconcile(store, job_id, ops, deadline_s=options.connect_timeout + 5, withheld_tail=withheld, root=root,
                         keep_logs=lambda attempt: complete_logs(ops, store, job_id, attempt,
                                                                 deadline_s=options.connect_timeout + 10))
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
        ops.sink.begin(host.name, a.attempt)       # the sink drops the lines it holds, as the stream brings them
        ops.read_log(host.name, a.attempt, deadline_s, lambda data: ops.sink.feed(host.name, data))

    from clusterctl.transport import fan_out

    results = fan_out([ops.hosts[n] for n in a.nodes if n in ops.hosts], fetch, host_timeout=deadline_s + 5)
    return {r.host.name: str(r.error) for r in results if r.error is not None}


def fill_logs(root: Path, store: Store, job_id: str, options: ConnectOptions, attempt: int | None = None, *,
              connect: Callable[[Host, ConnectOptions], Transport] = connect) -> dict[str, str]:
    """``logs`` of a job no supervisor follows: complete the controller's copy from the nodes first."""
    ops, _, _ = build_ops(root, store, job_id, options, starts=False, connect=connect)
    try:
        return complete_logs(ops, store, job_id, attempt, deadline_s=options.connect_timeout + 10)
    finally:
        ops.close()
