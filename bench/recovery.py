"""Recovery benchmark: MTTR and steps lost after a fault, clusterctl vs plain torchrun, side by side.

    python bench/recovery.py [--faults kill_worker_node,kill_rdzv_host,partition] [--reps 3] [--no-write]
                             [--prefix brc --subnet 232] [--torchrun-wait 90]
    python bench/recovery.py --series N [--no-write]      # N faults in one run (4 hosts): MTTR of each
    python bench/recovery.py --runtimes podman,docker [--faults ...] [--reps 3]   # + docker beside podman

On a 3-host testbed (network namespaces, sshd, podman; ``profile(gpus=0)``) the quickstart script
(``--step-time 0.1 --checkpoint-every 10``, 2 ranks per node, rank 0 records every trained step with its wall
time) runs once per fault and method:

- **clusterctl**: ``clusterctl launch`` (podman, ``nodes: "2:3"``, default supervisor settings but
  ``probe_interval_s: 1``), fault at step >= 25, then the job must SUCCEED.
- **torchrun**: plain ``torchrun --nnodes=1:3 --nproc-per-node=2 --rdzv-backend=c10d --max-restarts=3`` started
  by hand on every host (bare processes via the host's netns, FACTS §2 flags: ``is_host``, ``--local-addr``,
  ``GLOO_SOCKET_IFNAME``), same script and checkpoint directory, same rendezvous timeouts as the clusterctl job;
  watched for ``--torchrun-wait`` seconds after the fault: "dead" when every agent exited without a new step,
  "hung" when they still run without one.

Faults: ``kill_worker_node`` = SIGKILL everything of the job on a non-rendezvous node; ``kill_rdzv_host`` = the
same on the rendezvous host; ``partition`` = the non-rendezvous node's link down (healed at the end);
``partition_rdzv`` = the rendezvous host's link down and its job's processes killed.
MTTR = fault -> the first step recorded by a new attempt (clusterctl) / a new restart round (torchrun); steps lost
= steps trained more than once. Results replace the ``## recovery`` section of docs/benchmarks.md (its ``###``
sub-sections, written by the series arm and bench/falseverdict.py, are kept).

**Docker arm** (``--runtimes podman,docker``): the clusterctl runs once per runtime (podman, and docker with a
real dockerd per host), the faults and repetitions interleaved in the same run; their table goes to the
``### docker and podman side by side`` sub-section of ``## recovery``, and the main table is written from the same
run's podman and torchrun runs.

**Series arm** (``--series N``): one clusterctl job on a 4-host testbed (``nodes: "2:4"``, 1 rank per node) takes
N faults in a row, cycling through issue 16's five (a node killed, a node partitioned and healed, the rendezvous
host killed, a node partitioned with its job killed, a node killed); each fault waits until the previous
attempt made progress (a new checkpoint seen by the supervisor). MTTR of each fault -> the ``### series``
sub-section of ``## recovery``.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common  # noqa: E402  (puts the repository root on sys.path)
from common import DOC, ROOT, exit_on_signals  # noqa: E402
from docsection import read_subsection, write_subsection  # noqa: E402
from docsection import write_section as replace_section  # noqa: E402

from tests.integration import fault_series as fs  # noqa: E402
from tests.integration import recovery_harness as rh  # noqa: E402
from tests.testbed import Testbed, profile  # noqa: E402

SECTION = "## recovery"
SERIES = "### series: N faults in one run"
SIDE = "### docker and podman side by side"
SUBSECTIONS = (SERIES, SIDE, "### false verdicts under load")     # kept when the main table is rewritten
FAULTS = ("kill_worker_node", "kill_rdzv_host", "partition", "partition_rdzv")
STEPS, EVERY, STEP_TIME, FAULT_AT = 100, 10, 0.1, 25
PORT = 29500


def first_new_step(recs: list[dict], t_fault: float, key: str, before) -> dict | None:
    for r in recs:
        if r["time"] > t_fault and r.get(key) != before:
            return r
    return None


def lost_steps(recs: list[dict]) -> int:
    steps = [r["step"] for r in recs]
    return len(steps) - len(set(steps))


def fault(tb, kind: str, rdzv: str, other: str) -> str:
    victim = rdzv if kind in ("kill_rdzv_host", "partition_rdzv") else other
    if kind == "partition":
        tb.partition(victim)
    elif kind == "partition_rdzv":     # the rendezvous host loses its link and its job processes die
        tb.partition(victim)
        tb.kill(victim, pattern=rh.JOB_PATTERN)
    else:
        tb.kill(victim, pattern=rh.JOB_PATTERN)
    return victim


PHASES_NAME = "phases.jsonl"      # the quickstart's --phases file, in the job's dir on shared storage
PHASES = ("started", "torch", "process_group", "checkpoint", "first_step")


def rank_phases(path: Path, attempt, t0: float) -> dict | None:
    """The new attempt's ranks (quickstart ``--phases``): per phase, seconds after the fault when the last rank
    reached it, and the CPU seconds all its ranks had spent by their first step."""
    if attempt is None or not path.is_file():
        return None
    recs = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    recs = [r for r in recs if str(r.get("attempt")) == str(attempt)]
    out = {}
    for ph in PHASES:
        ts = [r["time"] for r in recs if r["phase"] == ph]
        out[ph] = round(max(ts) - t0, 1) if ts else None
    out["cpu"] = round(sum(r["cpu"] for r in recs if r["phase"] == "first_step"), 1)
    agents = [r["agent_cpu"] for r in recs if r["phase"] == "first_step" and r.get("agent_cpu") is not None]
    out["agent_cpu"] = round(sum(agents), 1) if agents else None      # one record per node (its local rank 0)
    return out


def run_clusterctl(tb, base: Path, kind: str, rep: int = 1, runtime: str = "podman", recovery: str = "",
                   nproc: int = 2) -> dict:
    tag = ("" if runtime == "podman" else runtime[0]) + (recovery[:1] if recovery else "")
    name = f"bench{tag}{kind.replace('_', '')}{rep}"
    phases_file = Path(tb.shared) / name / PHASES_NAME        # beside the job's --record file
    run = rh.new_run(tb, base / f"cc{tag}-{kind}-{rep}", name, runtime=runtime,
                     steps=STEPS, every=EVERY, step_time=STEP_TIME, nproc=nproc,    # 2: as the plain torchrun arm
                     recovery=recovery or None, extra_args=["--phases", str(phases_file)])
    victim = None
    try:
        run.launch()
        run.wait_step(FAULT_AT, timeout=300)
        before = run.steps_log()[-1]["attempt"]
        st = run.status()
        victim = fault(tb, kind, st["rendezvous_host"], rh.other_host(run))
        t0 = time.time()   # the fault took effect when fault() returned (finding the pids to kill takes ~1 s)
        end = run.wait_end(300)
        recs = run.steps_log()
        first = first_new_step(recs, t0, "attempt", before)
        ev = run.events()
        verdict = next((e for e in ev if e["kind"] == "verdict" and e["class"] != "success"), None)
        start2 = next((e for e in ev if e["kind"] == "start" and (e["attempt"] or 0) > 1), None)
        gang = next((e for e in ev if e["kind"] == "gang_stop"), None)
        relaunched = [e for e in ev if e["kind"] == "relaunch" and e["attempt"] == (start2 or {}).get("attempt")]
        steps = [r for r in recs if r["time"] > t0]

        def step_s(rs):   # median wall time per step of one attempt (rank 0's records, consecutive steps)
            d = [b["time"] - a["time"] for a, b in zip(rs, rs[1:]) if b["step"] == a["step"] + 1]
            return round(statistics.median(d), 4) if d else None
        phases = rank_phases(phases_file, (start2 or {}).get("attempt"), t0)
        method = "clusterctl" if runtime == "podman" else f"clusterctl {runtime}"
        if recovery:
            method += f" {recovery}"
        return {"method": method, "fault": kind, "victim": victim, "state": end["state"],
                # phases (s after the fault): verdict, survivors stopped (gang_stop + cleanup -> the next start
                # event), containers started (relaunch events), first step; warm/cold per survivor
                "stopped": round(start2["time"] - t0, 1) if start2 else None,
                "started": round(max(e["time"] for e in relaunched) - t0, 1) if relaunched else None,
                "gang": round(gang["time"] - t0, 1) if gang else None,
                "modes": ",".join(sorted(f"{e['node']}={e['class']}" for e in relaunched)),
                "steps_after": len(steps),
                "step_s_before": step_s([r for r in recs if r["attempt"] == before]),
                "step_s_after": step_s([r for r in steps if r["attempt"] != before][1:]),
                "mttr": round(first["time"] - t0, 1) if first else None, "phases": phases,
                "detect": round(verdict["time"] - t0, 1) if verdict else None,
                "relaunch": round(start2["time"] - t0, 1) if start2 else None,
                "lost": lost_steps(recs), "klass": verdict["class"] if verdict else None,
                "outcome": f"{end['state'].lower()}, {verdict['class'] if verdict else '?'} on {victim}, "
                           f"resumed at step {start2['checkpoint_step'] if start2 else '?'}"}
    finally:
        if victim and tb.partitioned(victim):
            tb.heal(victim)
        run.cli("stop", run.name, "--grace", "0", check=False, timeout=120)


def torchrun_cmd(tb, host, rdzv, rid: str, shared: Path) -> list[str]:
    conf = f"is_host={1 if host.name == rdzv.name else 0},join_timeout=60,last_call_timeout=2"
    script = (f"export PYTHONPATH={ROOT} CLUSTERCTL_CHECKPOINT_DIR={shared / 'ckpt'} GLOO_SOCKET_IFNAME=eth0 "
              f"CLUSTERCTL_ATTEMPT=torchrun PYTHONUNBUFFERED=1; cd {ROOT}; exec {ROOT}/.venv/bin/torchrun "
              f"--nnodes=1:3 --nproc-per-node=2 --rdzv-backend=c10d --rdzv-endpoint={rdzv.address}:{PORT} "
              f"--rdzv-id={rid} --rdzv-conf={conf} --local-addr={host.address} --max-restarts=3 "
              f"{rh.TRAIN} --steps {STEPS} --checkpoint-every {EVERY} --step-time {STEP_TIME} "
              f"--record {shared / 'steps.jsonl'} --log-every 5")
    return ["nsenter", f"--net=/run/netns/{host.ns}", "unshare", "--uts", "sh", "-c",
            f"hostname {host.name} && {script}"]


def run_torchrun(tb, base: Path, kind: str, wait_s: float) -> dict:
    shared = Path(tb.shared) / f"tr-{kind}"
    shared.mkdir(parents=True, exist_ok=True)
    record = shared / "steps.jsonl"
    rdzv, other = tb.hosts[0], tb.hosts[1]
    logs = base / f"tr-{kind}"
    logs.mkdir(parents=True, exist_ok=True)
    procs = {}
    for h in tb.hosts:
        fh = open(logs / f"{h.name}.log", "wb")
        procs[h.name] = subprocess.Popen(torchrun_cmd(tb, h, rdzv, f"tr{kind}{int(time.time())}", shared),
                                         stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True)
    victim = None

    def recs():
        out = []
        if record.exists():
            for line in record.read_text().splitlines():
                try:
                    out.append(json.loads(line))
                except ValueError:
                    pass
        return out
    try:
        end = time.monotonic() + 300
        while not any(r["step"] >= FAULT_AT for r in recs()):
            if time.monotonic() > end or all(p.poll() is not None for p in procs.values()):
                return {"method": "torchrun", "fault": kind, "outcome": "did not reach the fault step",
                        "mttr": None, "lost": None}
            time.sleep(0.3)
        before = recs()[-1]["restart"]
        victim = fault(tb, kind, rdzv.name, other.name)
        t0 = time.time()
        survivors = [n for n in procs if n != victim]
        deadline = t0 + wait_s
        first = None
        while time.time() < deadline:
            first = first_new_step(recs(), t0, "restart", before)
            if first or all(procs[n].poll() is not None for n in survivors):
                break
            time.sleep(0.3)
        waited = round(time.time() - t0)
        if first:
            # let it finish (bounded) so steps lost is counted over the whole run
            fin = time.time() + 120
            while time.time() < fin and any(procs[n].poll() is None for n in survivors):
                time.sleep(0.5)
            done = max((r["step"] for r in recs()), default=0)
            return {"method": "torchrun", "fault": kind, "victim": victim, "mttr": round(first["time"] - t0, 1),
                    "lost": lost_steps(recs()),
                    "outcome": f"survivors restarted without {victim}; " + (
                        "finished" if done >= STEPS else f"reached step {done}")}
        if all(procs[n].poll() is not None for n in survivors):
            codes = {n: procs[n].returncode for n in survivors}
            return {"method": "torchrun", "fault": kind, "victim": victim, "mttr": None, "lost": None,
                    "outcome": f"dead: survivors exited {codes} within {waited} s, no step after the fault"}
        return {"method": "torchrun", "fault": kind, "victim": victim, "mttr": None, "lost": None,
                "outcome": f"hung after {waited} s: survivors still running, no step after the fault"}
    finally:
        if victim and tb.partitioned(victim):
            tb.heal(victim)
        for p in procs.values():
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=30)
        for h in tb.hosts:   # workers that outlived their agent (e.g. on the partitioned node)
            tb.kill(h.name, pattern=str(rh.TRAIN))


def row(fault: str, method: str, rs: list[dict]) -> str:
    """One table row over the runs ``rs`` of one fault and method: medians, MTTR range, worst steps lost."""
    def med(key):
        vals = [r[key] for r in rs if r.get(key) is not None]
        return statistics.median(vals) if vals else None

    def fmt(v):
        return "-" if v is None else f"{v:.1f}"

    mttrs = [r["mttr"] for r in rs if r.get("mttr") is not None]
    mttr = fmt(med("mttr")) + (f" ({min(mttrs):.1f}-{max(mttrs):.1f})" if len(mttrs) > 1 else "")
    if len(mttrs) < len(rs) and mttrs:
        mttr += f", {len(rs) - len(mttrs)} run(s) without"
    lost = max((r["lost"] for r in rs if r.get("lost") is not None), default=None)
    outcomes = "; ".join(dict.fromkeys(r["outcome"] for r in rs))
    return (f"| {fault} | {method} | {mttr} | {fmt(med('detect'))} | {fmt(med('relaunch'))} | "
            f"{'-' if lost is None else lost} | {outcomes} |")


def section(results: list[dict], args) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    lines = [SECTION, "",
             f"Measured {when} on {os.cpu_count()} cores, Linux {platform.release()}, Python "
             f"{platform.python_version()}, load average {load:.1f} at the end. "
             f"3-host testbed (`profile(gpus=0)`), quickstart script, 2 ranks per node, {STEPS} steps, "
             f"`--step-time {STEP_TIME} --checkpoint-every {EVERY}`, fault at step >= {FAULT_AT}. "
             f"Rerun: `python bench/recovery.py{' --runtimes ' + args.runtimes if args.runtimes != 'podman' else ''}` (as root; own testbed, prefix `{args.prefix}`, "
             f"10.{args.subnet}.0.0/24).", "",
             "- MTTR: fault -> first step recorded by the new attempt (clusterctl) / new restart round (torchrun), "
             "from the script's `--record` timestamps. Steps lost: steps trained more than once over the run.",
             "- detect: fault -> the supervisor's verdict event; relaunch: fault -> the next attempt's start "
             "event. The fault's time is taken when the injection returned (the kill itself first scans /proc for "
             "the job's pids, ~1 s). The rest of the MTTR is container start + torchrun + worker start (torch, "
             "and torch._dynamo for the optimizer, imported by 2 agents + 4 workers on 2 shared cores) + "
             "rendezvous + loading the checkpoint.",
             f"- torchrun: plain `torchrun --nnodes=1:3 --max-restarts=3` per host, watched for "
             f"{args.torchrun_wait:g} s after the fault.", "",
             f"- clusterctl: {args.reps} runs per fault; MTTR, detect and relaunch are medians (MTTR min-max in "
             "brackets), steps lost the worst run. torchrun: one run per fault.", "",
             "| fault | method | MTTR s | detect s | relaunch s | steps lost | outcome |",
             "|---|---|---:|---:|---:|---:|---|"]
    lines += rows(results, lambda m: m)
    lines += ["", f"Goal: MTTR <= 15 s, steps lost <= {EVERY} (one checkpoint interval).", ""]
    return "\n".join(lines)


def rows(results: list[dict], name) -> list[str]:
    """One table row per fault and method, in the order they ran; ``name(method)`` labels the method."""
    out = []
    for fault in dict.fromkeys(r["fault"] for r in results):
        for method in dict.fromkeys(r["method"] for r in results):
            rs = [r for r in results if r["fault"] == fault and r["method"] == method]
            if rs:
                out.append(row(fault, name(method), rs))
    return out


def label(method: str) -> str:
    return "clusterctl podman" if method == "clusterctl" else method


def side_section(results: list[dict], args) -> str:
    """The ``### docker and podman side by side`` sub-section: the same table, one row per fault and runtime."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [SIDE, "",
             f"Measured {when} on {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end. Same "
             f"job and faults as the table above; each fault run with podman and with docker (a real Docker Engine "
             f"per host, `docker.io` 20.10), interleaved, {args.reps} run(s) per fault and runtime. Rerun: "
             f"`python bench/recovery.py --runtimes {args.runtimes} --faults {args.faults} --reps {args.reps}` "
             f"(own testbed, prefix `{args.prefix}`, 10.{args.subnet}.0.0/24).", "",
             "| fault | method | MTTR s | detect s | relaunch s | steps lost | outcome |",
             "|---|---|---:|---:|---:|---:|---|"]
    lines += rows(results, label)
    mttr = {m: [r["mttr"] for r in results if r["method"] == m and r.get("mttr") is not None]
            for m in dict.fromkeys(r["method"] for r in results)}
    lines += ["", "MTTR over every fault: " + "; ".join(
        f"{label(m)}: median {statistics.median(v):.1f} s, max {max(v):.1f} s" for m, v in mttr.items() if v)
        + " (goal: <= 15 s).", ""]
    return "\n".join(lines)


