"""The per-node watch: its node-side script (real sh), ``watch.Watches`` and how ``ClusterOps.observe`` uses it.

The node-side script runs in real processes; the Python side is driven by a fake clock and a fake mux whose
streams the tests feed by hand (no threads, no sleeping, nothing measured on the wall clock), but for one test of
the real ``StreamMux`` wiring."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field

import pytest

from clusterctl.config.inventory import Host
from clusterctl.config.spec import loads_job
from clusterctl.launch import runtimes
from clusterctl.store.logcopy import LogSink
from clusterctl.supervise import heartbeat, observe
from clusterctl.supervise.cluster_ops import ClusterOps
from clusterctl.supervise.watch import Watches
from clusterctl.transport.base import CommandResult


class _PidOf:
    """A runtime whose pid command prints a fixed pid."""

    def __init__(self, pid: int):
        self.pid = pid

    def pid_argv(self, node) -> list[str]:
        return ["echo", str(self.pid)]


def _lines(proc: subprocess.Popen, n: int) -> list[str]:
    return [proc.stdout.readline().strip() for _ in range(n)]


def test_watch_prints_1_while_the_process_lives_and_0_once_it_is_gone():
    target = subprocess.Popen(["sleep", "30"])
    watch = subprocess.Popen(runtimes.watch_argv(_PidOf(target.pid), None), stdout=subprocess.PIPE, text=True)
    try:
        assert _lines(watch, 2) == ["1", "1"]
        target.kill()
        target.wait()
        seen = _lines(watch, 3)
        assert seen[-1] == "0" and set(seen) <= {"0", "1"}
    finally:
        watch.kill()
        target.kill()


def _watch_with_manual_looks(tmp_path, pid_argv: list[str], root: str = ""):
    """The real WATCH script whose ``sleep`` (its one external command between looks) prints ``--`` and waits for
    the test to allow the next look: each look's output is the lines before its ``--``. No wall clock."""
    bin_dir, ticks = tmp_path / "bin", tmp_path / "ticks"
    bin_dir.mkdir()
    os.mkfifo(ticks)
    (bin_dir / "sleep").write_text(f'#!/bin/sh\necho --\nread _ <{ticks}\n')
    (bin_dir / "sleep").chmod(0o755)
    tick = os.open(ticks, os.O_RDWR)          # held open: a tick written before the read is kept, not lost
    watch = subprocess.Popen(["sh", "-c", runtimes.WATCH, "w", root, "", *pid_argv], stdout=subprocess.PIPE, text=True,
                             env={**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}"},
                             start_new_session=True)     # its fake sleep is killed with it (os.killpg)

    def look() -> list[str]:
        """The lines of the next look (the first call: the first look's)."""
        if look.started:
            os.write(tick, b"\n")
        look.started = True
        out = []
        while (line := watch.stdout.readline().strip()) != "--":
            assert line or watch.poll() is None, "the watch ended"
            out.append(line)
        return out

    look.started = False
    return watch, look, tick


def test_watch_prints_a_line_every_second_look_and_at_once_when_what_it_says_changes(tmp_path):
    """A steady node sends a line a second (every second look at 0.5 s), not one per look: each line is an SSH
    packet the supervisor decrypts. A change (the process gone, a new checkpoint) is printed at the very next look,
    even right after a line."""
    root = tmp_path / "ckpt"
    (root / "step-5").mkdir(parents=True)
    (root / "step-5" / "MANIFEST.json").write_text("{}")
    target = subprocess.Popen(["sleep", "30"])
    watch, look, tick = _watch_with_manual_looks(tmp_path, ["echo", str(target.pid)], str(root))
    try:
        assert [look() for _ in range(5)] == [["1 5"], [], ["1 5"], [], ["1 5"]]
        (root / "step-7").mkdir()
        (root / "step-7" / ".metadata").write_text("x")
        assert [look() for _ in range(3)] == [["1 7"], [], ["1 7"]]     # right after a line: at once
        target.kill()
        target.wait()
        assert [look() for _ in range(4)] == [["0 7"], [], ["0 7"], []]
    finally:
        os.killpg(watch.pid, signal.SIGKILL)      # the sh and its fake sleep (blocked on the fifo otherwise)
        watch.wait()
        target.kill()
        os.close(tick)


