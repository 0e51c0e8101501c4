"""What `clusterctl top JOB` shows (pure): every rank of the running attempt, from the rank view the job's
supervisor writes each round (``<job dir>/ranks.json``: ``supervise.ranklook``), as a table or as JSON.

The states (docs/oncall.md "clusterctl top"): starting (no step yet), training (progress in the last seconds),
waiting (in a collective, or in its own code with nobody waiting for it), stuck (its peers wait for it, and it
makes no progress: no CPU, no I/O, the same stack; or stopped; or in another collective than theirs), busy (no
progress but computing or writing: never a hang before hang_timeout_s), gone (its process is gone).
"""
from __future__ import annotations

from typing import Any

from clusterctl.views.columns import Column, fit

STALE_S = 10.0       # a rank view this old says nothing about now: the supervisor is not writing it
LOW_GPU_PCT = 70.0   # the seeds' on-call advice: below ~70 % GPU utilisation, look at the data or the network
KEYS = ("node", "rank", "step", "step_time_s", "state", "cpu_pct", "rss_bytes", "gpu_util_pct", "gpu_mem_bytes",
        "waiting_s", "collective", "where")


def rows(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """Every rank of ``ranks.json``, with the keys ``top --output json`` promises (others kept after them)."""
    out = []
    for r in doc.get("ranks") or []:
        if not isinstance(r, dict):
            continue
        out.append({**{k: r.get(k) for k in KEYS}, **{k: v for k, v in r.items() if k not in KEYS}})
    return out


def stale(doc: dict[str, Any] | None, now: float) -> bool:
    return doc is None or not isinstance(doc.get("time"), (int, float)) or now - doc["time"] > STALE_S


def advice(rs: list[dict[str, Any]]) -> list[str]:
    """What the view says about where time goes, where it can tell (the seeds' advice: GPU utilisation below ~70 %:
    the data pipeline or the communication; which one?)."""
    out = []
    for r in rs:
        if r.get("state") == "stuck" and r.get("stuck"):
            out.append(f"STUCK: {r['stuck']}")
    data = [r for r in rs if r.get("data_wait")]
    waiting = [r for r in rs if r.get("state") == "waiting" and (r.get("waiting_s") or 0) >= 1]
    low = [r for r in rs if r.get("gpu_util_pct") is not None and r["gpu_util_pct"] < LOW_GPU_PCT]
    if data:
        out.append("data pipeline: " + _ranks(data) + " wait for their DataLoader workers (more workers, faster "
                   "storage, or prefetch)")
    elif waiting and len(waiting) < len(rs):
        late = [r for r in rs if r not in waiting and r.get("state") in ("training", "busy", "stuck")]
        out.append("communication: " + _ranks(waiting) + " wait in collectives"
                   + (f" for {_ranks(late)}" + (" (stuck)" if all(r.get("state") == "stuck" for r in late)
                                                    else " (the slow side)") if late else ""))
    if low and not data and not waiting:
        out.append(f"GPU utilisation below {LOW_GPU_PCT:.0f}% on {_ranks(low)} with no rank waiting: look at the "
                   "step's own code (host work between kernels, small batches)")
    return out


def _ranks(rs: list[dict[str, Any]]) -> str:
    names = [f"{r.get('node')}/{r.get('rank')}" for r in rs]
    return "rank " + names[0] if len(names) == 1 else "ranks " + ", ".join(names[:8]) + (" ..." if len(names) > 8
                                                                                           else "")


def text(doc: dict[str, Any], job_id: str, *, now: float, width: int = 120) -> list[str]:
    """The table ``top`` prints (and refreshes)."""
    rs = rows(doc)
    head = (f"job {job_id}  attempt {doc.get('attempt', '-')}  {len(rs)} ranks"
            + (f"  (view {now - doc['time']:.0f}s old)" if isinstance(doc.get("time"), (int, float)) else ""))
    cols = [Column("node"), Column("rank", right=True), Column("step", right=True),
            Column("step time", right=True, short="s/step"), Column("state"), Column("cpu%", right=True),
            Column("rss", right=True), Column("gpu%", right=True), Column("gpu mem", right=True, short="gmem"),
            Column("waiting", right=True, short="wait"), Column("where", min=12, optional=True)]
    table = [[str(r["node"] or "-"), str(r["rank"]), _n(r["step"]), _s(r["step_time_s"], 3), str(r["state"]),
              _n(r["cpu_pct"], "{:.0f}"), _bytes(r["rss_bytes"]), _n(r["gpu_util_pct"], "{:.0f}"),
              _bytes(r["gpu_mem_bytes"]), _s(r["waiting_s"], 1) + (f" {r['collective']}" if r["collective"] else ""),
              str(r["where"] or "-")] for r in rs]
    lines = [head, *fit(cols, table, width, spill=10)]
    for s in doc.get("stragglers") or []:
        lines.append(f"straggler: node {s.get('node')} rank {s.get('rank')} {s.get('slowdown')}x slower")
    return lines + advice(rs)


def _n(x: Any, fmt: str = "{}") -> str:
    return "-" if x is None else fmt.format(x)


def _s(x: Any, digits: int) -> str:
    return "-" if x is None else f"{x:.{digits}f}s"


def _bytes(x: Any) -> str:
    if x is None:
        return "-"
    for unit in ("B", "K", "M", "G", "T"):
        if abs(x) < 1024 or unit == "T":
            return f"{x:.0f}{unit}" if unit == "B" else f"{x:.1f}{unit}"
        x /= 1024
    return "-"
