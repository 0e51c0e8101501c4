"""Hangs named: time to name a stuck rank and time to the hang verdict, five kinds of hang (issue 37).

    python bench/hang.py [--kinds sleep,fifo,sigstop,other,skip] [--reps 5] [--no-write] [--prefix bhg --subnet 238]
    python bench/hang.py --kinds slow [--reps 1]        # a straggler at 0.5x: time to its straggler event

On a 3-host testbed (network namespaces, sshd, podman; ``profile(gpus=0)``) a small DDP job
(tests/integration/jobs/sick.py: 3 nodes x 2 ranks, gloo, 0.1 s per step, the job's defaults but
``probe_interval_s: 1`` as every bench here) runs once per kind and repetition; at step 10 of attempt 1 one rank
(rank 1, 3, 5, 1, ... in turn: every node has its turn) gets sick while its peers go on into DDP's all-reduce:

- ``sleep``: it sleeps forever in its own code;  ``fifo``: it blocks reading a FIFO nobody writes;
- ``sigstop``: it stops itself (SIGSTOP);  ``other``: it waits in another collective (a second process group);
- ``skip``: it skips one step's collectives, so that at the end it waits in the final barrier while its peers wait
  in their last step's all-reduce.

The hang starts at the last step rank 0 recorded (its wall time). **Named**: the supervisor's first ``stuck``
event (what ``status`` and ``top`` show: node, rank, where, the collective its peers wait in); **verdict**: the
``hang`` verdict. Both must name the rank that got sick and its node (the sick rank writes them down). Goals:
median named <= 10 s, verdict <= 30 s with the defaults, the right node and rank every time. Any ``straggler``
event in these runs is a false one (counted). Results go into the ``### hangs named`` sub-section of
``## sick, not dead`` in docs/benchmarks.md.

``slow``: from step 10 one rank runs every step at half speed to the end (``--slow-steps`` steps): the time from
the fault to its ``straggler`` event (goal: within 2 minutes), the right node and rank, no hang; the
``### stragglers`` sub-section.
"""
from __future__ import annotations

import datetime
import json
import statistics
import sys
import time
from pathlib import Path

import common  # noqa: E402  (puts the repository root on sys.path)
from common import DOC, exit_on_signals  # noqa: E402
from docsection import write_subsection  # noqa: E402

from tests.integration import recovery_harness as rh  # noqa: E402
from tests.testbed import Testbed, profile  # noqa: E402

SECTION, SUB = "## sick, not dead", "### hangs named"
SICK = common.ROOT / "tests" / "integration" / "jobs" / "sick.py"
KINDS = ("sleep", "fifo", "sigstop", "other", "skip")
AT, STEPS = 10, 40
SUB_SLOW = "### stragglers"


