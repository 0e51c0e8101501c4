"""The ledger: the one writer of a job's lifecycle (jobs, attempts, node rows, events, cordons, the supervisor's
claim). Every method is one SQLite transaction (``Store.transaction``) named after what happened, with typed
arguments; the transitions are enforced here (``TRANSITIONS`` and the ``expect``ed states, through
``Store.set_state``), and ``Store.on_state`` listeners (``supervise.notify``) hear of a state change after its
commit. Nothing else in clusterctl calls ``Store``'s write methods (tests/unit/test_import_graph.py checks it).

The ledger keeps no state of its own: any command makes one over its store (``Ledger(store)``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from clusterctl.model import record as record_mod
from clusterctl.model.events import CheckpointSeen, EventKind, Relaunch
from clusterctl.model.record import JobRecord
from clusterctl.store.state import Attempt, Cordon, Event, Job, JobState, Store


@dataclass(frozen=True)
class Note:
    """An event to record with a change: its kind, message and the ``EVENT_FIELDS`` it sets."""
    kind: EventKind
    message: str
    fields: Mapping[str, Any] = field(default_factory=dict)


def note(kind: EventKind, message: str, **fields: Any) -> Note:
    return Note(kind, message, fields)


class Ledger:
    def __init__(self, store: Store):
        self.store = store

    def _notes(self, job_id: str, notes: Iterable[Note]) -> list[Event]:
        return [self.store.add_event(job_id, n.kind.value, n.message, **n.fields) for n in notes]

    # ---------------------------------------------------------------------------------------------- jobs
    def job_recorded(self, name: str, record_json: str, inventory_path: str | None, job_path: str | None, *,
                     exclusive: bool = True) -> str:
        """A new PENDING job (``JobActive`` if one of that name is active and ``exclusive``); its id."""
        return self.store.create_job(name, record_json, inventory_path, job_path, exclusive=exclusive)

    def record(self, job: Job) -> JobRecord:
        """The record of ``job``; one stored in an older version is rewritten as the current one."""
        rec = record_mod.from_job(job)
        if record_mod.outdated(job):
            self.record_changed(job.job_id, rec)
        return rec

    def record_changed(self, job_id: str, rec: JobRecord) -> None:
        """The job's record, migrated, or given new hosts or a checkpoint override (`resume`, `sbatch-run`)."""
        self.store.update_job(job_id, spec_json=rec.to_json())

    def state_changed(self, job_id: str, to: JobState, reason: str | None = None, *,
                      expect: Iterable[JobState] | None = None, notes: Iterable[Note] = ()) -> JobState:
        """The job moves to ``to`` (``InvalidTransition`` when ``TRANSITIONS`` or ``expect`` refuse it), with
        ``notes``; returns the state it left."""
        with self.store.transaction():
            old = self.store.set_state(job_id, to, reason, expect=expect)
            self._notes(job_id, notes)
            return old

    def job_ended(self, job_id: str, to: JobState, reason: str, *, expect: Iterable[JobState] | None = None,
                  note_text: str | None = None) -> JobState:
        """The job's end: its state and the ``end`` event, together."""
        return self.state_changed(job_id, to, reason, expect=expect,
                                  notes=[note(EventKind.END, note_text or f"job {to.value}: {reason}")])

    def stop_requested(self, job_id: str) -> JobState:
        """`clusterctl stop` on an active job: STOPPED now (the supervisor sees it and ends its work)."""
        return self.state_changed(job_id, JobState.STOPPED, "stopped by user",
                                  notes=[note(EventKind.STOP, "stop requested by user")])

    def resumed(self, job_id: str, message: str, rec: JobRecord | None = None) -> JobState:
        """`clusterctl resume`: fresh restart budgets, RECOVERING, the ``resume`` event (and the record's new
        hosts/checkpoint override), together."""
        with self.store.transaction():
            if rec is not None:
                self.store.update_job(job_id, spec_json=rec.to_json())
            self.store.update_job(job_id, failures_used=0, node_failures_used=0)
            return self.state_changed(job_id, JobState.RECOVERING, "resumed by user",
                                      notes=[note(EventKind.RESUME, message)])

    def forgotten(self, job_id: str) -> None:
        """`clusterctl forget`: a finished job's rows go (``JobActive`` if it is not finished)."""
        self.store.delete_job(job_id)

    def event(self, job_id: str, kind: EventKind, message: str, **fields: Any) -> Event:
        """One event that changes nothing else (a verdict before its consequences, a cleanup, a backoff)."""
        return self.store.add_event(job_id, kind.value, message, **fields)

    # ---------------------------------------------------------------------------------------------- attempts
    def attempt_started(self, job_id: str, attempt: int, rdzv_host: str, nodes: Sequence[str],
                        checkpoint: tuple[str, int] | None, message: str, *,
                        expect: Iterable[JobState] | None = None) -> Attempt:
        """STARTING (``expect``: the states it may come from; a `stop` that came first wins), the attempt row
        (its nodes in rank order, the checkpoint it resumes from) and the ``start`` event: one transaction."""
        path, step = checkpoint if checkpoint and checkpoint[0] else (None, None)
        with self.store.transaction():
            self.store.set_state(job_id, JobState.STARTING, None, expect=expect)
            a = self.store.start_attempt(job_id, attempt, rdzv_host, f"{job_id}-{attempt}", nodes, path, step)
            self.store.add_event(job_id, EventKind.START.value, message, attempt=attempt, checkpoint_step=step)
            return a

    def attempt_running(self, job_id: str, attempt: int, relaunches: Sequence[Relaunch] = (), *,
                        expect: Iterable[JobState] | None = None,
                        nodes: Mapping[str, Mapping[str, Any]] | None = None) -> None:
        """Every node started: RUNNING, the started nodes' rows (address, container) and for a relaunch one
        ``relaunch`` event per node (warm or cold, why): one transaction."""
        with self.store.transaction():
            self.state_changed(job_id, JobState.RUNNING, None, expect=expect, notes=[
                note(EventKind.RELAUNCH, r.message(), attempt=attempt, node=r.node, klass=r.mode) for r in relaunches])
            for node, fields in (nodes or {}).items():
                self.store.set_node(job_id, attempt, node, **fields)

    def attempt_ended(self, job_id: str, attempt: int, result: str, *, to: JobState | None = None,
                      reason: str | None = None, expect: Iterable[JobState] | None = None,
                      nodes: Mapping[str, Mapping[str, Any]] | None = None, notes: Iterable[Note] = (),
                      budget: tuple[bool, int] | None = None) -> None:
        """The attempt's end (``result``: succeeded, stopped, start_failed, abandoned, or the verdict), with the
        node rows and events that say how (the verdict, the budget's), the failure ``budget`` it spends ((infra?,
        used): the job row's count) and (``to``) the job's next state: one transaction. A job state the
        transitions refuse (a `stop` came first) raises ``InvalidTransition`` and records none of it."""
        with self.store.transaction():
            if budget is not None:
                self.store.update_job(job_id, **{"node_failures_used" if budget[0] else "failures_used": budget[1]})
            for node, fields in (nodes or {}).items():
                self.store.set_node(job_id, attempt, node, **fields)
            self._notes(job_id, notes)
            self.store.end_attempt(job_id, attempt, result)
            if to is not None:
                self.store.set_state(job_id, to, reason, expect=expect)

    def nodes_changed(self, job_id: str, attempt: int, rows: Mapping[str, Mapping[str, Any]]) -> None:
        """Node rows that changed (the caller sends only those: never one write per node and round), batched."""
        if not rows:
            return
        with self.store.transaction():
            for node, fields in rows.items():
                self.store.set_node(job_id, attempt, node, **fields)

    def checkpoint_seen(self, job_id: str, attempt: int, path: str, step: int) -> Event:
        """A new latest valid checkpoint (``views.status`` reads it back with ``model.events.checkpoint_of``)."""
        return self.event(job_id, EventKind.CHECKPOINT, CheckpointSeen(path, step).message(), attempt=attempt,
                          checkpoint_step=step)

    # ---------------------------------------------------------------------------------------------- hosts
    def host_cordoned(self, host: str, reason: str, by: str = "user", *, job_id: str | None = None,
                      message: str | None = None) -> Cordon:
        """``host`` cordoned (by the user, or by a job's supervisor, which records ``message`` as its event)."""
        with self.store.transaction():
            c = self.store.cordon(host, reason, by=by)
            if job_id is not None and message is not None:
                self.store.add_event(job_id, EventKind.CORDON.value, message, node=host)
            return c

    def host_uncordoned(self, host: str) -> bool:
        return self.store.uncordon(host)

    # ---------------------------------------------------------------------------------------------- supervisor
    def supervisor_claimed(self, job_id: str, pid: int, *, is_live: Callable[[int], bool] | None = None) -> bool:
        return self.store.claim_supervisor(job_id, pid, is_live=is_live)

    def supervisor_beat(self, job_id: str, pid: int) -> bool:
        return self.store.heartbeat(job_id, pid)

    def supervisor_released(self, job_id: str, pid: int) -> bool:
        return self.store.release_supervisor(job_id, pid)

    def supervisor_lost(self, job_id: str, message: str) -> Event | None:
        """The job's supervisor found gone (by `status`, a follower, `resume`): a ``supervisor_lost`` event, once
        per supervisor (none when one was recorded after its last heartbeat). None when there was one already."""
        with self.store.transaction():
            job = self.store.get_job(job_id)
            last = self.store.last_event(job_id, EventKind.SUPERVISOR_LOST.value)
            if last is not None and last.time >= (job.supervisor_seen_at or job.created_at):
                return None
            return self.store.add_event(job_id, EventKind.SUPERVISOR_LOST.value, message, attempt=job.attempt or None)
