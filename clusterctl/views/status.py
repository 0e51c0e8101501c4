"""What `clusterctl status` says: a pure view of the state store (no I/O beyond reading it).

Whether the supervisor is alive is a fact from outside the store (``controller.supervision``): it is passed in.
"""
from __future__ import annotations

import time
from typing import Any

from clusterctl.model import budget
from clusterctl.model import events as events_mod
from clusterctl.model import record as record_mod
from clusterctl.model.verdicts import Verdict
from clusterctl.store.state import TERMINAL_STATES, Job, Store
from clusterctl.views.logs import for_terminal

# the verdicts that are failures (not continue, success or stop), in the enum's order
FAILURE_KLASSES = tuple(v.value for v in Verdict if v not in (Verdict.CONTINUE, Verdict.SUCCESS, Verdict.STOPPED))
FAILURE_EVENTS = (events_mod.EventKind.VERDICT, events_mod.EventKind.START_FAILED, events_mod.EventKind.RECONCILED)
ENDED = frozenset(s.value for s in TERMINAL_STATES)     # a view's state once the job is over


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
    seen = next(((e, c) for e in reversed(events) if (c := events_mod.checkpoint_of(e)) is not None), None)
    if seen is not None:
        e, c = seen
        checkpoint = {"path": c.path, "step": c.step, "age_s": round(now - e.time, 1)}
    running = bool(current and current.ended_at is None and not job.terminal)
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
                      "found_by": "status" if e.kind == events_mod.EventKind.RECONCILED else "supervisor",
                      "error_tail": _tail(store, job.job_id, e), "stacks": _stacks(events, e)} for e in failures],
        "checkpoint": checkpoint,
        "warnings": _warnings(events, job.attempt),
        "startup": _startup(events, job.attempt),
        # the rank view (issue 37): stragglers named and not recovered, ranks stuck now (the current attempt's)
        "stragglers": [{"node": x.node, "rank": x.rank, "slowdown": round(x.slowdown, 2)}
                       for x in events_mod.stragglers_now(events, job.attempt)] if running else [],
        "stuck": [{"node": e.node, "rank": e.rank, "since": e.time, "message": e.message}
                  for e in events_mod.stuck_now(events, job.attempt)] if running else [],
        # every relaunch, per node: warm or cold, and why (the supervisor's ``relaunch`` events)
        "relaunches": [{"attempt": r.attempt, "node": r.node, "recovery": r.mode, "why": r.why}
                       for r in map(events_mod.relaunch_of, events) if r is not None],
        "restarts": budget_view(events, restarts, now),
        "supervised": sup["supervised"],
        "supervisor": {"pid": sup["pid"], "alive": sup["alive"], "last_seen": sup["last_seen"],
                       "host": sup.get("host", job.supervisor_host), "elsewhere": bool(sup.get("elsewhere"))},
        "supervisor_pid": job.supervisor_pid,
    }


def budget_view(events, restarts, now: float) -> dict[str, Any]:
    """Budget use within the window at ``now`` (``restarts``: the spec's ``Restarts``), from the job's
    ``budget``/``progress`` events after the last ``resume`` (see ``clusterctl.model.budget``)."""
    charges = budget.history(events)
    return {"failures_used": budget.used(charges, budget.USER, now=now, window_s=restarts.window_s),
            "max_failures": restarts.max_failures,
            "node_failures_used": budget.used(charges, budget.INFRA, now=now, window_s=restarts.window_s),
            "max_node_failures": restarts.max_node_failures,
            "window": restarts.window, "window_s": restarts.window_s}


def _restarts(job: Job):
    """The job's restart budgets, from its typed record (never a guess at where a dict keeps them)."""
    from clusterctl.config.spec import Restarts

    try:
        return record_mod.spec_of(job).restarts
    except Exception:  # noqa: BLE001 - a record that cannot be read: show the defaults
        return Restarts()


def _warnings(events, attempt: int) -> list[dict[str, Any]]:
    """What the supervisor warned of in the current attempt, loudly: NCCL on sockets where InfiniBand is expected
    (the ``network`` events; an earlier attempt's no longer says anything about the nodes now)."""
    return [{"time": e.time, "attempt": e.attempt, "kind": e.kind, "node": e.node, "message": e.message}
            for e in events if e.kind == events_mod.EventKind.NETWORK and e.attempt == attempt]


def _startup(events, attempt: int) -> dict[str, Any] | None:
    """Where the current attempt's start-up stood last (the supervisor's ``startup`` events: waiting for the
    rendezvous, ranks started, first step), or None when nothing was said of it."""
    e = next((e for e in reversed(events) if e.kind == events_mod.EventKind.STARTUP and e.attempt == attempt), None)
    return None if e is None else {"attempt": e.attempt, "phase": e.klass, "message": e.message, "time": e.time}


def _tail(store: Store, job_id: str, event) -> str | None:
    if not event.node or event.attempt is None:
        return None
    for n in store.nodes(job_id, event.attempt):
        if n.node == event.node:
            return n.error_tail
    return None


def _stacks(events, failure) -> list[str] | None:
    """For a hang: where each group of ranks waited ("ranks 0-6: all_reduce <- train_step train.py:88"), from the
    ``stacks`` event the supervisor recorded before it stopped the attempt."""
    if failure.klass != "hang":
        return None
    for e in events:
        if (e.kind == events_mod.EventKind.STACKS and e.attempt == failure.attempt and e.id > failure.id
                and e.klass != "dump"):
            return e.message.splitlines()
    return None


