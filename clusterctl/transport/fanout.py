"""Run a function on many hosts: bounded pool, per-host and overall deadlines, results as values.

A host that fails yields ``HostResult(error=...)``; it never aborts the others. A host still running when its
deadline passes yields ``DeadlineExceeded`` (its worker thread is a daemon and is abandoned, so one stuck host
cannot stall the caller).
"""
from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable, Generic, Sequence, TypeVar

from clusterctl.errors import DeadlineExceeded

H = TypeVar("H")
T = TypeVar("T")


@dataclass(frozen=True)
class HostResult(Generic[H, T]):
    host: H
    value: T | None = None
    error: BaseException | None = None
    duration_s: float = 0.0

    @property
    def ok(self) -> bool:
        return self.error is None


def _name(host) -> str:
    return getattr(host, "name", str(host))


def fan_out(hosts: Sequence[H], fn: Callable[[H], T], *, max_workers: int = 64, host_timeout: float | None = None,
            deadline: float | None = None, on_result: Callable[[HostResult], None] | None = None,
            clock: Callable[[], float] = time.monotonic) -> list[HostResult[H, T]]:
    """``fn(host)`` on every host, at most ``max_workers`` at once. Results come back in input order.

    ``host_timeout``: seconds one host may take from when its call starts. ``deadline``: seconds for the whole
    fan-out. ``on_result`` is called (from the caller's thread) as each host finishes, e.g. to drive progress.
    """
    n = len(hosts)
    if not n:                        # every probe round of a steady job (the watches answered for every node)
        return []
    results: list[HostResult | None] = [None] * n
    started: dict[int, float] = {}
    running: deque[int] = deque()    # started hosts in start order = the order their host_timeout expires
    left = [n]                       # hosts without a result (a count: no O(N) scan per finished host)
    queue = deque(range(n))
    cond = threading.Condition()
    t0 = clock()
    done_order: deque[int] = deque()

    def worker() -> None:
        while True:
            with cond:
                if not queue:
                    return
                i = queue.popleft()
                started[i] = clock()
                running.append(i)
            s = started[i]
            try:
                r = HostResult(hosts[i], value=fn(hosts[i]), duration_s=clock() - s)
            except BaseException as e:  # noqa: BLE001 - a host's failure is a value
                r = HostResult(hosts[i], error=e, duration_s=clock() - s)
            with cond:
                if results[i] is None:
                    results[i] = r
                    left[0] -= 1
                    done_order.append(i)
                cond.notify_all()

    def spawn() -> None:
        threading.Thread(target=worker, daemon=True, name="clusterctl-fanout").start()

    for _ in range(min(max_workers, n)):
        spawn()

    def expire(i: int, why: str) -> None:
        results[i] = HostResult(hosts[i], error=DeadlineExceeded(_name(hosts[i]), why),
                                duration_s=clock() - started.get(i, t0))
        left[0] -= 1
        done_order.append(i)
        if queue and i in started:  # its worker is stuck: replace it so the pool stays at max_workers
            spawn()

    with cond:
        while True:
            while done_order:
                i = done_order.popleft()
                if on_result:
                    on_result(results[i])
            if not left[0]:
                break
            now = clock()
            waits = []
            if deadline is not None:
                if now - t0 >= deadline:
                    for i in range(n):
                        if results[i] is None:
                            expire(i, f"no answer within the overall deadline of {deadline:g}s")
                    queue.clear()
                    continue
                waits.append(t0 + deadline - now)
            if host_timeout is not None:
                while running and (results[running[0]] is not None or now - started[running[0]] >= host_timeout):
                    i = running.popleft()
                    if results[i] is None:
                        expire(i, f"no answer within {host_timeout:g}s")
                if running:
                    waits.append(started[running[0]] + host_timeout - now)
                if done_order:
                    continue
            cond.wait(min(waits) if waits else None)
    return results  # type: ignore[return-value]
