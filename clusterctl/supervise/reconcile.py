"""What happened to a job while no supervisor watched it: ask the nodes, judge as the supervisor would, record it.

``status JOB`` and ``resume`` call ``reconcile`` when a job is active but its supervisor is gone (killed, OOM, the
controller machine rebooted). ``judge`` is pure: the nodes' observations -> the job's verdict, or None while the
attempt may still be healthy. ``reconcile`` does the I/O: one bounded probe round, then events (kind
``reconciled``), node rows, the attempt's end and the job's state.
"""
from __future__ import annotations

import math
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

from clusterctl.model.events import EventKind, checkpoint_of
from clusterctl.model.verdicts import Decision, Observation, Verdict, node_state
from clusterctl.store.ledger import Ledger, note
from clusterctl.store import paths
from clusterctl.store.state import ACTIVE_STATES, InvalidTransition, JobState, Store
from clusterctl.supervise import jobdir
from clusterctl.supervise.supervisor import Health, NodeOps, classify


CHECKPOINT_WAIT_S = 1.0     # how long a look that ends nothing waits for the checkpoint after the observation


def judge(obs: Sequence[Observation], *, rdzv_host: str, now: float) -> Decision | None:
    """The verdict on an attempt nobody supervised, from one look at its nodes. None: nothing to decide yet
    (every node still runs, or finished well while others run, or nodes that do not answer beside running ones:
    one look cannot tell a dead node from a slow link)."""
    if not obs:
        return None
    if all(o.state == "exited" and o.exit_code == 0 for o in obs):
        return Decision(Verdict.SUCCESS, message="every node finished with exit code 0")
    failed = [o for o in obs if o.state == "missing" or (o.state == "exited" and o.exit_code not in (0, None))]
    if not failed:
        return None
    d = classify(obs, Health(started=now, last_progress=now), rdzv_host=rdzv_host, probe_failures=1,
                 hang_timeout_s=math.inf, now=now, settle_s=0.0)
    return None if d.verdict == Verdict.CONTINUE else d


@dataclass(frozen=True)
class Reconciled:
    attempt: int
    nodes: tuple[tuple[str, str], ...]        # (node, state now: running | exited | killed | gone | unreachable)
    decision: Decision | None                 # None: the attempt may still be healthy (or it had ended before)
    state: JobState                           # the job's state after reconciling
    checkpoint: tuple[str, int] | None = None  # the latest valid checkpoint, when the attempt failed
    leftovers: tuple[str, ...] = ()           # nodes where this look could not remove the job's leftovers


def reconcile(store: Store, job_id: str, ops, *, deadline_s: float, clock=time.time,
              withheld_tail: str | None = None, keep_logs: Callable[[int], object] | None = None,
              root: Path | None = None) -> Reconciled | None:
    """One look at the current attempt's nodes (``ops``: a ``cluster_ops.ClusterOps``), recorded. None when the
    job has no attempt yet or is no longer active. Error tails reach the store redacted (the store's secrets);
    ``withheld_tail``: recorded instead of every tail (the caller cannot redact them: a secret value unknown).
    An attempt whose end is recorded is never judged again (its result stands). A look that ends the job removes
    its leftovers on every node (``clean_up``), after ``keep_logs(attempt)`` (the log copy completed from the
    nodes' own logs, which go with their containers), and, given the state dir ``root``, keeps the job's report
    in its dir as a supervisor's exit does (``events.jsonl`` completed, ``goodput.json``: ``jobdir.keep``)."""
    found = _look(store, job_id, ops, deadline_s=deadline_s, clock=clock, withheld_tail=withheld_tail,
                  keep_logs=keep_logs)
    if root is not None and found is not None and found.state.terminal:
        events = paths.job_dir(root, job_id) / jobdir.EVENTS
        jobdir.keep(store, root, job_id, jobdir.EventMirror(store, job_id, events), clock())
    return found


