"""The use case of ``clusterctl report JOB`` (issue 38): the job's goodput report, from the state database (its
events and attempts) and the job dir (``steps.jsonl``); for a job the database no longer knows (``forget``), from
its kept dir alone (``events.jsonl``, ``steps.jsonl``, ``goodput.json``: see ``supervise.jobdir``)."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from clusterctl.config.ids import JOB_ID_RE
from clusterctl.model.goodput import Mark, Segment, build
from clusterctl.store import paths
from clusterctl.store.state import JobNotFound, Store
from clusterctl.supervise import jobdir


@dataclass(frozen=True)
class Report:
    value: dict                                   # the JSON of `report -o json`
    segments: list[Segment] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)
    lanes: dict[int, tuple[str, ...]] = field(default_factory=dict)    # each attempt's nodes


def report(root: Path, store: Store, job_ref: str, *, now: float) -> Report:
    """``JobNotFound`` when neither the database nor a kept job dir knows ``job_ref`` (an id or a name)."""
    job = store.find_job(job_ref)
    if job is None:
        kept = kept_dir(root, job_ref)
        if kept is None:
            raise JobNotFound(job_ref)
        return _from_dir(kept, now)
    directory = paths.job_dir(root, job.job_id)
    marks = [Mark.of(e) for e in store.events(job.job_id)]
    segments: list[Segment] = []
    value = build(marks, jobdir.read_steps(directory / jobdir.STEPS), created_at=job.created_at, now=now,
                  job_id=job.job_id, name=job.name, state=job.state.value, segments=segments)
    lanes = {a.attempt: tuple(a.nodes) for a in store.attempts(job.job_id)}
    return Report(value, segments, marks, lanes)


def kept_dir(root: Path, job_ref: str) -> Path | None:
    """The job dir of ``job_ref`` that still holds a report's files: by id, else the newest whose
    ``goodput.json`` names the job."""
    jobs = Path(root) / "jobs"
    if JOB_ID_RE.match(job_ref) and ".." not in job_ref:
        d = jobs / job_ref
        if (d / jobdir.EVENTS).is_file() or (d / jobdir.GOODPUT).is_file():
            return d
    found = []
    for g in jobs.glob(f"*/{jobdir.GOODPUT}"):
        try:
            if json.loads(g.read_text()).get("name") == job_ref:
                found.append((g.stat().st_mtime, g.parent))
        except (OSError, ValueError, AttributeError):
            continue
    return max(found)[1] if found else None


def _from_dir(directory: Path, now: float) -> Report:
    marks = jobdir.read_marks(directory / jobdir.EVENTS)
    if not marks:
        return Report(jobdir.report_from_dir(directory, now) or {})
    segments: list[Segment] = []
    try:
        kept = json.loads((directory / jobdir.GOODPUT).read_text())
    except (OSError, ValueError):
        kept = {}
    value = build(marks, jobdir.read_steps(directory / jobdir.STEPS), created_at=kept.get("created_at"), now=now,
                  job_id=kept.get("job_id") or directory.name, name=kept.get("name"), state=kept.get("state"),
                  segments=segments)
    return Report(value, segments, marks, {})
