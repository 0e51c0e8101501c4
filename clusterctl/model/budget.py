"""Restart budgets over a window, and the backoff before a relaunch: pure functions shared by the supervisor
(which charges failures) and ``status`` (which shows budget use).

A budget (``restarts.max_failures`` for user errors, ``restarts.max_node_failures`` for infrastructure) is spent by
the failures of its kind within ``restarts.window`` (a duration such as ``24h``; or ``progress``: since the last
attempt that made progress). An attempt made progress when it wrote a new valid checkpoint or ran with output for
``restarts.progress_after_s``; progress also resets the backoff to its first value, so a long healthy run with
spaced failures recovers as fast after its 500th failure as after its first, while a crash loop (failures without
progress) still backs off exponentially and ends FAILED at its budget.

The failure history is the job's ``budget`` events (one per charged failure) and ``progress`` events (one per failed
attempt that had made progress), after the last ``resume`` event: ``clusterctl resume`` starts with fresh budgets.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from clusterctl.config import durations
from clusterctl.model.events import EventKind

PROGRESS = "progress"                 # restarts.window: count failures since the last progress
USER, INFRA = "user", "infrastructure"


def window_seconds(window: str | int | float) -> float | None:
    """``"24h"`` -> 86400.0 (``config.durations``: s, m, h, d, w; a bare number = seconds); ``"progress"`` ->
    None. ValueError for anything else (or a window of 0)."""
    if isinstance(window, bool):
        raise ValueError(f"expected a duration such as 24h, or {PROGRESS!r}, got {window!r}")
    if isinstance(window, (int, float)):
        seconds = float(window)
    elif isinstance(window, str) and window.strip() == PROGRESS:
        return None
    else:
        parsed = durations.seconds(str(window))
        if parsed is None:
            raise ValueError(f"expected a duration such as {durations.EXAMPLES}, or {PROGRESS!r} (since the last "
                             f"progress), got {window!r}")
        seconds = parsed
    if not math.isfinite(seconds) or seconds <= 0:
        raise ValueError(f"must be a finite duration longer than 0, got {window!r}")
    return seconds


def describe(window_s: float | None) -> str:
    """``within 24h`` / ``since the last progress``."""
    if window_s is None:
        return "since the last progress"
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if window_s >= (2 * size if unit == "d" else size) and window_s % size == 0:
            return f"within {window_s / size:g}{unit}"
    return f"within {window_s:g}s"


@dataclass(frozen=True)
class Charge:
    """One failure charged to a budget: when (any clock, the same for ``now``), its kind, whether the failed
    attempt had made progress."""

    time: float
    kind: str                          # USER or INFRA
    progress: bool = False


def history(events: Iterable) -> list[Charge]:
    """The charges recorded in a job's events (``state.Event``: kind, klass, time), since the last ``resume``."""
    events = list(events)
    last_resume = max((i for i, e in enumerate(events) if e.kind == EventKind.RESUME), default=-1)
    out, progress = [], False
    for e in events[last_resume + 1:]:
        if e.kind == EventKind.PROGRESS:
            progress = True
        elif e.kind == EventKind.BUDGET and e.klass in (USER, INFRA):
            out.append(Charge(e.time, e.klass, progress))
            progress = False
    return out


def used(charges: Iterable[Charge], kind: str, *, now: float, window_s: float | None) -> int:
    """Failures of ``kind`` that spend its budget at ``now``: those within the window, or (window None) those
    since the last progress (see ``streak``)."""
    if window_s is None:
        return streak(charges, kind)
    return sum(1 for c in charges if c.kind == kind and now - c.time < window_s)


def streak(charges: Iterable[Charge], kind: str) -> int:
    """Failures of ``kind`` since the last progress (of an attempt ended by a failure of any kind), the latest
    included: 1 = the first failure after progress (or ever)."""
    history = list(charges)
    start = max((i for i, c in enumerate(history) if c.progress), default=0)
    return sum(1 for c in history[start:] if c.kind == kind)


def backoff(kind: str, streak_: int, *, first_s: float, max_s: float) -> float:
    """Seconds to wait before the relaunch after the ``streak_``-th failure in a row without progress. An
    infrastructure failure is relaunched at once the first time (the lost node is already excluded); repeated
    ones, and user errors, wait ``first_s``, doubling up to ``max_s``."""
    exp = streak_ - 2 if kind == INFRA else streak_ - 1
    return 0.0 if exp < 0 else min(max_s, first_s * 2 ** exp)