WARM = "## warm recovery"


def warm_section(results: list[dict], args, heading: str = WARM) -> str:
    """``## warm recovery`` (or its ``### heading``): warm and cold side by side (one row per run, interleaved)
    with the phases, per runtime, and plain torchrun's rows when it ran."""
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    sec = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731

    def split(method: str) -> tuple[str, str]:        # "clusterctl [RUNTIME] RECOVERY" -> (runtime, recovery)
        parts = method.split()
        return (parts[1] if len(parts) == 3 else "podman"), parts[-1]

    lines = [heading, "",
             f"Measured {when} on {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end. "
             f"3-host testbed ({args.runtimes}), quickstart script, `nodes: \"2:3\"`, {args.nproc} rank(s) per node, "
             f"{STEPS} steps, `--step-time {STEP_TIME} --checkpoint-every {EVERY}`, fault at step >= {FAULT_AT}; "
             f"each fault run with `recovery: warm` and `recovery: cold` on each runtime, interleaved, {args.reps} "
             f"run(s) each. Rerun: `python bench/recovery.py --recovery {args.recovery} --methods {args.methods} "
             f"--faults {args.faults} --reps {args.reps} --nproc {args.nproc} --runtimes {args.runtimes}` (own "
             f"testbed, prefix `{args.prefix}`, 10.{args.subnet}.0.0/24).", "",
             "Phases, seconds after the fault: verdict (the supervisor's verdict event), stopped (the old "
             "attempt's containers removed, checkpoint found: the next attempt's start event), started (the "
             "survivors' new containers running: the last relaunch event), first step (the new attempt's first "
             "recorded step = MTTR). Between started and first step: rendezvous, the ranks (forked warm, or "
             "importing torch cold), process group, checkpoint load.", "",
             "| fault | runtime | recovery | MTTR s | verdict s | stopped s | started s | steps lost "
             "| step s before / after | survivors |",
             "|---|---|---|---:|---:|---:|---:|---:|---|---|"]
    for r in results:
        if r["method"] == "torchrun":
            lines.append(f"| {r['fault']} | plain torchrun | - | {sec(r['mttr'])} | - | - | - | "
                         f"{r['lost'] if r['lost'] is not None else '-'} | - | {r['outcome']} |")
            continue
        if not r["method"].startswith("clusterctl"):
            continue
        rt, rec = split(r["method"])
        lines.append(f"| {r['fault']} | {rt} | {rec} | {sec(r['mttr'])} | {sec(r['detect'])} | "
                     f"{sec(r['stopped'])} | {sec(r['started'])} | {r['lost']} | "
                     f"{r.get('step_s_before') or '-'} / {r.get('step_s_after') or '-'} | {r['modes'] or '-'} |")
    by: dict[tuple[str, str, str], list[float]] = {}
    for r in results:
        if r.get("mttr") is not None and r["method"].startswith("clusterctl"):
            by.setdefault((r["fault"], *split(r["method"])), []).append(r["mttr"])
    with_phases = [r for r in results if r.get("phases")]
    if with_phases:
        lines += ["", "The new attempt's ranks (quickstart `--phases`), seconds after the fault when the last rank "
                      "reached each phase: started (process start; a warm rank: its fork), torch (imported), "
                      "process group (joined: the rendezvous is done), checkpoint (loaded), first step; and the "
                      "CPU seconds of all its ranks, and of its torchrun agents (every node), by their first step.",
                  "", "| fault | runtime | recovery | started | torch | process group | checkpoint | first step "
                  "| rank CPU s | agent CPU s |", "|---|---|---|---:|---:|---:|---:|---:|---:|---:|"]
        for r in with_phases:
            rt, rec = split(r["method"])
            p = r["phases"]
            lines.append(f"| {r['fault']} | {rt} | {rec} | " + " | ".join(sec(p[k]) for k in PHASES)
                         + f" | {sec(p['cpu'])} | {sec(p.get('agent_cpu'))} |")
    lines += ["", "Median MTTR: " + "; ".join(f"{f} {rt} {m} {statistics.median(v):.1f} s"
                                              for (f, rt, m), v in by.items()) + "."]
    ratios = []
    for (f, rt, m), v in by.items():
        cold = by.get((f, rt, "cold"))
        if m == "warm" and cold:
            ratios.append(f"{f} {rt} {statistics.median(v) / statistics.median(cold):.2f}x")
    if ratios:
        lines += ["", "Warm / cold MTTR (goal <= 0.4x at 2 ranks per node): " + "; ".join(ratios) + "."]
    lines.append("")
    return "\n".join(lines)


