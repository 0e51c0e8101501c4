"""Steady state: the step time of a job with the warm machinery (`recovery: warm`) and without (`recovery: cold`),
side by side, no fault; or (``--compare view``) with the rank view and without it.

    python bench/steady.py [--reps 3] [--steps 300] [--step-time 0.1] [--runtime podman] [--no-write]
    python bench/steady.py --compare view [...]

``--compare view``: both modes cold; ``view`` as every job runs (each rank's monitor thread writes its view file
once a second, clusterctl/rankview.py), ``noview`` with the job's torchrun command ``env -u CLUSTERCTL_VIEW_DIR
torchrun`` (the ranks still run through the wrapper, whose monitor then does not start). Besides the step times,
the monitors' own CPU time (``mon_cpu_s`` of each rank's last view file) per second of the run. Written to
``### the rank view's cost`` of ``## sick, not dead``.

On a 3-host testbed (``profile(gpus=0)``), the quickstart script (2 ranks per node, ``nodes: "2:3"``) trains
``--steps`` steps once per repetition and mode, warm and cold interleaved (warm first in odd repetitions, cold
first in even ones). A warm job runs an idle zygote beside each node's attempt (torch imported, waiting in
``select``); a cold job none. Per run: the median and mean seconds per step of rank 0's recorded steps after
step ``--skip`` (the first steps share the cores with the zygotes' start: torch imported once per node). The
``### steady state`` sub-section of ``## warm recovery`` is written from the medians over the runs.
"""
from __future__ import annotations

import datetime
import glob
import json
import os
import statistics
import sys
import time
from pathlib import Path

import common  # noqa: E402  (puts the repository root on sys.path)
from common import DOC, exit_on_signals  # noqa: E402
from docsection import write_subsection  # noqa: E402

from tests.integration import recovery_harness as rh  # noqa: E402
from tests.testbed import Testbed, profile  # noqa: E402

WARM = "## warm recovery"
SUB = "### steady state: no fault"
SICK = "## sick, not dead"
VIEW_SUB = "### the rank view's cost"
NO_VIEW_TORCHRUN = "env -u CLUSTERCTL_VIEW_DIR torchrun"


def _monitor_cpu(tb, job_id: str) -> tuple[float, int] | None:
    """The ranks' monitors' CPU seconds (summed over the ranks' last view files) and how many ranks."""
    files = glob.glob(f"{tb.home}/.clusterctl/nodes/*/jobs/{job_id}/*/view/rank-*")
    got = []
    for f in files:
        try:
            got.append(float(json.loads(Path(f).read_text())["mon_cpu_s"]))
        except (OSError, ValueError, KeyError, TypeError):
            continue
    return (sum(got), len(got)) if got else None


def run_one(tb, base: Path, mode: str, rep: int, args) -> dict:
    name = f"steady{mode[0]}{rep}"
    kw = {"recovery": mode} if mode in ("warm", "cold") else \
        {"recovery": "cold", **({"torchrun": NO_VIEW_TORCHRUN} if mode == "noview" else {})}
    run = rh.new_run(tb, base / name, name, runtime=args.runtime, steps=args.steps, every=args.every,
                     step_time=args.step_time, nproc=2, **kw)
    try:
        run.launch()
        if mode == "warm":
            rh.wait_zygotes(run, timeout=120)
        started = time.monotonic()
        cpu = None
        while (row := run.job_row()) is None or not row.terminal:       # the monitors' CPU, until the job ends
            if row is not None and mode == "view":
                cpu = _monitor_cpu(tb, row.job_id) or cpu
            if time.monotonic() - started > args.steps * (args.step_time + 1) + 300:
                break
            time.sleep(1)
        end = run.wait_end(60)
        recs = [r for r in run.steps_log() if r["step"] > args.skip]
        gaps = [b["time"] - a["time"] for a, b in zip(recs, recs[1:]) if b["step"] == a["step"] + 1]
        out = {"mode": mode, "rep": rep, "state": end["state"], "steps": len(recs),
               "median": statistics.median(gaps) if gaps else None,
               "mean": statistics.fmean(gaps) if gaps else None}
        if cpu is not None:
            out["monitor_cpu_s"], out["ranks"] = round(cpu[0], 3), cpu[1]
        return out
    finally:
        run.cli("stop", run.name, "--grace", "0", check=False, timeout=120)


