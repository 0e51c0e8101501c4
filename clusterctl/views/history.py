"""Job history for `clusterctl status` (the list): which jobs to show and their row. Pure functions over ``Job``
values and a store read; no printing."""
from __future__ import annotations

import datetime
from typing import Any, Iterable, Sequence

from clusterctl.config import durations
from clusterctl.errors import UserError
from clusterctl.model.events import EventKind
from clusterctl.store.state import Job, JobState, Store

NEWEST_FINISHED = 20
REASON_CHARS = 60
_FORMATS = ("%Y-%m-%d", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M", "%Y-%m-%dT%H:%M:%S", "%Y-%m-%d %H:%M:%S")


def parse_since(text: str, now: float) -> float:
    """``2h``, ``30m``, ``45s``, ``3d``, ``1w`` ago, or a UTC date/time ``2026-12-01[THH:MM[:SS]]`` -> epoch s."""
    ago = durations.seconds(text)
    if ago is not None:
        return now - ago
    for fmt in _FORMATS:
        try:
            dt = datetime.datetime.strptime(text.strip().rstrip("Z"), fmt)
        except ValueError:
            continue
        return dt.replace(tzinfo=datetime.timezone.utc).timestamp()
    raise UserError(f"--since {text!r}: use a duration ({durations.EXAMPLES}) or a UTC date "
                    "(2026-12-01, 2026-12-01T08:00)")


def parse_states(values: Iterable[str]) -> tuple[JobState, ...]:
    out = []
    for v in values:
        for part in v.split(","):
            try:
                out.append(JobState(part.strip().upper()))
            except ValueError:
                raise UserError(f"--state {part!r}: one of {', '.join(s.value for s in JobState)}") from None
    return tuple(dict.fromkeys(out))


def ended_at(store: Store, job: Job) -> float | None:
    """When a finished job ended: its ``end`` event, else its last attempt's end, else its last update."""
    if not job.terminal:
        return None
    end = next((e.time for e in reversed(store.events(job.job_id)) if e.kind == EventKind.END), None)
    if end is None:
        attempts = store.attempts(job.job_id)
        end = attempts[-1].ended_at if attempts and attempts[-1].ended_at else job.updated_at
    return end


def select(store: Store, jobs: Sequence[Job], *, states: Sequence[JobState] = (), since: float | None = None,
           show_all: bool = False, limit: int = NEWEST_FINISHED) -> list[Job]:
    """Active jobs, then the ``limit`` newest finished ones (every one with ``show_all``), newest first within
    each; ``states`` keeps those states; ``since`` keeps jobs alive at some time after it (started or ended)."""
    keep = []
    for j in jobs:
        if states and j.state not in states:
            continue
        if since is not None and j.created_at < since and j.terminal and (ended_at(store, j) or 0) < since:
            continue
        keep.append(j)
    active = [j for j in keep if not j.terminal]
    finished = [j for j in keep if j.terminal]
    return active + (finished if show_all else finished[:limit])


def short_reason(reason: str | None, width: int = REASON_CHARS) -> str:
    if not reason:
        return ""
    line = " ".join(reason.split())
    return line if len(line) <= width else line[: width - 1] + "…"


def row(store: Store, job: Job, now: float) -> dict[str, Any]:
    """The list's fields for one job (JSON keys; times are epoch seconds)."""
    attempts = store.attempts(job.job_id)
    end = ended_at(store, job)
    return {"job_id": job.job_id, "name": job.name, "state": job.state.value, "attempt": job.attempt,
            "nodes": list(attempts[-1].nodes) if attempts else [], "started_at": job.created_at,
            "ended_at": end, "elapsed_s": round((end or now) - job.created_at, 1),
            "reason": job.reason, "short_reason": short_reason(job.reason)}


def clock(t: float | None, now: float) -> str:
    """A compact local time: HH:MM today, else MM-DD HH:MM (a time with no date is always today's)."""
    if not t:
        return "-"
    dt = datetime.datetime.fromtimestamp(t)
    return dt.strftime("%H:%M") if dt.date() == datetime.datetime.fromtimestamp(now).date() \
        else dt.strftime("%m-%d %H:%M")


def duration(s: float) -> str:
    s = int(max(0, s))
    if s < 60:
        return f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    if s < 86400:
        return f"{s // 3600}h{s % 3600 // 60:02d}m"
    return f"{s // 86400}d{s % 86400 // 3600:02d}h"
