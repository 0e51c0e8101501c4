"""One persistent transport per node: made on first use, kept between commands, dropped on a transport error.

What the supervisor's ``ClusterOps`` runs its commands, watches and log followers over. Connecting holds only that
node's lock: a node whose link is down (connect timeout) never holds up the connections to the others. A thread
waits for another thread's connect to the same node at most ``wait_s`` (issue 24: threads piled up behind a slow
sshd, each waiting forever), then fails with a ``ConnectError`` for that node.
"""
from __future__ import annotations

import threading
from typing import Callable, Sequence

from clusterctl.errors import ConnectError, TransportError
from clusterctl.transport.base import CommandResult, Transport


class Pool:
    """``connect(node)`` makes a node's transport (called again after ``drop``)."""

    def __init__(self, connect: Callable[[str], Transport], *, wait_s: float = 30.0) -> None:
        """``wait_s``: the longest wait for another thread's connect to the same node (more than a connect takes)."""
        self._connect, self.wait_s = connect, wait_s
        self._transports: dict[str, Transport] = {}
        self._lock = threading.Lock()
        self._connecting: dict[str, threading.Lock] = {}

    def get(self, node: str) -> Transport:
        """The node's kept connection, made on first use."""
        with self._lock:
            t = self._transports.get(node)
            if t is not None:
                return t
            node_lock = self._connecting.setdefault(node, threading.Lock())
        if not node_lock.acquire(timeout=self.wait_s):
            raise ConnectError(node, f"another connect to {node} did not finish within {self.wait_s:g}s")
        try:
            with self._lock:
                t = self._transports.get(node)
            if t is None:
                t = self._connect(node)
                with self._lock:
                    self._transports[node] = t
            return t
        finally:
            node_lock.release()

    def run(self, node: str, argv: Sequence[str], *, timeout: float, stdin: bytes | None = None) -> CommandResult:
        """``argv`` over the node's kept connection; a transport error drops it (the next call reconnects)."""
        try:
            return self.get(node).run(argv, timeout=timeout, stdin=stdin)
        except TransportError:
            self.drop(node)
            raise

    def drop(self, node: str) -> None:
        """Close and forget the node's connection (a dead one may fail to close in any way: ignored)."""
        with self._lock:
            t = self._transports.pop(node, None)
        if t is not None:
            try:
                t.close()
            except Exception:  # noqa: BLE001 - closing a dead connection may fail in any way
                pass

    def close(self) -> None:
        for node in list(self._transports):
            self.drop(node)
