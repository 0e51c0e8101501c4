"""Reading the controller's copy of a job's output: ``[node/rank] text`` lines, one section per node and attempt
(``[node/-] === attempt N ===``; see ``store.logcopy.LogSink``)."""
from __future__ import annotations

import re
from collections import deque
from dataclasses import dataclass
from pathlib import Path

from clusterctl.errors import UserError
from clusterctl.model import record as record_mod
from clusterctl.store import paths

LINE = re.compile(r"^\[([^/\]]+)/([^\]]+)\] ")
MARKER = re.compile(r"^\[([^/\]]+)/-\] === attempt (\d+) ===$")


# What a node prints reaches the operator's terminal (``logs``, an attached ``launch``, ``status``'s error tails):
# escape sequences could retitle the window, rewrite the screen, hide text, or on some terminals answer back.
# Every C0 control but TAB, DEL, every C1 control and the bidi overrides are shown as \xNN / \uNNNN instead.
# The stored log file keeps the bytes as printed (issue 24).
_UNSAFE = [*range(0, 9), *range(10, 32), 127, *range(0x80, 0xA0), *range(0x202A, 0x202F), *range(0x2066, 0x206A)]
_TERMINAL = {c: (f"\\x{c:02x}" if c < 0x100 else f"\\u{c:04x}") for c in _UNSAFE}


def for_terminal(line: str) -> str:
    """``line`` with control characters and escape sequences neutralised (shown, never interpreted)."""
    return line.translate(_TERMINAL)


def path(root, job_id: str) -> Path:
    return paths.output_log(root, job_id)


@dataclass(frozen=True)
class Selection:
    node: str | None = None
    rank: int | None = None
    attempt: int | None = None

    @classmethod
    def check(cls, store, job, *, node: str | None, rank: int | None, attempt: int | None) -> "Selection":
        """A selection of what the job really had: a node, rank or attempt it never had is a usage error
        (exit 2) that lists the valid ones."""
        attempts = store.attempts(job.job_id)
        if attempt is not None and attempt not in [a.attempt for a in attempts]:
            valid = ", ".join(str(a.attempt) for a in attempts) or "none yet"
            raise UserError(f"--attempt {attempt}: job {job.job_id} has no such attempt (attempts: {valid})")
        chosen = [a for a in attempts if attempt is None or a.attempt == attempt]
        spec = record_mod.spec_of(job)
        rec_hosts = {}
        try:
            rec_hosts = record_mod.from_job(job).hosts_by_name
        except Exception:  # noqa: BLE001 - an old record whose inventory is gone: nproc from the spec only
            pass
        nodes = list(dict.fromkeys(n for a in chosen for n in a.nodes)) or list(rec_hosts)
        if node is not None and node not in nodes:
            raise UserError(f"--node {node}: not a node of job {job.job_id}"
                            + (f" attempt {attempt}" if attempt else "") + f" (nodes: {', '.join(nodes) or 'none'})")

        def nproc(n: str) -> int:
            if spec.nproc_per_node != "gpu":
                return int(spec.nproc_per_node)
            h = rec_hosts.get(n)
            return int(h.gpus or 0) if h else 0

        world = max((sum(nproc(n) for n in a.nodes) for a in chosen), default=0)
        if rank is not None and not 0 <= rank < world:
            valid = f"0-{world - 1}" if world else "none yet"
            raise UserError(f"--rank {rank}: job {job.job_id} has no such rank (ranks: {valid})")
        return cls(node, rank, attempt)

    def keeps(self, line: str, attempt: int | None = None) -> bool:
        m = LINE.match(line)
        if not m:
            return self.node is None and self.rank is None and self.attempt is None
        if self.node is not None and m.group(1) != self.node:
            return False
        if self.rank is not None and m.group(2) != str(self.rank):
            return False
        return self.attempt is None or attempt == self.attempt


def read(log: Path, sel: Selection, tail: int | None = None) -> list[str]:
    """The selected lines in file order; with ``tail``, only the last ``tail`` of them (0: none). Reads the
    file once, line by line, keeping at most ``tail`` lines."""
    out: deque[str] | list[str] = deque(maxlen=tail) if tail is not None else []
    if tail == 0:
        return []
    current: dict[str, int] = {}
    for part in (log.with_name(log.name + ".1"), log):    # the rotated copy first (logcopy.LogSink, 64 MiB each)
        if not part.exists():
            continue
        with open(part, errors="replace") as f:
            for line in f:
                line = line.rstrip("\n")
                m = MARKER.match(line)
                if m:
                    current[m.group(1)] = int(m.group(2))
                head = LINE.match(line)
                if sel.keeps(line, current.get(head.group(1)) if head else None):
                    out.append(line)
    return list(out)


def stop_note(job, lines: list[str], when: str | None = None) -> str | None:
    """The line ``logs`` adds after the output of a job a user stopped, when that output shows torchrun's answer
    to the stop's SIGTERM: ``torch.distributed.elastic.multiprocessing.api.SignalException: Process N got signal:
    15`` and its traceback, which read like a crash at the end of a normal stop. None otherwise."""
    if str(job.state) != "STOPPED" or not any("SignalException" in line for line in lines):
        return None
    return (f"clusterctl: job {job.job_id} was stopped by `clusterctl stop`{f' at {when}' if when else ''}: its "
            "ranks got SIGTERM, and torchrun's SignalException traceback above is how it reports that, not a "
            "failure")
