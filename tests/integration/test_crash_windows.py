"""The moments between two steps of the supervisor, on the testbed (issue 24 item 1): `clusterctl stop` during a
relaunch backoff and during the start of an attempt must win — the job stays STOPPED, no attempt starts after the
stop, the supervisor exits by itself (no InvalidTransition), and nothing of the job is left on the hosts
(containers started after the stop included). Podman and bare: the runtimes remove a job differently.

The job's script fails at once without importing torch (``jobs/fail.py``), so each attempt ends within a second
and the supervisor spends its time in the backoff (60 s: a stop must not wait for it) or starting the next one."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.integration import recovery_harness as rh
from tests.integration.test_launch import assert_nothing_left, cleanup_hosts, clusterctl, write_inventory, write_job
from tests.testbed import profile

FAIL = Path(__file__).parent / "jobs" / "fail.py"


def _job(state: Path, name: str):
    with rh.open_store(state) as store:
        return store.find_job(name)


def _supervisor_gone(state: Path, name: str, timeout: float) -> float:
    """Seconds until the job's supervisor process has exited."""
    t0 = time.monotonic()
    rh.wait_for(lambda: not rh._alive(_job(state, name).supervisor_pid), timeout, "the supervisor to exit", 0.2)
    return time.monotonic() - t0


@pytest.mark.parametrize("runtime", ["podman", "bare"])
def test_stop_during_a_backoff_and_during_a_start_wins(make_testbed, tmp_path, runtime):
    tb = make_testbed(2, [profile(gpus=0)] * 2)
    name = "tbwin"
    state = tmp_path / "state"
    try:
        inv = write_inventory(tb, tmp_path / "inventory.yaml", runtime)
        job = write_job(tmp_path / "job.yaml", tb, name, runtime, extra={
            "nodes": 2, "nproc_per_node": 1, "script": str(FAIL), "args": [],
            "restarts": {"max_restarts": 0, "max_failures": 10, "backoff_s": 60, "backoff_max_s": 60}})
        r = clusterctl(state, "launch", str(job), "-i", str(inv), "--detach", "--skip-preflight", timeout=180)
        assert r.returncode == 0, r.stderr

        # 1. a stop during the backoff: at once, not after 60 s, and no attempt 2
        with rh.open_store(state) as store:
            job_id = store.find_job(name).job_id
            rh.wait_for(lambda: any(e.kind == "backoff" for e in store.events(job_id)), 120, "the backoff", 0.2)
        r = clusterctl(state, "stop", name, "--grace", "0", timeout=120)
        assert r.returncode == 0, r.stderr
        assert _supervisor_gone(state, name, 20) < 20
        j = _job(state, name)
        assert j.state.value == "STOPPED" and j.attempt == 1, (j.state, j.attempt, j.reason)
        assert_nothing_left(tb)

        # 2. a stop while the next attempt starts (after `resume`): the start's containers are removed too
        r = clusterctl(state, "resume", name, "--detach", timeout=180)
        assert r.returncode == 0, r.stderr
        rh.wait_for(lambda: _job(state, name).attempt >= 2 or _job(state, name).state.value == "STARTING", 120,
              "attempt 2 to start")
        r = clusterctl(state, "stop", name, "--grace", "0", timeout=120)
        assert r.returncode == 0, r.stderr
        _supervisor_gone(state, name, 60)
        j = _job(state, name)
        assert j.state.value == "STOPPED", (j.state, j.reason)
        with rh.open_store(state) as store:
            attempts = store.attempts(j.job_id)
            kinds = [e.kind for e in store.events(j.job_id)]
        assert all(a.ended_at is not None for a in attempts), attempts
        assert attempts[-1].attempt == 2, [a.attempt for a in attempts]     # none started after the stop
        assert kinds[-1] == "end", kinds[-5:]
        assert_nothing_left(tb)
    finally:
        if state.exists() and _job(state, name) is not None:
            clusterctl(state, "stop", name, "--grace", "0", timeout=120)
        cleanup_hosts(tb)


