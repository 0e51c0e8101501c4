"""What `clusterctl status` says: a pure view of the state store (no I/O beyond reading it).

Whether the supervisor is alive is a fact from outside the store (``controller.supervision``): it is passed in.
"""
from __future__ import annotations

import time
from typing import Any

from clusterctl import record as record_mod
from clusterctl.state import Job, Store

FAILURE_KLASSES = ("user_error", "killed", "config_error", "node_lost", "rendezvous_lost", "hang")
FAILURE_EVENTS = ("verdict", "start_failed", "reconciled")


def job_view(store: Store, job: Job, now: float | None = None, supervision: dict | None = None) -> dict[str, Any]:
    now = time.time() if now is None else now
    attempts = store.attempts(job.job_id)
    current = attempts[-1] if attempts else None
    nodes = store.nodes(job.job_id, job.attempt) if current else []
    events = store.events(job.job_id)
    failures = [e for e in events if e.kind in FAILURE_EVENTS and e.klass in FAILURE_KLASSES]
    restarts = _restarts(job)
    checkpoint = None
    if current and current.checkpoint_path:
        checkpoint = {"path": current.checkpoint_path, "step": current.checkpoint_step}
    for e in reversed(events):
        if e.kind == "checkpoint" and e.checkpoint_step is not None:
            checkpoint = {"path": e.message.rsplit(": ", 1)[-1], "step": e.checkpoint_step,
                          "age_s": round(now - e.time, 1)}
            break
    sup = supervision or {"pid": job.supervisor_pid, "alive": None, "last_seen": job.supervisor_seen_at,
                          "supervised": None}
    return {
        "job_id": job.job_id,
        "name": job.name,
        "state": job.state.value,
        "reason": job.reason,
        "attempt": job.attempt,
        "created_at": job.created_at,
        "started_at": current.started_at if current else None,
        "ended_at": current.ended_at if current and job.terminal else None,
        "rendezvous_host": current.rdzv_host if current else None,
        "nodes": [{"node": n.node, "address": n.address, "state": n.state, "exit_code": n.exit_code,
                   "signal": n.signal, "rank": n.rank} for n in nodes]
                 or ([{"node": n, "state": None} for n in current.nodes] if current else []),
        "failures": [{"time": e.time, "attempt": e.attempt, "class": e.klass, "node": e.node, "rank": e.rank,
                      "exit_code": e.exit_code, "signal": e.signal, "oom": bool(e.oom), "message": e.message,
                      "found_by": "status" if e.kind == "reconciled" else "supervisor",
                      "error_tail": _tail(store, job.job_id, e)} for e in failures],
        "checkpoint": checkpoint,
        "restarts": {"failures_used": job.failures_used, "max_failures": restarts.max_failures,
                     "node_failures_used": job.node_failures_used,
                     "max_node_failures": restarts.max_node_failures},
        "supervised": sup["supervised"],
        "supervisor": {"pid": sup["pid"], "alive": sup["alive"], "last_seen": sup["last_seen"]},
        "supervisor_pid": job.supervisor_pid,
    }


def _restarts(job: Job):
    """The job's restart budgets, from its typed record (never a guess at where a dict keeps them)."""
    from clusterctl.spec import Restarts

    try:
        return record_mod.spec_of(job).restarts
    except Exception:  # noqa: BLE001 - a record that cannot be read: show the defaults
        return Restarts()


def _tail(store: Store, job_id: str, event) -> str | None:
    if not event.node or event.attempt is None:
        return None
    for n in store.nodes(job_id, event.attempt):
        if n.node == event.node:
            return n.error_tail
    return None


def events_view(store: Store, job: Job) -> list[dict[str, Any]]:
    return [{"time": e.time, "attempt": e.attempt, "kind": e.kind, "class": e.klass, "node": e.node,
             "rank": e.rank, "exit_code": e.exit_code, "signal": e.signal, "checkpoint_step": e.checkpoint_step,
             "oom": e.oom, "message": e.message} for e in store.events(job.job_id)]