def _reuse_pid(pid: int) -> subprocess.Popen | None:
    """A new process that gets ``pid`` again (the kernel's next pid set through ns_last_pid: root, as CI runs);
    None when another process of the machine took it first (then that one lives under the reused pid)."""
    for _ in range(200):
        with open("/proc/sys/kernel/ns_last_pid", "w") as f:
            f.write(str(pid - 1))
        proc = subprocess.Popen(["sleep", "30"])
        if proc.pid == pid:
            return proc
        proc.kill()
        proc.wait()
        if os.path.exists(f"/proc/{pid}"):
            return None
    raise AssertionError(f"could not start a process with pid {pid}")


def test_watch_counts_a_process_that_reused_the_pid_as_gone(tmp_path):
    """The watch reads the main process's pid once (its runtime's pid_argv); when that process dies and another
    one gets its pid (pid_max is 32768 on many hosts), the watch must go on saying "0": a "1" would make the
    supervisor trust the node as running and never probe it again (issue 34 item 13)."""
    target = subprocess.Popen(["sleep", "30"])
    pid = target.pid
    watch, look, tick = _watch_with_manual_looks(tmp_path, ["echo", str(pid)])
    other = None
    try:
        assert look() == ["1"]
        target.kill()
        target.wait()
        assert look() == ["0"]
        time.sleep(0.05)        # a later clock tick (start times count 1/100 s): a pid reused in the same tick
        other = _reuse_pid(pid)  # would be indistinguishable, and on a real host a wrap takes minutes
        assert os.path.exists(f"/proc/{pid}")
        assert [look() for _ in range(4)] == [[], ["0"], [], ["0"]]
    finally:
        os.killpg(watch.pid, signal.SIGKILL)
        watch.wait()
        target.kill()
        if other is not None:
            other.kill()
            other.wait()
        os.close(tick)


def test_a_steady_watch_prints_about_a_line_a_second():
    """Wall clock, the real sleep: over 3 s a steady watch prints about 3 lines (it printed 6-7 when it wrote
    one per look). Only an upper bound: a loaded machine prints fewer, never more."""
    target = subprocess.Popen(["sleep", "30"])
    watch = subprocess.Popen(runtimes.watch_argv(_PidOf(target.pid), None), stdout=subprocess.PIPE, text=True)
    try:
        assert _lines(watch, 1) == ["1"]
        start = time.monotonic()
        lines = 0
        while True:
            watch.stdout.readline()
            if time.monotonic() - start > 3.0:
                break
            lines += 1
        assert lines <= 4
    finally:
        watch.kill()
        watch.wait()
        target.kill()


def test_watch_counts_a_zombie_as_gone():
    """An exited process nobody has reaped yet still has /proc/PID (a container init whose conmon was killed)."""
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{child.pid}/status") as f:
            if any(line.split()[:2] == ["State:", "Z"] for line in f):
                break
        time.sleep(0.02)
    watch = subprocess.Popen(runtimes.watch_argv(_PidOf(child.pid), None), stdout=subprocess.PIPE, text=True)
    try:
        assert _lines(watch, 2) == ["0", "0"]
    finally:
        watch.kill()
        child.wait()


def test_watch_prints_0_when_there_is_no_pid():
    watch = subprocess.Popen(["sh", "-c", runtimes.WATCH, "w", "", "", "true"], stdout=subprocess.PIPE, text=True)
    try:
        assert _lines(watch, 2) == ["0", "0"]
    finally:
        watch.kill()


def test_watch_reports_the_newest_complete_looking_checkpoint_step(tmp_path):
    """A step directory counts once its MANIFEST.json (or DCP .metadata) exists; temp dirs never do."""
    root = tmp_path / "ckpt"
    (root / "step-000000010").mkdir(parents=True)
    (root / "step-000000010" / "MANIFEST.json").write_text("{}")
    (root / "step-000000020").mkdir()                                   # being written: no manifest yet
    (root / ".tmp-step-000000030-x").mkdir()
    (root / ".tmp-step-000000030-x" / "MANIFEST.json").write_text("{}")
    target = subprocess.Popen(["sleep", "30"])
    watch = subprocess.Popen(runtimes.watch_argv(_PidOf(target.pid), None, str(root)), stdout=subprocess.PIPE,
                             text=True)
    try:
        assert _lines(watch, 1) == ["1 10"]
        (root / "step-000000020" / ".metadata").write_text("x")
        deadline = time.monotonic() + 5
        while _lines(watch, 1) != ["1 20"]:
            assert time.monotonic() < deadline
    finally:
        watch.kill()
        target.kill()


