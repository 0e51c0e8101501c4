"""Goodput (issue 38): what fraction of a job's time trained, where the rest went, one record per restart cycle.

Pure: ``build(marks, steps, created_at=, now=)`` -> the report as a JSON value (``clusterctl report -o json``, the
job dir's ``goodput.json``). Its inputs are the job's events as ``Mark`` values (from the ledger, or read back from
the job dir's ``events.jsonl``) and the steps the supervisor saw, ``StepSeen(time, attempt, step)`` (the job dir's
``steps.jsonl``; today from the ranks' ``step N`` log lines, see ``supervise.jobdir``).

The wall time (first ``start`` to the job's ``end``, or now) is cut into intervals, each in one bucket:

- an attempt's start -> its training's start: ``program_startup`` (torch, the process group, the checkpoint load:
  restore time is not told apart from start-up without a signal for it); the steps from the checkpoint it resumed
  from to its first step seen are trained before that line, one pace each (the attempt's seconds per step over its
  step lines), and are steps, not start-up;
- between consecutive steps seen: the steps' time, shared evenly among the steps between two records, to
  ``productive_s`` when the step's progress was kept, else ``wasted_progress_from_disruption`` (a step after the
  checkpoint the next attempt resumed from is trained again). Lines received together (a log copy read in chunks:
  ``podman logs -f`` reads once a second) are one record, their highest step: their arrival times tell nothing
  of the steps between; the last span of an attempt lasts a pace a step unless its line came more than a read
  (``READ_S``) later;
- the failed attempt's last step -> its verdict: ``hang_detection`` (verdict ``hang``) or
  ``infrastructure_recovery_from_disruption`` (detection), and the verdict -> the next start: ``backoff`` (the
  supervisor's ``backoff`` waits), ``waiting_for_nodes`` (from a ``waiting`` event to the next start), the rest
  ``infrastructure_recovery_from_disruption`` (gang stop, cleanup, the relaunch);
- the last step -> the job's end (final save, teardown), and a stopped job's time until its ``resume``: ``other``.
  A job that a look ended (`status`/`resume` found its supervisor gone: a ``reconciled`` event) ended at that look;
  the attempt's verdict, when the look judged it, is that event's class, found then.

``unproductive_checkpoint_save_time``, ``unproductive_checkpoint_restore_time`` and ``data_loading`` stay 0 until a
signal tells them apart (they are inside the steps' and the start-up's time); the report says so in ``unknown``.
Without any step seen (a script that prints no ``step N`` lines), nothing inside an attempt can be split: that time
is ``unknown_s``, and ``productive_s``, ``goodput``, ``ettr``, ``steps`` and each disruption's ``fault_at``,
``first_step_at``, ``lost_steps``, ``lost_s`` are null, with ``unknown`` saying why: the report never guesses.
"""
from __future__ import annotations

import re
import statistics
from dataclasses import asdict, dataclass
from typing import Any, Iterable

from clusterctl.model.events import EventKind

BUCKETS = ("program_startup", "wasted_progress_from_disruption", "infrastructure_recovery_from_disruption",
           "unproductive_checkpoint_save_time", "unproductive_checkpoint_restore_time", "data_loading", "other",
           "hang_detection", "backoff", "waiting_for_nodes")
NOT_SUCCESS = frozenset({"success", "stopped"})      # verdicts that are not a disruption
NO_SIGNAL = ("no step signal: the job's ranks printed no `step N` line, so the time inside its attempts cannot be "
             "split into training, start-up and redone work (unknown_s); productive_s, goodput, ettr, steps and "
             "each disruption's fault_at, first_step_at, lost_steps and lost_s are unknown")
NOT_SPLIT = ("checkpoint save, checkpoint restore and data loading are not told apart from the steps and the "
             "start-up (no signal for them): their buckets are 0")
# the job's end: its ``end`` event, or the ``reconciled`` one of a look (`status`, `resume`) that found the supervisor
# gone and ended the job (every ``reconciled`` event is such an end); a ``reconciled`` event with a class is also the
# attempt's verdict, found at that look
ENDS = (EventKind.END, EventKind.RECONCILED)
_WAIT = re.compile(r"waiting ([0-9.]+)s")