def _look(store: Store, job_id: str, ops, *, deadline_s: float, clock, withheld_tail: str | None,
          keep_logs: Callable[[int], object] | None) -> Reconciled | None:
    ledger = Ledger(store)
    job = store.get_job(job_id)
    attempts = store.attempts(job_id)
    if job.terminal or not attempts:
        return None
    a = attempts[-1]
    ledger.supervisor_lost(job_id, lost_message(job))

    def tidy() -> tuple[str, ...]:
        return clean_up(ledger, job_id, ops, lambda: keep_logs(a.attempt) if keep_logs else None)

    if a.result == "succeeded":       # the supervisor recorded the success, then died before the job's end
        ledger.state_changed(job_id, JobState.SUCCEEDED, "every node finished with exit code 0 (the supervisor "
                                                         "ended before it recorded the job's end)",
                             notes=[note(EventKind.RECONCILED, f"attempt {a.attempt} had succeeded; the job is "
                                                               "SUCCEEDED", attempt=a.attempt, klass="success")])
        return Reconciled(a.attempt, (), Decision(Verdict.SUCCESS, message="every node finished with exit code 0"),
                          JobState.SUCCEEDED, leftovers=tidy())
    if a.ended_at is not None:        # it ended (recorded: verdict, stop, start failure); no next attempt began
        try:
            ledger.state_changed(job_id, JobState.FAILED,
                                 f"attempt {a.attempt} had ended ({a.result}) and the supervisor was gone before the "
                                 f"next attempt; `clusterctl resume {job.name}` relaunches from the latest "
                                 "valid checkpoint", expect=(job.state,),
                                 notes=[note(EventKind.RECONCILED, f"attempt {a.attempt} had ended ({a.result}) "
                                             "before the supervisor was gone: not judged again; the job is FAILED",
                                             attempt=a.attempt)])
        except InvalidTransition:     # a new supervisor (or a stop) moved the job meanwhile: theirs
            return Reconciled(a.attempt, (), None, store.get_job(job_id).state)
        return Reconciled(a.attempt, (), None, JobState.FAILED, leftovers=tidy())
    # the checkpoint on the nodes' storage is asked while they are observed (a look takes the longer, not both)
    on_disk: list = []
    nodes = in_record(ops, a.nodes)
    asking = threading.Thread(target=lambda: on_disk.append(_latest(ops, nodes)), daemon=True, name="checkpoint")
    asking.start()
    obs = ops.observe(a.attempt, nodes, watch=False, deadline_s=deadline_s)
    d = judge(obs, rdzv_host=a.rdzv_host or "", now=clock())
    ledger.nodes_changed(job_id, a.attempt, {o.node: dict(
        state=node_state(o), exit_code=o.exit_code, signal=o.signal, rank=o.rank,
        error_tail=(withheld_tail if withheld_tail and o.error_tail else o.error_tail) or None) for o in obs})
    states = tuple((o.node, node_state(o)) for o in obs)
    # a look that ends the attempt waits for the answer (ClusterOps bounds it by its probe timeout); one that
    # ends nothing does not hold `status` up for it (unknown, never "none": the next look asks again)
    asking.join(None if d is not None else CHECKPOINT_WAIT_S)
    checkpoint = on_disk[0] if on_disk else None
    checkpoint_now(ledger, job_id, a.attempt, checkpoint)   # the one on disk now, not the last a supervisor saw
    if d is None:
        return Reconciled(a.attempt, states, None, job.state)
    if store.get_job(job_id).terminal:      # someone else (a new supervisor, another status) got there first
        return Reconciled(a.attempt, states, d, store.get_job(job_id).state)
    try:      # ``expect``: two looks at once (followers, status): the first one's end stands, once
        if d.verdict == Verdict.SUCCESS:
            ledger.attempt_ended(job_id, a.attempt, "succeeded", to=JobState.SUCCEEDED, expect=ACTIVE_STATES,
                                 reason="every node finished with exit code 0 (found after the supervisor was gone)",
                                 notes=[note(EventKind.RECONCILED, f"attempt {a.attempt} finished with exit code 0 "
                                             "on every node while no supervisor watched it", attempt=a.attempt,
                                             klass="success")])
            return Reconciled(a.attempt, states, d, JobState.SUCCEEDED, leftovers=tidy())
        step = f"checkpoint step {checkpoint[1]}" if checkpoint and checkpoint[0] else (
            "the start (no checkpoint yet)" if checkpoint else "the latest valid checkpoint")
        ledger.attempt_ended(job_id, a.attempt, d.verdict.value, to=JobState.FAILED, expect=ACTIVE_STATES,
                             reason=f"{d.message} (while unsupervised); `clusterctl resume {job.name}` relaunches "
                                    f"from {step}",
                             notes=[note(EventKind.RECONCILED, f"while unsupervised: {d.message}", attempt=a.attempt,
                                         klass=d.verdict.value, node=d.node, rank=d.rank, exit_code=d.exit_code,
                                         signal=d.signal, oom=d.oom or None,
                                         checkpoint_step=checkpoint[1] if checkpoint and checkpoint[0] else None)])
    except InvalidTransition:
        return Reconciled(a.attempt, states, d, store.get_job(job_id).state)
    return Reconciled(a.attempt, states, d, JobState.FAILED, checkpoint, tidy())


