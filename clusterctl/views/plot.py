"""``clusterctl report JOB --plot FILE``: the run as a picture (PNG or SVG, by FILE's extension). One lane per
node: each attempt it was in, coloured by where the time went (start-up, training, redone work, detection,
recovery, backoff, waiting); faults (x on the lost node's lane), verdicts (dashed), restarts (dotted) and
checkpoints (ticks on the top lane) marked; goodput in the title. matplotlib is an optional extra
(``pip install 'clusterctl[plot]'``)."""
from __future__ import annotations

from pathlib import Path
from typing import Mapping, Sequence

from clusterctl.errors import UserError
from clusterctl.model.events import EventKind
from clusterctl.model.goodput import Mark, Segment
from clusterctl.views.report import LABELS, pct

FORMATS = (".png", ".svg")
EXTRA = "plot"
COLOURS = {
    "productive": "#2ca02c", "program_startup": "#9e9e9e", "wasted_progress_from_disruption": "#ff7f0e",
    "infrastructure_recovery_from_disruption": "#d62728", "hang_detection": "#9467bd", "backoff": "#8c564b",
    "waiting_for_nodes": "#e377c2", "other": "#c7c7c7", "unknown": "#bcd4e6",
}
ALL = "job"         # the top lane: the whole job (checkpoints, and every interval between attempts)


def check_path(path: str) -> Path:
    p = Path(path)
    if p.suffix.lower() not in FORMATS:
        raise UserError(f"--plot {path}: the file's extension says the format: .png or .svg")
    if not p.parent.is_dir():
        raise UserError(f"--plot {path}: no directory {p.parent}")
    return p


def _pyplot():
    try:
        import matplotlib
    except ImportError:
        raise UserError(f"--plot needs matplotlib, an optional extra: pip install 'clusterctl[{EXTRA}]'") from None
    matplotlib.use("Agg")           # no display: a file only
    import matplotlib.pyplot as plt

    return plt


def plot(report: dict, segments: Sequence[Segment], marks: Sequence[Mark], lanes: Mapping[int, Sequence[str]],
         path: str) -> Path:
    """Write the picture to ``path`` (``check_path``). ``lanes``: each attempt's nodes (an attempt missing there
    is drawn on the top lane only)."""
    out = check_path(path)
    plt = _pyplot()
    t0 = report.get("started_at") or min((s.start for s in segments), default=0.0)
    nodes = sorted({n for ns in lanes.values() for n in ns})
    rows = [ALL, *nodes]
    y = {name: len(rows) - 1 - i for i, name in enumerate(rows)}
    fig, ax = plt.subplots(figsize=(11, 1.2 + 0.55 * len(rows)))
    used = set()
    for s in segments:
        for lane in [ALL, *lanes.get(s.attempt, ())]:
            ax.broken_barh([(s.start - t0, s.end - s.start)], (y[lane] - 0.35, 0.7),
                           facecolors=COLOURS.get(s.bucket, "#dddddd"), edgecolor="none")
        used.add(s.bucket)
    for m in marks:
        x = m.time - t0
        if m.kind == EventKind.CHECKPOINT:
            ax.plot([x, x], [y[ALL] - 0.45, y[ALL] + 0.45], color="black", lw=0.8)
        elif m.kind == EventKind.START and (m.attempt or 0) > 1:
            ax.axvline(x, color="#1f77b4", ls=":", lw=1)
    for d in report.get("disruptions") or []:
        ax.axvline(d["detected_at"] - t0, color="#d62728", ls="--", lw=1)
        if d["fault_at"] is not None:
            lane = d["node"] if d["node"] in y else ALL
            ax.plot([d["fault_at"] - t0], [y[lane]], marker="x", color="black", ms=10, mew=2)
    ax.set_yticks([y[r] for r in rows], rows)
    ax.set_xlabel("seconds since the first start")
    ax.set_xlim(0, max(report.get("wall_s") or 0.0, 1.0))
    ax.set_ylim(-0.6, len(rows) - 0.4)
    title = (f"{report.get('name') or report.get('job_id') or 'job'}: goodput {pct(report.get('goodput'))}, "
             f"ETTR {pct(report.get('ettr'))}, {len(report.get('disruptions') or [])} disruption(s)")
    ax.set_title(title)
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    handles = [Patch(color=COLOURS[b], label="training (kept)" if b == "productive" else LABELS.get(b, b))
               for b in COLOURS if b in used]
    handles += [Line2D([], [], color="black", marker="x", ls="none", label="fault (last step seen)"),
                Line2D([], [], color="#d62728", ls="--", label="verdict"),
                Line2D([], [], color="#1f77b4", ls=":", label="restart"),
                Line2D([], [], color="black", marker="|", ls="none", label="checkpoint")]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.25 if len(rows) > 2 else -0.4),
              ncol=5, fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(out, format=out.suffix.lower()[1:], dpi=110)
    plt.close(fig)
    return out
