"""False verdicts under load: a healthy job, the controller CPU-starved and one node's sshd stalling.

    python bench/falseverdict.py [--minutes 10] [--stall 0.5-3.0] [--run 1.0-3.0] [--no-write]
                                 [--prefix bfv --subnet 236]

On a 3-host testbed (podman, ``nodes: "2:3"``, 1 rank per node, quickstart script with ``--step-time 0.1``, default
supervisor settings but ``probe_interval_s: 1``) a healthy job runs for ``--minutes`` while

- ``stress-ng --cpu <cores>`` keeps every core of this machine busy (the controller, and the nodes, which share it);
  the Debian package is installed when missing;
- one non-rendezvous node's sshd is slowed: its session processes (the ones carrying the supervisor's
  connection: the node's watch, log follower and probes) are SIGSTOPped for a random ``--stall`` seconds, then
  SIGCONTed for a random ``--run`` seconds, over and over.

Nothing fails, so every verdict of the supervisor in that window is false; the count (``node_lost`` and any other)
goes to the ``### false verdicts under load`` sub-section of ``## recovery`` in docs/benchmarks.md. Afterwards, with
the load still on and the stalls stopped, the job on the slowed node is killed: the time to its verdict shows that a
killed node is still detected quickly.
"""
from __future__ import annotations

import datetime
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common  # noqa: E402  (puts the repository root on sys.path)
from common import DOC, exit_on_signals  # noqa: E402
from docsection import write_subsection  # noqa: E402

from tests.integration import recovery_harness as rh  # noqa: E402
from tests.testbed import (  # noqa: E402
    Testbed,
    profile,
    system,  # noqa: E402
)

SECTION, SUB = "## recovery", "### false verdicts under load"
SESSION = re.compile(r"^sshd: \S+@")          # an sshd session process (not the listener)


def ensure_stress_ng() -> str:
    path = shutil.which("stress-ng")
    if path:
        return path
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    subprocess.run(["apt-get", "install", "-y", "-q", "stress-ng"], check=True, timeout=600, env=env,
                   stdin=subprocess.DEVNULL)
    return shutil.which("stress-ng") or "/usr/bin/stress-ng"


def span(text: str) -> tuple[float, float]:
    lo, _, hi = text.partition("-")
    return float(lo), float(hi or lo)


class SshdStaller:
    """SIGSTOP/SIGCONT cycles of one testbed host's sshd session processes, in a thread."""

    def __init__(self, tb, host: str, stall: tuple[float, float], run: tuple[float, float], seed: int = 16):
        self.tb, self.host, self.stall, self.run = tb, host, stall, run
        self.rng = random.Random(seed)
        self.stop_event = threading.Event()
        self.stalls: list[float] = []
        self.thread = threading.Thread(target=self._loop, daemon=True, name="sshd-staller")

    def _pids(self) -> list[int]:
        return [pid for pid, cmd in self.tb.processes(self.host) if SESSION.match(cmd)]

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            pids = self._pids()
            d = self.rng.uniform(*self.stall)
            system.kill_pids(pids, signal.SIGSTOP)
            self.stalls.append(d)
            self.stop_event.wait(d)
            system.kill_pids(self._pids(), signal.SIGCONT)
            self.stop_event.wait(self.rng.uniform(*self.run))

    def start(self) -> None:
        self.thread.start()

    def stop(self) -> None:
        self.stop_event.set()
        self.thread.join(timeout=30)
        system.kill_pids(self._pids(), signal.SIGCONT)