@dataclass(frozen=True)
class Mark:
    """One event of the job, as the report reads it (``events.jsonl`` holds these, one JSON object a line)."""
    time: float
    kind: str
    attempt: int | None = None
    klass: str | None = None
    node: str | None = None
    step: int | None = None            # a start's resume step, a checkpoint's step
    message: str = ""
    id: int | None = None

    @classmethod
    def of(cls, event: Any) -> "Mark":
        """From a ``store.state.Event``."""
        return cls(time=event.time, kind=str(event.kind), attempt=event.attempt, klass=event.klass, node=event.node,
                   step=event.checkpoint_step, message=event.message, id=event.id)

    @classmethod
    def from_json(cls, d: dict) -> "Mark":
        return cls(**{k: d.get(k) for k in ("time", "kind", "attempt", "klass", "node", "step", "id")},
                   message=d.get("message") or "")

    def to_json(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class StepSeen:
    """A step the supervisor saw an attempt reach, and when (``steps.jsonl``)."""
    time: float
    attempt: int
    step: int

    @classmethod
    def from_json(cls, d: dict) -> "StepSeen":
        return cls(float(d["time"]), int(d["attempt"]), int(d["step"]))


def _r(x: float | None, nd: int = 3) -> float | None:
    return None if x is None else round(x, nd)


def _p90(xs: list[float]) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, max(0, -(-9 * len(s) // 10) - 1))]     # nearest rank


@dataclass(frozen=True)
class Segment:
    """One interval of the wall time and its bucket (``productive``, ``unknown`` or a badput bucket), for the
    picture (``build(..., segments=[])`` fills the list)."""
    bucket: str
    start: float
    end: float
    attempt: int


def build(marks: Iterable[Mark], steps: Iterable[StepSeen], *, created_at: float | None, now: float,
          job_id: str | None = None, name: str | None = None, state: str | None = None,
          segments: list[Segment] | None = None) -> dict:
    """The report (see the module's doc). ``created_at``: when the job was recorded (ETTR counts from there: the
    queue and every wait included); ``now``: the end of a job that has not ended; ``segments``: a list to fill
    with the intervals the figures sum (in time order per attempt)."""
    segs: list[Segment] = [] if segments is None else segments
    marks = sorted(marks, key=lambda m: (m.time, m.id or 0))
    starts: dict[int, Mark] = {}
    for m in marks:
        if m.kind == EventKind.START and m.attempt is not None and m.attempt not in starts:
            starts[m.attempt] = m
    attempts = sorted(starts)
    seen: dict[int, list[StepSeen]] = {}
    for s in sorted(steps, key=lambda s: s.time):
        seen.setdefault(s.attempt, []).append(s)
    signal = bool(seen)
    paces = [p for p in (_pace(_deliveries(ss)) for ss in seen.values()) if p]
    job_pace = sum(t for t, _ in paces) / sum(n for _, n in paces) if paces else None
    buckets = dict.fromkeys(BUCKETS, 0.0)
    unknown_s, productive = 0.0, 0.0
    durations: list[float] = []
    gaps = [r.step - p.step for ss in seen.values() for p, r in zip(ss, ss[1:]) if r.step > p.step]
    disruptions: list[dict] = []
    head = {"job_id": job_id, "name": name, "state": state}
    if not attempts:
        return {**head, "wall_s": 0.0, "productive_s": None, "goodput": None, "ettr": None,
                "badput_s": buckets, "unknown_s": 0.0, "disruptions": [], "steps": None, "step_signal": None,
                "unknown": ["the job never started an attempt"]}
    t0 = starts[attempts[0]].time
    last_start = starts[attempts[-1]].time
    ends = [m for m in marks if m.kind in ENDS and m.time >= last_start]
    end = ends[-1].time if ends else max(now, last_start)

    def add(bucket: str, a: float, b: float, attempt: int) -> None:
        if b > a:
            buckets[bucket] += b - a
            segs.append(Segment(bucket, a, b, attempt))

    for i, a in enumerate(attempts):
        start = starts[a]
        nxt = starts[attempts[i + 1]] if i + 1 < len(attempts) else None
        limit = nxt.time if nxt else end
        verdict = next((m for m in marks if (m.kind in (EventKind.VERDICT, EventKind.START_FAILED)
                                             or m.kind == EventKind.RECONCILED and m.klass) and m.attempt == a
                        and start.time <= m.time <= limit), None)
        stopped_by_user = next((m for m in marks if m.kind in (EventKind.STOP, *ENDS)
                                and start.time <= m.time <= limit), None)
        over = verdict.time if verdict else (stopped_by_user.time if stopped_by_user else limit)
        klass = (verdict.klass or "start_failed") if verdict else None
        recs = _deliveries([s for s in seen.get(a, []) if start.time <= s.time <= limit])
        resume_next = (nxt.step or 0) if nxt else None
        wasted_a = 0.0
        if recs:
            spans, trained_from, steps_end = _spans(recs, start, job_pace)
            add("program_startup", start.time, trained_from, a)
            for k, (p_step, p_time, r_step, r_time) in enumerate(spans):
                n = r_step - p_step
                dt = r_time - p_time
                if k > 0:                                    # the head is the rate's estimate, not a measurement
                    durations.append(dt / n)
                kept = n if resume_next is None else max(0, min(r_step, resume_next) - p_step)
                productive += dt * kept / n
                wasted_a += dt * (n - kept) / n
                cut = p_time + dt * kept / n
                segs.extend(Segment(b, x, y, a) for b, x, y in (("productive", p_time, cut),
                            ("wasted_progress_from_disruption", cut, r_time)) if y > x)
            failed = klass is not None and klass not in NOT_SUCCESS
            add("hang_detection" if klass == "hang" else
                "infrastructure_recovery_from_disruption" if failed else "other", steps_end, over, a)
        elif signal:
            add("program_startup", start.time, over, a)       # it never reached a step
        else:
            unknown_s += max(0.0, over - start.time)
            segs.append(Segment("unknown", start.time, over, a))
        buckets["wasted_progress_from_disruption"] += wasted_a
        # the verdict -> the next start (or the job's end)
        gap = [m for m in marks if over <= m.time <= limit]
        rest_bucket = "infrastructure_recovery_from_disruption" if nxt and klass not in (None, "stopped") else "other"
        spent = 0.0
        for m in gap:
            if m.kind == EventKind.BACKOFF:
                w = _WAIT.search(m.message)
                d = min(float(w.group(1)) if w else 0.0, limit - m.time)
                buckets["backoff"] += d
                spent += d
                segs.append(Segment("backoff", m.time, m.time + d, a))
        waiting = next((m for m in gap if m.kind == EventKind.WAITING), None)
        if waiting:
            d = max(0.0, limit - waiting.time - spent)
            buckets["waiting_for_nodes"] += d
            spent += d
            segs.append(Segment("waiting_for_nodes", limit - d, limit, a))
        user_end = next((m for m in gap if m.kind in ENDS), None)
        resume = next((m for m in gap if m.kind == EventKind.RESUME and user_end and m.time >= user_end.time), None)
        if nxt and user_end and resume:          # ended, then resumed by the user: the time between was theirs
            buckets["other"] += resume.time - user_end.time
            spent += resume.time - user_end.time
            segs.append(Segment("other", user_end.time, resume.time, a))
        buckets[rest_bucket] += max(0.0, limit - over - spent)
        if limit - over - spent > 0:       # drawn from the verdict on (the waits above lie later in the gap)
            segs.append(Segment(rest_bucket, over, over + (limit - over - spent), a))
        if klass is not None and klass not in NOT_SUCCESS:
            disruptions.append(_cycle(a, verdict, start, nxt, recs, seen.get(attempts[i + 1], []) if nxt else [],
                                      marks, limit, resume_next, wasted_a, signal))

    wall = end - t0
    life = end - (created_at if created_at is not None else t0)
    unknown = [] if signal else [NO_SIGNAL]
    every = statistics.median(gaps) if gaps else None
    if signal:
        unknown.append(NOT_SPLIT)
        if every and every > 1:
            unknown.append(f"steps were seen every {every:g} steps: lost_steps may be short by up to "
                           f"{every - 1:g} and each step time is an average over {every:g} steps")
    all_steps = [s.step for ss in seen.values() for s in ss]
    return {
        **head,
        "wall_s": _r(wall),
        "productive_s": _r(productive) if signal else None,
        "goodput": _r(productive / wall, 4) if signal and wall > 0 else None,
        "ettr": _r(productive / life, 4) if signal and life > 0 else None,
        "badput_s": {k: _r(v) for k, v in buckets.items()},
        "unknown_s": _r(unknown_s),
        "disruptions": disruptions,
        "steps": {"first": min(all_steps), "last": max(all_steps),
                  "median_s": _r(statistics.median(durations), 4) if durations else None,
                  "p90_s": _r(_p90(durations), 4) if durations else None} if signal else None,
        "step_signal": {"source": "log", "every": every} if signal else None,
        "started_at": _r(t0), "ended_at": _r(end) if ends else None, "created_at": _r(created_at),
        "unknown": unknown,
    }


DELIVERY_S = 0.05     # step lines received within this of each other came in one read of the log
READ_S = 1.0          # a step line reaches the supervisor at most this long after it was printed (podman's read)
PACE_MIN_S = 10.0     # an attempt's own pace needs deliveries over this long (else the job's is used)


def _deliveries(recs: list[StepSeen]) -> list[StepSeen]:
    """One record per delivery: the highest step of the lines that arrived together. A log copy that is read in
    chunks (``podman logs -f`` reads the container's log file once a second) hands over several steps at one
    instant: their times say when the chunk came, not when each step ended, so only the chunk's last step is
    timed (the steps between two chunks share the time between them, as sparse step lines do)."""
    out: list[StepSeen] = []
    for s in recs:
        if out and s.step <= out[-1].step:
            continue
        if out and s.time - out[-1].time <= DELIVERY_S:
            out[-1] = s
        else:
            out.append(s)
    return out


def _pace(recs: list[StepSeen]) -> tuple[float, int] | None:
    """(seconds, steps) from the first delivery to the last, None with fewer than two."""
    return (recs[-1].time - recs[0].time, recs[-1].step - recs[0].step) if recs[-1].step > recs[0].step else None


def _spans(recs: list[StepSeen], start: Mark, job_pace: float | None) -> tuple[list[tuple[int, float, int, float]],
                                                                               float, float]:
    """An attempt's deliveries as spans of steps ``(from_step, from_time, to_step, to_time)``, when its training
    began and when its last step ended. The steps between the two are timed by the deliveries, but where they
    cannot be, the attempt's own pace (seconds per step over its deliveries; over the whole job's, ``job_pace``,
    when the attempt's deliveries span less than ``PACE_MIN_S``: two deliveries a read apart say little) estimates
    them:

    - the head: the steps from the checkpoint it resumed from (``start.step``; 0: from scratch) to the first step
      seen trained before that line came, from one pace per step before it (never before the start): the first
      step seen is not start-up;
    - the tail: the last step's line may come up to a read of the log (``READ_S``) later than the step (a
      chunk): the last span lasts one pace per step, or longer where its line came more than a read after that
      (a last step that was slow: a fault hit it); the rest is the fault's (its detection), not the steps'."""
    first, last = recs[0], recs[-1]
    own = _pace(recs)
    pace = own[0] / own[1] if own and own[0] >= PACE_MIN_S else job_pace if job_pace else \
        own[0] / own[1] if own else None
    spans = [(p.step, p.time, r.step, r.time) for p, r in zip(recs, recs[1:])]
    if pace is not None and spans:
        p_step, p_time, r_step, r_time = spans[-1]
        spans[-1] = (p_step, p_time, r_step, min(r_time, max(p_time + (r_step - p_step) * pace, r_time - READ_S)))
    base = start.step or 0
    if pace is not None and first.step > base:
        began = max(start.time, first.time - (first.step - base) * pace)
        if first.time > began:
            spans.insert(0, (base, began, first.step, first.time))
    trained_from = spans[0][1] if spans else first.time
    return spans, trained_from, spans[-1][3] if spans else last.time


def _cycle(attempt: int, verdict: Mark, start: Mark, nxt: Mark | None, recs: list[StepSeen],
           next_recs: list[StepSeen], marks: list[Mark], limit: float, resume_next: int | None, wasted: float,
           signal: bool) -> dict:
    """One restart cycle (NVIDIA resiliency-ext's cycle records are the model)."""
    after = [m for m in marks if verdict.time <= m.time <= limit]
    gang = next((i for i, m in enumerate(after) if m.kind == EventKind.GANG_STOP and m.attempt == attempt), None)
    stopped = next((m.time for m in after[gang + 1:]), None) if gang is not None else verdict.time
    if stopped is None:
        stopped = nxt.time if nxt else None
    modes = [m.klass for m in marks if nxt and m.kind == EventKind.RELAUNCH and m.attempt == nxt.attempt]
    first = next((s for s in next_recs if s.time >= nxt.time), None) if nxt else None
    last = recs[-1] if recs else None
    if resume_next is None:              # not restarted: what a resume would redo, from the last checkpoint seen
        cks = [m.step for m in marks if m.kind == EventKind.CHECKPOINT and m.step is not None
               and m.time <= verdict.time]
        resume_next = max(cks, default=start.step or 0)
    return {
        "attempt": attempt, "verdict": verdict.klass or "start_failed", "node": verdict.node,
        # a step line read a hair after the verdict (another thread of the supervisor stamped it): the fault was
        # no later than its detection
        "fault_at": _r(min(last.time, verdict.time)) if last else None,
        "detected_at": _r(verdict.time), "stopped_at": _r(stopped),
        "restarted_at": _r(nxt.time) if nxt else None,
        "first_step_at": _r(first.time) if first else None,
        "recovery": ("warm" if all(x == "warm" for x in modes) else "cold") if modes else None,
        "lost_steps": max(0, last.step - resume_next) if last else (0 if signal else None),
        "lost_s": _r(wasted) if signal else None,
        "cordoned": any(m.kind == EventKind.CORDON and m.node == verdict.node for m in marks
                        if verdict.time <= m.time <= limit),
    }
