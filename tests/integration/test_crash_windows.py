"""The moments between two steps of the supervisor, on the testbed (issue 24 item 1): `clusterctl stop` during a
relaunch backoff and during the start of an attempt must win — the job stays STOPPED, no attempt starts after the
stop, the supervisor exits by itself (no InvalidTransition), and nothing of the job is left on the hosts
(containers started after the stop included). Podman and bare: the runtimes remove a job differently.

The job's script fails at once without importing torch (``jobs/fail.py``), so each attempt ends within a second
and the supervisor spends its time in the backoff (60 s: a stop must not wait for it) or starting the next one."""
from __future__ import annotations

import time
from pathlib import Path

import pytest

from tests.integration import recovery_harness as rh
from tests.integration.test_launch import (assert_nothing_left, cleanup_hosts, clusterctl, write_inventory,
                                           write_job)
from tests.testbed import profile

FAIL = Path(__file__).parent / "jobs" / "fail.py"


def _job(state: Path, name: str):
    with rh.open_store(state) as store:
        return store.find_job(name)


def _wait(pred, timeout: float, what: str, interval: float = 0.05):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = pred()
        if got:
            return got
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g}s waiting for {what}")


def _supervisor_gone(state: Path, name: str, timeout: float) -> float:
    """Seconds until the job's supervisor process has exited."""
    t0 = time.monotonic()
    _wait(lambda: not rh._alive(_job(state, name).supervisor_pid), timeout, "the supervisor to exit", 0.2)
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
            _wait(lambda: any(e.kind == "backoff" for e in store.events(job_id)), 120, "the backoff", 0.2)
        r = clusterctl(state, "stop", name, "--grace", "0", timeout=120)
        assert r.returncode == 0, r.stderr
        assert _supervisor_gone(state, name, 20) < 20
        j = _job(state, name)
        assert j.state.value == "STOPPED" and j.attempt == 1, (j.state, j.attempt, j.reason)
        assert_nothing_left(tb)

        # 2. a stop while the next attempt starts (after `resume`): the start's containers are removed too
        r = clusterctl(state, "resume", name, "--detach", timeout=180)
        assert r.returncode == 0, r.stderr
        _wait(lambda: _job(state, name).attempt >= 2 or _job(state, name).state.value == "STARTING", 120,
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
