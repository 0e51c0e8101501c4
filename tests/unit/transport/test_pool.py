"""transport.pool.Pool: one kept connection per node, dropped on a transport error, connects that never wait for
another node's."""
from __future__ import annotations

import threading

import pytest

from clusterctl.errors import TransportError
from clusterctl.transport.base import CommandResult
from clusterctl.transport.pool import Pool


class Fake:
    def __init__(self, node: str, fail: bool = False, close_fails: bool = False):
        self.node, self.fail, self.close_fails, self.closed, self.runs = node, fail, close_fails, False, []

    def run(self, argv, *, timeout=None, stdin=None):
        self.runs.append((list(argv), timeout, stdin))
        if self.fail:
            raise TransportError(self.node, "connection lost")
        return CommandResult(tuple(argv), 0, "ok\n", "", 0.0)

    def close(self):
        self.closed = True
        if self.close_fails:
            raise OSError("socket already gone")


def test_a_node_keeps_its_connection_until_a_transport_error_drops_it():
    made: list[Fake] = []

    def connect(node):
        made.append(Fake(node, fail=len(made) == 1))      # the second connection made breaks on use
        return made[-1]

    pool = Pool(connect)
    assert pool.run("n1", ["true"], timeout=3, stdin=b"x").stdout == "ok\n"
    assert made[0].runs == [(["true"], 3, b"x")]
    assert pool.get("n1") is made[0] and len(made) == 1     # kept
    assert pool.get("n2") is made[1]
    with pytest.raises(TransportError):
        pool.run("n2", ["true"], timeout=3)
    assert made[1].closed                                    # dropped...
    assert pool.get("n2") is made[2] and not made[0].closed  # ...and made again on next use; n1's untouched


def test_an_error_that_is_not_the_transports_keeps_the_connection():
    class Broken(Fake):
        def run(self, argv, *, timeout=None, stdin=None):
            raise ValueError("a bug, not a lost connection")

    t = Broken("n1")
    pool = Pool(lambda node: t)
    with pytest.raises(ValueError):
        pool.run("n1", ["true"], timeout=1)
    assert not t.closed and pool.get("n1") is t


def test_close_closes_every_connection_even_when_one_fails_to_close():
    made = {}
    pool = Pool(lambda node: made.setdefault(node, Fake(node, close_fails=node == "n1")))
    for n in ("n1", "n2", "n3"):
        pool.get(n)
    pool.close()
    assert all(t.closed for t in made.values())
    pool.drop("n2")                                          # nothing left: a no-op


def test_a_node_that_cannot_connect_does_not_hold_up_the_others():
    entered, release = threading.Event(), threading.Event()

    def connect(node):
        if node == "n1":
            entered.set()
            release.wait(10)
            raise TransportError(node, "connect timed out")
        return Fake(node)

    pool = Pool(connect)
    errors = []
    slow = threading.Thread(target=lambda: errors.append(pytest.raises(TransportError, pool.get, "n1")))
    slow.start()
    assert entered.wait(10)
    try:
        assert pool.get("n2").node == "n2" and pool.get("n3").node == "n3"   # while n1 is still connecting
    finally:
        release.set()
        slow.join(10)
    assert errors and not slow.is_alive()


def test_one_node_is_connected_once_by_concurrent_callers():
    calls, gate = [], threading.Event()

    def connect(node):
        calls.append(node)
        gate.wait(10)
        return Fake(node)

    pool = Pool(connect)
    got = []
    threads = [threading.Thread(target=lambda: got.append(pool.get("n1"))) for _ in range(4)]
    for th in threads:
        th.start()
    gate.set()
    for th in threads:
        th.join(10)
    assert calls == ["n1"] and len(got) == 4 and len({id(t) for t in got}) == 1


def test_waiting_for_another_threads_connect_has_a_deadline():
    """Issue 24 item 7: a thread that finds another thread connecting to the same node waits ``wait_s`` at most."""
    import time

    from clusterctl.errors import ConnectError

    release = threading.Event()

    def connect(node):
        release.wait(30)              # a connect stuck on a slow sshd (in real life bounded by connect_timeout)
        return Fake(node)

    pool = Pool(connect, wait_s=0.3)
    first = threading.Thread(target=pool.get, args=("n1",), daemon=True)
    first.start()
    time.sleep(0.1)
    t0 = time.monotonic()
    with pytest.raises(ConnectError, match="did not finish within 0.3s"):
        pool.get("n1")
    assert time.monotonic() - t0 < 2
    release.set()
    first.join(5)
    assert isinstance(pool.get("n1"), Fake)      # the lock was released: the next get finds the connection
