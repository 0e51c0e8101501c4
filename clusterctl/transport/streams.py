"""Every long-lived stream of the controller (the nodes' watches and log followers) on one selector thread.

A thread per stream costs two threads per node (plus paramiko's one per connection): 8,000 threads at 4,096
nodes, each waking up for every watch line. Here one thread selects over all the streams' file descriptors
and calls each stream's ``on_data`` as its output arrives; opening a stream (which may connect over SSH and wait
for the exec request) runs on a small bounded pool, never on the selector thread.

A stream is kept open until it is stopped: when it ends (EOF, a lost connection) ``on_end(error)`` is called,
and after ``retry_s`` it is opened again (``before_reopen()`` first), as the per-stream threads did.

A stream added with ``poll=True`` (the log followers) is not selected on: the loop reads every polled stream
once per ``poll_s`` (1 s), whatever came meanwhile in one piece. Read as it arrives, every SSH packet (a log
line, as a rank prints it) costs a wake of this thread, a channel read (~60 us of CPU on the testbed machine) and a
byte paramiko writes to the channel's pipe (``fileno()``; a polled channel never gets one). Polled, a node costs
a read a second however fast it prints: at 2 lines/s 40 us per line instead of 60-70; at 50 lines/s one read
instead of 50 (issue 15). Every 0.5 s would not pay at 2 lines/s (as many reads, and empty ones). A watch is
selected on: a process end must wake the supervisor at once. ``flush(streams)`` reads polled streams now (before
a stop, so that the last lines of an attempt are not left in a buffer).

Transports with ``open_stream(argv)`` (SSH) hand over their channel; any other ``Transport`` is adapted with
``ThreadedStream`` (its blocking ``stream`` on a thread of its own, its output passed on through a pipe).
"""
from __future__ import annotations

import heapq
import itertools
import os
import selectors
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Callable, Protocol, Sequence


class OpenStream(Protocol):
    """A started long-lived command. ``read()``: its output (``b""`` once it ended, ``None`` when nothing is
    there now); a lost connection raises ``TransportError``. ``fileno()`` is readable when ``read`` has an
    answer."""

    def fileno(self) -> int: ...

    def read(self) -> bytes | None: ...

    def close(self) -> None: ...


class ThreadedStream:
    """``transport.stream(argv, ...)`` on its own thread, as an ``OpenStream`` (transports without
    ``open_stream``: the local transport, tests' fakes)."""

    def __init__(self, transport, argv: Sequence[str]):
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._chunks: deque[bytes] = deque()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        self._ended = False
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(transport, list(argv)), daemon=True,
                                        name=f"stream-{getattr(transport.host, 'name', '?')}")
        self._thread.start()

    def _run(self, transport, argv) -> None:
        try:
            transport.stream(argv, self._feed, self._stop)
        except BaseException as e:  # noqa: BLE001 - handed to the reader
            self._error = e
        self._ended = True
        self._poke()

    def _feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._poke()

    def _poke(self) -> None:
        with self._lock:             # never into a closed fd (its number may belong to another file by now)
            if self._closed:
                return
            try:
                os.write(self._w, b"x")
            except OSError:
                pass

    def fileno(self) -> int:
        return self._r

    def read(self) -> bytes | None:
        try:
            os.read(self._r, 65536)
        except (BlockingIOError, OSError):
            pass
        if self._chunks:
            out = []
            while self._chunks:
                out.append(self._chunks.popleft())
            if self._ended:
                self._poke()          # the end is still to be read: keep the fd readable for the next select
            return b"".join(out)
        if self._ended:
            if self._error is not None:
                raise self._error
            return b""
        return None

    def close(self) -> None:
        self._stop.set()
        with self._lock:
            if self._closed:
                return
            self._closed = True
            os.close(self._r)
            os.close(self._w)


