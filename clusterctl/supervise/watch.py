"""What the controller hears from the nodes between probes: each node's watch and its log follower.

A node's **watch** is a node-side script (``runtimes.WATCH``) printing a line a second over the node's kept
connection, and one at once (within 0.5 s) when what it says changes: ``1`` while the attempt's main process
lives, ``0`` once it is gone, and the newest checkpoint step it sees, then the views of the node's ranks
(clusterctl/rankview.py: each rank's file, TAB-separated). ``Watches`` keeps, per node, what those lines said
(``Watch``: when the last one came, alive, when the process was first seen gone, the checkpoint step, each rank's
``RankView`` and when its file last changed)
and how long the node may stay silent (``heartbeat.Arrivals``); ``heard`` turns that into an ``Observation``
without a remote command (``observe.heard``).

A node's **log follower** streams the node's whole log into the controller's copy (a ``Sink``:
``store.logcopy.LogSink``) on every (re)connect; the sink drops what it already holds. ``progress`` says whether a node wrote a line since
the last time it was asked.

Every stream runs on one ``StreamMux`` (made on first use). The commands and the connections are the caller's
(``ClusterOps``): a watch or follower gets its argv and an ``open_stream(node, argv)``. Times come from ``now``
(``time.monotonic`` unless a test passes a fake clock) and the mux is made by ``mux`` (a test passes a fake one and
feeds the lines itself: no thread, no sleep).
"""
from __future__ import annotations

import json
import re
import threading
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, Sequence

from clusterctl.model.ranks import RankView
from clusterctl.model.verdicts import Observation
from clusterctl.supervise.heartbeat import Arrivals
from clusterctl.supervise.observe import heard
from clusterctl.transport.streams import OpenStream, StreamMux


SILENCE_EPSILON_S = 0.02    # a round woken for a node's silence comes this long after it passed the limit
MAX_WATCH_LINE = 1 << 20    # bytes of one watch line (its ranks' views: ~1-2 KB each) kept while its end is awaited
_RANK = re.compile(rb'"rank":\s*(-?[0-9]+)')


class Handle(Protocol):
    """A stream kept open by a ``Mux`` (``streams.Stream``)."""

    def stop(self) -> None: ...


class Mux(Protocol):
    """Keeps streams open (``streams.StreamMux``)."""

    def add(self, name: str, opener: Callable[[], OpenStream], on_data: Callable[[bytes], None], *,
            on_end: Callable[[BaseException | None], None] | None = None, retry_s: float = 0.5,
            before_reopen: Callable[[], None] | None = None, poll: bool = False) -> Handle: ...

    def flush(self, streams: Sequence[Handle], timeout: float = 2.0) -> bool: ...

    def close(self) -> None: ...


class Sink(Protocol):
    """The controller's copy of the nodes' output (``store.logcopy.LogSink``)."""

    def begin(self, node: str, attempt: int) -> int: ...

    def restart(self, node: str) -> None: ...

    def feed(self, node: str, data: bytes) -> None: ...

    def lines(self, node: str) -> int: ...


@dataclass
class Watch:
    """What one node's watch of one attempt has heard (``observe.WatchState``)."""

    attempt: int
    stop: threading.Event = field(default_factory=threading.Event)
    last: float | None = None       # ``now()`` of the last line; None before the first
    alive: bool = False             # the attempt's main process (container init / bare runner) is alive
    gone_at: float | None = None    # ``now()`` of the first "gone" line after it was seen alive
    checkpoint_step: int | None = None   # newest step directory with a manifest (or DCP .metadata) it saw
    stream: Handle | None = None
    node: str = ""
    ranks: dict[int, RankView] = field(default_factory=dict)   # the ranks' views of the last line that had them
    answered: dict[int, float] = field(default_factory=dict)   # per rank: ``now()`` when its file last changed
    raw: dict[int, bytes] = field(default_factory=dict)        # per rank: its file's line as last heard
    partial: bytes = b""            # the start of a line whose end has not come yet

    def rank_views(self, now: float) -> dict[int, RankView]:
        """The ranks' views with ``answered_age_s`` (seconds since each file last changed) as of ``now``."""
        ranks, answered = self.ranks, self.answered
        return {r: replace(v, answered_age_s=max(0.0, now - answered.get(r, now))) for r, v in ranks.items()}

    def halt(self) -> None:
        self.stop.set()
        if self.stream is not None:
            self.stream.stop()


@dataclass
class Follower:
    stream: Handle | None
    stop: threading.Event
    last_seen: int = 0              # the sink's line count for the node when progress was last asked

    def halt(self) -> None:
        self.stop.set()
        if self.stream is not None:
            self.stream.stop()


