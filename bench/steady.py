"""Steady state: the step time of a job with the warm machinery (`recovery: warm`) and without (`recovery: cold`),
side by side, no fault.

    python bench/steady.py [--reps 3] [--steps 300] [--step-time 0.1] [--runtime podman] [--no-write]

On a 3-host testbed (``profile(gpus=0)``), the quickstart script (2 ranks per node, ``nodes: "2:3"``) trains
``--steps`` steps once per repetition and mode, warm and cold interleaved (warm first in odd repetitions, cold
first in even ones). A warm job runs an idle zygote beside each node's attempt (torch imported, waiting in
``select``); a cold job none. Per run: the median and mean seconds per step of rank 0's recorded steps after
step ``--skip`` (the first steps share the cores with the zygotes' start: torch imported once per node). The
``### steady state`` sub-section of ``## warm recovery`` is written from the medians over the runs.
"""
from __future__ import annotations

import datetime
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


def run_one(tb, base: Path, mode: str, rep: int, args) -> dict:
    name = f"steady{mode[0]}{rep}"
    run = rh.new_run(tb, base / name, name, runtime=args.runtime, steps=args.steps, every=args.every,
                     step_time=args.step_time, nproc=2, recovery=mode)
    try:
        run.launch()
        if mode == "warm":
            rh.wait_zygotes(run, timeout=120)
        end = run.wait_end(args.steps * (args.step_time + 1) + 300)
        recs = [r for r in run.steps_log() if r["step"] > args.skip]
        gaps = [b["time"] - a["time"] for a, b in zip(recs, recs[1:]) if b["step"] == a["step"] + 1]
        return {"mode": mode, "rep": rep, "state": end["state"], "steps": len(recs),
                "median": statistics.median(gaps) if gaps else None,
                "mean": statistics.fmean(gaps) if gaps else None}
    finally:
        run.cli("stop", run.name, "--grace", "0", check=False, timeout=120)


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
    args = ap.parse_args(argv)
    exit_on_signals()
    base = common.scratch("clusterctl-bench-steady-")   # removed at exit unless the bench failed
    tb = Testbed(3, base / "tb", [profile(gpus=0)] * 3, prefix=args.prefix, subnet_octet=args.subnet,
                 docker=args.runtime == "docker")
    results = []
    try:
        tb.up()
        for rep in range(1, args.reps + 1):
            for mode in (("warm", "cold") if rep % 2 else ("cold", "warm")):
                t = time.monotonic()
                r = run_one(tb, base, mode, rep, args)
                print(json.dumps(r), f"({time.monotonic() - t:.0f} s)", flush=True)
                results.append(r)
    finally:
        tb.down()
    text = section(results, args)
    print(text)
    if not args.no_write:
        write_subsection(WARM, SUB, text, DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