def run_one(tb, base: Path, kind: str, rep: int, rank: int, slow_steps: int = 600) -> dict:
    name = f"bhang{kind}{rep}"
    shared = Path(tb.shared) / name
    mark = shared / "sick.json"
    run = rh.new_run(tb, base / f"{kind}-{rep}", name, script=SICK, nodes="3", nproc=2,
                     steps=AT + slow_steps if kind == "slow" else STEPS, step_time=0.1,
                     extra_args=["--fault", kind, "--rank", str(rank), "--at", str(AT), "--mark", str(mark),
                                 "--fifo", str(shared / "never.fifo")])
    top = ""
    try:
        run.launch()
        end = time.monotonic() + (400 if kind == "slow" else 240)
        verdict = None
        while time.monotonic() < end and verdict is None:
            time.sleep(1)
            job = run.job_row()
            if job is not None and job.terminal:
                break
            with run.store() as store:
                events = store.events(job.job_id) if job else []
            want = "straggler" if kind == "slow" else "verdict"
            verdict = next((e for e in events if e.kind == want and e.klass != "success"), None)
            if not top and any(e.kind == ("straggler" if kind == "slow" else "stuck") for e in events):
                top = run.cli("top", name, "--once", check=False, timeout=60).stdout   # what on-call sees then
        ev = run.events()
        if kind == "slow":
            truth = json.loads(mark.read_text()) if mark.exists() else {}
            s = next((e for e in ev if e["kind"] == "straggler" and e["class"] == "named"), None)
            return {"kind": kind, "rep": rep, "rank": truth.get("rank"), "node": truth.get("node"),
                    "named_s": round(s["time"] - truth["time"], 1) if s and truth else None,
                    "named": f"{s['node']}/{s['rank']}" if s else None, "message": (s or {}).get("message", ""),
                    "named_right": bool(s and (s["node"], s["rank"]) == (truth.get("node"), truth.get("rank"))),
                    "false_stragglers": sum(e["kind"] == "straggler" and e["class"] == "named"
                                            and (e["node"], e["rank"]) != (truth.get("node"), truth.get("rank"))
                                            for e in ev),
                    "hangs": sum(e["kind"] == "verdict" and e["class"] == "hang" for e in ev), "top": top}
        truth = json.loads(mark.read_text()) if mark.exists() else {}
        recs = [r for r in run.steps_log() if r["attempt"] == 1]
        last = recs[-1]["time"] if recs else None
        stuck = next((e for e in ev if e["kind"] == "stuck" and e["class"] == "stuck"), None)
        v = next((e for e in ev if e["kind"] == "verdict" and e["class"] != "success"), None)
        return {"kind": kind, "rep": rep, "rank": truth.get("rank"), "node": truth.get("node"),
                "last_step": recs[-1]["step"] if recs else None,
                "named_s": round(stuck["time"] - last, 1) if stuck and last else None,
                "named": f"{stuck['node']}/{stuck['rank']}" if stuck else None,
                "named_right": bool(stuck and (stuck["node"], stuck["rank"]) == (truth.get("node"), truth.get("rank"))),
                "verdict_s": round(v["time"] - last, 1) if v and last else None,
                "verdict": f"{v['class']} {v['node']}/{v['rank']}" if v else None,
                "verdict_right": bool(v and v["class"] == "hang"
                                      and (v["node"], v["rank"]) == (truth.get("node"), truth.get("rank"))),
                "false_stragglers": sum(e["kind"] == "straggler" for e in ev),
                "message": (v or {}).get("message", "")[:200], "top": top}
    finally:
        run.cli("stop", run.name, "--grace", "0", check=False, timeout=120)


def _med(xs):
    xs = [x for x in xs if x is not None]
    return f"{statistics.median(xs):.1f}" if xs else "-"


def _max(xs):
    xs = [x for x in xs if x is not None]
    return f"{max(xs):.1f}" if xs else "-"


def section(results: list[dict], args) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [SUB, "",
             f"`python bench/hang.py`, {max(sum(r['kind'] == k for r in results) for k in KINDS)} runs per kind "
             f"({when}; {common.machine('the 3 testbed hosts, their 6 ranks, the supervisor and other sessions')}). "
             "3 nodes x 2 ranks (podman, gloo, DDP), job defaults (`stuck_timeout_s: 20`) but `probe_interval_s: 1`; "
             f"one rank gets sick at step {AT} of attempt 1 (rank 1, 3, 5 in turn). Seconds after the last step rank 0 "
             "recorded: **named** = the first `stuck` event (status/top name the rank), **verdict** = the `hang` "
             "verdict; right = the sick rank's node and rank.", "",
             "| hang | runs | named median (max) s | verdict median (max) s | named right | verdict right |",
             "|---|---|---|---|---|---|"]
    for kind in dict.fromkeys(r["kind"] for r in results):
        rs = [r for r in results if r["kind"] == kind]
        lines.append(f"| {kind} | {len(rs)} | {_med(r['named_s'] for r in rs)} ({_max(r['named_s'] for r in rs)}) | "
                     f"{_med(r['verdict_s'] for r in rs)} ({_max(r['verdict_s'] for r in rs)}) | "
                     f"{sum(r['named_right'] for r in rs)}/{len(rs)} | {sum(r['verdict_right'] for r in rs)}/{len(rs)} |")
    allr = results
    lines.append(f"\nFalse `straggler` events in these runs: {sum(r['false_stragglers'] for r in allr)}.")
    lines += ["", f"All: named median {_med(r['named_s'] for r in allr)} s (goal <= 10 s), verdict median "
                  f"{_med(r['verdict_s'] for r in allr)} s, max {_max(r['verdict_s'] for r in allr)} s (goal <= 30 s); "
                  f"right node and rank {sum(r['verdict_right'] for r in allr)}/{len(allr)} verdicts."]
    wrong = [r for r in allr if not r["verdict_right"]]
    for r in wrong:
        lines.append(f"- {r['kind']} run {r['rep']}: sick {r['node']}/{r['rank']}; named {r['named']}, "
                     f"verdict {r['verdict']}: {r['message']}")
    return "\n".join(lines) + "\n"