def view_section(results: list[dict], args) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0]
    lines = [VIEW_SUB, "",
             f"Measured {when} on {os.cpu_count()} cores, load average {load:.1f} at the end. 3-host testbed "
             f"({args.runtime}), quickstart script (DDP, Adam, a DataLoader with workers), 2 ranks per node, "
             f"{args.steps} steps, `--step-time {args.step_time} --checkpoint-every {args.every}`, no fault, cold "
             f"starts; `view` (every rank's monitor writes its view each second) and `noview` (the job's torchrun "
             f"`{NO_VIEW_TORCHRUN}`: the wrapper runs, its monitor does not) interleaved, {args.reps} run(s) each. "
             f"Seconds per step of rank 0's steps after step {args.skip} (median and mean of each run); monitor "
             f"CPU: the `mon_cpu_s` of every rank's last view, summed. Rerun: `python bench/steady.py --compare "
             f"view --reps {args.reps} --steps {args.steps} --step-time {args.step_time}`.", "",
             "| run | mode | state | steps | median s/step | mean s/step | monitors' CPU s (ranks) |",
             "|---:|---|---|---:|---:|---:|---:|"]
    for r in results:
        cpu = f"{r['monitor_cpu_s']:.2f} ({r['ranks']})" if "monitor_cpu_s" in r else "-"
        lines.append(f"| {r['rep']} | {r['mode']} | {r['state'].lower()} | {r['steps']} | "
                     + (f"{r['median']:.4f} | {r['mean']:.4f} | " if r["median"] is not None else "- | - | ")
                     + f"{cpu} |")
    by = {m: [r for r in results if r["mode"] == m and r["median"] is not None] for m in ("view", "noview")}
    if by["view"] and by["noview"]:
        med = {m: statistics.median(r["median"] for r in rs) for m, rs in by.items()}
        mean = {m: statistics.median(r["mean"] for r in rs) for m, rs in by.items()}
        lines += ["", f"Median over the runs: view {med['view']:.4f} s/step vs noview {med['noview']:.4f} s/step "
                      f"(view / noview **{med['view'] / med['noview']:.3f}**); means {mean['view']:.4f} vs "
                      f"{mean['noview']:.4f} ({mean['view'] / mean['noview']:.3f}). Goal: <= 1 % of step time."]
    return "\n".join(lines) + "\n"


def section(results: list[dict], args) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    load = os.getloadavg()[0]
    lines = [SUB, "",
             f"Measured {when} on {os.cpu_count()} cores, load average {load:.1f} at the end. 3-host testbed "
             f"({args.runtime}), quickstart script, 2 ranks per node, {args.steps} steps, `--step-time "
             f"{args.step_time} --checkpoint-every {args.every}`, no fault; `recovery: warm` and `recovery: cold` "
             f"interleaved, {args.reps} run(s) each. Seconds per step of rank 0's steps after step {args.skip} "
             f"(median and mean of each run). Rerun: `python bench/steady.py --reps {args.reps} --steps "
             f"{args.steps} --step-time {args.step_time}` (own testbed, prefix `{args.prefix}`, "
             f"10.{args.subnet}.0.0/24).", "",
             "| run | recovery | state | steps | median s/step | mean s/step |", "|---:|---|---|---:|---:|---:|"]
    for r in results:
        lines.append(f"| {r['rep']} | {r['mode']} | {r['state'].lower()} | {r['steps']} | "
                     f"{r['median']:.4f} | {r['mean']:.4f} |" if r["median"] is not None else
                     f"| {r['rep']} | {r['mode']} | {r['state'].lower()} | {r['steps']} | - | - |")
    by = {m: [r for r in results if r["mode"] == m and r["median"] is not None] for m in ("warm", "cold")}
    if by["warm"] and by["cold"]:
        med = {m: statistics.median(r["median"] for r in rs) for m, rs in by.items()}
        mean = {m: statistics.median(r["mean"] for r in rs) for m, rs in by.items()}
        lines += ["", f"Median over the runs: warm {med['warm']:.4f} s/step vs cold {med['cold']:.4f} s/step "
                      f"(warm / cold **{med['warm'] / med['cold']:.3f}**); means {mean['warm']:.4f} vs "
                      f"{mean['cold']:.4f} ({mean['warm'] / mean['cold']:.3f}). Goal: within 2 %."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = common.parser(__doc__.splitlines()[0], prefix="bst", subnet=234, reps=3)
    ap.add_argument("--steps", type=int, default=300)
    ap.add_argument("--every", type=int, default=50, help="checkpoint interval (steps)")
    ap.add_argument("--step-time", type=float, default=0.1)
    ap.add_argument("--skip", type=int, default=50, help="steps left out at the start (the zygotes' start)")
    ap.add_argument("--runtime", default="podman")
    ap.add_argument("--compare", choices=("warm", "view"), default="warm",
                    help="warm: recovery warm vs cold; view: the rank view on vs off")
    args = ap.parse_args(argv)
    modes = ("warm", "cold") if args.compare == "warm" else ("view", "noview")
    exit_on_signals()
    base = common.scratch("clusterctl-bench-steady-")   # removed at exit unless the bench failed
    tb = Testbed(3, base / "tb", [profile(gpus=0)] * 3, prefix=args.prefix, subnet_octet=args.subnet,
                 docker=args.runtime == "docker")
    results = []
    try:
        tb.up()
        for rep in range(1, args.reps + 1):
            for mode in (modes if rep % 2 else modes[::-1]):
                t = time.monotonic()
                r = run_one(tb, base, mode, rep, args)
                print(json.dumps(r), f"({time.monotonic() - t:.0f} s)", flush=True)
                results.append(r)
    finally:
        tb.down()
    text = section(results, args) if args.compare == "warm" else view_section(results, args)
    print(text)
    if not args.no_write:
        write_subsection(*((WARM, SUB) if args.compare == "warm" else (SICK, VIEW_SUB)), text, DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