def test_bare_pid_argv_reads_the_runner_pid_until_it_has_exited(tmp_path):
    class Node:
        container_name, node_dir, log_path = "x", str(tmp_path), None

    from clusterctl.launch.runtimes import bare

    runner = subprocess.Popen(["sleep", "60"])          # stands for the runner: its pid and identity as it writes them
    try:
        ident = subprocess.run(["sh", "-c", f'{bare._IDENT}\nident "$1"', "sh", str(runner.pid)], capture_output=True,
                               text=True, check=True).stdout
        (tmp_path / "ident").write_text(ident)
        (tmp_path / "pid").write_text(f"{runner.pid}\n")
        argv = runtimes.get("bare").pid_argv(Node())
        assert subprocess.run(argv, capture_output=True, text=True).stdout.strip() == str(runner.pid)
        (tmp_path / "exit").write_text("0\n")
        assert subprocess.run(argv, capture_output=True, text=True).stdout.strip() == ""
    finally:
        runner.kill()
        runner.wait()


def test_container_pid_argv():
    class Node:
        container_name, node_dir, log_path, job_id = "clusterctl-j-1_n1", "/x", None, "j-1"

    argv = runtimes.get("podman").pid_argv(Node())
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["podman", "j-1", "clusterctl-j-1_n1"]
    assert 'inspect --format="{{.State.Pid}}" "$cid"' in argv[2]


# ------------------------------------------------------------------------------------------- fakes
class Clock:
    """A fake monotonic clock: ``advance(s)`` moves it."""

    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t

    def advance(self, s: float) -> None:
        self.t += s


@dataclass(eq=False)
class FakeStream:
    name: str
    opener: object
    on_data: object
    on_end: object
    retry_s: float
    before_reopen: object
    poll: bool = False
    stopped: bool = False

    def stop(self) -> None:
        self.stopped = True


@dataclass
class FakeMux:
    """``watch.Mux`` that opens nothing: the test feeds each stream's ``on_data`` itself (``feed``)."""

    streams: dict[str, FakeStream] = field(default_factory=dict)
    closed: bool = False
    flushed: list[list[str]] = field(default_factory=list)   # per flush: the streams, none stopped yet

    def add(self, name, opener, on_data, *, on_end=None, retry_s=0.5, before_reopen=None, poll=False) -> FakeStream:
        s = self.streams[name] = FakeStream(name, opener, on_data, on_end, retry_s, before_reopen, poll)
        return s

    def flush(self, streams, timeout=2.0) -> bool:
        assert not any(s.stopped for s in streams)
        self.flushed.append([s.name for s in streams])
        return True

    def feed(self, name: str, data: bytes) -> None:
        s = self.streams[name]
        assert not s.stopped
        s.on_data(data)

    def close(self) -> None:
        self.closed = True


class Sink:
    """``watch.Sink``: what the follower wrote, per node."""

    def __init__(self):
        self.data: dict[str, list[bytes]] = {}
        self.begun: list[tuple[str, int]] = []
        self.restarts: list[str] = []

    def begin(self, node, attempt):
        self.begun.append((node, attempt))
        self.data.setdefault(node, [])
        return 0

    def restart(self, node):
        self.restarts.append(node)

    def feed(self, node, data):
        self.data.setdefault(node, []).append(data)

    def lines(self, node):
        return sum(d.count(b"\n") for d in self.data.get(node, []))


def _watches(**kw) -> tuple[Watches, FakeMux, Clock, list[str]]:
    mux, clock, dropped = FakeMux(), Clock(), []
    w = Watches(kw.pop("sink", None) or Sink(), open_stream=lambda node, argv: (node, argv), drop=dropped.append,
                heartbeat_timeout_s=kw.pop("heartbeat_timeout_s", 2.0), now=clock, mux=lambda: mux, **kw)
    return w, mux, clock, dropped


# ------------------------------------------------------------------------------------------- watch.Watches
def test_a_watch_records_each_line_on_its_clock_and_a_process_that_ends_wakes_the_supervisor():
    ws, mux, clock, _ = _watches()
    w = ws.watch(1, "n1", lambda: ["watch", "n1"])
    assert w.last is None and ws.heard("n1") is None                 # no line yet: probe the node
    assert mux.streams["watch-n1"].opener() == ("n1", ["watch", "n1"])
    mux.feed("watch-n1", b"1\n")
    assert (w.last, w.alive, w.gone_at) == (100.0, True, None)
    assert ws.heard("n1").state == "running" and not ws.changed.is_set()
    clock.advance(0.5)
    mux.feed("watch-n1", b"1\n0\n")                                   # the last line of a chunk counts
    assert (w.last, w.alive, w.gone_at) == (100.5, False, 100.5)
    assert ws.heard("n1") is None                                     # gone: the listing decides
    assert ws.wait_for_change(5) is True                              # woken at once, then cleared
    assert ws.wait_for_change(0) is False
    clock.advance(0.5)
    mux.feed("watch-n1", b"0\n")
    assert w.gone_at == 100.5                                         # the first "gone" line after alive


