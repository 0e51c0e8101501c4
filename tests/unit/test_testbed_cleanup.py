"""Testbed.down stops the supervisors of jobs that target its addresses (and only those)."""
from __future__ import annotations

import json
import subprocess
import sys
import time

from clusterctl.store.state import Store
from tests.testbed import system

FAKE_SUPERVISOR = "import time; time.sleep(60)"


def _fake_supervisor(state_dir, job_id) -> subprocess.Popen:
    # same argv shape as controller.spawn_supervisor: python -c ... --state-dir DIR _supervise JOB_ID
    return subprocess.Popen([sys.executable, "-c", FAKE_SUPERVISOR, "--state-dir", str(state_dir), "_supervise",
                             job_id])


def test_supervisors_using_finds_only_jobs_on_that_subnet(tmp_path):
    mine_dir, other_dir = tmp_path / "a", tmp_path / "b"
    procs = []
    try:
        for d, addr in ((mine_dir, "10.201.0.11"), (other_dir, "10.202.0.11")):
            d.mkdir()
            store = Store(d / "state.db")
            job_id = store.create_job("j", json.dumps({"hosts": [{"name": "node1", "address": addr}]}), None, None)
            store.close()
            procs.append(_fake_supervisor(d, job_id))
        time.sleep(0.3)
        found = system.supervisors_using("10.201.0.")
        assert procs[0].pid in found
        assert procs[1].pid not in found
    finally:
        for p in procs:
            p.kill()
            p.wait()
