"""Shared by tests/integration/test_recovery.py and bench/recovery.py: a quickstart job on a testbed, run
through the real `clusterctl` CLI (subprocesses, own state dir), plus the checks every fault run ends with."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "quickstart" / "train.py"
CLUSTERCTL = [sys.executable, "-m", "clusterctl.cli"]
JOB_PATTERN = r"torchrun|train\.py|catatonit|conmon"   # the job's processes in a host's netns (not sshd)


def job_yaml(path: Path, shared: Path, *, name: str, steps: int = 150, every: int = 10, step_time: float = 0.1,
             extra_args: list[str] | None = None, restarts: dict | None = None, supervisor: dict | None = None,
             nodes: str = "2:3", nproc: int = 1, mounts: list[str] | None = None, script: Path = TRAIN,
             recovery: str | None = None, torchrun: str | None = None) -> Path:
    spec = {
        "name": name, "nodes": nodes, "nproc_per_node": nproc, "script": str(script),
        "args": ["--steps", str(steps), "--checkpoint-every", str(every), "--step-time", str(step_time),
                 "--record", str(shared / "steps.jsonl"), "--log-every", "5", *(extra_args or [])],
        "checkpoint": {"dir": str(shared / "ckpt")},
        "rendezvous": {"port": 29400, "join_timeout": 60, "last_call_timeout": 2},
        "restarts": {"max_restarts": 0, **(restarts or {})},
        "supervisor": {"probe_interval_s": 1, **(supervisor or {})},
        "container": {"ulimits": {}},
    }
    if mounts:
        spec["mounts"] = list(mounts)
    if recovery:
        spec["recovery"] = recovery
    if torchrun:
        spec["torchrun"] = torchrun
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


@dataclass
class Run:
    """One job launched with the CLI on a testbed."""
    tb: object
    state_dir: Path
    inventory: Path
    job: Path
    name: str
    steps: int
    record: Path
    log: list[str] = field(default_factory=list)
    runtime: str = "podman"

    def cli(self, *args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
        env = dict(os.environ, CLUSTERCTL_STATE_DIR=str(self.state_dir))
        p = subprocess.run([*CLUSTERCTL, "--state-dir", str(self.state_dir), *args], capture_output=True,
                           text=True, timeout=timeout, env=env, cwd=str(REPO), stdin=subprocess.DEVNULL)
        self.log.append(f"$ clusterctl {' '.join(args)} -> {p.returncode}\n{p.stdout[-3000:]}{p.stderr[-3000:]}")
        if check and p.returncode != 0:
            raise AssertionError(f"clusterctl {' '.join(args)} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
        return p

    def launch(self) -> None:
        self.cli("launch", str(self.job), "-i", str(self.inventory), "--detach", "--skip-preflight", timeout=60)

    def status(self) -> dict:
        return json.loads(self.cli("status", self.name, "-o", "json", timeout=30).stdout)

    def events(self) -> list[dict]:
        return json.loads(self.cli("events", self.name, "-o", "json", timeout=30).stdout)

    def events_text(self) -> str:
        return self.cli("events", self.name, timeout=30, check=False).stdout

    def steps_log(self) -> list[dict]:
        if not self.record.exists():
            return []
        out = []
        for line in self.record.read_text().splitlines():
            try:
                out.append(json.loads(line))
            except ValueError:
                pass    # a line cut by a SIGKILL mid-write
        return out

    def max_step(self) -> int:
        return max((r["step"] for r in self.steps_log()), default=0)

    def wait_step(self, step: int, timeout: float = 360) -> float:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if self.max_step() >= step:
                return time.time()
            job = self.job_row()       # not `clusterctl status`: a CLI process per look takes seconds on a busy
            if job is not None and job.terminal:   # box, and the job trains past the step meanwhile
                raise AssertionError(f"job ended ({job.state.value}: {job.reason}) before step {step}\n"
                                     + self.events_text())
            time.sleep(0.2)
        raise AssertionError(f"step {step} not reached in {timeout}s (at {self.max_step()})\n" + self.events_text())

    def wait_attempt(self, attempt: int, timeout: float = 60) -> dict:
        """Until ``attempt`` runs; then what `clusterctl status` says. The waiting reads the state DB: a CLI
        process per look costs ~0.8 s of CPU, and torch's start-up on the testbed needs the cores."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            job = self.job_row()
            if job is not None and job.attempt >= attempt and job.state.value == "RUNNING":
                st = self.status()
                if st["attempt"] >= attempt and st["state"].lower() == "running":
                    return st
            time.sleep(0.5)
        raise AssertionError(f"attempt {attempt} not running after {timeout}s\n" + self.events_text())

    def wait_end(self, timeout: float = 480) -> dict:
        """Until the job is terminal and its supervisor gone; then what `clusterctl status` says. Read from the state
        DB while a supervisor lives (see wait_attempt); without one, `status` itself (it reconciles)."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            job = self.job_row()
            if job is None or job.terminal or not _alive(job.supervisor_pid):
                st = self.status()
                if st["state"].lower() in ("failed", "stopped", "succeeded") and not _alive(st.get("supervisor_pid")):
                    return st
            time.sleep(0.5)
        raise AssertionError(f"job not finished after {timeout}s: {self.status()}\n" + self.events_text())

    def supervisor_pid(self) -> int:
        return int(self.job_row().supervisor_pid)

    def store(self):
        return open_store(self.state_dir)

    def job_row(self):
        return job_row(self.state_dir, self.name)

    def current_attempt(self):
        with self.store() as store:
            return store.attempts(store.get_job(self.name).job_id)[-1]


def _alive(pid) -> bool:
    if not pid:
        return False
    try:
        os.kill(int(pid), 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:   # a zombie (our own child) is not alive
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


def open_store(state_dir: Path):
    """A state dir's DB, opened directly: no CLI process, so a look is fast even on a loaded box and the test acts
    on what it saw right away."""
    from clusterctl.store import paths
    from clusterctl.store.state import Store

    return Store(paths.db_path(state_dir))


def job_row(state_dir: Path, name: str):
    """The job's row in the state DB (None before the launch has written it)."""
    with open_store(state_dir) as store:
        return store.find_job(name)