def open_stream(transport, argv: Sequence[str]) -> OpenStream:
    """The transport's own ``open_stream`` when it has one, else ``ThreadedStream``."""
    native = getattr(transport, "open_stream", None)
    return native(argv) if native is not None else ThreadedStream(transport, argv)


@dataclass(eq=False)
class Stream:
    """A stream kept open by ``StreamMux``; ``stop()`` ends it for good."""

    name: str
    opener: Callable[[], OpenStream]
    on_data: Callable[[bytes], None]
    on_end: Callable[[BaseException | None], None]
    retry_s: float
    before_reopen: Callable[[], None] | None
    mux: "StreamMux" = field(repr=False)
    handle: OpenStream | None = None
    stopped: bool = False
    opens: int = 0
    poll: bool = False       # read every ``StreamMux.poll_s``, not when readable

    def stop(self) -> None:
        self.stopped = True
        self.mux._post(("stop", self))


class StreamMux:
    """One selector thread for many streams; opens on a pool of ``open_workers`` threads."""

    def __init__(self, *, open_workers: int = 16, poll_s: float = 1.0, clock: Callable[[], float] = time.monotonic):
        self.clock, self.poll_s = clock, poll_s
        self._polled: set[Stream] = set()      # open streams read every poll_s
        self._next_poll = 0.0
        self._sel = selectors.DefaultSelector()
        self._wake_r, self._wake_w = os.pipe()
        os.set_blocking(self._wake_r, False)
        os.set_blocking(self._wake_w, False)
        self._sel.register(self._wake_r, selectors.EVENT_READ, None)
        self._inbox: deque = deque()
        self._timers: list[tuple[float, int, Stream]] = []
        self._seq = itertools.count()
        self._pool = ThreadPoolExecutor(max_workers=open_workers, thread_name_prefix="stream-open")
        self._closed = False
        self._thread = threading.Thread(target=self._loop, daemon=True, name="streams")
        self._thread.start()

    def add(self, name: str, opener: Callable[[], OpenStream], on_data: Callable[[bytes], None], *,
            on_end: Callable[[BaseException | None], None] | None = None, retry_s: float = 0.5,
            before_reopen: Callable[[], None] | None = None, poll: bool = False) -> Stream:
        """Open ``opener()`` now and keep it open until ``stop()``: ``on_data`` (on the selector thread) for its
        output, ``on_end(error)`` when it ends, reopened ``retry_s`` later (after ``before_reopen()``).
        ``poll``: read it every ``poll_s`` rather than as its output arrives."""
        s = Stream(name, opener, on_data, on_end or (lambda e: None), retry_s, before_reopen, self, poll=poll)
        self._post(("open", s))
        return s

    def flush(self, streams: Sequence[Stream], timeout: float = 2.0) -> bool:
        """Pass what the polled ``streams`` hold now to their ``on_data`` before returning (False: the loop did
        not get to it within ``timeout``)."""
        if not any(s.poll for s in streams):
            return True
        done = threading.Event()
        if threading.current_thread() is self._thread:
            self._flush(streams, done)
        else:
            self._post(("flush", (streams, done)))
        return done.wait(timeout)

    def _flush(self, streams: Sequence[Stream], done: threading.Event) -> None:
        for s in streams:
            if s in self._polled:
                self._drain(s)
        done.set()

    def close(self) -> None:
        self._closed = True
        self._post(("close", None))
        self._thread.join(5)
        self._pool.shutdown(wait=False, cancel_futures=True)

    # ------------------------------------------------------------------------------------ selector thread
    def _post(self, msg) -> None:
        self._inbox.append(msg)
        try:
            os.write(self._wake_w, b"x")
        except (BlockingIOError, OSError):
            pass            # the pipe is full (the loop is behind) or closed: the loop will see the inbox anyway

    def _open(self, s: Stream) -> None:
        """On the pool: open, then hand the stream to the selector thread."""
        if s.stopped:
            return
        if s.opens and s.before_reopen is not None:
            s.before_reopen()
        s.opens += 1
        try:
            handle = s.opener()
        except BaseException as e:  # noqa: BLE001 - ended before it started: tried again later
            self._post(("failed", (s, e)))
            return
        self._post(("opened", (s, handle)))

    def _end(self, s: Stream, error: BaseException | None) -> None:
        h, s.handle = s.handle, None
        if h is not None:
            if s.poll:
                self._polled.discard(s)
            else:
                try:
                    self._sel.unregister(h)
                except (KeyError, ValueError, OSError):
                    pass
            try:
                h.close()
            except Exception:  # noqa: BLE001 - closing a dead stream may fail in any way
                pass
        if s.stopped:
            return
        try:
            s.on_end(error)
        except Exception:  # noqa: BLE001 - a callback must not kill every stream
            pass
        heapq.heappush(self._timers, (self.clock() + s.retry_s, next(self._seq), s))

    def _handle_inbox(self) -> bool:
        try:
            while os.read(self._wake_r, 65536):
                pass
        except (BlockingIOError, OSError):
            pass
        while self._inbox:
            verb, arg = self._inbox.popleft()
            if verb == "close":
                return False
            if verb == "open":
                self._pool.submit(self._open, arg)
            elif verb == "stop":
                if arg.handle is not None:
                    self._end(arg, None)
            elif verb == "flush":
                self._flush(*arg)
            elif verb == "opened":
                s, handle = arg
                s.handle = handle
                if s.stopped:
                    self._end(s, None)
                    continue
                if s.poll:
                    if not self._polled:
                        self._next_poll = self.clock() + self.poll_s
                    self._polled.add(s)
                else:
                    try:
                        self._sel.register(handle, selectors.EVENT_READ, s)
                    except (ValueError, OSError) as e:
                        self._end(s, e)
                        continue
                self._read(s)        # output that came with the start
            elif verb == "failed":
                s, e = arg
                self._end(s, e)
        return True

    def _read(self, s: Stream) -> bool:
        """One read of ``s``; True when it passed output on."""
        try:
            data = s.handle.read()
        except BaseException as e:  # noqa: BLE001 - a lost connection: reopened later
            self._end(s, e)
            return False
        if data is None:
            return False
        if not data:
            self._end(s, None)
            return False
        if not s.stopped:
            try:
                s.on_data(data)
            except Exception:  # noqa: BLE001 - a callback must not kill every stream
                pass
        return True

    def _drain(self, s: Stream, reads: int = 64) -> None:
        """Read ``s`` until it has nothing now (at most ``reads`` times: a stream that keeps writing cannot hold
        the loop; the rest comes at the next poll)."""
        for _ in range(reads):
            if s.handle is None or not self._read(s):
                return

    def _loop(self) -> None:
        while not self._closed:
            timeout = None
            if self._timers:
                timeout = max(0.0, self._timers[0][0] - self.clock())
            if self._polled:
                due = max(0.0, self._next_poll - self.clock())
                timeout = due if timeout is None else min(timeout, due)
            for key, _ in self._sel.select(timeout):
                if key.data is None:
                    if not self._handle_inbox():
                        self._shutdown()
                        return
                elif key.data.handle is not None and key.data.handle is key.fileobj:
                    self._read(key.data)
            if self._inbox and not self._handle_inbox():
                self._shutdown()
                return
            now = self.clock()
            if self._polled and now >= self._next_poll:
                for s in list(self._polled):
                    self._drain(s)
                self._next_poll = now + self.poll_s
            while self._timers and self._timers[0][0] <= now:
                _, _, s = heapq.heappop(self._timers)
                if not s.stopped:
                    self._pool.submit(self._open, s)
        self._shutdown()

    def _shutdown(self) -> None:
        for s in [key.data for key in self._sel.get_map().values() if key.data is not None] + list(self._polled):
            s.stopped = True
            self._end(s, None)
        self._sel.close()
        for fd in (self._wake_r, self._wake_w):
            try:
                os.close(fd)
            except OSError:
                pass