def test_a_dead_process_never_seen_alive_has_no_gone_time_and_wakes_nobody():
    ws, mux, clock, _ = _watches()
    w = ws.watch(1, "n1", lambda: ["watch"])
    mux.feed("watch-n1", b"0\n")
    assert (w.alive, w.gone_at) == (False, None) and not ws.changed.is_set()


def test_silence_beyond_the_limit_is_unreachable():
    ws, mux, clock, _ = _watches(heartbeat_timeout_s=2.0)
    ws.watch(1, "n1", lambda: ["watch"])
    mux.feed("watch-n1", b"1\n")
    clock.advance(2.0)
    assert ws.heard("n1").state == "running"                          # exactly the limit: not yet
    clock.advance(0.1)
    o = ws.heard("n1")
    assert o.state == "unreachable" and o.error_tail == "no heartbeat for 2.1s (limit 2.0s)"


def test_the_wait_ends_when_a_nodes_silence_passes_its_limit_so_its_first_failed_probe_is_not_late():
    """The round counting a silent node's first failed probe comes when the silence passes the limit (+20 ms),
    not up to a whole probe interval later; a silence already past the limit does not cut the next wait short."""
    ws, mux, clock, _ = _watches(heartbeat_timeout_s=2.0)
    ws.watch(1, "n1", lambda: ["watch"])
    ws.watch(1, "n2", lambda: ["watch"])
    assert ws.wait_for_change(0.05) is False                          # no line yet: nothing is due
    mux.feed("watch-n1", b"1\n")
    clock.advance(1.0)
    mux.feed("watch-n2", b"1\n")
    clock.advance(0.85)                                               # n1 silent 1.85 s of its 2 s
    t = time.monotonic()
    assert ws.wait_for_change(5) is False
    assert 0.12 <= time.monotonic() - t < 1.0                         # ~0.15 + 0.02 s, not 5 s
    clock.advance(0.2)
    assert ws.heard("n1").state == "unreachable" and ws.heard("n2").state == "running"
    t = time.monotonic()                                              # n1 already past: the wait is n2's
    ws.wait_for_change(5)
    assert 0.8 <= time.monotonic() - t < 2.0                          # n2 has 2 - 1.05 = 0.95 s left


def test_checkpoint_steps_are_hinted_and_a_new_one_wakes_the_supervisor():
    ws, mux, clock, _ = _watches()
    ws.watch(1, "n1", lambda: ["watch"])
    ws.watch(1, "n2", lambda: ["watch"])
    assert ws.checkpoint_hint() is None
    mux.feed("watch-n1", b"1 10\n")
    assert ws.checkpoint_hint() == 10 and ws.wait_for_change(0)
    mux.feed("watch-n2", b"1 20\n")
    mux.feed("watch-n1", b"1 10\n")
    assert ws.checkpoint_hint() == 20
    assert ws.wait_for_change(0) and not ws.wait_for_change(0)       # n1's unchanged step did not wake it again


def test_a_new_attempt_replaces_the_watch_and_its_first_line_is_not_a_gap():
    ws, mux, clock, _ = _watches(heartbeat_timeout_s=0.3)
    w1 = ws.watch(1, "n1", lambda: ["watch", "1"])
    assert ws.watch(1, "n1", lambda: pytest.fail("started twice")) is w1
    mux.feed("watch-n1", b"1\n")
    first = mux.streams["watch-n1"]
    clock.advance(60)
    w2 = ws.watch(2, "n1", lambda: ["watch", "2"])
    assert w1.stop.is_set() and first.stopped and w2 is not w1 and w2.last is None
    mux.feed("watch-n1", b"1\n")
    assert list(ws._arrivals["n1"].gaps) == []                       # 60 s between the attempts: not a gap
    assert ws.snapshot() == {"n1": w2}


def test_no_command_no_stream_and_keep_stops_the_others():
    ws, mux, clock, _ = _watches()
    w = ws.watch(1, "n1", lambda: None)                  # no plan yet: nothing to run
    assert w.stream is None and "watch-n1" not in mux.streams
    ws.watch(1, "n2", lambda: ["watch"])
    ws.watch(1, "n3", lambda: ["watch"])
    ws.keep(["n1", "n3"])
    assert sorted(ws.snapshot()) == ["n1", "n3"] and mux.streams["watch-n2"].stopped