def wait_for(pred, timeout: float, what: str, interval: float = 0.05, run: Run | None = None):
    """``pred()``'s first true value within ``timeout`` s, polled every ``interval`` s; else an AssertionError
    naming ``what`` (with ``run``'s events, when given)."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}"
                         + (f"\n{run.events_text()}" if run else ""))


def stop_unless_done(run: Run) -> None:
    """A test's teardown: `clusterctl stop` unless the job ended by itself (succeeded or stopped, its supervisor
    gone), so that no supervisor outlives the testbed. `stop` connects to every node (~2 s of CPU): a finished job
    that the test has already checked needs none."""
    if not run.state_dir.exists():      # never launched: nothing to stop (and no error to hide the test's own)
        return
    job = run.job_row()
    if job is None:
        return
    if job.terminal and job.state.value in ("SUCCEEDED", "STOPPED") and not _alive(job.supervisor_pid):
        return
    run.cli("stop", run.name, "--grace", "0", check=False, timeout=120)


def new_run(tb, tmp: Path, name: str, runtime: str = "podman", **job_kw) -> Run:
    """``runtime``: podman, or docker on a testbed built with ``docker=True`` (the job then mounts what podman's
    containers.conf gives every container: ``tb.job_mounts``)."""
    tmp.mkdir(parents=True, exist_ok=True)
    shared = Path(tb.shared) / name
    shared.mkdir(parents=True, exist_ok=True)
    inv = tb.inventory(tmp / "inventory.yaml", runtime=runtime)
    if runtime == "bare":       # the hosts' PATH (sshd SetEnv) has no venv: torchrun by its path
        job_kw.setdefault("torchrun", str(Path(sys.prefix) / "bin" / "torchrun"))
    job = job_yaml(tmp / "job.yaml", shared, name=name, mounts=tb.job_mounts(runtime), **job_kw)
    steps = job_kw.get("steps", 150)
    return Run(tb, tmp / "state", inv, job, name, steps, shared / "steps.jsonl", runtime=runtime)


def wait_zygotes(run: Run, timeout: float = 90) -> None:
    """Every node of the job's attempt has a zygote (warm recovery) that imported torch: its socket is in the
    node's warm dir (the testbed's hosts share this machine's /tmp, or the TMPDIR their sshd sets)."""
    import glob

    from clusterctl.launch.runtimes import warm_job_key, warm_root

    root = warm_root(tmpdir=run.tb.hosts[0].env.get("TMPDIR", "/tmp"))
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        with run.store() as store:
            attempts = store.attempts(store.get_job(run.name).job_id)
        socks = glob.glob(f"{root}/{warm_job_key(run.job_row().job_id)}-*/s/z.sock")
        if attempts and len(socks) >= len(attempts[-1].nodes):
            return
        time.sleep(0.5)
    raise AssertionError("the zygotes did not come up\n" + run.events_text())


