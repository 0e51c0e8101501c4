"""How long a node's watch may stay silent before that counts as a failed probe.

The watch prints a line a second over the node's SSH connection, and one at once when what it reports changes
(``runtimes.WATCH``): its gaps are 1 s or shorter. A fixed limit (``heartbeat_timeout_s``, max(2, 2 x
probe_interval_s): a steady node misses about one line before its silence counts) declares a healthy node silent
when its lines come late: an sshd slowed down, a controller starved of CPU. So the limit follows each node's own
record, in the spirit of phi-accrual failure detection (Hayashibara et al., 2004; Cassandra, Akka): the gaps
between the node's recent lines are fitted with a normal distribution, and a silence counts only once it is less
likely than ``10**-PHI`` under it — and longer than ``MARGIN`` times the longest gap the node had recently and came
back from. The result never goes below the configured limit (a steady node is judged by exactly that limit) nor
above ``CAP`` times it (a partitioned node is still found in bounded time). A killed process does not depend on
this at all: the watch reports it gone.
"""
from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

SAMPLES = 120          # gaps kept per node: about 2 minutes of lines
MIN_SAMPLES = 10       # fewer (a node's first 10 s, as when the watch printed twice a second): the configured limit
PHI = 8.0              # a silence this unlikely (probability 1e-8) under the node's own gaps is suspicious
MIN_SIGMA = 0.05       # x the configured limit: a steady watch has almost no spread; do not read it as certainty
                       # (and keep a steady node at the configured limit: 1 s gaps + Z x 0.1 s = 1.56 s < 2 s)
MARGIN = 1.25          # and longer than 1.25 x the longest recent gap
CAP = 4.0              # never more than 4 x the configured limit
RECOMPUTE = 8          # the fit is redone after this many lines (or at once when a gap beats the longest one)
_Z = statistics.NormalDist().inv_cdf(1 - 10 ** -PHI)


@dataclass
class Arrivals:
    """The arrival times of one node's watch lines (times from one monotonic clock)."""

    floor_s: float                                     # the configured limit (heartbeat_timeout_s)
    gaps: deque = field(default_factory=lambda: deque(maxlen=SAMPLES))
    last: float | None = None
    # the last fit: (lines seen then, its longest gap, the limit). ``limit()`` is asked for every node every
    # probe round; refitting 240 gaps each time was most of a round's CPU at 1,000+ nodes
    _fit: tuple[int, float, float] | None = field(default=None, repr=False)
    _count: int = field(default=0, repr=False)

    def arrived(self, now: float) -> None:
        if self.last is not None:
            gap = max(0.0, now - self.last)
            self.gaps.append(gap)
            self._count += 1
            if self._fit is not None and gap > self._fit[1]:
                self._fit = None          # a longer stall than any in the fit: the limit must follow at once
        self.last = now

    def restart(self) -> None:
        """A new watch (a new attempt): the wait for its first line is not a gap of the node's heartbeat."""
        self.last = None

    def limit(self) -> float:
        """Seconds of silence after which the node counts as one failed probe."""
        fit = self._fit
        if fit is not None and self._count - fit[0] < RECOMPUTE:
            return fit[2]
        count = self._count
        gaps = tuple(self.gaps)       # one copy (the watch's thread appends meanwhile)
        if len(gaps) < MIN_SAMPLES:
            return self.floor_s
        mean = math.fsum(gaps) / len(gaps)
        sigma = max(MIN_SIGMA * self.floor_s, math.sqrt(math.fsum((g - mean) ** 2 for g in gaps) / len(gaps)))
        longest = max(gaps)
        limit = min(CAP * self.floor_s, max(self.floor_s, mean + _Z * sigma, MARGIN * longest))
        self._fit = (count, longest, limit)
        return limit
