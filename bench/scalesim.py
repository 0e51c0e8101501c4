"""Simulated nodes for ``bench/scale.py --simulate``: the supervisor's real machinery over fake transports.

A forked *node server* (one process, one selector loop) plays every node: a stream opened by the controller
connects to its unix socket and says ``W <i>`` (the node's watch, as ``runtimes.WATCH``: it looks every 0.5 s and
prints ``1`` at every second look, ``0`` at the first look after its process was killed, then a line a second;
nothing once it is partitioned) or ``L <i>`` (the node's log: ``[0]:seq <k>`` lines at a fixed rate,
``k`` from 0 for every stream, as a node's log is streamed from its first line). So the controller's CPU,
memory and threads are its own, measured in its own process; nodes' output arrives through real file
descriptors, as over SSH.

``SimTransport`` answers ``run`` at once from the simulated state (the bare runtime's listing, start, kill).
"""
from __future__ import annotations

import os
import selectors
import signal
import socket
import threading
import time
from pathlib import Path

from clusterctl.transport.base import CommandResult

LOOK = 0.5            # the watch looks this often; it prints when what it says changed, else every LOOKS_PER_LINE
LOOKS_PER_LINE = 2
TICK = 0.05


def serve(path: str, n: int, log_rate: float, control: int) -> None:
    """The node server's loop (in the forked child). ``control``: a pipe fd carrying ``kill i``/``cut i``."""
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4096)
    srv.setblocking(False)
    sel = selectors.DefaultSelector()
    sel.register(srv, selectors.EVENT_READ, "accept")
    sel.register(control, selectors.EVENT_READ, "control")
    watches: dict[socket.socket, int] = {}
    logs: dict[socket.socket, list] = {}          # sock -> [node, next seq, start time]
    killed: set[int] = set()
    cut: set[int] = set()
    pending: dict[socket.socket, bytes] = {}
    drops = 0
    next_tick = time.monotonic()
    tick_no = 0
    ticks_per_look = round(LOOK / TICK)
    said: dict[socket.socket, tuple[bytes, int]] = {}    # watch -> (its last line, looks since)

    def send(s: socket.socket, data: bytes) -> bool:
        nonlocal drops
        try:
            s.send(data)
            return True
        except BlockingIOError:
            drops += 1
            return True
        except OSError:
            return False

    while True:
        timeout = max(0.0, next_tick - time.monotonic())
        for key, _ in sel.select(timeout):
            if key.data == "accept":
                try:
                    c, _ = srv.accept()
                except BlockingIOError:
                    continue
                c.setblocking(False)
                pending[c] = b""
                sel.register(c, selectors.EVENT_READ, "hello")
            elif key.data == "control":
                msg = os.read(control, 4096).decode()
                if not msg:
                    return
                for line in msg.splitlines():
                    verb, arg = line.split()
                    if verb == "kill":
                        killed.add(int(arg))
                    elif verb == "cut":
                        cut.add(int(arg))
                    else:                 # heal
                        cut.discard(int(arg))
                        killed.discard(int(arg))
            else:
                c = key.fileobj
                try:
                    data = c.recv(256)
                except OSError:
                    data = b""
                if key.data == "hello" and data and b"\n" in pending[c] + data:
                    kind, node = (pending.pop(c) + data).split(b"\n")[0].split()
                    sel.modify(c, selectors.EVENT_READ, "stream")
                    if kind == b"W":
                        watches[c] = int(node)
                    else:
                        logs[c] = [int(node), 0, time.monotonic()]
                elif key.data == "hello" and data:
                    pending[c] += data
                elif not data:            # the controller closed the stream
                    sel.unregister(c)
                    pending.pop(c, None)
                    watches.pop(c, None)
                    said.pop(c, None)
                    logs.pop(c, None)
                    c.close()
        now = time.monotonic()
        if now < next_tick:
            continue
        next_tick += TICK
        tick_no += 1
        for c, node in list(watches.items()):
            # nodes' watches are not synchronised: node i looks in its own slot of the 0.5 s period
            if node % ticks_per_look == tick_no % ticks_per_look and node not in cut:
                line = b"0\n" if node in killed else b"1\n"
                last, looks = said.get(c, (b"", LOOKS_PER_LINE))
                if line == last and looks + 1 < LOOKS_PER_LINE:
                    said[c] = (last, looks + 1)
                    continue
                said[c] = (line, 0)
                if not send(c, line):
                    watches.pop(c, None)
        for c, st in list(logs.items()):
            node, seq, t0 = st
            due = int((now - t0) * log_rate)
            if due > seq and node not in cut and node not in killed:
                lines = b"".join(b"[0]:seq %d\n" % k for k in range(seq, due))
                st[1] = due
                if not send(c, lines):
                    logs.pop(c, None)