def test_a_bare_runner_that_died_without_its_exit_file_never_gets_its_reused_pid_signalled(make_testbed, tmp_path):
    """The bare runner of node2 is killed with its whole process group (as the OOM killer or clusterctl's own KILL
    would: no ``exit`` file), and its pid file then names an unrelated live process (a reused pid, in a process
    group of its own). The supervisor's relaunch (which cleans up the dead attempt), `status` and `stop` must all
    leave that process alone."""
    tb = make_testbed(2, [profile(gpus=0)] * 2)
    name = "tbpid"
    state = tmp_path / "state"
    victim = None
    try:
        inv = write_inventory(tb, tmp_path / "inventory.yaml", "bare")
        job = write_job(tmp_path / "job.yaml", tb, name, "bare", steps=100000, step_time=0.05,
                        extra={"nodes": "1:2", "nproc_per_node": 1,
                               "restarts": {"max_restarts": 0, "max_failures": 3, "max_node_failures": 3}})
        r = clusterctl(state, "launch", str(job), "-i", str(inv), "--detach", "--skip-preflight", timeout=180)
        assert r.returncode == 0, r.stderr
        j = rh.wait_for(lambda: (x := _job(state, name)) and x.state.value == "RUNNING" and x, 180, "attempt 1", 0.5)
        # both nodes in the world (ci12: on a loaded box node1's rendezvous closed alone, elastic 1:2, before node2's
        # torchrun joined; killed then, node2 took no peer down and nothing relaunched in 120 s)
        def started() -> bool:
            with rh.open_store(state) as store:
                return any("every rank printed" in e.message for e in store.events(j.job_id))
        rh.wait_for(started, 180, "both nodes' ranks to start", 0.5)
        node_dir = tb.home / ".clusterctl" / "nodes" / "node2" / "jobs" / j.job_id / "1"
        runner = int((node_dir / "pid").read_text())
        subprocess.run(["kill", "-KILL", "--", f"-{runner}"], check=False)
        for pid, cmd in tb.processes(tb.hosts[1]):           # the ranks (own sessions) die with it, as on an OOM
            if "train.py" in cmd or "torchrun" in cmd:
                subprocess.run(["kill", "-KILL", str(pid)], check=False)
        victim = subprocess.Popen(["sleep", "600"], start_new_session=True)
        (node_dir / "pid").write_text(f"{victim.pid}\n")
        rh.wait_for(lambda: _job(state, name).attempt >= 2, 120, "the relaunch after node2's runner died", 0.5)
        assert victim.poll() is None, "the relaunch's cleanup signalled the process that reused the runner's pid"
        r = clusterctl(state, "status", name, "--output", "json", timeout=120)
        assert r.returncode == 0, r.stderr
        r = clusterctl(state, "stop", name, "--grace", "0", timeout=120)
        assert r.returncode == 0, r.stderr
        _supervisor_gone(state, name, 60)
        time.sleep(0.5)
        assert victim.poll() is None, "`stop` signalled the process that reused the runner's pid"
    finally:
        if victim is not None:
            victim.kill()
            victim.wait()
        if state.exists() and _job(state, name) is not None:
            clusterctl(state, "stop", name, "--grace", "0", timeout=120)
        cleanup_hosts(tb)


def test_a_state_dir_filled_by_a_chatty_job_never_kills_the_supervisor_silently(tmp_path):
    """The embedded default (this machine, bare) with its state dir on a 3 MiB tmpfs and a job that prints ~13 MB:
    the log copy cannot be written for most of it. The supervisor must not die silently: it keeps supervising
    (the job ends SUCCEEDED, its supervisor exits) and its log says the copy could not be written."""
    mnt = tmp_path / "small"
    mnt.mkdir()
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=3m", "tmpfs", str(mnt)], capture_output=True, text=True)
    assert r.returncode == 0, f"cannot mount a tmpfs for the test: {r.stderr}"
    state = mnt / "state"
    try:
        job = tmp_path / "job.yaml"
        job.write_text(f"name: chatty\nnodes: 1\nnproc_per_node: 1\nscript: {FAIL.parent / 'chatty.py'}\n"
                       f"args: ['60000']\nrestarts: {{max_restarts: 0, max_failures: 0}}\n"
                       f"supervisor: {{probe_interval_s: 1}}\n")
        env = {"PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}"}
        r = clusterctl(state, "launch", str(job), "--detach", env=env, cwd=tmp_path, timeout=180)
        assert r.returncode == 0, r.stderr
        rh.wait_for(lambda: (j := _job(state, "chatty")) and j.terminal and not rh._alive(j.supervisor_pid), 240,
              "the job to end and its supervisor to exit", 0.5)
        j = _job(state, "chatty")
        assert j.state.value in ("SUCCEEDED", "FAILED"), j.state
        log = (state / "jobs" / j.job_id / "supervisor.log").read_text(errors="replace")
        assert "cannot write the log copy" in log or "cannot write the state database" in log, log[-2000:]
        if j.state.value == "FAILED":       # ended loudly: the reason says why
            assert "supervisor failed" in (j.reason or ""), j.reason
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def test_a_supervisor_killed_right_after_success_never_lets_resume_rerun_the_job(make_testbed, tmp_path):
    """The supervisor is SIGKILLed the moment its attempt is recorded `succeeded` (before, the containers were
    removed first and the job's end written after: a kill in between left an active job whose `resume` relaunched
    a finished run). `status` and `resume` must call it SUCCEEDED and start nothing."""
    import signal

    tb = make_testbed(2, [profile(gpus=0)] * 2)
    name = "tbok"
    state = tmp_path / "state"
    try:
        inv = write_inventory(tb, tmp_path / "inventory.yaml", "podman")
        job = write_job(tmp_path / "job.yaml", tb, name, "podman", extra={
            "nodes": 2, "nproc_per_node": 1, "script": str(FAIL.parent / "ok.py"), "args": [],
            "recovery": "cold"})
        r = clusterctl(state, "launch", str(job), "-i", str(inv), "--detach", "--skip-preflight", timeout=180)
        assert r.returncode == 0, r.stderr
        with rh.open_store(state) as store:
            job_id = store.find_job(name).job_id
            pid = rh.wait_for(lambda: store.get_job(job_id).supervisor_pid, 60, "the supervisor's claim")
            rh.wait_for(lambda: any(a.result == "succeeded" for a in store.attempts(job_id)), 180,
                  "the attempt to be recorded succeeded", 0.01)
        os.kill(pid, signal.SIGKILL)
        r = clusterctl(state, "resume", name, "--detach", "-o", "json", timeout=180)
        assert r.returncode == 0, r.stderr
        with rh.open_store(state) as store:
            j = store.get_job(job_id)
            assert j.state.value == "SUCCEEDED", (j.state, j.reason)
            assert [a.attempt for a in store.attempts(job_id)] == [1]        # nothing relaunched
        assert json.loads(r.stdout)["outcome"] == "succeeded", r.stdout
    finally:
        if state.exists() and _job(state, name) is not None:
            clusterctl(state, "stop", name, "--grace", "0", timeout=120)
        cleanup_hosts(tb)