def test_a_failed_stream_drops_the_nodes_connection():
    ws, mux, clock, dropped = _watches()
    ws.watch(1, "n1", lambda: ["watch"])
    ws.follow(1, "n2", ["logs"])
    mux.streams["watch-n1"].on_end(None)                 # a clean end: the connection is fine
    mux.streams["watch-n1"].on_end(OSError("reset"))
    mux.streams["logs-n2"].on_end(OSError("reset"))
    assert dropped == ["n1", "n2"]


def test_a_watch_that_stalls_often_gets_a_longer_silence_limit_a_steady_one_does_not():
    """Limit 0.3 s: a node whose lines come every 20 ms but stall 0.45 s every 5 lines (a slowed sshd) is not a
    failed probe once its jitter is known (heartbeat.Arrivals); a steady node that goes silent still is after
    0.3 s."""
    ws, mux, clock, _ = _watches(heartbeat_timeout_s=0.3)
    ws.watch(1, "stalls", lambda: ["watch"])
    ws.watch(1, "steady", lambda: ["watch"])
    # the lines' arrival times (ms), from a common start
    stalls = list(_arrivals([20, 20, 20, 20, 450], 6000))
    steady = list(_arrivals([20], 1000))
    states = {"stalls": set(), "steady": set()}
    t0 = clock.t
    for ms in range(0, 6000, 10):
        clock.t = t0 + ms / 1000
        for node, times in (("stalls", stalls), ("steady", steady)):
            while times and times[0] <= ms:
                times.pop(0)
                mux.feed(f"watch-{node}", b"1\n")
        if ms >= 3000 and ms % 50 == 0:                  # the steady node went silent at 1 s
            for node in states:
                states[node].add(ws.heard(node).state)
        if ms == 990:
            assert ws.limit("steady") == 0.3
    assert 0.45 * heartbeat.MARGIN <= ws.limit("stalls") <= heartbeat.CAP * 0.3
    assert states == {"stalls": {"running"}, "steady": {"unreachable"}}


def _arrivals(gaps_ms: list[int], until_ms: int):
    t, i = 0, 0
    while t < until_ms:
        yield t
        t += gaps_ms[i % len(gaps_ms)]
        i += 1


def test_a_follower_copies_the_log_and_progress_says_whether_lines_came_since_last_asked():
    sink = Sink()
    ws, mux, clock, _ = _watches(sink=sink)
    ws.follow(1, "n1", ["logs", "-f"])
    assert sink.begun == [("n1", 1)] and mux.streams["logs-n1"].opener() == ("n1", ["logs", "-f"])
    assert mux.streams["logs-n1"].poll                    # a log line wakes nobody: read every poll_s
    assert ws.progress("n1") is False
    mux.feed("logs-n1", b"[0]:step 1\n")
    assert ws.progress("n1") is True and ws.progress("n1") is False
    mux.streams["logs-n1"].before_reopen()                # a reconnect streams the whole log again
    assert sink.restarts == ["n1"]
    old = mux.streams["logs-n1"]
    ws.follow(2, "n1", ["logs", "-f", "2"])              # the next attempt: the old stream writes nothing more
    assert old.stopped and mux.flushed == [["logs-n1"]]  # ... after what it held reached the sink
    old.on_data(b"late\n")
    assert b"late\n" not in sink.data["n1"]
    assert ws.progress("unknown") is False


def test_close_stops_every_stream_and_the_mux():
    ws, mux, clock, _ = _watches()
    ws.watch(1, "n1", lambda: ["watch"])
    ws.follow(1, "n1", ["logs"])
    ws.close()
    assert mux.closed and all(s.stopped for s in mux.streams.values()) and ws.snapshot() == {}
    assert mux.flushed == [["logs-n1"]] and not mux.streams["watch-n1"].poll


# ------------------------------------------------------------------------------------------- observe
JOB = """
name: j
nodes: 3
nproc_per_node: 1
script: train.py
container: {ulimits: {}}
"""


class FakeTransport:
    """A node: ``run`` answers every command with its ``podman ps`` listing (and records it)."""

    def __init__(self, host, ps: list[dict]):
        self.host, self.ps, self.runs = host, ps, []

    def run(self, argv, *, timeout, stdin=None) -> CommandResult:
        self.runs.append(list(argv))
        return CommandResult(tuple(argv), 0, json.dumps(self.ps), "", 0.01)

    def open_stream(self, argv):
        return ("stream", self.host.name, list(argv))      # what the (fake) mux's opener returns

    def close(self) -> None:
        pass


