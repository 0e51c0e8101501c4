#!/usr/bin/env python3
"""Launch benchmark: time from `clusterctl launch` to the first training step vs the same torchrun by hand.

    python bench/launch.py [--sizes 2,4] [--reps 3] [--runtime bare|podman|docker] [--no-write]

Brings up its own testbed (prefix ``bla``, subnet 10.238.0.0/24, CPU hosts with the test image), then for each
size N (nodes x 2 processes of examples/quickstart/train.py, gloo), side by side in the same run, alternating the
order per repetition:

  clusterctl  ``clusterctl launch job.yaml -i inventory.yaml`` (attached: quick preflight, job record, detached
              supervisor, start over SSH, log copy), until the first ``[<node1>/0] step `` line on its stdout
  by-hand     N parallel ``ssh user@host 'cd WORKDIR && env K=V... torchrun ARGV'`` (bare) or
              ``ssh user@host podman run --rm --network=host --init -e K=V... IMAGE torchrun ARGV`` (podman;
              docker: ``docker run --rm --network=host -v MOUNTS... -e K=V... IMAGE torchrun ARGV``, a real
              dockerd per host),
              with the exact torchrun argv and environment of ``clusterctl launch --dry-run --output json``
              (a fresh --rdzv-id per run), until rank 0's first ``step`` line on node1's ssh stdout

Both wait for the run to finish before the next one (same rendezvous port). The median ratio clusterctl/by-hand
is the launch overhead (goal: within 1.5x). For clusterctl, ``clusterctl events`` gives where the time goes:
launch -> "start" event (CLI start, preflight, record, supervisor spawn, reachability, checkpoint lookup) ->
first step. Writes the table into docs/benchmarks.md under ``## launch`` (docker: ``## launch: docker``; other
sections are left alone).
The testbed is torn down at the end, even on error or SIGTERM.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common  # noqa: E402  (puts the repository root on sys.path)
from common import ROOT, exit_on_signals  # noqa: E402

from tests.testbed import IMAGE, Testbed, profile  # noqa: E402

SECTION = "## launch"
TRAIN = ROOT / "examples" / "quickstart" / "train.py"
VENV_BIN = Path(sys.prefix) / "bin"
GOAL = 1.5
RUN_TIMEOUT = 600.0


def cli(state: Path, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTERCTL_INVENTORY", "CLUSTERCTL_STATE_DIR")}
    return subprocess.run([sys.executable, "-m", "clusterctl.cli", "--state-dir", str(state), *args],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)


def write_job(path: Path, name: str, nodes: int, runtime: str, port: int, mounts: list[str]) -> Path:
    import yaml

    job = {"name": name, "nodes": nodes, "nproc_per_node": 2, "script": str(TRAIN),
           "args": ["--steps", "3", "--log-every", "1", "--checkpoint-every", "0"],
           "rendezvous": {"port": port, "join_timeout": 120, "last_call_timeout": 1},
           "restarts": {"max_restarts": 0, "max_failures": 0}, "supervisor": {"probe_interval_s": 1},
           "container": {"ulimits": {}}}
    if runtime == "bare":
        job["torchrun"] = str(VENV_BIN / "torchrun")
    if mounts:
        job["mounts"] = mounts
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def _read_until(stream, pattern: re.Pattern, found: threading.Event, stamp: list, sink: list) -> None:
    for line in iter(stream.readline, ""):
        sink.append(line)
        if not found.is_set() and pattern.search(line):
            stamp.append(time.monotonic())
            found.set()


def run_clusterctl(state: Path, job: Path, inv: Path, node1: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTERCTL_INVENTORY", "CLUSTERCTL_STATE_DIR")}
    wall0, t0 = time.time(), time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "clusterctl.cli", "--state-dir", str(state), "launch", str(job),
                          "-i", str(inv)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         stdin=subprocess.DEVNULL, env=env)
    found, stamp, out, err = threading.Event(), [], [], []
    pat = re.compile(rf"^\[{re.escape(node1)}/0\] step \d+")
    th = threading.Thread(target=_read_until, args=(p.stdout, pat, found, stamp, out), daemon=True)
    th.start()
    te = threading.Thread(target=lambda: err.extend(p.stderr), daemon=True)
    te.start()
    try:
        rc = p.wait(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        rc = p.wait()
    th.join(10)
    te.join(10)
    if rc != 0 and stamp:   # failed after training started (e.g. a worker aborting in teardown): still timed
        print(f"clusterctl: launch exited {rc} after the first step (not counted)", file=sys.stderr)
    if not stamp:
        raise RuntimeError(f"clusterctl launch failed (rc {rc}):\n{''.join(err)[-3000:]}\n{''.join(out)[-3000:]}")
    name = job.stem
    evs = json.loads(cli(state, "events", name, "--output", "json").stdout)
    start_ev = next((e["time"] for e in evs if e["kind"] == "start"), None)
    return {"first_step": stamp[0] - t0, "start_event": (start_ev - wall0) if start_ev else None,
            "events": [(round(e["time"] - wall0, 2), e["kind"], e["message"]) for e in evs]}


def hand_command(node: dict, runtime: str, rdzv_id: str, tb: Testbed) -> list[str]:
    targv = [f"--rdzv-id={rdzv_id}" if a.startswith("--rdzv-id=") else a for a in node["torchrun_argv"]]
    env = node["env"]
    if runtime == "bare":
        wd = str(TRAIN.parent)
        remote = f"cd {shlex.quote(wd)} && env " + " ".join(shlex.quote(f"{k}={v}") for k, v in env.items()) \
            + " " + shlex.join(targv)
    elif runtime == "docker":     # no --init: as clusterctl runs it (runtimes/docker.py: init_args)
        remote = shlex.join(["docker", "run", "--rm", "--network=host", "--ipc=host",
                             *[f"--volume={m}" for m in tb.job_mounts(runtime)],
                             *[f"--env={k}={v}" for k, v in env.items()], IMAGE, *targv])
    else:
        remote = shlex.join(["podman", "run", "--rm", "--network=host", "--ipc=host", "--init",
                             *[f"--env={k}={v}" for k, v in env.items()], IMAGE, *targv])
    return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
            "-o", f"UserKnownHostsFile={tb.known_hosts}", "-o", "IdentitiesOnly=yes", "-i", str(tb.key),
            f"{tb.user}@{node['address']}", remote]


def run_by_hand(plan: dict, runtime: str, rdzv_id: str, tb: Testbed) -> dict:
    t0 = time.monotonic()
    procs = [subprocess.Popen(hand_command(n, runtime, rdzv_id, tb), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL) for n in plan["nodes"]]
    found, stamp, outs = threading.Event(), [], [[] for _ in procs]
    threads = []
    for i, p in enumerate(procs):
        pat = re.compile(r"^\[0\]:step \d+") if i == 0 else re.compile(r"(?!)")
        t = threading.Thread(target=_read_until, args=(p.stdout, pat, found, stamp, outs[i]), daemon=True)
        t.start()
        threads.append(t)
    rcs = []
    for p in procs:
        try:
            rcs.append(p.wait(timeout=RUN_TIMEOUT))
        except subprocess.TimeoutExpired:
            p.kill()
            rcs.append(p.wait())
    for t in threads:
        t.join(10)
    if rcs[0] or not stamp:
        raise RuntimeError(f"by-hand run failed (rcs {rcs}):\n" + "".join(outs[0])[-3000:])
    if any(rcs):   # after training: plain torchrun's exit barrier fails when the store host leaves first
        print(f"by-hand: exit codes {rcs} after the first step (not counted)", file=sys.stderr)
    return {"first_step": stamp[0] - t0}


def main(argv=None) -> int:
    ap = common.parser(__doc__.split("\n\n")[0], prefix="bla", subnet=238, sizes="2,4", reps=3)
    ap.add_argument("--runtime", choices=("bare", "podman", "docker"), default="podman")
    ap.add_argument("--port", type=int, default=29470)
    args = ap.parse_args(argv)
    sizes = common.sizes_of(args)
    n_max = max(sizes)
    exit_on_signals()

    base = Path(tempfile.mkdtemp(prefix="clusterctl-bench-launch-"))
    tb = Testbed(n_max, base, [profile(gpus=0)] * n_max, prefix=args.prefix, subnet_octet=args.subnet,
                 docker=args.runtime == "docker")
    heading = SECTION + (": docker" if args.runtime == "docker" else "")
    samples: dict[tuple[int, str], list[dict]] = {}
    loads = []
    try:
        tb.up()
        inv_all = tb.inventory(base / "inventory.yaml", runtime=args.runtime)
        plans, jobs, invs = {}, {}, {}
        for n in sizes:
            invs[n] = tb.inventory(base / f"inventory-{n}.yaml", runtime=args.runtime,
                                   hosts=[h.name for h in tb.hosts[:n]])
            jobs[n] = write_job(base / f"bl{n}.yaml", f"bl{n}", n, args.runtime, args.port,
                                tb.job_mounts(args.runtime))
            r = cli(base / "state-dry", "launch", str(jobs[n]), "-i", str(invs[n]), "--dry-run", "--output", "json")
            if r.returncode != 0:
                raise RuntimeError(f"dry run failed: {r.stderr}")
            plans[n] = json.loads(r.stdout)
        del inv_all
        methods = ("clusterctl", "by-hand")
        for rep in range(args.reps):
            for n in sizes:
                order = methods if (rep + sizes.index(n)) % 2 == 0 else methods[::-1]
                for m in order:
                    loads.append(os.getloadavg()[0])
                    if m == "clusterctl":
                        res = run_clusterctl(base / f"state-{n}-{rep}", jobs[n], invs[n], tb.hosts[0].name)
                    else:
                        res = run_by_hand(plans[n], args.runtime, f"bl{n}-hand-{rep}", tb)
                    samples.setdefault((n, m), []).append(res)
                    extra = (f" (start event at {res['start_event']:.1f}s)" if res.get("start_event") else "")
                    print(f"rep {rep + 1}/{args.reps} n={n} {m:10s} first step {res['first_step']:6.1f}s{extra}",
                          file=sys.stderr)
    finally:
        tb.down()
        subprocess.run(["rm", "-rf", str(base)], check=False)

    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    rows = ["| nodes | method | first step s (median) | min-max | ratio clusterctl/by-hand | goal <= 1.5x |",
            "|---:|---|---:|---|---:|---|"]
    verdicts, timelines = [], []
    for n in sizes:
        med = {}
        for m in ("clusterctl", "by-hand"):
            xs = [s["first_step"] for s in samples[(n, m)]]
            med[m] = statistics.median(xs)
        ratio = med["clusterctl"] / med["by-hand"]
        for m in ("clusterctl", "by-hand"):
            xs = [s["first_step"] for s in samples[(n, m)]]
            rows.append(f"| {n} | {m} | {med[m]:.1f} | {min(xs):.1f}-{max(xs):.1f} | "
                        + (f"{ratio:.2f} | {'met' if ratio <= GOAL else 'NOT met'} |" if m == "clusterctl"
                           else " | |"))
        starts = [s["start_event"] for s in samples[(n, "clusterctl")] if s.get("start_event") is not None]
        verdicts.append(f"- {n} nodes: clusterctl {med['clusterctl']:.1f}s vs by hand {med['by-hand']:.1f}s -> "
                        f"{ratio:.2f}x ({'within' if ratio <= GOAL else 'over'} {GOAL}x); clusterctl's `start` "
                        f"event (CLI start + quick preflight + record + supervisor spawn + reachability + "
                        f"checkpoint lookup) came {statistics.median(starts):.1f}s after `launch` (median), "
                        f"so the start-to-first-step part was "
                        f"{med['clusterctl'] - statistics.median(starts):.1f}s vs {med['by-hand']:.1f}s by hand")
        last = samples[(n, "clusterctl")][-1]["events"]
        timelines.append(f"`clusterctl events` of the last {n}-node run (seconds after `launch`): "
                         + "; ".join(f"{t:.1f}s {k}" for t, k, _ in last))
    section = "\n".join([
        heading, "",
        f"Measured {when} on {os.cpu_count()} cores, Linux {platform.release()}, Python {platform.python_version()}; "
        f"runtime {args.runtime}; {args.reps} repetitions per cell, order alternated per repetition; medians. "
        f"Load average during the runs: {min(loads):.1f}-{max(loads):.1f} (the machine is shared: absolute times "
        "are inflated, the ratio is what to read). Rerun: `python bench/launch.py --sizes 2,4 --reps 3 "
        f"--runtime {args.runtime}` (as root; own testbed, prefix `bla`, 10.238.0.0/24, rendezvous port "
        f"{args.port}).", "",
        "- Job: examples/quickstart/train.py, N nodes x 2 processes (gloo, CPU), `--steps 3 --log-every 1`, no "
        "checkpoints. Measured: from starting the command to the first `step` line of rank 0 seen by the caller.",
        "- **clusterctl**: `clusterctl launch job.yaml -i inventory.yaml` attached (quick preflight, job record, "
        "detached supervisor, start over SSH, the log copy it prints).",
        "- **by-hand**: N parallel OpenSSH clients, " + (
            "`ssh host 'cd WORKDIR && env K=V... torchrun ARGV'`" if args.runtime == "bare" else
            "`ssh host docker run --rm --network=host --ipc=host --volume=... --env=K=V... IMAGE torchrun ARGV` "
            "(a real dockerd per host; the volumes are the host's /usr, Python, venv, repo and shared dir, as in "
            "the clusterctl job's `mounts`)" if args.runtime == "docker" else
            "`ssh host podman run --rm --network=host --ipc=host --init --env=K=V... IMAGE torchrun ARGV`")
        + ", the torchrun argv and environment taken from `clusterctl launch --dry-run --output json` (fresh "
        "`--rdzv-id` per run); rank 0's first `step` line on node1's ssh stdout.", "",
        *rows, "", *verdicts, "", *[f"- {t}" for t in timelines], ""])
    common.publish(heading, section, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
