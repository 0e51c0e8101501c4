"""Starts that never train (issue 34 item 12): start the quickstart (examples/quickstart, 2 ranks, 2 DataLoader
workers each) again and again, and count the starts whose every rank made its first step within a bound. A start
that did not is *stuck*: the stacks of all its processes (the torchrun agent, the ranks, their DataLoader workers;
py-spy, Python and native frames) are kept under --keep, and it is killed.

    python bench/starts.py [--starts 300] [--via torchrun|local|podman] [--bound 300] [--max-minutes M]
                           [--keep DIR] [--no-write] [--prefix bsr --subnet 239]

- ``--via torchrun``: ``torchrun --standalone --nproc-per-node 2 train.py`` started here, the cheapest start;
  ``--via local``: ``clusterctl launch`` of the quickstart with the embedded default inventory (this machine, bare
  runtime; a state dir of its own), what a user's first attempt is; ``--via podman``: ``clusterctl launch`` on a
  2-host testbed of its own (podman, 2 ranks per node, a checkpoint dir as in the recovery benches, cold), where
  the hang was seen.
- Each start trains 2 steps and reports its phases (train.py ``--phases``): reached = every rank's ``first_step``
  within ``--bound`` seconds of the start. A start that ended before (a failure, not a hang) is counted apart,
  with its output kept.
- ``--no-write`` prints the section without touching docs/benchmarks.md (``## starts``).
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

import common

HEADING = "## starts"
QUICKSTART = common.ROOT / "examples" / "quickstart"
VENV_BIN = Path(sys.executable).parent
PY_SPY = shutil.which("py-spy", path=f"{VENV_BIN}:{os.environ.get('PATH', '')}")


RANKS = {"torchrun": 2, "local": 2, "podman": 4}


def first_steps(phases: Path) -> dict[int, float]:
    """rank -> wall time of its first step (train.py --phases)."""
    out = {}
    try:
        for line in phases.read_text().splitlines():
            try:
                p = json.loads(line)
            except ValueError:
                continue
            if p.get("phase") == "first_step":
                out[int(p["rank"])] = float(p["time"])
    except OSError:
        pass
    return out


def children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                ppid = int(open(f"/proc/{d}/stat").read().rsplit(")", 1)[1].split()[1])
            except (OSError, ValueError, IndexError):
                continue
            kids.setdefault(ppid, []).append(int(d))
    return kids


def tree(root: int) -> list[int]:
    """``root`` and every descendant (ranks live in sessions of their own: the parent links are what is left)."""
    kids, out, todo = children(), [], [root]
    while todo:
        p = todo.pop()
        out.append(p)
        todo.extend(kids.get(p, []))
    return out


def with_env(needle: str) -> list[int]:
    """Processes whose environment holds ``needle`` (NAME=value) and their descendants."""
    found = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                if needle.encode() in open(f"/proc/{d}/environ", "rb").read().split(b"\0"):
                    found.append(int(d))
            except OSError:
                continue
    return sorted({q for p in found for q in tree(p)})


def stacks(pids: list[int]) -> str:
    out = []
    for pid in pids:
        try:
            cmd = open(f"/proc/{pid}/cmdline", "rb").read().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        out.append(f"===== pid {pid}: {cmd[:300]}")
        if PY_SPY:      # native frames too; py-spy cannot unwind some processes natively: then Python frames
            for native in (["--native"], []):
                r = subprocess.run([PY_SPY, "dump", *native, "--pid", str(pid)], capture_output=True, text=True,
                                   timeout=60)
                if r.returncode == 0:
                    break
            out.append(r.stdout + r.stderr)
        try:
            out.append("wchan: " + open(f"/proc/{pid}/wchan").read())
        except OSError:
            pass
    return "\n".join(out)


def kill(pids: list[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


class Child:
    """A start that is one child process of this one (``self.proc``): ended, and its exit code within a bound."""

    proc: subprocess.Popen

    def ended(self) -> bool:
        return self.proc.poll() is not None

    def finish(self, timeout: float) -> int | None:
        """Its exit code, or None when it did not end within ``timeout`` s."""
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None


class Torchrun(Child):
    """One start: torchrun of the quickstart, here."""

    def __init__(self, work: Path, i: int):
        self.phases, self.log = work / f"phases-{i}.jsonl", work / f"out-{i}.log"
        env = {**os.environ, "OMP_NUM_THREADS": "1", "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}"}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(
                [str(VENV_BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", str(QUICKSTART / "train.py"),
                 "--steps", "2", "--checkpoint-every", "0", "--phases", str(self.phases)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=work,
                start_new_session=True)

    def processes(self) -> list[int]:
        return tree(self.proc.pid)

    def kill(self) -> None:
        if self.proc.poll() is None:      # never by a pid this process has reaped (it may be another's by now)
            kill(self.processes())
        self.proc.wait()


class Local(Child):
    """One start: ``clusterctl launch`` of the quickstart with the embedded default (this machine, bare)."""

    def __init__(self, work: Path, i: int):
        self.phases, self.log = work / f"phases-{i}.jsonl", work / f"out-{i}.log"
        self.state, self.name = work / f"state-{i}", f"starts{i}"
        job = work / f"job-{i}.yaml"
        job.write_text(
            f"name: {self.name}\nnodes: 1\nnproc_per_node: 2\nscript: {QUICKSTART / 'train.py'}\n"
            f"args: ['--steps', '2', '--checkpoint-every', '0', '--phases', '{self.phases}']\n"
            f"env: {{OMP_NUM_THREADS: '1'}}\nrendezvous: {{port: {29600 + i % 50}, join_timeout: 60, "
            f"last_call_timeout: 1}}\nrestarts: {{max_restarts: 0, max_failures: 0}}\n"
            f"supervisor: {{probe_interval_s: 1}}\n")
        env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "CLUSTERCTL_STATE_DIR": str(self.state)}
        self.env = env
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen([sys.executable, "-m", "clusterctl.cli", "--state-dir", str(self.state),
                                          "launch", str(job)], stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT, env=env, cwd=work)

    def _cli(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "clusterctl.cli", "--state-dir", str(self.state), *args],
                              capture_output=True, text=True, env=self.env, timeout=timeout)

    def processes(self) -> list[int]:
        job_id = next((d.name for d in (self.state / "jobs").glob(f"{self.name}-*")), "")
        return with_env(f"CLUSTERCTL_JOB_ID={job_id}") if job_id else []

    def stacks(self) -> str:
        r = self._cli("stacks", self.name)
        return f"$ clusterctl stacks {self.name}  (exit {r.returncode})\n{r.stdout}{r.stderr}"

    def kill(self) -> None:
        self._cli("stop", self.name, "--grace", "0")
        kill(self.processes())
        try:
            self.proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


class Podman:
    """One start: ``clusterctl launch`` on the testbed (2 hosts, podman, 2 ranks each, cold)."""

    def __init__(self, work: Path, i: int, tb):
        from tests.integration import recovery_harness as rh

        self.tb, self.name = tb, f"starts{i}"
        shared = Path(tb.shared) / self.name
        self.phases = shared / "phases.jsonl"
        self.run = rh.new_run(tb, work / self.name, self.name, runtime="podman", steps=2, every=1000, step_time=0,
                              nodes="2", nproc=2, extra_args=["--phases", str(self.phases)], recovery="cold",
                              restarts={"max_failures": 0})
        self.log = work / self.name / "cli.log"
        self.run.launch()

    def ended(self) -> bool:
        job = self.run.job_row()
        return job is not None and job.terminal

    def processes(self) -> list[int]:
        return [pid for h in self.tb.hosts for pid, cmd in self.tb.processes(h) if "train.py" in cmd]

    def stacks(self) -> str:
        r = self.run.cli("stacks", self.name, check=False, timeout=180)
        return f"$ clusterctl stacks {self.name}  (exit {r.returncode})\n{r.stdout}{r.stderr}"

    def finish(self, timeout: float) -> int | None:
        try:
            return 0 if self.run.wait_end(timeout)["state"].lower() == "succeeded" else 1
        except AssertionError:
            return None

    def kill(self) -> None:
        self.run.cli("stop", self.name, "--grace", "0", check=False, timeout=180)

    def save_log(self, to: Path) -> None:
        to.write_text("\n".join(self.run.log) + "\n" + self.run.events_text())


def run(args) -> dict:
    work = common.scratch("starts.")
    keep = Path(args.keep)
    keep.mkdir(parents=True, exist_ok=True)
    tb = None
    if args.via == "podman":
        from tests.testbed import Testbed, profile

        tb = Testbed(2, work / "tb", [profile(gpus=0)] * 2, prefix=args.prefix, subnet_octet=args.subnet)
        tb.up()
    try:
        return starts(args, work, keep, tb)
    finally:
        if tb is not None:
            tb.down()


def starts(args, work: Path, keep: Path, tb) -> dict:
    times, stuck, failed = [], [], []
    t_end = time.monotonic() + args.max_minutes * 60 if args.max_minutes else None
    done = 0
    for i in range(args.starts):
        if t_end is not None and time.monotonic() > t_end:
            break
        t0 = time.time()
        s = Podman(work, i, tb) if tb is not None else {"torchrun": Torchrun, "local": Local}[args.via](work, i)
        try:
            outcome = watch(s, i, t0, args.bound, RANKS[args.via], keep, times, stuck, failed)
        except BaseException:
            s.kill()                  # SIGTERM/^C: nothing of the start in flight is left behind
            raise
        done += 1
        if isinstance(s, Local):
            shutil.rmtree(s.state, ignore_errors=True)
        print(f"start {i}: {outcome} ({done} done: {len(stuck)} stuck, {len(failed)} failed)", flush=True)
    return {"via": args.via, "starts": done, "reached": len(times), "stuck": stuck, "failed": failed,
            "times": times, "bound": args.bound}


def save_log(s, to: Path) -> None:
    if hasattr(s, "save_log"):
        s.save_log(to)
    else:
        shutil.copy(s.log, to)


def watch(s, i: int, t0: float, bound: float, ranks: int, keep: Path, times: list, stuck: list,
          failed: list) -> str:
    """Wait until start ``i`` reached the first step on all ``ranks``, ended, or passed ``bound`` (stuck: its
    stacks are kept, it is killed); the outcome in a word."""
    while True:
        got = first_steps(s.phases)
        if len(got) == ranks:
            times.append(max(got.values()) - t0)
            if s.finish(120) is None:
                s.kill()
            return f"{times[-1]:.1f}s"
        if s.ended() and len(first_steps(s.phases)) < ranks:
            failed.append(i)
            save_log(s, keep / f"failed-{i}.log")
            return "failed"
        if time.time() - t0 > bound:
            stuck.append(i)
            text = f"start {i}: no first step on rank(s) {sorted(set(range(ranks)) - set(got))} after {bound:g}s\n"
            try:
                text += f"phases:\n{s.phases.read_text()}\n"
            except OSError:
                text += "phases: none\n"
            text += stacks(s.processes())
            if hasattr(s, "stacks"):
                text += "\n" + s.stacks()
            (keep / f"stuck-{i}.txt").write_text(text)
            save_log(s, keep / f"stuck-{i}.log")
            print(f"start {i}: STUCK (stacks in {keep}/stuck-{i}.txt)", flush=True)
            s.kill()
            return "stuck"
        time.sleep(0.2)


def section(r: dict, machine: str) -> str:
    t = sorted(r["times"])
    q = (lambda f: t[min(len(t) - 1, int(f * len(t)))]) if t else (lambda f: float("nan"))
    return (f"{HEADING}\n\n"
            f"Starts that never train (issue 34 item 12): the quickstart started again and again, "
            f"`python bench/starts.py --via {r['via']} --starts N`.\n"
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine}.\n\n"
            f"| via | starts | reached the first step within {r['bound']:g} s | stuck | failed (ended) | "
            f"time to first step: median / p95 / max |\n|---|---|---|---|---|---|\n"
            f"| {r['via']} | {r['starts']} | {r['reached']} | {len(r['stuck'])} | {len(r['failed'])} | "
            f"{statistics.median(t) if t else float('nan'):.1f} / {q(0.95):.1f} / {max(t) if t else float('nan'):.1f} s |\n")


def main() -> int:
    ap = common.parser(__doc__.splitlines()[0], prefix="bsr", subnet=239)
    ap.add_argument("--starts", type=int, default=300)
    ap.add_argument("--via", choices=["torchrun", "local", "podman"], default="torchrun")
    ap.add_argument("--bound", type=float, default=300.0,
                    help="seconds to every rank's first step (default 300: the supervisor's hang verdict)")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop starting new ones after this long (0: never)")
    ap.add_argument("--keep", default="/tmp/clusterctl-starts", help="where stuck starts' stacks and logs go")
    args = ap.parse_args()
    common.exit_on_signals()
    r = run(args)
    print(json.dumps({k: v for k, v in r.items() if k != "times"}), flush=True)
    common.publish(HEADING, section(r, common.machine("other helpers' tests and builds", load=True)),
                   write=not args.no_write)
    return 1 if r["stuck"] else 0


if __name__ == "__main__":
    sys.exit(main())