def measure(tb, base: Path, args) -> dict:
    run = rh.new_run(tb, base / "job", "benchfalseverdict", steps=10 ** 6, every=50, step_time=0.1, nodes="2:3",
                     nproc=1)
    stress = None
    staller = None
    try:
        run.launch()
        run.wait_step(10, timeout=300)
        st = run.status()
        victim = rh.other_host(run)
        seconds = args.minutes * 60
        t0 = time.time()
        stress = subprocess.Popen([ensure_stress_ng(), "--cpu", str(os.cpu_count()), "--timeout",
                                   f"{int(seconds) + 120}s", "--quiet"], stdin=subprocess.DEVNULL,
                                  start_new_session=True)
        staller = SshdStaller(tb, victim, span(args.stall), span(args.run))
        staller.start()
        while time.time() < t0 + seconds:
            time.sleep(5)
        staller.stop()
        t1 = time.time()
        ev = run.events()
        window = [e for e in ev if t0 <= e["time"] <= t1]
        verdicts = [e for e in window if e["kind"] == "verdict"]
        recs = [r for r in run.steps_log() if t0 <= r["time"] <= t1]
        out = {"victim": victim, "rdzv": st["rendezvous_host"], "seconds": round(t1 - t0),
               "stalls": len(staller.stalls), "stall_s": round(sum(staller.stalls), 1),
               "longest_stall": round(max(staller.stalls, default=0), 2),
               "node_lost": sum(e["class"] in ("node_lost", "rendezvous_lost") for e in verdicts),
               "verdicts": [f"{e['class']}: {e['message']}" for e in verdicts],
               "steps": len(recs), "attempt": run.status()["attempt"]}
        # a killed node must still be found quickly: kill the job on the slowed node (load still on; another
        # non-rendezvous node when a false verdict dropped it from the job)
        time.sleep(3)
        now = run.status()
        target = victim if victim in [n["node"] for n in now["nodes"]] else rh.other_host(run)
        tk = time.time()
        tb.kill(target, pattern=rh.JOB_PATTERN)
        end = time.monotonic() + 60
        detect = None
        while time.monotonic() < end and detect is None:
            hit = [e for e in run.events() if e["kind"] == "verdict" and e["time"] >= tk]
            detect = round(hit[0]["time"] - tk, 1) if hit else None
            time.sleep(0.5)
        out["kill_detect_s"], out["killed"] = detect, target
        return out
    finally:
        if staller is not None:
            staller.stop()
        if stress is not None and stress.poll() is None:
            os.killpg(stress.pid, signal.SIGKILL)
            stress.wait(timeout=30)
        run.cli("stop", run.name, "--grace", "0", check=False, timeout=120)


def section(r: dict, args) -> str:
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    lines = [SUB, "",
             f"Measured {when} on {os.cpu_count()} cores (`python bench/falseverdict.py --minutes {args.minutes:g} "
             f"--stall {args.stall} --run {args.run}`; own 3-host testbed, prefix `{args.prefix}`, "
             f"10.{args.subnet}.0.0/24). A healthy job (`nodes: \"2:3\"`, 1 rank per node, `probe_interval_s: 1`, "
             f"other supervisor settings default) for {r['seconds']} s with `stress-ng --cpu {os.cpu_count()}` on "
             f"every core and the sshd session processes of {r['victim']} (not the rendezvous host) SIGSTOPped "
             f"{r['stalls']} times ({args.stall} s each, {r['stall_s']} s in all, longest {r['longest_stall']} s), "
             f"SIGCONTed for {args.run} s in between.", "",
             "| false `node_lost` | other false verdicts | attempts at the end | steps trained in the window | "
             "kill on the slowed node detected after |",
             "|---:|---:|---:|---:|---:|",
             f"| {r['node_lost']} | {len(r['verdicts']) - r['node_lost']} | {r['attempt']} | {r['steps']} | "
             f"{'-' if r['kill_detect_s'] is None else r['kill_detect_s']} s ({r['killed']}) |", ""]
    for v in r["verdicts"]:
        lines.append(f"- false verdict: {v}")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    ap = common.parser(__doc__.splitlines()[0], prefix="bfv", subnet=236)
    ap.add_argument("--minutes", type=float, default=10)
    ap.add_argument("--stall", default="0.5-3.0", help="seconds each SIGSTOP of the node's sshd lasts (LO-HI)")
    ap.add_argument("--run", default="1.0-3.0", help="seconds between two stalls (LO-HI)")
    args = ap.parse_args(argv)
    exit_on_signals()
    ensure_stress_ng()
    base = Path(tempfile.mkdtemp(prefix="clusterctl-bench-falseverdict-"))
    tb = Testbed(3, base / "tb", [profile(gpus=0)] * 3, prefix=args.prefix, subnet_octet=args.subnet)
    try:
        tb.up()
        r = measure(tb, base, args)
    finally:
        tb.down()
    print(r, flush=True)
    text = section(r, args)
    print(text)
    if not args.no_write:
        write_subsection(SECTION, SUB, text, DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