def _ps(job_id: str, attempt: int, state: str, code: int = 0) -> list[dict]:
    labels = {runtimes.LABEL_JOB_ID: job_id, runtimes.LABEL_ATTEMPT: str(attempt)}
    return [{"Names": ["c"], "State": state, "ExitCode": code, "Labels": labels}]


HOSTS = {f"n{i}": Host(name=f"n{i}", address=f"10.0.0.{i}", runtime="podman", gpus=0) for i in (1, 2, 3)}


def _ops(tmp_path, ps: dict[str, list[dict]], **kw) -> tuple[ClusterOps, dict, FakeMux, Clock]:
    """ClusterOps over FakeTransports (a `podman ps` listing per node) on a fake clock and mux, attempt 1
    adopted."""
    spec = loads_job(JOB, "job.yaml")
    transports = {n: FakeTransport(h, ps.get(n, [])) for n, h in HOSTS.items()}
    mux, clock = FakeMux(), Clock()
    ops = ClusterOps(spec=spec, hosts=HOSTS, job_id="j-1", store=None, sink=LogSink(tmp_path / "out.log"),
                     connect=lambda host, options: transports[host.name], clock=clock, mux=lambda: mux, **kw)
    ops.adopt(1, list(HOSTS), "n1")
    return ops, transports, mux, clock


def test_observe_answers_from_the_watch_and_probes_only_a_node_whose_process_ended(tmp_path):
    ops, transports, mux, clock = _ops(tmp_path, {"n2": _ps("j-1", 1, "exited", 1)}, heartbeat_timeout_s=0.3)
    try:
        ops.observe(1, list(HOSTS))        # starts the watches
        assert sorted(mux.streams) == ["watch-n1", "watch-n2", "watch-n3"]
        mux.feed("watch-n1", b"1\n")
        mux.feed("watch-n2", b"0\n")
        mux.feed("watch-n3", b"1\n")       # and then nothing
        clock.advance(0.1)
        mux.feed("watch-n1", b"1\n")
        for t in transports.values():
            t.runs.clear()
        obs = {o.node: o for o in ops.observe(1, list(HOSTS))}
        assert obs["n1"].state == "running" and not transports["n1"].runs        # no remote command
        assert obs["n2"].state == "exited" and obs["n2"].exit_code == 1 and transports["n2"].runs   # probed
        assert obs["n3"].state == "running" and not transports["n3"].runs        # silent, but not for long yet
        clock.advance(0.25)
        mux.feed("watch-n1", b"1\n")
        obs = {o.node: o for o in ops.observe(1, list(HOSTS))}
        assert obs["n3"].state == "unreachable" and obs["n3"].error_tail == "no heartbeat for 0.3s (limit 0.3s)"
        assert not transports["n3"].runs     # a silent node is not probed (the probe would hang)
        assert obs["n1"].state == "running"
    finally:
        ops.close()
    assert mux.closed


def test_the_watch_runs_the_runtimes_watch_script_for_the_adopted_plan(tmp_path):
    ops, transports, mux, clock = _ops(tmp_path, {})
    try:
        ops.attach(1)
        assert sorted(mux.streams) == [f"{k}-{n}" for k in ("logs", "watch") for n in HOSTS]
        _, host, argv = mux.streams["watch-n2"].opener()
        want = runtimes.watch_argv(runtimes.get("podman"), ops.plan.node("n2"), ops.spec.checkpoint.dir,
                                   "~/.clusterctl/nodes/n2/jobs/j-1/1/view")      # the attempt's rank view
        assert host == "n2" and argv == want
        assert "clusterctl-watch" in argv
        with pytest.raises(ValueError, match="adopt attempt 2 first"):
            ops.attach(2)
    finally:
        ops.close()


def test_a_container_listed_running_after_its_init_was_seen_gone_is_missing(tmp_path):
    """podman keeps listing a container as running when its conmon was SIGKILLed with it; the watch saw the init
    go, so after GONE_CONFIRM_S the listing is not believed (and no extra inspect is needed)."""
    ops, transports, mux, clock = _ops(tmp_path, dict.fromkeys(HOSTS, _ps("j-1", 1, "running")))
    try:
        ops.observe(1, list(HOSTS))
        for n in HOSTS:
            mux.feed(f"watch-{n}", b"1\n")
        clock.advance(0.1)
        mux.feed("watch-n2", b"0\n")
        assert ops.wait_for_change(5) is True
        clock.advance(observe.GONE_CONFIRM_S + 0.01)
        for n in ("n1", "n3"):
            mux.feed(f"watch-{n}", b"1\n")
        transports["n2"].runs.clear()
        obs = {o.node: o for o in ops.observe(1, list(HOSTS))}
        assert obs["n2"].state == "missing" and "still lists it as running" in obs["n2"].error_tail
        assert [a[:2] for a in transports["n2"].runs] == [["podman", "ps"]]      # the listing only
        assert obs["n1"].state == obs["n3"].state == "running"
    finally:
        ops.close()


