"""Starts that never train (issue 34 item 12): start the quickstart (examples/quickstart, 2 ranks, 2 DataLoader
workers each) again and again, and count the starts whose every rank made its first step within a bound. A start
that did not is *stuck*: the stacks of all its processes (the torchrun agent, the ranks, their DataLoader workers;
py-spy, Python and native frames) are kept under --keep, and it is killed.

    python bench/starts.py [--starts 300] [--via torchrun|local|podman] [--parallel K] [--bound 300]
                           [--max-minutes M] [--keep DIR] [--no-write] [--prefix bsr --subnet 239]

- ``--via torchrun``: ``torchrun --standalone --nproc-per-node 2 train.py`` started here, the cheapest start;
  ``--via local``: ``clusterctl launch`` of the quickstart with the embedded default inventory (this machine, bare
  runtime; a state dir of its own), what a user's first attempt is; ``--via podman``: ``clusterctl launch`` on a
  2-host testbed of its own (podman, 2 ranks per node, a checkpoint dir as in the recovery benches, cold), where
  the hang was seen.
- Each start trains 2 steps and reports its phases (train.py ``--phases``): reached = every rank's ``first_step``
  within ``--bound`` seconds of the start. A start that ended before (a failure, not a hang) is counted apart,
  with its output kept.
- ``--parallel K`` keeps K starts in flight at once (default 1): each is still a launch of a job of its own (its
  own state dir, job name and rendezvous port, from a pool that never hands out one in flight; podman: K jobs on the
  same 2 hosts), so the bench does 300 starts in an hour on a small machine. A start that reached its first step
  on every rank is left FINISH (120) s to end; one that did not is killed and counted apart (``unfinished``). The
  load average is sampled every 10 s (median and max in the result).
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


def cpu_s(pid: int) -> float | None:
    """User + system CPU seconds of ``pid`` so far (None when it is gone)."""
    try:
        fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def stacks(pids: list[int]) -> str:
    """Each process's stacks, then the CPU seconds each used while they were taken: a start whose ranks still
    advance is starved (slow), one whose ranks all stand still is deadlocked."""
    out, before, t0 = [], {pid: cpu_s(pid) for pid in pids}, time.monotonic()
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
    out.append(f"===== CPU seconds of each process over the {time.monotonic() - t0:.0f} s the stacks took")
    out += [f"pid {pid}: {before[pid]} -> {cpu_s(pid)}" for pid in pids]
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

    def __init__(self, work: Path, i: int, port: int):
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

    def __init__(self, work: Path, i: int, port: int):
        self.phases, self.log = work / f"phases-{i}.jsonl", work / f"out-{i}.log"
        self.state, self.name = work / f"state-{i}", f"starts{i}"
        job = work / f"job-{i}.yaml"
        job.write_text(
            f"name: {self.name}\nnodes: 1\nnproc_per_node: 2\nscript: {QUICKSTART / 'train.py'}\n"
            f"args: ['--steps', '2', '--checkpoint-every', '0', '--phases', '{self.phases}']\n"
            f"env: {{OMP_NUM_THREADS: '1'}}\nrendezvous: {{port: {port}, join_timeout: 60, "
            f"last_call_timeout: 1}}\nrestarts: {{max_restarts: 0, max_failures: 0}}\n"
            f"supervisor: {{probe_interval_s: 1}}\n")
        # PYTHONPATH: this checkout's clusterctl, not the editable install's (another tree, which may change
        # under a run: one start of a run here imported a module of /work/main from before a merge, one after)
        env = {**os.environ, "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}", "CLUSTERCTL_STATE_DIR": str(self.state),
               "PYTHONPATH": str(common.ROOT)}
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
    """One start: ``clusterctl launch`` on the testbed (2 hosts, podman, 2 ranks each, cold); starts in flight at
    once are jobs of their own on the same 2 hosts, each with its own rendezvous port."""

    def __init__(self, work: Path, i: int, port: int, tb):
        import yaml

        from tests.integration import recovery_harness as rh

        self.tb, self.name = tb, f"starts{i}"
        shared = Path(tb.shared) / self.name
        self.phases = shared / "phases.jsonl"
        self.run = rh.new_run(tb, work / self.name, self.name, runtime="podman", steps=2, every=1000, step_time=0,
                              nodes="2", nproc=2, extra_args=["--phases", str(self.phases)], recovery="cold",
                              restarts={"max_failures": 0})
        spec = yaml.safe_load(self.run.job.read_text())
        spec["rendezvous"]["port"] = port
        self.run.job.write_text(yaml.safe_dump(spec, sort_keys=False))
        self.log = work / self.name / "cli.log"
        self.run.launch()

    def ended(self) -> bool:
        """Terminal and its supervisor gone (none may outlive the testbed)."""
        from tests.integration.recovery_harness import _alive

        job = self.run.job_row()
        return job is not None and job.terminal and not _alive(job.supervisor_pid)

    def processes(self) -> list[int]:
        job = self.run.job_row()
        mine = with_env(f"CLUSTERCTL_JOB_ID={job.job_id}") if job is not None else []
        return mine or [pid for h in self.tb.hosts for pid, cmd in self.tb.processes(h) if "train.py" in cmd]

    def stacks(self) -> str:
        r = self.run.cli("stacks", self.name, check=False, timeout=180)
        return f"$ clusterctl stacks {self.name}  (exit {r.returncode})\n{r.stdout}{r.stderr}"

    def kill(self) -> None:
        self.run.cli("stop", self.name, "--grace", "0", check=False, timeout=180)
        end = time.monotonic() + 120
        while not self.ended() and time.monotonic() < end:
            time.sleep(0.5)

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
        def start(i: int, port: int):
            if tb is not None:
                return Podman(work, i, port, tb)
            return {"torchrun": Torchrun, "local": Local}[args.via](work, i, port)
        return starts(args, start, keep)
    finally:
        if tb is not None:
            tb.down()


class Ports:
    """Rendezvous ports for the starts in flight: never one a start in flight holds, and the one given back longest
    ago first (a killed start's port may linger a while)."""

    def __init__(self, base: int, n: int):
        self.free = list(range(base, base + n))

    def take(self) -> int:
        return self.free.pop(0)

    def give(self, port: int) -> None:
        self.free.append(port)


class Flight:
    """One start in flight: its number, the start, when it began, its port; ``reached``: its time to the first step
    on every rank once it has it (it is then left to end, within FINISH s)."""

    def __init__(self, i: int, s, t0: float, port: int):
        self.i, self.s, self.t0, self.port = i, s, t0, port
        self.reached: float | None = None
        self.deadline = 0.0


FINISH = 120.0      # seconds a start that reached its first step has to end by itself (2 steps) before it is killed


def starts(args, start, keep: Path, poll: float = 0.5) -> dict:
    """Run ``args.starts`` starts, ``args.parallel`` of them in flight at once (``start(i, port)`` begins one),
    until done or ``args.max_minutes`` passed (no new one then; those in flight are seen to their end)."""
    r = {"via": args.via, "parallel": args.parallel, "starts": 0, "reached": 0, "stuck": [], "failed": [],
         "unfinished": [], "times": [], "bound": args.bound, "loads": []}
    t_end = time.monotonic() + args.max_minutes * 60 if args.max_minutes else None
    ports, flying, i, next_load = Ports(args.port_base, 50), [], 0, 0.0
    try:
        while True:
            while (len(flying) < args.parallel and i < args.starts
                   and (t_end is None or time.monotonic() < t_end)):
                port, t0 = ports.take(), time.time()
                try:
                    flying.append(Flight(i, start(i, port), t0, port))
                except Exception as e:      # its launch failed: a failed start, not one that hangs
                    r["failed"].append(i)
                    (keep / f"failed-{i}.log").write_text(f"the start did not begin: {e!r}\n")
                    ports.give(port)
                    r["starts"] += 1
                i += 1
            if not flying:
                break
            for f in list(flying):
                outcome = step(f, args.bound, RANKS[args.via], keep, r)
                if outcome is None:
                    continue
                flying.remove(f)
                ports.give(f.port)
                r["starts"] += 1
                if hasattr(f.s, "state"):
                    shutil.rmtree(f.s.state, ignore_errors=True)
                print(f"start {f.i}: {outcome} ({r['starts']} done: {len(r['stuck'])} stuck, "
                      f"{len(r['failed'])} failed, {len(flying)} in flight)", flush=True)
            if time.monotonic() >= next_load:
                r["loads"].append(os.getloadavg()[0])
                next_load = time.monotonic() + 10
            time.sleep(poll)
    except BaseException:
        for f in flying:              # SIGTERM/^C: nothing of the starts in flight is left behind
            f.s.kill()
        raise
    r["reached"] = len(r["times"])
    r["within"] = sum(t <= args.bound for t in r["times"])     # a start looked at late may have reached after it
    return r


def save_log(s, to: Path) -> None:
    if hasattr(s, "save_log"):
        s.save_log(to)
    else:
        shutil.copy(s.log, to)


def step(f: Flight, bound: float, ranks: int, keep: Path, r: dict) -> str | None:
    """One look at start ``f``: None while it goes on; else its outcome in a word, counted in ``r``. Reached: the
    first step on all ``ranks`` (then it is given FINISH s to end); failed: it ended before (its log kept); stuck:
    ``bound`` s passed first (its stacks kept, it is killed)."""
    s, i = f.s, f.i
    if f.reached is None:
        got = first_steps(s.phases)
        if len(got) == ranks:
            f.reached = max(got.values()) - f.t0
            f.deadline = time.time() + FINISH
            r["times"].append(f.reached)
        elif s.ended() and len(first_steps(s.phases)) < ranks:
            r["failed"].append(i)
            save_log(s, keep / f"failed-{i}.log")
            return "failed"
        elif time.time() - f.t0 > bound:
            r["stuck"].append(i)
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
        else:
            return None
    if s.ended():
        return f"{f.reached:.1f}s"
    if time.time() > f.deadline:
        r["unfinished"].append(i)
        save_log(s, keep / f"unfinished-{i}.log")
        s.kill()
        return f"{f.reached:.1f}s, did not end within {FINISH:g}s: killed"
    return None


def quantiles(xs: list[float]) -> tuple[float, float, float]:
    """Median, p95 (nearest rank) and max; NaN for none."""
    if not xs:
        return (float("nan"),) * 3
    t = sorted(xs)
    return statistics.median(t), t[min(len(t) - 1, int(0.95 * len(t)))], t[-1]


def section(r: dict, machine: str) -> str:
    med, p95, top = quantiles(r["times"])
    lmed, _, lmax = quantiles(r["loads"])
    return (f"{HEADING}\n\n"
            f"Starts that never train (issue 34 item 12): the quickstart started again and again, "
            f"`python bench/starts.py --via {r['via']} --parallel {r['parallel']} --starts N`.\n"
            f"Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on {machine}.\n\n"
            f"| via | in flight | starts | reached the first step within {r['bound']:g} s | stuck | failed (ended) | "
            f"time to first step: median / p95 / max | load average: median / max |\n"
            f"|---|---|---|---|---|---|---|---|\n"
            f"| {r['via']} | {r['parallel']} | {r['starts']} | {r['within']} | {len(r['stuck'])} | "
            f"{len(r['failed'])} | {med:.1f} / {p95:.1f} / {top:.1f} s | {lmed:.1f} / {lmax:.1f} |\n")


def main() -> int:
    ap = common.parser(__doc__.splitlines()[0], prefix="bsr", subnet=239)
    ap.add_argument("--starts", type=int, default=300)
    ap.add_argument("--via", choices=["torchrun", "local", "podman"], default="torchrun")
    ap.add_argument("--parallel", type=int, default=1, help="starts in flight at once (default 1)")
    ap.add_argument("--port-base", type=int, default=None,
                    help="first of 50 rendezvous ports (default 29600 local, 29400 podman)")
    ap.add_argument("--bound", type=float, default=300.0,
                    help="seconds to every rank's first step (default 300: the supervisor's hang verdict)")
    ap.add_argument("--max-minutes", type=float, default=0, help="stop starting new ones after this long (0: never)")
    ap.add_argument("--keep", default="/tmp/clusterctl-starts", help="where stuck starts' stacks and logs go")
    args = ap.parse_args()
    if args.port_base is None:
        args.port_base = 29400 if args.via == "podman" else 29600
    if not 1 <= args.parallel <= 50:
        ap.error("--parallel: 1 to 50")
    common.exit_on_signals()
    r = run(args)
    med, p95, top = quantiles(r["times"])
    lmed, _, lmax = quantiles(r["loads"])
    print(json.dumps({**{k: v for k, v in r.items() if k not in ("times", "loads")},
                      "first_step_s": {"median": med, "p95": p95, "max": top},
                      "load": {"median": lmed, "max": lmax, "min": min(r["loads"], default=float("nan"))}}),
          flush=True)
    common.publish(HEADING, section(r, common.machine("other helpers' tests and builds", load=True)),
                   write=not args.no_write)
    return 1 if r["stuck"] else 0


if __name__ == "__main__":
    sys.exit(main())