class Watches:
    """Every node's watch and log follower. ``open_stream(node, argv)``: start ``argv`` on the node (over its kept
    connection); ``drop(node)``: forget that connection (a stream that failed: the next open reconnects)."""

    def __init__(self, sink: Sink, *, open_stream: Callable[[str, Sequence[str]], OpenStream],
                 drop: Callable[[str], None], heartbeat_timeout_s: float,
                 now: Callable[[], float] = time.monotonic, mux: Callable[[], Mux] = StreamMux):
        self.sink, self.now = sink, now
        self._open_stream, self._drop, self._make_mux = open_stream, drop, mux
        self.heartbeat_timeout_s = heartbeat_timeout_s
        self._lock = threading.Lock()
        self._mux: Mux | None = None           # every watch and log follower, on one selector thread
        self._watches: dict[str, Watch] = {}
        self._followers: dict[str, Follower] = {}
        self._arrivals: dict[str, Arrivals] = {}   # per node, across attempts: the gaps between its watch lines
        self.changed = threading.Event()      # set when a watched process ends: probe now, not after the interval

    def _streams(self) -> Mux:
        with self._lock:
            if self._mux is None:
                self._mux = self._make_mux()
            return self._mux

    # -------------------------------------------------------------------------------------------- watches
    def watch(self, attempt: int, node: str, argv: Callable[[], Sequence[str] | None]) -> Watch:
        """The node's watch for ``attempt`` (started on first use with ``argv()``, when that is not None; a new
        attempt replaces the old one)."""
        w = self._watches.get(node)
        if w is not None and w.attempt == attempt:
            return w
        if w is not None:
            w.halt()
        w = self._watches[node] = Watch(attempt, node=node)
        arrivals = self._arrivals.setdefault(node, Arrivals(self.heartbeat_timeout_s))
        arrivals.restart()
        command = argv()

        def on_end(error: BaseException | None) -> None:
            if error is not None:     # a dead watch would read as a silent node: reconnect, go on
                self._drop(node)

        if command:
            w.stream = self._streams().add(f"watch-{node}", lambda: self._open_stream(node, command),
                                           lambda data: self.line(w, arrivals, data), on_end=on_end, retry_s=0.5)
        return w

    def line(self, w: Watch, arrivals: Arrivals, data: bytes) -> None:
        """Output of a watch: its last whole line is ``ALIVE [STEP]``, then the ranks' views, each after a TAB
        (``runtimes.WATCH``; a line without them is valid). A line cut by the stream waits for its end."""
        data = w.partial + data
        head, _, w.partial = data.rpartition(b"\n")
        if len(w.partial) > MAX_WATCH_LINE:     # no end in sight: dropped (its end then reads as junk)
            w.partial = b""
        if not head:
            return
        parts = head.rsplit(b"\n", 1)[-1].split(b"\t")
        fields = parts[0].split()
        if not fields or fields[0] not in (b"0", b"1"):
            return           # not a watch line (the tail of a line cut when its stream was reopened)
        alive, now = fields[0] == b"1", self.now()
        arrivals.arrived(now)
        self._ranks(w, parts[1:], now)      # none: no rank file (yet, or any more)
        if w.alive and not alive:
            w.gone_at = now
            self.changed.set()
        w.alive, w.last = alive, now
        step = int(fields[1]) if len(fields) > 1 and fields[1].isdigit() else None
        if step is not None and step != w.checkpoint_step:
            w.checkpoint_step = step
            self.changed.set()    # a new checkpoint: the supervisor records it now, not rounds later

    @staticmethod
    def _ranks(w: Watch, lines: Sequence[bytes], now: float) -> None:
        """The ranks' views of a watch line (a file that did not change keeps its view and its answer time; a rank
        whose file is gone or unreadable is left out). New dicts, swapped in whole: the supervisor's thread reads
        them while the streams' thread writes."""
        raw, ranks, answered = {}, {}, {}
        for line in lines:
            m = _RANK.search(line)
            if m is None:
                continue
            rank = int(m.group(1))
            if w.raw.get(rank) == line:
                raw[rank], ranks[rank], answered[rank] = line, w.ranks[rank], w.answered[rank]
                continue
            try:
                view = RankView.from_json(json.loads(line), node=w.node)
            except ValueError:
                continue
            old = w.ranks.get(rank)    # the same file with the node's fresh look at the process ("os"): no answer
            same = old is not None and (old.n, old.pid) == (view.n, view.pid) and rank in w.answered
            raw[rank], ranks[rank], answered[rank] = line, view, w.answered[rank] if same else now
        w.raw, w.answered, w.ranks = raw, answered, ranks

    def rank_views(self, node: str) -> dict[int, RankView]:
        """What the node's watch last heard of its ranks (``Watch.rank_views``; empty before a line had them)."""
        w = self._watches.get(node)
        return w.rank_views(self.now()) if w is not None else {}

    def get(self, node: str) -> Watch | None:
        return self._watches.get(node)

    def snapshot(self) -> dict[str, Watch]:
        """Every node's current watch."""
        return dict(self._watches)

    def limit(self, node: str) -> float:
        """Seconds of silence after which ``node`` counts as one failed probe (its own jitter, see heartbeat)."""
        a = self._arrivals.get(node)
        return a.limit() if a is not None else self.heartbeat_timeout_s

    def heard(self, node: str) -> Observation | None:
        """What the node's watch alone says (``observe.heard``): unreachable, running (with ``progress``), or None
        (probe the node: no watch line yet, or its process ended)."""
        w = self._watches.get(node)
        if w is None or w.last is None:
            return None
        o = heard(node, w, limit=self.limit(node), now=self.now())
        return replace(o, progress=self.progress(node)) if o is not None and o.state == "running" else o

    def checkpoint_hint(self) -> int | None:
        """The newest checkpoint step any watch has seen on the shared storage (cheap, unverified)."""
        steps = [w.checkpoint_step for w in self._watches.values() if w.checkpoint_step is not None]
        return max(steps) if steps else None

    def keep(self, nodes: Sequence[str]) -> None:
        """Stop the watches of every node not in ``nodes`` (left out of a new attempt)."""
        keep = set(nodes)
        self.stop([n for n in self._watches if n not in keep])

    def stop(self, nodes: Sequence[str]) -> None:
        for n in nodes:
            w = self._watches.pop(n, None)
            if w is not None:
                w.halt()

    def wait_for_change(self, seconds: float) -> bool:
        """Sleep up to ``seconds``; wake early when a watched process ends (or a new checkpoint shows): True then.
        Also wake (False) just after a node's silence passes its limit, so that the round which counts its first
        failed probe comes then, not up to ``seconds`` later; the next failed probe still comes a full round after
        it (``probe_failures`` rounds apart, as before): a node is lost after silence limit + (K-1) x interval."""
        now = self.now()
        due = [w.last + self.limit(n) - now for n, w in list(self._watches.items()) if w.last is not None]
        changed = self.changed.wait(min([seconds, *(d + SILENCE_EPSILON_S for d in due if d >= 0)]))
        self.changed.clear()
        return changed

    # -------------------------------------------------------------------------------------------- logs
    def follow(self, attempt: int, node: str, argv: Sequence[str]) -> Follower:
        """Copy the node's log of ``attempt`` (``argv`` streams it whole) into the sink. Every (re)connect streams
        the whole log and the sink drops the lines it already holds: nothing is lost while a link is down, nothing
        is copied twice (a re-attached supervisor continues the section a dead one started)."""
        self.stop_followers([node])
        stop = threading.Event()
        self.sink.begin(node, attempt)

        def on_data(data: bytes) -> None:
            if not stop.is_set():     # a stream being torn down must not write into the next attempt's section
                self.sink.feed(node, data)

        def on_end(error: BaseException | None) -> None:
            if error is not None:
                self._drop(node)

        f = self._followers[node] = Follower(None, stop, last_seen=self.sink.lines(node))
        f.stream = self._streams().add(f"logs-{node}", lambda: self._open_stream(node, argv), on_data,
                                       on_end=on_end, retry_s=1.0, before_reopen=lambda: self.sink.restart(node),
                                       poll=True)     # read once a second: a log line need not wake anyone
        return f

    def progress(self, node: str) -> bool:
        """New log output from the node since the last time this was asked."""
        f = self._followers.get(node)
        if f is None:
            return False
        seen, f.last_seen = f.last_seen, self.sink.lines(node)
        return f.last_seen != seen

    def stop_followers(self, nodes: Sequence[str] | None = None) -> None:
        """Stop the nodes' log followers, after what they hold now reached the sink (they are polled)."""
        gone = [self._followers.pop(n, None) for n in list(self._followers if nodes is None else nodes)]
        followers = [f for f in gone if f is not None]
        streams = [f.stream for f in followers if f.stream is not None]
        if streams and self._mux is not None:
            self._mux.flush(streams)
        for f in followers:
            f.halt()

    def close(self) -> None:
        """Stop every watch and follower, and the mux."""
        self.stop_followers()
        self.stop(list(self._watches))
        with self._lock:
            mux, self._mux = self._mux, None
        if mux is not None:
            mux.close()