def slow_section(results: list[dict], args) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [SUB_SLOW, "",
             f"`python bench/hang.py --kinds slow --reps {args.reps}` ({when}; same testbed and job as above): from "
             f"step {AT} one rank runs every step at half speed (0.5x) to the end. Seconds from the fault to its "
             "`straggler` event (goal: within 2 minutes; named after 60 s at >= 1.5x).", "",
             "| run | sick rank | named after s | named | slowdown said | false stragglers | hangs |",
             "|---|---|---|---|---|---|---|"]
    for r in results:
        said = r["message"].split(" runs ", 1)[-1].split(" slower", 1)[0] if r["message"] else "-"
        lines.append(f"| {r['rep']} | {r['node']}/{r['rank']} | {r['named_s'] if r['named_s'] is not None else '-'} | "
                     f"{r['named'] or '-'} {'(right)' if r['named_right'] else '(wrong)'} | {said} | "
                     f"{r['false_stragglers']} | {r['hangs']} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = common.parser(__doc__.splitlines()[0], prefix="bhg", subnet=238, reps=5)
    ap.add_argument("--kinds", default=",".join(KINDS))
    ap.add_argument("--slow-steps", type=int, default=600, help="steps at half speed (kind slow)")
    ap.add_argument("--first-rep", type=int, default=1, help="number the runs from this one (with --merge)")
    ap.add_argument("--merge", action="append", default=[], metavar="LOG",
                    help="also count the runs an earlier invocation printed to LOG (its JSON lines)")
    args = ap.parse_args(argv)
    exit_on_signals()
    base = common.scratch("clusterctl-bench-hang-")
    tb = Testbed(3, base / "tb", [profile(gpus=0)] * 3, prefix=args.prefix, subnet_octet=args.subnet)
    results = []
    for log in args.merge:
        for line in Path(log).read_text().splitlines():
            if line.startswith("{"):
                results.append(json.loads(line[: line.rindex("}") + 1]))
    try:
        tb.up()
        i = args.first_rep - 1
        for rep in range(args.first_rep, args.first_rep + args.reps):
            for kind in args.kinds.split(","):
                rank = (1, 3, 5)[i % 3]
                i += 1
                t = time.monotonic()
                r = run_one(tb, base, kind, rep, rank, args.slow_steps)
                print(json.dumps({k: v for k, v in r.items() if k != "top"}), f"({time.monotonic() - t:.0f} s)",
                      flush=True)
                if r["top"]:
                    print(r["top"], flush=True)
                results.append(r)
    finally:
        tb.down()
    for sub, rs, make in ((SUB, [r for r in results if r["kind"] != "slow"], section),
                          (SUB_SLOW, [r for r in results if r["kind"] == "slow"], slow_section)):
        if rs:
            text = make(rs, args)
            print(text)
            if not args.no_write:
                write_subsection(SECTION, sub, text, DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
