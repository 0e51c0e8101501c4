"""What the supervisor keeps in the job's dir for the goodput report (issue 38), beside ``output.log``:

    steps.jsonl    one line per step seen: {"time", "attempt", "step"} (``StepTap``)
    events.jsonl   append-only, every event of the job (each phase boundary) as ``model.goodput.Mark``
                   (``EventMirror``: after each state change's commit, and when the supervisor exits)
    goodput.json   the report (``model.goodput.build``), written when the supervisor exits (the job's end)

So a report survives ``forget`` of the database when the dir is kept (``clusterctl report`` reads the dir when the
database no longer knows the job), and a Slurm requeue chain (one job id) has one of each.

The step signal today is the ranks' output: a line ``step N`` (as the quickstart's ``step N/TOTAL loss ...``),
timed when the supervisor's log copy receives it (streamed: ``podman logs -f`` / ``tail -F`` over the kept
connection). Steps are seen at the script's logging cadence (the quickstart's ``--log-every``); the report says
when that is coarser than one step. A per-rank progress view (issue 37) can write the same records.
"""
from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Callable, Iterable

from clusterctl.model.goodput import Mark, StepSeen, build
from clusterctl.store import paths
from clusterctl.store.state import Store

STEPS, EVENTS, GOODPUT = "steps.jsonl", "events.jsonl", "goodput.json"
# a line of the log copy: "[node/rank] step N..." (a rank's) or "[node/-] === attempt N ===" (a section's start)
_STEP = re.compile(r"^\[([^\]/]*)/(\d+)\] step (\d+)\b")
_SECTION = re.compile(r"^\[([^\]/]*)/-\] === attempt (\d+) ===$")


class StepTap:
    """``LogSink.echo``: each new ``step N`` line of a rank becomes a ``steps.jsonl`` record (the highest step
    of each attempt only: a script that prints on every rank gives one record per step). ``attempt``: the
    attempt of a node whose section began before this tap (a supervisor that re-attached)."""

    def __init__(self, path: Path, attempt: int = 0, clock: Callable[[], float] = time.time):
        self.path, self.clock = path, clock
        self._attempt: dict[str, int] = {}
        self._default = attempt
        self._best: dict[int, int] = {}
        self._first: dict[int, int] = {}      # attempt -> its first step seen (an attempt's start-up is over)
        self._fd: int | None = None

    def __call__(self, line: str) -> None:
        if "] step " not in line and "=== attempt" not in line:     # the common case: one substring test
            return
        m = _STEP.match(line)
        if m is None:
            s = _SECTION.match(line)
            if s:
                self._attempt[s.group(1)] = int(s.group(2))
            return
        attempt, step = self._attempt.get(m.group(1), self._default), int(m.group(3))
        if step <= self._best.get(attempt, -1):
            return
        self._best[attempt] = step
        self._first.setdefault(attempt, step)
        try:
            if self._fd is None:
                self._fd = paths.open_private(self.path)
            os.write(self._fd, (json.dumps({"time": round(self.clock(), 3), "attempt": attempt, "step": step})
                                + "\n").encode())
        except Exception:  # noqa: BLE001 - a full disk: the report says less, training goes on
            pass

    def first_step(self, attempt: int) -> int | None:
        """The first ``step N`` line of ``attempt`` this tap saw (None: none yet)."""
        return self._first.get(attempt)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


class EventMirror:
    """Appends the job's events to ``events.jsonl`` once each (resumes after the last id the file holds)."""

    def __init__(self, store: Store, job_id: str, path: Path):
        self.store, self.job_id, self.path = store, job_id, path
        self.last_id = max((m.id or 0 for m in read_marks(path)), default=0)

    def sync(self) -> None:
        try:
            new = self.store.events(self.job_id, after_id=self.last_id)
            if not new:
                return
            fd = paths.open_private(self.path)
            try:
                os.write(fd, "".join(json.dumps(Mark.of(e).to_json()) + "\n" for e in new).encode())
            finally:
                os.close(fd)
            self.last_id = new[-1].id
        except Exception:  # noqa: BLE001 - the mirror is a copy: it never stops the supervisor
            pass

    def chain(self, listener: Callable | None) -> Callable:
        """An ``on_state`` hook that calls ``listener`` (the notifier), then syncs."""
        def on_state(job_id, old, new) -> None:
            if listener is not None:
                listener(job_id, old, new)
            self.sync()
        return on_state


def _jsonl(path: Path) -> Iterable[dict]:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return []
    out = []
    for line in text.splitlines():
        try:
            d = json.loads(line)
        except ValueError:
            continue          # a line cut by a crash mid-write
        if isinstance(d, dict):
            out.append(d)
    return out


def read_marks(path: Path) -> list[Mark]:
    out = []
    for d in _jsonl(path):
        try:
            out.append(Mark.from_json(d))
        except (TypeError, KeyError):
            continue
    return out


def read_steps(path: Path) -> list[StepSeen]:
    out = []
    for d in _jsonl(path):
        try:
            out.append(StepSeen.from_json(d))
        except (TypeError, KeyError, ValueError):
            continue
    return out


def report(store: Store, root: Path, job_id: str, now: float) -> dict:
    """The job's goodput report from the database (its events) and the job dir (its steps)."""
    job = store.get_job(job_id)
    directory = paths.job_dir(root, job.job_id)
    return build([Mark.of(e) for e in store.events(job.job_id)], read_steps(directory / STEPS),
                 created_at=job.created_at, now=now, job_id=job.job_id, name=job.name, state=job.state.value)


def report_from_dir(directory: Path, now: float) -> dict | None:
    """A report from the job dir alone (the database forgot the job): its ``goodput.json`` rebuilt from
    ``events.jsonl`` and ``steps.jsonl`` when they are there, else ``goodput.json`` as written; None: neither."""
    marks = read_marks(directory / EVENTS)
    kept = {}
    try:
        kept = json.loads((directory / GOODPUT).read_text())
    except (OSError, ValueError):
        pass
    if not marks:
        return kept or None
    return build(marks, read_steps(directory / STEPS), created_at=kept.get("created_at"), now=now,
                 job_id=kept.get("job_id") or directory.name, name=kept.get("name"), state=kept.get("state"))


def keep(store: Store, root: Path, job_id: str, mirror: EventMirror, now: float) -> None:
    """When the supervisor exits: the last events into ``events.jsonl``, the report into ``goodput.json``."""
    mirror.sync()
    try:
        paths.write_private(paths.job_dir(root, job_id) / GOODPUT,
                            json.dumps(report(store, root, job_id, now), indent=2) + "\n")
    except Exception:  # noqa: BLE001 - a copy: never in the way of the supervisor's exit
        pass


RANKS = "ranks.json"     # the supervisor's rank view, each round (``clusterctl top`` reads it)


def write_ranks(directory: Path, doc: dict) -> None:
    """Replace ``<job dir>/ranks.json`` atomically (a reader never sees half a file)."""
    paths.write_private(directory / RANKS, json.dumps(doc, separators=(",", ":")))


def read_ranks(directory: Path) -> dict | None:
    """The last ``ranks.json`` the supervisor wrote, or None (none yet, or unreadable)."""
    try:
        doc = json.loads((directory / RANKS).read_text())
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) and isinstance(doc.get("ranks"), list) else None
