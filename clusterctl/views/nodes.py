"""Node health for `clusterctl nodes` and the cordon rules of launch/resume. Pure functions over store values."""
from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

from clusterctl.errors import UserError
from clusterctl.store.state import Attempt, Cordon, Event
from clusterctl.views.status import FAILURE_EVENTS, FAILURE_KLASSES

WINDOW_S = 7 * 86400


def node_rows(hosts: Sequence[str], cordons: Mapping[str, Cordon], attempts: Iterable[Attempt],
              events: Iterable[Event], now: float) -> list[dict[str, Any]]:
    """One row per host (inventory hosts first, then cordoned hosts not in it): ``state`` ok|cordoned, the
    cordon's reason/since/by, jobs run there, failures by class in the last 7 days, the last failure."""
    names = list(dict.fromkeys([*hosts, *cordons]))
    jobs: dict[str, set[str]] = {n: set() for n in names}
    for a in attempts:
        for n in a.nodes:
            if n in jobs:
                jobs[n].add(a.job_id)
    failures: dict[str, dict[str, int]] = {n: {} for n in names}
    last: dict[str, dict[str, Any]] = {}
    for e in events:
        if e.node not in failures or e.klass not in FAILURE_KLASSES or e.kind not in FAILURE_EVENTS:
            continue
        if e.time >= now - WINDOW_S:
            failures[e.node][e.klass] = failures[e.node].get(e.klass, 0) + 1
        if e.node not in last or e.time >= last[e.node]["time"]:
            last[e.node] = {"time": e.time, "job_id": e.job_id, "class": e.klass, "message": e.message}
    rows = []
    for n in names:
        c = cordons.get(n)
        rows.append({"host": n, "state": "cordoned" if c else "ok", "reason": c.reason if c else None,
                     "since": c.since if c else None, "by": c.by if c else None, "in_inventory": n in hosts,
                     "jobs": len(jobs[n]), "failures_7d": failures[n], "last_failure": last.get(n)})
    return rows


def split(hosts: Sequence[Any], cordons: Mapping[str, Cordon]) -> tuple[list[Any], list[tuple[str, str]]]:
    """(usable hosts, [(cordoned host, reason)]) keeping the order; ``hosts`` are ``Host``s or names."""
    usable, excluded = [], []
    for h in hosts:
        name = getattr(h, "name", h)
        if name in cordons:
            excluded.append((name, cordons[name].reason))
        else:
            usable.append(h)
    return usable, excluded


def too_few(min_nodes: int, usable: int, excluded: Sequence[tuple[str, str]]) -> UserError:
    named = "; ".join(f"{h} ({why})" for h, why in excluded)
    return UserError(f"the job needs at least {min_nodes} node(s) but only {usable} remain without the cordoned "
                     f"host(s) {named}; check them with `clusterctl nodes`, then "
                     f"`clusterctl uncordon {' '.join(h for h, _ in excluded)}`")
