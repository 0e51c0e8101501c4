#!/usr/bin/env python3
"""srun transport vs SSH on a real Slurm testbed: a probe round and a launch, side by side in one run.

    python bench/slurm.py [--hosts 4] [--reps 5] [--no-write] [--prefix bsl --subnet 229]

Brings up its own testbed with Slurm (``Testbed(..., slurm=True)``: munged, slurmctld on the first host, a slurmd per
host; bare runtime), holds one allocation of every host (``salloc --no-shell``), and measures, alternating the
order per repetition, the same clusterctl code over the two transports:

  probe round   the supervisor's status probe (the bare runtime's ``list_argv``) on every host at once
                (``fan_out``): ``first`` opens the transport and runs it (SSH: TCP, key exchange, auth, exec;
                srun: one job step), ``kept`` runs it again over the open transport (what the supervisor does every
                ``probe_interval_s``: SSH reuses its connection, srun starts a new step each time)
  launch        ``clusterctl launch job.yaml -i INV`` (attached) of a ``--hosts``-node job, one process per node,
                10 steps: command start -> rank 0's first ``step`` line, and -> the command's exit (SUCCEEDED),
                with ``-i INVENTORY.yaml`` (SSH) and with ``-i slurm:overlay.yaml`` (srun, from the allocation)

Prints a markdown table and writes it into docs/benchmarks.md under ``## slurm: srun vs SSH``. Every supervisor it
started is stopped and the allocation cancelled before the testbed goes down, even on error or SIGTERM.
"""
from __future__ import annotations

import datetime
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: E402  (puts the repository root on sys.path)
from common import ROOT, exit_on_signals, machine  # noqa: E402

from clusterctl.config import inventory  # noqa: E402
from clusterctl.launch import runtimes
from clusterctl.transport import ConnectOptions, connect, fan_out  # noqa: E402
from tests.integration.test_launch import write_job  # noqa: E402
from tests.testbed import Testbed, profile  # noqa: E402

SECTION = "## slurm: srun vs SSH"
METHODS = ("ssh", "srun")
STEP = re.compile(r"\] step \d+/")
NOTES = """\
Reading (the run of 2026-12-03; a rerun replaces the table, not this paragraph):

- An srun command costs about the same each time (a new `srun` client, a step created by slurmctld, a fork by
  the node's slurmd): ~0.07-0.1 s at 4 nodes here, against ~0.01 s for a command on a kept SSH connection. The
  first command to a node is a little cheaper over srun than SSH's handshake.
- The supervisor's steady cost is mostly its watches (one long-lived stream per node, a line a second: one step
  per node over srun), which answer a probe round without a command; a command per node per round runs only
  when a watch is silent or a process ended, so the per-command difference shows up at a relaunch, not per second.
- A launch sends a handful of commands per node (the quick preflight's probe, the start, the watch, the log
  follower): over srun it reached rank 0's first step ~2 s later here; both are dominated by the ranks' own start (torch import on
  2 shared cores).
"""


def salloc(tb, nodes: int) -> str:
    r = subprocess.run(["salloc", "--no-shell", f"--nodes={nodes}", "--time=60"], capture_output=True, text=True,
                       timeout=60, env=dict(os.environ, **tb.slurm.env), stdin=subprocess.DEVNULL)
    m = re.search(r"Granted job allocation (\d+)", r.stderr)
    if not m:
        raise RuntimeError(f"salloc failed: {r.stderr.strip()}")
    return m.group(1)


def probe_rounds(hosts, opts, argv, kept_rounds: int) -> tuple[float, float, int]:
    """-> (first round s, median kept round s, hosts that answered every round)."""
    def first(h):
        t = connect(h, opts)
        return t, t.run(argv, timeout=30)

    t0 = time.perf_counter()
    rs = fan_out(hosts, first, host_timeout=120)
    first_s = time.perf_counter() - t0
    transports = {r.host.name: r.value[0] for r in rs if r.ok}
    ok = {r.host.name for r in rs if r.ok and r.value[1].exit_code == 0}
    kept = []
    try:
        for _ in range(kept_rounds):
            t0 = time.perf_counter()
            rk = fan_out([h for h in hosts if h.name in transports],
                         lambda h: transports[h.name].run(argv, timeout=30), host_timeout=120)
            kept.append(time.perf_counter() - t0)
            ok &= {r.host.name for r in rk if r.ok and r.value.exit_code == 0}
    finally:
        for t in transports.values():
            t.close()
    return first_s, statistics.median(kept), len(ok)


