"""The soak: 30 minutes of a job that is sick but never dead, and nothing the supervisor says about it false
(issue 37's goals).

    python bench/soak.py [--scale 1.0] [--no-write] [--prefix bsk --subnet 227]

On a 3-host testbed (network namespaces, sshd, podman; ``profile(gpus=0)``) one job of 3 nodes x 2 ranks
(bench/soak_train.py: DDP, gloo, a step every ~0.2 s; the job's defaults but ``probe_interval_s: 1`` as every bench
here) trains for 27 minutes (the start-up takes ~3 on a loaded box) through these phases (``soak_train.PHASES``), each on one rank while its peers wait
in DDP's all-reduce: 200 s of silent compute (torch), 200 s of silent compute in C calls holding the GIL
(``sum(range(N))``, ~10 s each: the rank's monitor thread cannot write), a checkpoint written slowly over 90 s,
a straggler at 0.5x for 4 minutes, 200 s of silent compute in a pure Python loop, a slow checkpoint of 100 s.

Counted from the supervisor's events: false ``stuck`` events (every one here is false) and ``hang`` verdicts (the
same), attempts (goal: one), the straggler's ``straggler`` event (the right node and rank, seconds after its
phase began: goal <= 120 s) and false stragglers (any other rank named). Results go into the ``### soak``
sub-section of ``## sick, not dead`` in docs/benchmarks.md. ``--scale 0.15``: the same phases 0.15 x as long (a
dry run of ~5 minutes: too short to name the straggler).
"""
from __future__ import annotations

import datetime
import json
import shutil
import sys
import time
from pathlib import Path

import common  # noqa: E402  (puts the repository root on sys.path)
from common import DOC, exit_on_signals  # noqa: E402
from docsection import write_subsection  # noqa: E402

from tests.integration import recovery_harness as rh  # noqa: E402
from tests.testbed import Testbed, profile  # noqa: E402

SECTION, SUB = "## sick, not dead", "### soak"
TRAIN = common.ROOT / "bench" / "soak_train.py"
DURATION_S = 1620.0


def run(tb, base: Path, scale: float, keep: Path) -> dict:
    """The soak; ``keep`` gets what explains a false verdict after the testbed is gone: the job's state dir (events,
    logs, the dumps and stacks a hang keeps) and ``tops.jsonl`` (``top --once -o json`` at each stuck, straggler
    and verdict event)."""
    name = "bsoak"
    shared = Path(tb.shared) / name
    shared.mkdir(parents=True, exist_ok=True)
    phases = shared / "phases.jsonl"
    r = rh.new_run(tb, base / "job", name, script=TRAIN, nodes="3", nproc=2, steps=0, step_time=0.2,
                   extra_args=["--duration", str(DURATION_S), "--scale", str(scale), "--phases", str(phases),
                               "--ckpt-dir", str(shared / "slow")])
    t0 = time.time()
    tops = []
    try:
        r.launch()
        end = time.monotonic() + DURATION_S * scale + 600
        seen = 0
        while time.monotonic() < end:
            time.sleep(5)
            job = r.job_row()
            if job is not None and job.terminal:
                break
            with r.store() as store:
                events = store.events(job.job_id) if job else []
            for e in events[seen:]:
                if e.kind in ("stuck", "straggler", "verdict"):
                    print(f"{time.time() - t0:7.1f}s event {e.kind} {e.klass} {e.node}/{e.rank}: {e.message}",
                          flush=True)
                    t = r.cli("top", name, "--once", "--output", "json", check=False, timeout=60).stdout
                    with open(keep / "tops.jsonl", "a") as f:
                        f.write(json.dumps({"t": round(time.time() - t0, 1), "event": e.kind, "class": e.klass,
                                            "node": e.node, "rank": e.rank, "message": e.message, "top": t}) + "\n")
                    if e.kind in ("stuck", "straggler"):
                        tops.append(t)
            seen = len(events)
        job = r.job_row()
        ev = r.events()
        truth = [json.loads(x) for x in phases.read_text().splitlines()] if phases.exists() else []
        recs = r.steps_log()
        with r.store() as store:
            attempts = store.attempts(job.job_id) if job else []
        slow = next((p for p in truth if p["phase"] == "slow"), None)
        named = [e for e in ev if e["kind"] == "straggler" and e["class"] == "named"]
        right = [e for e in named if slow and (e["node"], e["rank"]) == (slow["node"], slow["rank"])
                 and slow["start"] <= e["time"] <= slow["end"] + 60]
        return {"scale": scale, "state": job.state.value if job else None, "attempts": len(attempts),
                "wall_s": round(time.time() - t0), "steps": max((x["step"] for x in recs), default=0),
                "phases": truth,
                "stuck_events": [e["message"] for e in ev if e["kind"] == "stuck" and e["class"] == "stuck"],
                "hangs": [e["message"] for e in ev if e["kind"] == "verdict" and e["class"] == "hang"],
                "verdicts": [f"{e['class']}: {e['message']}"[:200] for e in ev if e["kind"] == "verdict"],
                "straggler": {"node": slow["node"], "rank": slow["rank"]} if slow else None,
                "straggler_named_s": round(right[0]["time"] - slow["start"], 1) if right else None,
                "straggler_message": right[0]["message"] if right else None,
                "straggler_cleared": any(e["kind"] == "straggler" and e["class"] != "named" for e in ev),
                "false_stragglers": [e["message"] for e in named if e not in right], "tops": tops[:3]}
    finally:
        r.cli("stop", r.name, "--grace", "0", check=False, timeout=120)
        shutil.copytree(r.state_dir, keep / "state", dirs_exist_ok=True, ignore_dangling_symlinks=True)


