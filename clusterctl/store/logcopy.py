"""The controller's copy of every node's output (``LogSink``): ``<state dir>/jobs/<job_id>/output.log``, lines as
``[node/rank] text``, one section per node and attempt, bounded (rotated to ``output.log.1``, a reserve left free for
the state database). Written by the supervisor's log followers (``supervise.watch``), read by ``views.logs``."""
from __future__ import annotations

import errno
import os
import re
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Callable, Sequence

from clusterctl.store import paths

RANK_PREFIX = re.compile(rb"^\[(\d+)\]:")
MAX_LINE = 64 << 10   # LogSink: output without a newline is written in pieces of this size, not buffered
MAX_LOG_BYTES = 64 << 20   # LogSink: output.log is rotated to output.log.1 at this size (at most 2 x 64 MiB)


class LogSink:
    """The controller's copy of every node's output: ``[node/rank] line`` in one file (0600, never through a
    symlink). A line longer than ``MAX_LINE`` is cut into pieces (memory and copying stay bounded).

    Each node's output of an attempt is a section that starts with ``[node/-] === attempt N ===``. A node's log is
    always streamed from its first line; ``begin``/``restart`` make the sink drop the lines it already holds, so a
    reconnect or a re-attached supervisor (``resume``) neither loses nor repeats a line. What is dropped is counted
    per rank (``-``: torchrun's own lines): a runtime that merges stdout and stderr (``podman logs``) may interleave
    the ranks differently on each read, but keeps each rank's lines in order."""

    MARKER = "=== attempt {} ==="

    def __init__(self, path: Path, echo: Callable[[str], None] | None = None, max_bytes: int = MAX_LOG_BYTES,
                 clock: Callable[[], float] = time.monotonic):
        self.path, self.echo, self.max_bytes, self.clock = path, echo, max_bytes, clock
        self._size = 0
        self.trouble: OSError | None = None  # the last write that failed (a full disk): said in the log, lines dropped
        self.dropped = 0
        self._trouble_said = -1e18
        self._room_checked, self._room = -1e18, 0
        self.lock = threading.Lock()
        self._fd: int | None = None          # kept open (O_APPEND): not an open + close per chunk of output
        # node -> attempt -> lines per rank of that section in the file, and node -> attempt of its open section:
        # read from the file once, then kept up to date (a scan of the whole file per node and attempt start was
        # O(N x log))
        self._sections: dict[str, dict[int, Counter[str]]] | None = None
        self._current: dict[str, int] = {}
        self.partial: dict[str, bytes] = {}
        self.copied: dict[str, Counter[str]] = {}   # lines per rank of the node's current section in the file
        self._skip: dict[str, Counter[str]] = {}    # lines per rank of the stream now starting the file holds
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        os.close(paths.open_private(path))

    def lines(self, node: str) -> int:
        """Lines of ``node``'s ranks (not torchrun's own, ``-``) in its current section copied so far: what counts
        as a node's progress (``watch.Watches.progress``; the agent's start-up lines are not the job's)."""
        with self.lock:
            return sum(n for rank, n in self.copied.get(node, Counter()).items() if rank != "-")

    def ranks(self, node: str) -> int:
        """How many of ``node``'s ranks have a line in its current section (an attempt's start-up: ranks started)."""
        with self.lock:
            return sum(1 for rank, n in self.copied.get(node, Counter()).items() if rank != "-" and n)

    def begin(self, node: str, attempt: int) -> int:
        """Open (or continue) ``node``'s section of ``attempt``; returns the lines it already holds."""
        held = self.section_lines(node, attempt)
        with self.lock:
            self.copied[node] = held or Counter()
        if held is None:
            self.write(node, [self.MARKER.format(attempt).encode()], count=False)
        with self.lock:
            self._index().setdefault(node, {}).setdefault(attempt, Counter())
            self._current[node] = attempt
        self.restart(node)
        return sum((held or Counter()).values())

    def restart(self, node: str) -> None:
        """A new stream of ``node``'s whole log starts: skip what the file holds, forget a partial line."""
        with self.lock:
            self._skip[node] = Counter(self.copied.get(node, Counter()))
            self.partial[node] = b""

    def section_lines(self, node: str, attempt: int) -> Counter[str] | None:
        """Lines per rank of ``node``'s section of ``attempt`` in the file (None: no such section)."""
        with self.lock:
            held = self._index().get(node, {}).get(attempt)
            return None if held is None else Counter(held)

    _LINE = re.compile(r"^\[(.*?)/(\d+|-)\] ")
    _MARK = re.compile(r"^=== attempt (\d+) ===$")

    def _index(self) -> dict[str, dict[int, Counter[str]]]:
        """The sections of the file, lines per rank (read once; the caller holds the lock)."""
        if self._sections is None:
            sections: dict[str, dict[int, Counter[str]]] = {}
            current: dict[str, int] = {}
            try:
                with open(self.path, errors="replace") as f:
                    for line in f:
                        m = self._LINE.match(line)
                        if not m:
                            continue
                        node = m.group(1)
                        mark = self._MARK.match(line[m.end():].rstrip("\n")) if m.group(2) == "-" else None
                        if mark:
                            current[node] = int(mark.group(1))
                            sections.setdefault(node, {})[current[node]] = Counter()
                        elif node in current:
                            sections[node][current[node]][m.group(2)] += 1
            except OSError:
                pass
            self._sections, self._current = sections, current
        return self._sections

    def feed(self, node: str, data: bytes) -> None:
        """A piece of ``node``'s stream: its complete lines are written, the rest waits for the next piece."""
        buf = self.partial.pop(node, b"") + data
        *lines, rest = buf.split(b"\n")
        while len(rest) > MAX_LINE:
            lines.append(rest[:MAX_LINE])
            rest = rest[MAX_LINE:]
        self.partial[node] = rest
        skip = self._skip.get(node)
        if skip:
            kept = []
            for line in lines:
                rank = _rank(line)
                if skip[rank] > 0:
                    skip[rank] -= 1
                    if not skip[rank]:
                        del skip[rank]      # an empty Counter: later pieces take the fast path
                else:
                    kept.append(line)
            lines = kept
        self.write(node, lines)

    def write(self, node: str, lines: Sequence[bytes], *, count: bool = True) -> None:
        """``lines`` (without their newlines) as ``[node/rank] text``: the ``[R]:`` prefix that torchrun's
        ``--tee`` puts on a rank's lines becomes the rank (``-`` for a line without one), the text is decoded
        (invalid UTF-8 replaced) and its trailing whitespace dropped. The piece is decoded at once and each line
        handled with str methods only, no regex match or decode per line (15-35 % less CPU per line at 25-200
        lines per piece, what a coalesced node sends); the bytes are those of a line-by-line ``RANK_PREFIX``
        match (tests/unit/supervise/test_log_sink.py compares them)."""
        if not lines:
            return
        dash = f"[{node}/-] "
        out, ranks = [], []
        # b"\n" is never part of a multi-byte sequence: decoding the joined lines replaces what decoding each would
        for line in b"\n".join(lines).decode(errors="replace").split("\n"):
            if line[:1] == "[":
                i = line.find("]:")
                rank = line[1:i]
                if i > 1 and rank.isdigit() and rank.isascii():     # RANK_PREFIX's \d on bytes: [0-9] only
                    out.append(f"[{node}/{rank}] {line[i + 2:].rstrip()}")
                    ranks.append(rank)
                    continue
            out.append(dash + line.rstrip())
            ranks.append("-")
        data = ("\n".join(out) + "\n").encode()
        with self.lock:
            try:
                self._append(data)
            except OSError as e:       # ENOSPC, EIO: never silent, never fatal: the lines are counted as dropped
                self._failed(e, len(out))
                return
            if count and node in self._current and self._sections is not None:
                self._sections[node][self._current[node]].update(ranks)
            if count:
                self.copied.setdefault(node, Counter()).update(ranks)
        if self.echo:
            for line in out:
                self.echo(line)

    def _append(self, data: bytes) -> None:
        """Write ``data`` whole (the caller holds the lock); at ``max_bytes`` the file is rotated first:
        ``output.log`` -> ``output.log.1`` (the one before is dropped), a new ``output.log`` begins."""
        if self._fd is None:
            self._fd = paths.open_private(self.path)
            self._size = os.fstat(self._fd).st_size
        now = self.clock()
        if now >= self._room_checked + 1.0:     # once a second: the state DB beside the copy keeps its room
            self._room_checked = now
            st = os.statvfs(self.path.parent)
            self._room = st.f_bavail * st.f_frsize - reserve(st.f_blocks * st.f_frsize)
        self._room -= len(data)
        if self._room < 0:
            raise OSError(errno.ENOSPC, "kept free for the state database (the file system is nearly full)")
        if self._size and self._size + len(data) > self.max_bytes:
            os.close(self._fd)
            self._fd = None
            os.replace(self.path, rotated(self.path))
            self._fd = paths.open_private(self.path)
            self._size = 0
        while data:
            n = os.write(self._fd, data)
            data = data[n:]
            self._size += n
        if self.trouble is not None:
            print(f"clusterctl: the log copy {self.path} is written again ({self.dropped} lines were dropped)",
                  file=sys.stderr, flush=True)
            self.trouble, self.dropped = None, 0

    def _failed(self, error: OSError, lines: int) -> None:
        self.trouble = error
        self.dropped += lines
        now = self.clock()
        if now - self._trouble_said >= 60:
            self._trouble_said = now
            print(f"clusterctl: cannot write the log copy {self.path}: {error.strerror or error} "
                  f"({self.dropped} lines dropped so far; the nodes keep their own logs: `clusterctl logs` "
                  "completes the copy from them once there is room)", file=sys.stderr, flush=True)

    def close(self) -> None:
        with self.lock:
            fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def reserve(fs_size: int) -> int:
    """Bytes of the state dir's file system the log copy leaves free for the state database: 10 % of it, at least
    256 KiB and at most 64 MiB (a chatty job must not starve the job's own records)."""
    return max(256 << 10, min(64 << 20, fs_size // 10))


def rotated(path: Path) -> Path:
    """Where ``LogSink`` keeps the copy's previous ``MAX_LOG_BYTES`` (``output.log.1``)."""
    return path.with_name(path.name + ".1")


def _rank(line: bytes) -> str:
    m = RANK_PREFIX.match(line)
    return m.group(1).decode() if m else "-"