def run_series(base: Path, n: int, args) -> list[dict]:
    tb = Testbed(4, base / "tb4", [profile(gpus=0)] * 4, prefix=args.prefix, subnet_octet=args.subnet)
    kinds = [fs.FIVE[i % len(fs.FIVE)] for i in range(n)]
    try:
        tb.up()
        run = rh.new_run(tb, base / "series", "benchseries", steps=100000, every=EVERY, step_time=STEP_TIME,
                         nodes="2:4", nproc=1)
        try:
            run.launch()
            return fs.run_series(run, kinds, first_step=FAULT_AT, log=lambda m: print(m, flush=True))
        finally:
            run.cli("stop", run.name, "--grace", "0", check=False, timeout=120)
    finally:
        tb.down()


def series_section(results: list[dict], args) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    mttrs = [r["mttr"] for r in results]
    lines = [SERIES, "",
             f"Measured {when} on {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end. "
             f"One job on a 4-host testbed (`nodes: '2:4'`, 1 rank per node, `--step-time {STEP_TIME} "
             f"--checkpoint-every {EVERY}`), {len(results)} faults in one run, cycling through issue 16's five; "
             "each fault once the previous attempt made progress (a new checkpoint seen by the supervisor). "
             f"Rerun: `python bench/recovery.py --series {len(results)}` (own testbed, prefix `{args.prefix}`, "
             f"10.{args.subnet}.0.0/24).", "",
             "| # | fault | victim | class | MTTR s | detect s | relaunch s | backoff | nodes after |",
             "|---:|---|---|---|---:|---:|---:|---|---|"]
    for r in results:
        sec = lambda v: "-" if v is None else f"{v:.1f}"  # noqa: E731
        lines.append(f"| {r['n']} | {r['fault']} | {r['victim']} | {r['klass']} | {sec(r['mttr'])} | "
                     f"{sec(r['detect'])} | {sec(r['relaunch'])} | {'; '.join(r['backoff']) or 'none'} | "
                     f"{', '.join(r['nodes'])} |")
    lines += ["", f"MTTR: first {mttrs[0]:.1f} s, last {mttrs[-1]:.1f} s, median {statistics.median(mttrs):.1f} s, "
                  f"max {max(mttrs):.1f} s (goal: every one <= 15 s, none growing with the fault's rank).", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    ap = common.parser(__doc__.splitlines()[0], prefix="brc", subnet=232)
    ap.add_argument("--faults", default=",".join(FAULTS))
    ap.add_argument("--methods", default="clusterctl,torchrun")
    ap.add_argument("--torchrun-wait", type=float, default=90)
    ap.add_argument("--reps", type=int, default=3, help="clusterctl runs per fault (torchrun: one)")
    ap.add_argument("--series", type=int, default=0, metavar="N",
                    help="instead: N faults in one run on 4 hosts, MTTR of each (the ### series sub-table)")
    ap.add_argument("--recovery", default="",
                    help="warm,cold: each clusterctl run once per recovery mode, interleaved (the job's "
                         "`recovery:` key); the ## warm recovery section is written from them")
    ap.add_argument("--nproc", type=int, default=2, help="ranks per node of the clusterctl runs")
    ap.add_argument("--subsection", default="",
                    help="with --recovery: write the table into this ### sub-section of ## warm recovery (the "
                         "section's other text is kept) instead of replacing the section")
    ap.add_argument("--runtimes", default="podman",
                    help="clusterctl's runtimes, comma-separated (podman, docker): with docker, the side-by-side "
                         "sub-table is written too (the main table keeps podman's runs and torchrun's)")
    args = ap.parse_args(argv)
    exit_on_signals()
    base = common.scratch("clusterctl-bench-recovery-")   # removed at exit unless the bench failed
    if args.series:
        text = series_section(run_series(base, args.series, args), args)
        print(text)
        if not args.no_write:
            write_subsection(SECTION, SERIES, text, DOC)
        return 0
    rts = args.runtimes.split(",")
    modes = [m for m in args.recovery.split(",") if m] or [""]
    tb = Testbed(3, base / "tb", [profile(gpus=0)] * 3, prefix=args.prefix, subnet_octet=args.subnet,
                 docker="docker" in rts)
    results = []
    try:
        tb.up()
        for kind in args.faults.split(","):
            for method in args.methods.split(","):
                for rep in range(1, (args.reps if method == "clusterctl" else 1) + 1):
                    for rt in (rts if method == "clusterctl" else ["-"]):
                        for rec in (modes if method == "clusterctl" else [""]):
                            t = time.monotonic()
                            r = run_clusterctl(tb, base, kind, rep, rt, rec, args.nproc) if method == "clusterctl" \
                                else run_torchrun(tb, base, kind, args.torchrun_wait)
                            print(json.dumps(r), f"({time.monotonic() - t:.0f} s)", flush=True)
                            results.append(r)
    finally:
        tb.down()
    if modes != [""]:             # warm beside cold: the ## warm recovery section (or its ### sub-section) only
        text = warm_section(results, args, f"### {args.subsection}" if args.subsection else WARM)
        print(text)
        if not args.no_write:
            if args.subsection:
                write_subsection(WARM, f"### {args.subsection}", text, DOC)
            else:
                replace_section(WARM, text, DOC)
        return 0
    if rts != ["podman"]:         # docker beside podman: the side-by-side sub-table
        text = side_section([r for r in results if r["method"].startswith("clusterctl")], args)
        print(text)
        if not args.no_write:
            write_subsection(SECTION, SIDE, text, DOC)
    main_rows = [r for r in results if r["method"] in ("clusterctl", "torchrun")]
    if "podman" in rts and main_rows:   # the main table: podman's runs and plain torchrun's
        text = section(main_rows, args)
        print(text)
        text += "".join("\n" + sub for sub in (read_subsection(SECTION, s, DOC) for s in SUBSECTIONS) if sub)
        if not args.no_write:
            replace_section(SECTION, text, DOC)
    return 0

if __name__ == "__main__":
    sys.exit(main())