def section(res: dict) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [SUB, "",
             f"`python bench/soak.py`{'' if res['scale'] == 1 else ' --scale ' + str(res['scale'])} ({when}; "
             f"{common.machine('the 3 testbed hosts, their 6 ranks, the supervisor and other sessions', load=True)}). "
             f"One job, 3 nodes x 2 ranks (podman, gloo, DDP, a step every ~0.2 s), job defaults but "
             f"`probe_interval_s: 1`, {res['wall_s']} s from launch to its end, {res['steps']} steps; its phases "
             "(each on one rank while its peers wait in DDP's all-reduce; wall seconds as the sick rank recorded "
             "them):", "",
             "| phase | rank (node) | length s |", "|---|---|---|"]
    for p in res["phases"]:
        lines.append(f"| {p['phase']} | {p['rank']} ({p['node']}) | {p['end'] - p['start']:.0f} |")
    s = res["straggler"]
    lines += ["", "(compute: torch matmuls; gilcall: `sum(range(N))` C calls of ~10 s holding the GIL, so the "
              "rank's own monitor cannot write and the node's look at its /proc says it computes; ckpt: 1 MiB "
              "written and fsynced every 0.5 s; slow: every step at half speed; pyloop: a pure Python loop.)", "",
              "| measure | goal | result |", "|---|---|---|",
              f"| false `stuck` events | 0 | {len(res['stuck_events'])} |",
              f"| false `hang` verdicts | 0 | {len(res['hangs'])} |",
              f"| attempts | 1 | {res['attempts']} ({res['state']}) |",
              f"| straggler named after (s) | <= 120 | "
              f"{res['straggler_named_s'] if res['straggler_named_s'] is not None else 'not named'}"
              f"{' (' + s['node'] + ' rank ' + str(s['rank']) + ', right)' if s and res['straggler_named_s'] is not None else ''} |",
              f"| straggler cleared after it recovered | yes | {'yes' if res['straggler_cleared'] else 'no'} |",
              f"| false stragglers | 0 | {len(res['false_stragglers'])} |"]
    if res["straggler_message"]:
        lines += ["", f"The straggler event: \"{res['straggler_message']}\"."]
    for what in ("stuck_events", "hangs", "false_stragglers"):
        for m in res[what]:
            lines.append(f"- false ({what}): {m[:240]}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = common.parser(__doc__.splitlines()[0], prefix="bsk", subnet=227)
    ap.add_argument("--scale", type=float, default=1.0, help="every phase and the whole run this many times as long")
    args = ap.parse_args(argv)
    exit_on_signals()
    base = common.scratch("clusterctl-bench-soak-")
    keep = Path(f"/tmp/clusterctl-soak-{time.strftime('%Y%m%d-%H%M%S')}")
    keep.mkdir(parents=True)
    tb = Testbed(3, base / "tb", [profile(gpus=0)] * 3, prefix=args.prefix, subnet_octet=args.subnet)
    try:
        tb.up()
        res = run(tb, base, args.scale, keep)
    finally:
        tb.down()
    print(json.dumps({k: v for k, v in res.items() if k != "tops"}, indent=1))
    for t in res["tops"]:
        print(t)
    text = section(res)
    print(text)
    print(f"kept {keep}: the job's state dir and top at each event")
    if not args.no_write:
        write_subsection(SECTION, SUB, text, DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