def in_record(ops: NodeOps, nodes) -> list[str]:
    """``nodes`` that are still the job's hosts (``NodeOps.known``: its record): one that `resume --exclude` took
    out (which cleaned it up then) is neither asked nor cleaned again; the record has no address for it."""
    return ops.known(list(nodes))


def _latest(ops, nodes) -> tuple[str, int] | None:
    try:
        return ops.latest_checkpoint(list(nodes))
    except Exception:  # noqa: BLE001 - no node could tell: unknown
        return None


def utc(t: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t))


def lost_message(job) -> str:
    """What the ``supervisor_lost`` event says: which supervisor, and since when the job runs unsupervised."""
    who = f"pid {job.supervisor_pid}" + (f" on {job.supervisor_host}" if job.supervisor_host else "") \
        if job.supervisor_pid else "none recorded"
    since = (f"its last heartbeat was at {utc(job.supervisor_seen_at)}" if job.supervisor_seen_at else
             "it never sent a heartbeat")
    return (f"clusterctl's supervisor ({who}) is gone: {since}; the job runs unsupervised (nothing restarts it on "
            f"failure) until `clusterctl resume {job.name}`")


def unsupervised_span(job, now: float) -> str:
    """For the ``adopt``/``resume`` event: how long ``job`` ran unsupervised, from its last supervisor's last
    heartbeat to ``now`` (empty when none is known)."""
    if not job.supervisor_seen_at:
        return ""
    return (f"; it ran unsupervised from {utc(job.supervisor_seen_at)} to {utc(now)} "
            f"({max(0, int(now - job.supervisor_seen_at))} s)")


def checkpoint_now(ledger: Ledger, job_id: str, attempt: int, found: tuple[str, int] | None) -> None:
    """The latest valid checkpoint the nodes' storage holds now, recorded (a ``checkpoint`` event, as the
    supervisor records it) when it is not the last one recorded: the job trained on while nobody watched."""
    if not found or not found[0]:
        return
    last = next((c for e in reversed(ledger.store.events(job_id)) if (c := checkpoint_of(e)) is not None), None)
    if last is None or (last.path, last.step) != found:
        ledger.checkpoint_seen(job_id, attempt, found[0], found[1])


def clean_up(ledger: Ledger, job_id: str, ops, before: Callable[[], object] = lambda: None) -> tuple[str, ...]:
    """The job ended while nobody supervised it: remove what it left on every node it ran on (the survivors'
    containers or processes, the zygotes, the warm dirs), or say what is left where: a ``cleanup`` event naming
    the nodes cleaned, a ``cleanup_pending`` event per node that could not be (unreachable, the runtime refused).
    Returns those nodes."""
    nodes = in_record(ops, sorted({n for a in ledger.store.attempts(job_id) for n in a.nodes}))
    before()
    errors = ops.stop(None, nodes)
    done = [n for n in nodes if n not in errors]
    if done:
        ledger.event(job_id, EventKind.CLEANUP, f"the job ended while unsupervised: removed its containers, "
                                                f"processes, zygotes and warm dirs on {', '.join(done)}")
    for node, e in errors.items():
        ledger.event(job_id, EventKind.CLEANUP_PENDING,
                     f"{node}: the job's leftovers (containers, processes, zygote, warm dir) may still be there: "
                     f"{e.message}; `clusterctl stop {job_id}` removes them once the node answers", node=node)
    return tuple(errors)
