"""The supervisor's memory of one attempt's ranks (issue 37): each round it judges the rank views the watches
brought (``model.ranks.judge``), tells what changed (a rank newly stuck or recovered, a straggler named or
recovered), which stuck rank makes the attempt a hang, and the document ``clusterctl top`` reads
(``<job dir>/ranks.json``). Pure: the supervisor does the events and the verdict, jobdir the write.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from clusterctl.model import ranks
from clusterctl.model.ranks import ArrivalLog, RankState, Rates, Straggler, Stragglers, Views


SLOWDOWN_EVERY_S = 5.0    # slowdowns are computed this often (a straggler is named after 60 s; it costs CPU)


@dataclass(frozen=True)
class Look:
    """What one round of rank views says."""

    states: list[RankState]
    stuck: list[RankState] = field(default_factory=list)       # newly stuck this round
    unstuck: list[RankState] = field(default_factory=list)     # stuck before, not now (nor gone)
    named: list[Straggler] = field(default_factory=list)       # stragglers named this round
    recovered: list[Straggler] = field(default_factory=list)
    culprit: RankState | None = None                           # a stuck rank past stuck_timeout_s: a hang


@dataclass
class RankWatch:
    stuck_timeout_s: float
    stragglers: Stragglers = field(default_factory=Stragglers)
    rates: Rates = field(default_factory=Rates)
    arrivals: ArrivalLog = field(default_factory=ArrivalLog)
    _stuck: dict[tuple[str, int], RankState] = field(default_factory=dict)
    _slow_at: float = -float("inf")
    _colls: int = -1

    def look(self, views: Views, *, now: float, gone_nodes=(), all_running: bool = True) -> Look:
        """``now``: the supervisor's clock; ``all_running``: every node's process runs and answers (else no
        culprit this round: a node being lost is the verdict's to name)."""
        self.rates.update(views, now)
        computing = {k for k, pct in self.rates.cpu_pct.items() if pct >= ranks.COMPUTING_PCT}
        states = ranks.judge(views, gone_nodes=gone_nodes, computing=computing)
        named, recovered = [], []
        if now - self._slow_at >= SLOWDOWN_EVERY_S:       # each rank refreshes its arrivals every 10 s
            self._slow_at, slow = now, ranks.slowdowns(views, self.arrivals)
            # collectives completed since the last look (any rank's count moved): a pause is no straggler
            done = sum(v.colls or 0 for node_views in views.values() for v in node_views.values())
            moving, self._colls = done != self._colls, done
            named, recovered = self.stragglers.update(slow, now, moving=moving)
        stuck_now = {(s.node, s.rank): s for s in states if s.state == "stuck"}
        new = [s for k, s in stuck_now.items() if k not in self._stuck]
        gone = {(s.node, s.rank) for s in states if s.state == "gone"}
        unstuck = [s for k, s in self._stuck.items() if k not in stuck_now and k not in gone]
        self._stuck = stuck_now
        culprit = ranks.stuck_culprit(states, stuck_timeout_s=self.stuck_timeout_s) if all_running else None
        return Look(states, new, unstuck, named, recovered, culprit)

    def document(self, look: Look, *, job_id: str, attempt: int, wall: float) -> dict[str, Any]:
        """``ranks.json``: every rank's row for ``top`` (the keys ``top --output json`` prints) and the
        stragglers."""
        rows = []
        for s in look.states:
            key = (s.node, s.rank)
            rows.append({"node": s.node, "rank": s.rank, "step": s.step,
                         "step_time_s": _round(self.rates.step_time.get(key), 3), "state": s.state,
                         "cpu_pct": _round(self.rates.cpu_pct.get(key), 1), "rss_bytes": s.rss,
                         "gpu_util_pct": s.gpu_util, "gpu_mem_bytes": s.gpu_mem,
                         "waiting_s": _round(s.waiting_s, 1), "collective": str(s.in_coll) if s.in_coll else None,
                         "progress_age_s": _round(s.progress_age_s, 1), "where": s.where or None,
                         "why": s.why or None, "data_wait": s.data_wait,
                         "stuck": s.message() if s.state == "stuck" else None})
        return {"v": 1, "job_id": job_id, "attempt": attempt, "time": wall, "ranks": rows,
                "stragglers": [x.as_json() for x in self.stragglers.listed()]}


def _round(x: float | None, digits: int) -> float | None:
    return None if x is None else round(x, digits)
