"""What keeps the supervisor's cost per node flat (issue 15): one selector thread for every stream, node rows
written only when they change, the heartbeat fit cached, fan_out without a scan of every host per result."""
from __future__ import annotations

import math
import random
import socket
import statistics
import threading
import time

from clusterctl.supervise import heartbeat
from clusterctl.supervise.heartbeat import Arrivals
from clusterctl.transport import fan_out
from clusterctl.transport.streams import StreamMux, ThreadedStream, open_stream


def wait_for(pred, timeout=5.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return True
        time.sleep(0.01)
    return False


class SockStream:
    """An ``OpenStream`` over one end of a socketpair (the test writes the other end)."""

    def __init__(self, sock):
        self.sock = sock
        sock.setblocking(False)
        self.closed = False

    def fileno(self):
        return self.sock.fileno()

    def read(self):
        try:
            return self.sock.recv(65536)
        except BlockingIOError:
            return None

    def close(self):
        self.closed = True
        self.sock.close()


# ------------------------------------------------------------------------------------------ StreamMux
def test_many_streams_share_one_thread_and_each_keeps_its_order():
    mux = StreamMux(open_workers=4)
    peers, got = [], {}
    try:
        before = threading.active_count()
        for i in range(200):
            a, b = socket.socketpair()
            peers.append(a)
            got[i] = []
            mux.add(f"s{i}", lambda b=b: SockStream(b), got[i].append)
        assert wait_for(lambda: all(p.send(b"x") for p in peers[:1]))
        for k in range(20):
            for p in peers:
                p.send(b"%d\n" % k)
        assert wait_for(lambda: all(b"".join(v).count(b"\n") == 20 for v in got.values()))
        assert all(b"".join(v) == b"x" * (i == 0) + b"".join(b"%d\n" % k for k in range(20))
                   for i, v in got.items())
        assert threading.active_count() - before <= 4 + 1      # the open pool, not a thread per stream
    finally:
        mux.close()
        for p in peers:
            p.close()


def test_an_ended_stream_is_reopened_after_retry_s_and_before_reopen_runs_first():
    mux = StreamMux()
    opened, ends, events = [], [], []

    def opener():
        a, b = socket.socketpair()
        opened.append(a)
        events.append("open")
        return SockStream(b)

    try:
        s = mux.add("w", opener, lambda d: None, on_end=ends.append, retry_s=0.05,
                    before_reopen=lambda: events.append("before"))
        assert wait_for(lambda: len(opened) == 1)
        opened[0].close()                                # the remote command ended (EOF)
        assert wait_for(lambda: len(opened) == 2)
        assert ends == [None] and events == ["open", "before", "open"]
        s.stop()
        time.sleep(0.2)
        assert len(opened) == 2                          # stopped: not reopened
    finally:
        mux.close()


def test_a_failing_open_or_read_is_reported_and_retried():
    mux = StreamMux()
    tries, ends, peers = [], [], []

    def opener():
        tries.append(1)
        if len(tries) < 3:
            raise ConnectionError("node down")
        a, b = socket.socketpair()
        peers.append(a)                  # kept open: the stream stays up
        return SockStream(b)

    try:
        s = mux.add("w", opener, lambda d: None, on_end=ends.append, retry_s=0.02)
        assert wait_for(lambda: len(tries) == 3)
        assert [type(e) for e in ends] == [ConnectionError, ConnectionError]
        s.stop()
    finally:
        mux.close()


def test_a_stopped_stream_is_closed_and_gets_no_more_data():
    mux = StreamMux()
    a, b = socket.socketpair()
    handle, got = SockStream(b), []
    try:
        s = mux.add("w", lambda: handle, got.append)
        a.send(b"1\n")
        assert wait_for(lambda: got == [b"1\n"])
        s.stop()
        assert wait_for(lambda: handle.closed)
    finally:
        mux.close()
        a.close()


class PolledOnly(SockStream):
    """A stream that must never be selected on."""

    def fileno(self):
        raise AssertionError("a polled stream's fileno() was asked for (paramiko would write to a pipe per packet)")


def test_a_polled_stream_is_read_every_poll_s_in_one_piece_and_its_end_is_seen():
    mux = StreamMux(poll_s=0.3)
    a, b = socket.socketpair()
    got, ends, at = [], [], []
    handle = PolledOnly(b)
    try:
        mux.add("logs", lambda: handle, lambda d: (got.append(d), at.append(time.monotonic())),
                on_end=ends.append, retry_s=60, poll=True)
        time.sleep(0.1)                                    # opened (and read once: nothing yet)
        t0 = time.monotonic()
        for k in range(5):
            a.send(b"%d\n" % k)
            time.sleep(0.01)
        assert wait_for(lambda: got)
        assert got == [b"0\n1\n2\n3\n4\n"] and at[0] - t0 <= 0.3 + 0.2   # one read at the next poll
        a.close()                                           # the remote command ended
        assert wait_for(lambda: ends == [None]) and handle.closed
    finally:
        mux.close()


def test_flush_hands_over_what_a_polled_stream_holds_before_it_returns_and_close_ends_polled_streams():
    mux = StreamMux(poll_s=60)                              # no poll would come within the test
    pairs = [socket.socketpair() for _ in range(3)]
    got = {i: [] for i in range(3)}
    handles = [PolledOnly(b) for _, b in pairs]
    try:
        streams = [mux.add(f"l{i}", lambda h=h: h, got[i].append, poll=True) for i, h in enumerate(handles)]
        time.sleep(0.1)
        for i, (a, _) in enumerate(pairs):
            a.send(b"last lines of %d\n" % i)
        time.sleep(0.1)
        assert got == {0: [], 1: [], 2: []}                 # polled: nothing read yet
        assert mux.flush(streams[:2]) is True
        assert got == {0: [b"last lines of 0\n"], 1: [b"last lines of 1\n"], 2: []}
        assert mux.flush([]) is True
    finally:
        mux.close()
        for a, _ in pairs:
            a.close()
    assert all(h.closed for h in handles)


class BlockingTransport:
    """A transport with only the blocking ``stream`` (tests' fakes, the local transport)."""

    class host:
        name = "n1"

    def stream(self, argv, on_data, stop):
        for i in range(3):
            on_data(b"%d\n" % i)
        if argv == ["fail"]:
            raise ConnectionError("lost")


def test_transports_without_open_stream_are_adapted_on_a_thread():
    mux = StreamMux()
    got, ends = [], []
    try:
        mux.add("w", lambda: open_stream(BlockingTransport(), ["ok"]), got.append, on_end=ends.append, retry_s=60)
        assert wait_for(lambda: ends == [None])
        assert b"".join(got) == b"0\n1\n2\n"
        mux.add("f", lambda: open_stream(BlockingTransport(), ["fail"]), lambda d: None, on_end=ends.append,
                retry_s=60)
        assert wait_for(lambda: len(ends) == 2)
        assert isinstance(ends[1], ConnectionError)
    finally:
        mux.close()


def test_threaded_stream_never_writes_into_a_closed_fd():
    s = ThreadedStream(BlockingTransport(), ["ok"])
    s.close()
    s._poke()                         # after close: a no-op, not a write into whatever reuses the fd number
    s.close()


# ------------------------------------------------------------------------------------------ heartbeat fit
def _old_limit(a: Arrivals) -> float:
    gaps = tuple(a.gaps)
    sigma = max(heartbeat.MIN_SIGMA * a.floor_s, statistics.pstdev(gaps))
    unlikely = statistics.NormalDist(statistics.fmean(gaps), sigma).inv_cdf(1 - 10 ** -heartbeat.PHI)
    return min(heartbeat.CAP * a.floor_s, max(a.floor_s, unlikely, heartbeat.MARGIN * max(gaps)))


def test_the_float_fit_matches_the_statistics_module():
    rng = random.Random(3)
    for _ in range(20):
        a = Arrivals(0.3)
        t = 0.0
        for _ in range(rng.randint(heartbeat.MIN_SAMPLES, 300)):
            t += rng.choice([0.5, 0.5, 0.45, rng.uniform(0.01, 1.5)])
            a.arrived(t)
        assert math.isclose(a.limit(), _old_limit(a), rel_tol=1e-9)


def test_the_fit_is_reused_but_a_longer_stall_is_followed_at_once():
    a = Arrivals(2.0)
    t = 0.0
    for _ in range(100):
        t += 0.5
        a.arrived(t)
    first = a.limit()
    t += 0.5
    a.arrived(t)
    assert a.limit() == first and a._fit is not None          # cached: no refit for one more steady line
    t += 7.0                                                  # a 7 s stall, then the node came back
    a.arrived(t)
    assert a.limit() >= heartbeat.MARGIN * 7.0 - 1e-9 or a.limit() == heartbeat.CAP * 2.0


# ------------------------------------------------------------------------------------------ fan_out
def test_fan_out_over_many_hosts_is_linear():
    """Each finished host used to scan every started host (O(N^2): minutes at 20,000)."""
    t = time.monotonic()
    results = fan_out(list(range(20000)), lambda h: h * 2, max_workers=8, host_timeout=60)
    assert [r.value for r in results[:3]] == [0, 2, 4] and all(r.ok for r in results)
    assert time.monotonic() - t < 30


def test_fan_out_host_timeout_still_expires_a_stuck_host():
    stuck = threading.Event()
    results = fan_out([1, 2, 3], lambda h: stuck.wait(5) if h == 2 else h, max_workers=3, host_timeout=0.3)
    assert results[0].ok and results[2].ok and not results[1].ok
    stuck.set()


# ------------------------------------------------------------------------------------------ node rows
def test_the_supervisor_writes_a_node_row_only_when_it_changes(tmp_path):
    from clusterctl.store.state import JobState, Store
    from clusterctl.supervise.supervisor import Policy, Supervisor
    from tests.unit.supervise.test_supervisor import E, FakeOps, R, obs

    class CountingStore(Store):
        writes: list = []

        def set_node(self, job_id, attempt, node, **fields):
            self.writes.append((attempt, node, fields.get("state")))
            return super().set_node(job_id, attempt, node, **fields)

    store = CountingStore(tmp_path / "state.db")
    steady = [obs(a=R, b=R) for _ in range(50)]
    ops = FakeOps(steady + [obs(a=R, b=(E, 0)), obs(a=(E, 0), b=(E, 0))])
    job_id = store.create_job("demo", "{}", None, None)
    sup = Supervisor(job_id, store, ops, Policy(min_nodes=2, max_nodes=2, backoff_s=0), ["a", "b"],
                     clock=iter(range(10**6)).__next__, sleep=lambda s: None)
    assert sup.run() == JobState.SUCCEEDED
    assert store.writes == [(1, "a", "running"), (1, "b", "running"), (1, "b", "exited"), (1, "a", "exited")]
    assert [n.state for n in store.nodes(job_id)] == ["exited", "exited"]
    store.close()


# ------------------------------------------------------------------------------------------ log sections
def _scan(path, node, attempt):
    """The old LogSink.section_lines: a scan of the whole file (lines per rank)."""
    from collections import Counter
    marker, head, count, inside = f"[{node}/-] === attempt {attempt} ===", f"[{node}/", None, False
    for line in open(path):
        if not line.startswith(head):
            continue
        line = line.rstrip("\n")
        if line == marker:
            count, inside = Counter(), True
        elif line.startswith(f"[{node}/-] === attempt ") and line.endswith(" ==="):
            inside = False
        elif inside:
            count[line[len(head):].split("]", 1)[0]] += 1
    return count


def test_log_sections_are_indexed_once_and_match_a_scan_of_the_file(tmp_path):
    from clusterctl.store.logcopy import LogSink

    path = tmp_path / "out.log"
    rng = random.Random(5)
    sink = LogSink(path)
    for attempt in (1, 2, 3):
        for node in ("n1", "n2", "n3"):
            sink.begin(node, attempt)
        for _ in range(200):
            node = rng.choice(["n1", "n2", "n3"])
            sink.feed(node, b"".join(b"[%d]:line [x/1] y\n" % rng.randint(0, 3) for _ in range(rng.randint(1, 4))))
    again = LogSink(path)                       # a re-attached supervisor reads the file once
    for node in ("n1", "n2", "n3"):
        for attempt in (1, 2, 3, 4):
            assert again.section_lines(node, attempt) == sink.section_lines(node, attempt) \
                == _scan(path, node, attempt)


def test_starting_an_attempt_on_many_nodes_does_not_rescan_the_log(tmp_path):
    from clusterctl.store.logcopy import LogSink

    path = tmp_path / "out.log"
    path.write_text("".join(f"[n{i % 2000}/0] some output line {i}\n" for i in range(200_000)))
    sink = LogSink(path)
    t = time.monotonic()
    for i in range(2000):
        assert sink.begin(f"n{i}", 2) == 0
    assert time.monotonic() - t < 5          # was 2,000 scans of a 6 MB file