def events_view(store: Store, job: Job) -> list[dict[str, Any]]:
    return [{"time": e.time, "attempt": e.attempt, "kind": e.kind, "class": e.klass, "node": e.node,
             "rank": e.rank, "exit_code": e.exit_code, "signal": e.signal, "checkpoint_step": e.checkpoint_step,
             "oom": e.oom, "message": e.message} for e in store.events(job.job_id)]


# ------------------------------------------------------------------------------------------------ text
def unsupervised(v: dict[str, Any]) -> bool:
    """An active job whose supervisor is gone: nothing restarts it on failure."""
    return v["supervised"] is False and v["state"] not in ENDED


def unsupervised_line(v: dict[str, Any], now: float | None = None) -> str:
    sup = v["supervisor"]
    seen = f"last seen {_ago(sup['last_seen'], now)}" if sup["last_seen"] else "never seen"
    where = f" on {sup['host']}" if sup.get("elsewhere") else ""
    return (f"UNSUPERVISED: job {v['job_id']} is {v['state']} but clusterctl's supervisor is not running "
            f"(pid {sup['pid'] or '-'}{where}, {seen}): nothing restarts it on failure. "
            f"Run: clusterctl resume {v['name']}")


def text(v: dict[str, Any], now: float | None = None) -> list[str]:
    """``status JOB`` as lines of text (a ``job_view``)."""
    lines: list[str] = []
    p = lines.append
    if unsupervised(v):
        p(unsupervised_line(v, now))
    elif v.get("reconciled"):
        r = v["reconciled"]
        p(f"UNSUPERVISED: clusterctl's supervisor of job {v['job_id']} was gone; its nodes say attempt "
          f"{r['attempt']} ended ({r['verdict']}: {r['message']}): the job is now {r['state']}."
          + ("" if r["state"] == "SUCCEEDED" else f" Run: clusterctl resume {v['name']}"))
    for w in v.get("warnings") or []:
        p(w["message"])     # on its own line: "WARNING: node: NCCL uses sockets where InfiniBand is expected ..."
    p(f"job       {v['job_id']}  ({v['name']})")
    p(f"state     {v['state']}" + (f"  — {v['reason']}" if v["reason"] else ""))
    sup = v["supervisor"]
    where = f" on {sup['host']} (supervised elsewhere: a shared state dir)" if sup.get("elsewhere") else ""
    p(f"supervisor pid {sup['pid'] or '-'}{where} " + ("alive" if sup["alive"] else "not running")
      + (f", last heartbeat {_ago(sup['last_seen'], now)}" if sup["last_seen"] else ""))
    p(f"attempt   {v['attempt']}  started {_ago(v['started_at'], now)}  rendezvous {v['rendezvous_host'] or '-'}")
    p("nodes     " + ", ".join(_node_text(n) for n in v["nodes"]))
    up = v.get("startup")
    if up and up["phase"] in ("rendezvous", "ranks") and v["state"] not in ENDED:   # still starting: where it stands
        p(f"startup   {up['message']} ({_ago(up['time'], now)})")
    ck = v["checkpoint"]
    p("checkpoint " + (f"{ck['path']} (step {ck['step']})" if ck else "none"))
    r = v["restarts"]
    p(f"restarts  user errors {r['failures_used']}/{r['max_failures']}, "
      f"infrastructure {r['node_failures_used']}/{r['max_node_failures']}"
      + (f" ({'within ' + r['window'] if r['window_s'] else 'since the last progress'})" if "window" in r else ""))
    for x in v.get("stuck") or []:
        p(f"STUCK     {x['message']}")
    for x in v.get("stragglers") or []:
        p(f"straggler node {x['node']} rank {x['rank']}: {x['slowdown']:.2f}x slower than the fastest rank")
    for r in v.get("relaunches") or []:
        p(f"relaunch  attempt {r['attempt']} {r['node']} {r['recovery']}: {r['why']}")
    for f in v["failures"]:
        rank = f["rank"] if f["rank"] is not None else "-"
        p(f"failure   attempt {f['attempt']} [{f['class']}] node {f['node'] or '-'} rank {rank} "
          f"exit {f['exit_code'] if f['exit_code'] is not None else '-'} signal {f['signal'] or '-'}"
          + (" OOM" if f.get("oom") else "") + f": {f['message']}")
        for line in (f["error_tail"] or "").splitlines()[-10:]:
            p(f"          | {for_terminal(line)}")      # a node's text: its escape sequences shown, not run
        for line in f.get("stacks") or []:
            p(f"          waiting: {line}")
    return lines


def _ago(t: float | None, now: float | None = None) -> str:
    if not t:
        return "-"
    s = int((time.time() if now is None else now) - t)
    return f"{s}s ago" if s < 120 else f"{s // 60}m ago" if s < 7200 else f"{s // 3600}h ago"


def _node_text(n: dict[str, Any]) -> str:
    state = n["state"] or "?"
    if n.get("signal"):
        state += f"({n['signal']})"
    elif n.get("exit_code") not in (None, 0) or state == "exited":
        state += f"(exit {n['exit_code'] if n.get('exit_code') is not None else '?'})"
    return f"{n['node']}={state}"