class StreamingTransport(FakeTransport):
    """``stream`` plays the node's watch: one "1", then "0" once ``die`` is set."""

    open_stream = None          # no native stream: ``streams.ThreadedStream`` runs ``stream`` on a thread

    def __init__(self, host, ps):
        super().__init__(host, ps)
        self.die = threading.Event()

    def stream(self, argv, on_data, stop: threading.Event) -> None:
        assert argv[:2] == ["sh", "-c"] and "clusterctl-watch" in argv
        on_data(b"1\n")
        self.die.wait()
        on_data(b"0\n")
        stop.wait()


def test_wait_for_change_over_the_real_stream_mux_wakes_when_a_watched_process_ends(tmp_path):
    """The real wiring: ``StreamMux`` and a transport's blocking ``stream`` on its own thread."""
    spec = loads_job(JOB, "job.yaml")
    transports = {n: StreamingTransport(h, []) for n, h in HOSTS.items()}
    ops = ClusterOps(spec=spec, hosts=HOSTS, job_id="j-1", store=None, sink=LogSink(tmp_path / "out.log"),
                     connect=lambda host, options: transports[host.name])
    ops.adopt(1, list(HOSTS), "n1")
    try:
        ops.observe(1, list(HOSTS))
        watches = {n: ops.watches.get(n) for n in HOSTS}
        w = watches["n2"]
        deadline = time.monotonic() + 30
        # every node's "1" arrived (each stream has a thread of its own: on a loaded box n1's may come after n2's
        # "0" unless it is waited for; the test once failed so under `-n 2`)
        while not all(x.alive for x in watches.values()):
            assert time.monotonic() < deadline
            ops.wait_for_change(0.05)
        transports["n2"].die.set()
        while not ops.wait_for_change(1):                 # woken (True) when n2's "0" arrives after its "1"
            assert time.monotonic() < deadline
        assert w.gone_at is not None and w.last is not None and not w.alive
        assert watches["n1"].alive and watches["n3"].alive   # only the watch of the process that ended says so
    finally:
        ops.close()


# ------------------------------------------------------------------------------------------- the rank view
def _rank_line(rank: int, n: int, **kw) -> bytes:
    return json.dumps({"v": 1, "n": n, "rank": rank, "pid": 100 + rank, "state": "training", **kw},
                      separators=(",", ":")).encode()


def test_watch_lines_carry_every_rank_file_tab_separated(tmp_path):
    """The real WATCH script: each line is ``ALIVE [STEP]`` then each rank file's line after a TAB (printf: the
    JSON's backslashes arrive as written); a missing or empty file is left out; no view dir: the old line."""
    view = tmp_path / "view"
    view.mkdir()
    (view / "rank-0").write_bytes(_rank_line(0, 1, where='C:\\new "x"') + b"\n")
    (view / "rank-1").write_bytes(b"")
    (view / "rank-10").write_bytes(_rank_line(10, 4) + b"\n")
    target = subprocess.Popen(["sleep", "30"])
    try:
        for vdir, want in ((str(view), [_rank_line(0, 1, where='C:\\new "x"'), _rank_line(10, 4)]), ("", [])):
            watch = subprocess.Popen(runtimes.watch_argv(_PidOf(target.pid), None, None, vdir), stdout=subprocess.PIPE)
            try:
                line = watch.stdout.readline().rstrip(b"\n")
            finally:
                watch.kill()
                watch.wait()
            head, *ranks = line.split(b"\t")
            assert head.split() == [b"1"] and ranks == want
            for r in ranks:
                assert json.loads(r)["rank"] in (0, 10)
    finally:
        target.kill()
        target.wait()


