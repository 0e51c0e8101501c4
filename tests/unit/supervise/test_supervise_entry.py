"""The supervisor's entry point (issue 25): ``python -m clusterctl.supervise`` is what ``spawn_supervisor`` starts;
``clusterctl _supervise JOB_ID`` (the release before) still runs the same body, and both command lines count as a
job's supervisor for liveness, ``resume`` and the testbed's cleanup."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl.supervise import controller


def _sleeper(*argv: str) -> subprocess.Popen:
    p = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", *argv])
    deadline = time.monotonic() + 10
    while argv[0].encode() not in Path(f"/proc/{p.pid}/cmdline").read_bytes() and time.monotonic() < deadline:
        time.sleep(0.02)
    return p


@pytest.mark.skipif(not Path("/proc/self/cmdline").exists(), reason="reads /proc")
@pytest.mark.parametrize("argv", [("clusterctl.supervise", "--state-dir", "/x", "job-1"),
                                  ("--state-dir", "/x", "_supervise", "job-1", "--adopt")])
def test_both_command_lines_are_a_supervisor(argv):
    p = _sleeper(*argv)
    try:
        assert controller._is_supervisor(p.pid, "job-1")
        assert not controller._is_supervisor(p.pid, "job-2")
    finally:
        p.kill()
        p.wait()


def test_another_process_is_not_a_supervisor():
    p = _sleeper("clusterctl.cli", "status", "job-1")
    try:
        assert not controller._is_supervisor(p.pid, "job-1")
    finally:
        p.kill()
        p.wait()


def test_both_entry_points_fail_alike(tmp_path):
    """No state DB: the same one-line error and exit code from the new entry point and the old command line."""
    new = subprocess.run([sys.executable, "-m", "clusterctl.supervise", "--state-dir", str(tmp_path), "job-1"],
                         capture_output=True, text=True, timeout=60)
    old = subprocess.run([sys.executable, "-m", "clusterctl.cli", "--state-dir", str(tmp_path), "_supervise",
                          "job-1"], capture_output=True, text=True, timeout=60)
    assert new.returncode == old.returncode != 0
    assert new.stderr.strip() == old.stderr.strip() != ""
    assert "Traceback" not in new.stderr


def test_testbed_cleanup_finds_a_supervisor_started_either_way(tmp_path):
    """tests/testbed/system.supervisors_using reads the job id after `clusterctl.supervise --state-dir DIR`
    as after `_supervise`."""
    import json

    from clusterctl.store.state import Store
    from tests.testbed import system

    store = Store(tmp_path / "state.db")
    job_id = store.create_job("j", json.dumps({"hosts": [{"name": "node1", "address": "10.203.0.11"}]}), None, None)
    store.close()
    procs = [_sleeper("clusterctl.supervise", "--state-dir", str(tmp_path), job_id),
             _sleeper("--state-dir", str(tmp_path), "_supervise", job_id, "--adopt")]
    try:
        found = system.supervisors_using("10.203.0.")
        assert {p.pid for p in procs} <= set(found)
        assert not set(system.supervisors_using("10.204.0.")) & {p.pid for p in procs}
    finally:
        for p in procs:
            p.kill()
            p.wait()
