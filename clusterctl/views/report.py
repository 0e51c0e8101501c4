"""``clusterctl report JOB`` as text: the goodput report (``model.goodput.build``) in a few lines an on-call
engineer pastes into a post-mortem. Pure."""
from __future__ import annotations

LABELS = {
    "program_startup": "start-up", "wasted_progress_from_disruption": "redone work",
    "infrastructure_recovery_from_disruption": "recovery", "unproductive_checkpoint_save_time": "checkpoint save",
    "unproductive_checkpoint_restore_time": "checkpoint restore", "data_loading": "data loading",
    "other": "other", "hang_detection": "hang detection", "backoff": "backoff",
    "waiting_for_nodes": "waiting for nodes",
}


def seconds(x: float | None) -> str:
    if x is None:
        return "?"
    if x < 1:              # a 20 ms step is 0.02s, not 0.0s
        return f"{x:.2g}s"
    if x < 60:
        return f"{x:.1f}s"
    m, s = divmod(int(round(x)), 60)
    h, m = divmod(m, 60)
    return f"{h}h{m:02d}m{s:02d}s" if h else f"{m}m{s:02d}s"


def pct(x: float | None) -> str:
    return "unknown" if x is None else f"{100 * x:.1f}%"


def _after(t: float | None, t0: float | None) -> str:
    return "?" if t is None or t0 is None else f"+{t - t0:.1f}s"


def text(r: dict) -> list[str]:
    wall = r["wall_s"] or 0.0
    head = f"job {r.get('name') or '?'} ({r.get('job_id') or '?'})" + (f": {r['state']}" if r.get("state") else "")
    lines = [head,
             f"wall {seconds(wall)}, productive {seconds(r['productive_s'])}, goodput {pct(r['goodput'])}, "
             f"ETTR {pct(r['ettr'])} (queue and waits included)"]
    st = r.get("steps")
    if st:
        every = (r.get("step_signal") or {}).get("every")
        lines.append(f"steps {st['first']} -> {st['last']}, step time {seconds(st['median_s'])} median, "
                     f"{seconds(st['p90_s'])} p90" + (f" (seen every {every:g} steps)" if every and every > 1 else ""))
    losses = sorted(((v, k) for k, v in r["badput_s"].items() if v and v > 0), reverse=True)
    if r.get("unknown_s"):
        losses.insert(0, (r["unknown_s"], "unknown"))
    if losses:
        lines.append("lost: " + ", ".join(f"{LABELS.get(k, k)} {seconds(v)} ({100 * v / wall:.1f}%)" if wall else
                                          f"{LABELS.get(k, k)} {seconds(v)}" for v, k in losses[:4]))
    ds = r["disruptions"]
    lines.append(f"disruptions: {len(ds)}" if ds else "disruptions: none")
    for d in ds:
        t0 = d["fault_at"] if d["fault_at"] is not None else d["detected_at"]
        since = "the fault" if d["fault_at"] is not None else "the verdict (the fault's time is unknown)"
        redone = (f"{d['lost_steps']} steps / {seconds(d['lost_s'])} redone" if d["lost_steps"] is not None
                  else "redone work unknown")
        lines.append(
            f"  attempt {d['attempt']}: {d['verdict']}" + (f" on {d['node']}" if d["node"] else "")
            + f"; after {since}: detected {_after(d['detected_at'], t0)}, stopped {_after(d['stopped_at'], t0)}, "
            f"restarted {_after(d['restarted_at'], t0)}"
            + (f" ({d['recovery']})" if d["recovery"] else "")
            + f", training again {_after(d['first_step_at'], t0)}; {redone}"
            + ("; node cordoned" if d["cordoned"] else ""))
    for u in r.get("unknown") or []:
        lines.append(f"cannot tell: {u}")
    return lines