def test_the_watch_parses_each_ranks_view_and_when_its_file_last_changed():
    ws, mux, clock, _ = _watches()
    w = ws.watch(1, "n1", lambda: ["watch"])
    mux.feed("watch-n1", b"1 5\t" + _rank_line(0, 1, step=3) + b"\t" + _rank_line(1, 1) + b"\n")
    assert w.alive and w.checkpoint_step == 5
    views = ws.rank_views("n1")
    assert sorted(views) == [0, 1] and views[0].step == 3 and views[0].node == "n1" and views[0].pid == 100
    assert views[0].answered_age_s == 0.0
    clock.advance(1.0)                  # rank 0 wrote again, rank 1 did not (stopped, or holding the GIL)
    line = b"1 5\t" + _rank_line(0, 2, step=4) + b"\t" + _rank_line(1, 1) + b"\n"
    mux.feed("watch-n1", line[:30])     # a line cut by the stream: nothing until its end comes
    assert ws.rank_views("n1")[0].step == 3
    mux.feed("watch-n1", line[30:])
    clock.advance(2.5)
    views = ws.rank_views("n1")
    assert views[0].step == 4 and views[0].answered_age_s == 2.5 and views[1].answered_age_s == 3.5
    mux.feed("watch-n1", b"garbage\tnot json\n")           # not a watch line: ignored
    assert sorted(ws.rank_views("n1")) == [0, 1] and w.alive
    mux.feed("watch-n1", b"1 5\t{broken\t" + _rank_line(1, 2) + b"\n")   # a rank's file it cannot read: gone
    assert sorted(ws.rank_views("n1")) == [1]
    mux.feed("watch-n1", b"0 5\n")                          # an old-format line: valid, and no rank file now
    assert not w.alive and ws.rank_views("n1") == {}


def test_watch_adds_each_ranks_proc_state_and_cpu_read_from_outside_when_its_start_time_matches(tmp_path):
    """The real WATCH script: a rank file naming a live process (pid and start time, as rankview.py writes them)
    gets ``"os": "STATE TICKS"`` read from that process's /proc/PID/stat (what lets a rank whose own thread cannot
    write be seen computing: issue 37's "busy, never stuck"); a pid whose start time differs (another process
    that has the number) or a line that is not an object is left as it is. The pid is read through the main
    process's /proc (``/proc/$p/root/proc``: a container's own), here the host's."""
    view = tmp_path / "view"
    view.mkdir()
    hog = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    target = subprocess.Popen(["sleep", "30"])
    try:
        start = int(open(f"/proc/{hog.pid}/stat").read().rsplit(")", 1)[1].split()[19])
        (view / "rank-0").write_bytes(_rank_line(0, 1, pid=hog.pid, start=start) + b"\n")
        (view / "rank-1").write_bytes(_rank_line(1, 1, pid=hog.pid, start=start + 1) + b"\n")
        (view / "rank-2").write_bytes(b'{"rank": 2, "pid": 1, "start": 1] not json\n')
        time.sleep(0.5)
        watch = subprocess.Popen(runtimes.watch_argv(_PidOf(target.pid), None, None, str(view)),
                                 stdout=subprocess.PIPE)
        try:
            first = watch.stdout.readline().rstrip(b"\n").split(b"\t")
            second = watch.stdout.readline().rstrip(b"\n").split(b"\t")
        finally:
            watch.kill()
            watch.wait()
        (r0, r1), r2 = (json.loads(x) for x in first[1:3]), first[3]
        state, ticks = r0["os"].split()
        assert state == "R" and int(ticks) > 0 and r0["n"] == 1
        assert "os" not in r1 and r2 == b'{"rank": 2, "pid": 1, "start": 1] not json'
        assert int(json.loads(second[1])["os"].split()[1]) > int(ticks)     # its CPU advances, its file does not
    finally:
        for p in (hog, target):
            p.kill()
            p.wait()


def test_a_rank_file_that_did_not_change_has_not_answered_though_the_nodes_look_at_its_process_did():
    """The watch adds each rank's /proc state and CPU (``"os"``) to its file's line: the line changes every second
    while the rank's own counter ``n`` stands still. It has not answered since ``n`` last changed."""
    ws, mux, clock, _ = _watches()
    ws.watch(1, "n1", lambda: ["watch"])
    mux.feed("watch-n1", b"1\t" + _rank_line(0, 5, os="R 100", hz=100) + b"\n")
    for t in range(1, 6):
        clock.advance(1.0)
        mux.feed("watch-n1", b"1\t" + _rank_line(0, 5, os=f"R {100 + 100 * t}", hz=100) + b"\n")
    v = ws.rank_views("n1")[0]
    assert v.answered_age_s == 5.0 and not v.answering and (v.os_state, v.os_cpu_s) == ("R", 6.0)
    clock.advance(1.0)
    mux.feed("watch-n1", b"1\t" + _rank_line(0, 6, os="R 700", hz=100) + b"\n")
    assert ws.rank_views("n1")[0].answered_age_s == 0.0