def launch(state: Path, job: Path, inv: str, env: dict) -> tuple[float | None, float, int]:
    """``clusterctl launch`` attached -> (s to rank 0's first step line, s to exit, exit code)."""
    argv = [sys.executable, "-m", "clusterctl.cli", "--state-dir", str(state), "launch", str(job), "-i", inv]
    t0 = time.perf_counter()
    p = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=str(ROOT),
                         env=env, stdin=subprocess.DEVNULL)
    first = None
    tail = []
    for line in p.stdout:
        tail = (tail + [line])[-20:]
        if first is None and STEP.search(line):
            first = time.perf_counter() - t0
    code = p.wait(timeout=300)
    total = time.perf_counter() - t0
    if code != 0:
        print("".join(tail), file=sys.stderr)
    return first, total, code


def main(argv=None) -> int:
    ap = common.parser(__doc__.split("\n\n")[0], prefix="bsl", subnet=229, reps=5)
    ap.add_argument("--hosts", type=int, default=4, help="testbed hosts = allocation = job nodes")
    ap.add_argument("--kept-rounds", type=int, default=5, help="kept-transport probe rounds per repetition")
    args = ap.parse_args(argv)
    n = args.hosts
    exit_on_signals()

    base = Path(tempfile.mkdtemp(prefix="clusterctl-bench-slurm-"))
    tb = Testbed(n, base, [profile(gpus=0, image=False)] * n, prefix=args.prefix, subnet_octet=args.subnet,
                 slurm=True)
    samples: dict[tuple[str, str], list[float]] = {}
    failures: list[str] = []
    launched: list[tuple[Path, str, dict]] = []      # (state dir, job name, env): stopped before the testbed goes
    jid = None
    try:
        t0 = time.monotonic()
        tb.up()
        print(f"testbed {args.prefix}: {n} hosts with Slurm up in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        jid = salloc(tb, n)
        nodelist = re.search(r" NodeList=(\S+)", tb.scontrol("-o", "show", "job", jid).stdout).group(1)
        slurm_env = {**tb.slurm.env, "SLURM_JOB_ID": jid, "SLURM_JOB_NODELIST": nodelist}
        os.environ.update(slurm_env)       # the srun transport in this process finds the allocation here
        env = {k: v for k, v in os.environ.items() if k not in ("CLUSTERCTL_INVENTORY", "CLUSTERCTL_STATE_DIR")}

        ssh_inv = tb.inventory(base / "inventory.yaml", runtime="bare")
        overlay = base / "overlay.yaml"
        overlay.write_text("all:\n  vars:\n    clusterctl_runtime: bare\n    clusterctl_gpus: 0\n"
                           "    clusterctl_interface: eth0\n")
        invs = {"ssh": str(ssh_inv), "srun": f"slurm:{overlay}"}
        hosts = {m: list(inventory.load(invs[m]).hosts) for m in METHODS}
        assert {h.connection for h in hosts["srun"]} == {"srun"} and {h.connection for h in hosts["ssh"]} == {"ssh"}
        opts = ConnectOptions(connect_timeout=30, command_timeout=60, connect_retries=0,
                              known_hosts=str(tb.known_hosts), ssh_config=str(base / "no_ssh_config"))
        probe = runtimes.get("bare").list_argv("bench-slurm-none")
        for m in METHODS:                                   # warm-up (page cache, imports, munge), not measured
            probe_rounds(hosts[m], opts, probe, 1)
        for rep in range(args.reps):
            order = METHODS if rep % 2 == 0 else METHODS[::-1]
            for m in order:
                first, kept, ok = probe_rounds(hosts[m], opts, probe, args.kept_rounds)
                samples.setdefault((m, "probe first"), []).append(first)
                samples.setdefault((m, "probe kept"), []).append(kept)
                if ok != n:
                    failures.append(f"rep {rep + 1} {m} probe: {ok}/{n} hosts answered")
                print(f"rep {rep + 1}/{args.reps} {m:4s} probe: first {first:.3f}s kept {kept:.3f}s ok {ok}/{n}",
                      file=sys.stderr)
            for m in order:
                name = f"bsl-{m}-{rep}"
                state = base / f"state-{name}"
                job = write_job(base / f"{name}.yaml", tb, name, "bare", steps=10,
                                extra={"nodes": n, "nproc_per_node": 1})
                launched.append((state, name, env))
                first, total, code = launch(state, job, invs[m], env)
                if code != 0 or first is None:
                    failures.append(f"rep {rep + 1} {m} launch: exit code {code}, first step "
                                    f"{'seen' if first is not None else 'never seen'}")
                else:
                    samples.setdefault((m, "launch: first step"), []).append(first)
                    samples.setdefault((m, "launch: SUCCEEDED"), []).append(total)
                print(f"rep {rep + 1}/{args.reps} {m:4s} launch: first step "
                      f"{'-' if first is None else f'{first:.2f}s'} exit {code} after {total:.2f}s", file=sys.stderr)
    finally:
        for state, name, env in launched:
            subprocess.run([sys.executable, "-m", "clusterctl.cli", "--state-dir", str(state), "stop", name],
                           capture_output=True, timeout=120, env=env, cwd=str(ROOT), stdin=subprocess.DEVNULL)
        if jid is not None:
            subprocess.run(["scancel", jid], capture_output=True, timeout=30, env=dict(os.environ, **tb.slurm.env))
        t0 = time.monotonic()
        tb.down()
        print(f"testbed {args.prefix}: down in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        subprocess.run(["rm", "-rf", str(base)], check=False)

    rows = ["| what | SSH s (median) | SSH min-max | srun s (median) | srun min-max | srun / SSH |",
            "|---|---:|---|---:|---|---:|"]
    lines = []
    for what in ("probe first", "probe kept", "launch: first step", "launch: SUCCEEDED"):
        a, b = samples.get(("ssh", what), []), samples.get(("srun", what), [])
        if not a or not b:
            rows.append(f"| {what} | - | - | - | - | - |")
            continue
        ma, mb = statistics.median(a), statistics.median(b)
        rows.append(f"| {what} | {ma:.3f} | {min(a):.3f}-{max(a):.3f} | {mb:.3f} | {min(b):.3f}-{max(b):.3f} "
                    f"| {mb / ma:.2f}x |")
        lines.append((what, ma, mb))
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    section = "\n".join([
        SECTION, "",
        f"Measured {when} on {machine('sshd, slurmctld, the slurmds, their steps and the clients')}. "
        f"{n} testbed hosts in one allocation (`salloc --no-shell --nodes={n}`), bare runtime; {args.reps} "
        f"repetitions, the order of the two transports alternated per repetition; medians. Rerun: "
        f"`python bench/slurm.py --hosts {n} --reps {args.reps}` (as root; it builds and removes its own testbed, "
        f"prefix `{args.prefix}`, 10.{args.subnet}.0.0/24).", "",
        "- **probe first**: every host at once (`fan_out`), open the transport and run the supervisor's status probe "
        "(the bare runtime's listing): SSH = TCP + key exchange + auth + exec; srun = one job step "
        "(`srun --overlap --nodes=1 --ntasks=1 -w HOST --jobid=J`).",
        f"- **probe kept**: the same over the open transports, median of {args.kept_rounds} rounds per repetition: "
        "what the supervisor pays every `probe_interval_s` (SSH reuses its connection; srun has none and starts a "
        "step each time).",
        f"- **launch**: `clusterctl launch job.yaml -i INV` attached, {n} nodes x 1 process, 10 steps: the "
        "command's start -> rank 0's first `step` line, and -> its exit (SUCCEEDED). `-i inventory.yaml` (SSH) vs "
        "`-i slurm:overlay.yaml` (srun; hosts from the allocation).", "",
        *rows, "",
        *(f"- {what}: srun {mb:.3f}s vs SSH {ma:.3f}s ({mb / ma:.2f}x)" for what, ma, mb in lines),
        *(["", "Failures: " + "; ".join(failures)] if failures else []),
        "",
        NOTES,
    ])
    common.publish(SECTION, section, write=not args.no_write)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