def check_steps(run: Run, resumed_steps: list[int] | None = None) -> dict:
    """Final step reached, every step trained at least once, no step after a resume point skipped: each attempt
    starts right after the checkpoint it resumed from and trains consecutive steps."""
    recs = run.steps_log()
    steps = [r["step"] for r in recs]
    assert steps, "no step recorded"
    assert max(steps) == run.steps, f"final step {run.steps} not reached (max {max(steps)})"
    missing = set(range(1, run.steps + 1)) - set(steps)
    assert not missing, f"steps never trained: {sorted(missing)[:20]}"
    # within each attempt (record's "attempt" field), steps are consecutive: nothing skipped after the resume
    by_attempt: dict[str, list[int]] = {}
    for r in recs:
        by_attempt.setdefault(r["attempt"], []).append(r["step"])
    for a, ss in by_attempt.items():
        assert ss == list(range(ss[0], ss[0] + len(ss))), f"attempt {a}: steps not consecutive: {ss}"
    starts = {a: ss[0] - 1 for a, ss in by_attempt.items()}     # the step each attempt resumed from
    if resumed_steps is not None:
        assert sorted(starts.values()) == sorted(resumed_steps), f"resume points {starts} != {resumed_steps}"
    return {"attempts": starts, "trained_twice": len(steps) - len(set(steps))}


def check_clean(run: Run, timeout: float = 30) -> None:
    """No container and no process of the job left on any host."""
    from clusterctl.launch.runtimes import warm_job_key

    jk = warm_job_key(run.job_row().job_id)
    end = time.monotonic() + timeout
    left: dict = {}
    while time.monotonic() < end:
        left = {}
        for h in run.tb.hosts:
            names = [] if run.runtime == "bare" else \
                [n for n in run.tb.container_names(h, run.runtime, "label=clusterctl.job_id") if run.name in n]
            # a rank, or a zygote and what it forked (their command line names the warm dir: the job's warm key)
            procs = [c for _, c in run.tb.processes(h)
                     if (str(TRAIN) in c and run.name in c) or ("/zygote.py " in c and jk in c)]
            if names or procs:
                left[h.name] = (names, procs)
        if not left:
            return
        time.sleep(1)
    raise AssertionError(f"left behind: {left}")


def rank_pids(tb, host) -> list[int]:
    """The training ranks on a host: train.py processes whose parent is torchrun (the quickstart's DataLoader
    worker processes have the same command line, but a rank as their parent)."""
    procs = dict(tb.processes(host))
    out = []
    for pid, cmd in sorted(procs.items()):
        if str(TRAIN.name) not in cmd or "torchrun" in cmd:
            continue
        try:
            ppid = int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, ValueError, IndexError):
            continue
        if "torchrun" in procs.get(ppid, ""):
            out.append(pid)
    return out


def rdzv_host(run: Run) -> str:
    return run.current_attempt().rdzv_host


def other_host(run: Run) -> str:
    att = run.current_attempt()
    return next(n for n in att.nodes if n != att.rdzv_host)


def cpu_testbed(n: int, base: Path, prefix: str, octets, docker: bool = False) -> "object":
    """An ``n``-host CPU testbed (``profile(gpus=0)``) on the first free 10.<octet>.0.0/24 of ``octets``, up (with
    a dockerd per host when ``docker``); the test fails (never skips) with the reason when it cannot be built. The
    caller calls ``down()``."""
    import pytest

    from tests.testbed import Testbed, profile
    from tests.testbed.system import claim_octet

    octet = claim_octet(octets)
    if octet is None:
        pytest.fail(f"no free 10.x.0.0/24 subnet among {list(octets)} for testbed {prefix}", pytrace=False)
    tb = Testbed(n, base, [profile(gpus=0)] * n, prefix=prefix, subnet_octet=octet, docker=docker)
    try:
        tb.up()
    except Exception as e:  # noqa: BLE001 - a failure with the reason, never a skip
        pytest.fail(f"testbed could not be built: {type(e).__name__}: {e}", pytrace=False)
    return tb
