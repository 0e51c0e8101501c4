"""What the job's event log says, as values: the event kinds (a ``str`` enum whose values are the strings stored
since schema 1, so old rows read back and readers comparing with strings keep working) and the payloads whose
text a reader needs back (a checkpoint's path, a relaunch's mode and reason).

Written only by ``store.ledger``; read by ``views`` and ``supervise.notify`` through ``checkpoint_of`` /
``relaunch_of``, never by splitting a message themselves. Pure.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from enum import Enum


class EventKind(str, Enum):
    # the job as the user drives it
    STOP = "stop"                         # `clusterctl stop`
    RESUME = "resume"                     # `clusterctl resume`
    RECONCILED = "reconciled"             # `status`/`resume` found what happened while nobody supervised
    SLURM_RUN = "slurm_run"               # one run of the sbatch script (SLURM_JOB_ID, SLURM_RESTART_COUNT)
    # an attempt, start to end
    ADOPT = "adopt"                       # a new supervisor re-attached to a running attempt
    SUPERVISOR_LOST = "supervisor_lost"   # `status`/a follower/`resume` found the supervisor gone (since when)
    WAITING = "waiting"                   # fewer healthy nodes than MIN: waiting for lost ones
    START = "start"
    START_FAILED = "start_failed"
    RELAUNCH = "relaunch"                 # per node: warm or cold, and why (klass = the mode)
    STARTUP = "startup"                   # an attempt's start-up until its first step (klass: rendezvous | ranks |
                                          # first_step): "waiting for rendezvous: 1/2 nodes joined", ...
    CHECKPOINT = "checkpoint"             # a new latest valid checkpoint (checkpoint_step, path in the message)
    VERDICT = "verdict"                   # why the attempt ended (klass = the verdict)
    STACKS = "stacks"                     # every rank's stack, taken before a hung attempt is stopped
    GANG_STOP = "gang_stop"
    PROGRESS = "progress"
    BUDGET = "budget"
    BACKOFF = "backoff"
    END = "end"                           # the job's end (state and reason)
    # the nodes
    CLEANUP = "cleanup"
    CLEANUP_PENDING = "cleanup_pending"
    CORDON = "cordon"
    SLURM_DRAIN = "slurm_drain"
    NETWORK = "network"                   # NCCL came up on sockets where InfiniBand is expected (a warning)
    # the ranks (the rank view, model.ranks)
    STUCK = "stuck"                       # a rank stuck while its peers wait (klass stuck | recovered)
    STRAGGLER = "straggler"               # a rank every collective waits for (klass named | recovered; slowdown)
    # the supervisor's own trouble
    NOTIFY_FAILED = "notify_failed"

    def __str__(self) -> str:
        return self.value


def kind_of(value: str) -> "EventKind | str":
    """The stored kind as an ``EventKind`` (a kind written by a newer clusterctl stays its string)."""
    try:
        return EventKind(value)
    except ValueError:
        return value


# ------------------------------------------------------------------------------ payloads read back from the text

CHECKPOINT_PREFIX = "latest valid checkpoint: "


@dataclass(frozen=True)
class CheckpointSeen:
    path: str
    step: int

    def message(self) -> str:
        return CHECKPOINT_PREFIX + self.path


def checkpoint_of(event) -> CheckpointSeen | None:
    """The checkpoint a ``checkpoint`` event recorded (None for another kind, or one without a step)."""
    if event.kind != EventKind.CHECKPOINT or event.checkpoint_step is None:
        return None
    text = event.message
    path = text[len(CHECKPOINT_PREFIX):] if text.startswith(CHECKPOINT_PREFIX) else text.rsplit(": ", 1)[-1]
    return CheckpointSeen(path, event.checkpoint_step)


@dataclass(frozen=True)
class Relaunch:
    attempt: int
    node: str
    mode: str             # warm | cold
    why: str

    def message(self) -> str:
        return f"attempt {self.attempt}: {self.node} {self.mode}: {self.why}"


def relaunch_of(event) -> Relaunch | None:
    """A ``relaunch`` event's node, mode (its ``klass``) and reason."""
    if event.kind != EventKind.RELAUNCH:
        return None
    return Relaunch(event.attempt, event.node, event.klass,
                    event.message.split(f"{event.node} {event.klass}: ", 1)[-1])


@dataclass(frozen=True)
class StragglerSeen:
    """A ``straggler`` event: ``named`` (how much slower) or ``recovered``."""

    attempt: int
    node: str
    rank: int
    slowdown: float
    named: bool = True

    def message(self) -> str:
        if self.named:
            return (f"straggler: node {self.node} rank {self.rank} runs {self.slowdown:.2f}x slower than the "
                    "fastest rank (every collective waits for it)")
        return f"straggler recovered: node {self.node} rank {self.rank} ({self.slowdown:.2f}x now)"


def straggler_of(event) -> StragglerSeen | None:
    """A ``straggler`` event's node, rank and slowdown (the number is read back from its text)."""
    if event.kind != EventKind.STRAGGLER or event.node is None or event.rank is None:
        return None
    m = re.search(r"(\d+(?:\.\d+)?)x", event.message)
    return StragglerSeen(event.attempt, event.node, event.rank, float(m.group(1)) if m else 0.0,
                         event.klass != "recovered")


def stragglers_now(events, attempt: int) -> list[StragglerSeen]:
    """The stragglers named in ``attempt`` and not recovered since, by rank."""
    now: dict[tuple[str, int], StragglerSeen] = {}
    for e in events:
        s = straggler_of(e)
        if s is None or s.attempt != attempt:
            continue
        if s.named:
            now[(s.node, s.rank)] = s
        else:
            now.pop((s.node, s.rank), None)
    return sorted(now.values(), key=lambda s: (s.rank, s.node))


def stuck_now(events, attempt: int) -> list:
    """The ``stuck`` events of ``attempt`` whose rank has not recovered since (the latest per rank)."""
    now: dict[tuple[str, int], object] = {}
    for e in events:
        if e.kind != EventKind.STUCK or e.attempt != attempt:
            continue
        if e.klass == "recovered":
            now.pop((e.node, e.rank), None)
        else:
            now[(e.node, e.rank)] = e
    return list(now.values())