class NodeServer:
    """Forks the node server (before the controller starts any thread) and steers it."""

    def __init__(self, path: Path, n: int, log_rate: float):
        self.path = str(path)
        r, w = os.pipe()
        self.pid = os.fork()
        if self.pid == 0:                         # the child: nodes only
            os.close(w)
            try:
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                serve(self.path, n, log_rate, r)
            finally:
                os._exit(0)
        os.close(r)
        self.control = w
        deadline = time.monotonic() + 10
        while not os.path.exists(self.path):
            if time.monotonic() > deadline:
                raise RuntimeError("node server did not start")
            time.sleep(0.01)

    def tell(self, verb: str, node: int) -> None:
        os.write(self.control, f"{verb} {node}\n".encode())

    def close(self) -> None:
        os.close(self.control)
        os.waitpid(self.pid, 0)

    def cpu_s(self) -> float:
        with open(f"/proc/{self.pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class SimStream:
    def __init__(self, sock: socket.socket):
        self.sock = sock
        sock.setblocking(False)

    def fileno(self) -> int:
        return self.sock.fileno()

    def read(self) -> bytes | None:
        try:
            return self.sock.recv(65536)
        except BlockingIOError:
            return None

    def close(self) -> None:
        self.sock.close()


class SimState:
    """What every simulated node runs: per node, the attempt and whether its process was killed."""

    def __init__(self):
        self.attempt: dict[str, int] = {}
        self.killed: set[str] = set()
        self.lock = threading.Lock()


class SimTransport:
    """A node's transport: ``stream`` over the node server, ``run`` answered from ``SimState``."""

    def __init__(self, host, index: int, server: NodeServer, state: SimState, job_id: str):
        self.host, self.index, self.server, self.state, self.job_id = host, index, server, state, job_id

    def _connect(self, kind: str) -> socket.socket:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.connect(self.server.path)
        s.sendall(f"{kind} {self.index}\n".encode())
        return s

    def stream(self, argv, on_data, stop: threading.Event) -> None:
        """As ``SSHTransport.stream``: select with a 0.5 s timeout, recv, until EOF or ``stop``."""
        import select

        s = self._connect("W" if "clusterctl-watch" in argv else "L")
        poller = select.poll()          # (select.select fails for fds >= 1024: see SSHTransport)
        poller.register(s, select.POLLIN)
        try:
            while not stop.is_set():
                if poller.poll(500):
                    data = s.recv(65536)
                    if not data:
                        break
                    on_data(data)
        finally:
            s.close()

    def open_stream(self, argv) -> "SimStream":
        """As ``SSHTransport.open_stream``: the started stream for ``StreamMux`` (one selector thread)."""
        return SimStream(self._connect("W" if "clusterctl-watch" in argv else "L"))

    def run(self, argv, *, timeout=None, stdin=None) -> CommandResult:
        text = " ".join(map(str, argv))
        name = self.host.name
        out = ""
        if "clusterctl-start" in text:
            with self.state.lock:
                # the node dir ends in /<attempt>
                self.state.attempt[name] = int(str(argv[4]).rstrip("/").rsplit("/", 1)[-1])
                self.state.killed.discard(name)
        elif "clusterctl-list" in text:
            a = self.state.attempt.get(name)
            if a is not None:
                st, ec = ("exited", "137") if name in self.state.killed else ("running", "")
                out = f"{a}\t{st}\t{ec}\t4242\tc-{name}\t{self.job_id}\n"
        elif "clusterctl-tail" in text or "clusterctl-logs" in text:
            out = "[0]:seq 0\n"
        return CommandResult(tuple(map(str, argv)), 0, out, "", 0.0)

    def put(self, data, path, mode=0o600) -> None:
        pass

    def close(self) -> None:
        pass
