"""`clusterctl top JOB` (issue 37): reads the rank view the job's live supervisor writes (ranks.json), prints
`{"ranks": [...]}` with --once --output json, the table otherwise; an unknown job is exit 2, a job that is not
running or has no supervisor exit 1 with what to run instead."""
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from clusterctl.model.ranks import RankView
from clusterctl.store import paths
from clusterctl.store.ledger import Ledger
from clusterctl.store.state import JobState, Store
from clusterctl.supervise import jobdir
from clusterctl.supervise.ranklook import RankWatch

REPO = Path(__file__).resolve().parents[3]
AR = {"pg": "0", "seq": 7, "op": "all_reduce", "for_s": 12.0}


def cli(tmp_path, *args):
    e = {**os.environ, "CLUSTERCTL_STATE_DIR": str(tmp_path / "state"), "COLUMNS": "160", "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "clusterctl.cli", *args], capture_output=True, text=True, env=e,
                          cwd=tmp_path, timeout=60, stdin=subprocess.DEVNULL)


@pytest.fixture
def running(tmp_path):
    """A RUNNING job whose supervisor (a process whose command line is a supervisor's) beats, and its view."""
    root = paths.ensure_state_dir(tmp_path / "state")
    store = Store(paths.db_path(root))
    ledger = Ledger(store)
    job_id = ledger.job_recorded("demo", json.dumps({"spec": {"name": "demo", "script": "t.py"}, "hosts": []}),
                                 None, None)
    ledger.attempt_started(job_id, 1, "n1", ["n1", "n2"], None, "attempt 1")
    ledger.attempt_running(job_id, 1)
    sup = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "clusterctl.supervise", job_id])
    beating = threading.Event()

    def beat():       # as the real supervisor does: a CLI call on a loaded box takes seconds
        while not beating.wait(1.0):
            ledger.supervisor_beat(job_id, sup.pid)

    try:
        assert ledger.supervisor_claimed(job_id, sup.pid)
        ledger.supervisor_beat(job_id, sup.pid)
        t = threading.Thread(target=beat, daemon=True)
        t.start()
        yield root, store, job_id
    finally:
        beating.set()
        t.join()
        sup.kill()
        sup.wait()
        store.close()


def write_view(root, job_id, attempt=1):
    views = {"n1": {0: RankView.from_json({"rank": 0, "step": 12, "step_age_s": 13.0, "coll_age_s": 12.0,
                                           "state": "waiting", "in": AR, "cpu_s": 3.0, "rss": 1 << 30}, node="n1")},
             "n2": {1: RankView.from_json({"rank": 1, "step": 12, "step_age_s": 13.0, "coll_age_s": 13.0,
                                           "state": "still", "where": "train.py:55 <module>"}, node="n2")}}
    w = RankWatch(20)
    doc = w.document(w.look(views, now=1.0), job_id=job_id, attempt=attempt, wall=time.time())
    jobdir.write_ranks(paths.ensure_job_dir(root, job_id), doc)


def test_once_json_prints_every_rank_with_the_promised_keys(tmp_path, running):
    root, _, job_id = running
    write_view(root, job_id)
    r = cli(tmp_path, "top", "demo", "--once", "--output", "json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert list(doc) == ["ranks"]
    assert [(x["node"], x["rank"], x["step"], x["state"]) for x in doc["ranks"]] == [("n1", 0, 12, "waiting"),
                                                                                 ("n2", 1, 12, "stuck")]
    for x in doc["ranks"]:
        assert {"node", "rank", "step", "step_time_s", "state", "cpu_pct", "rss_bytes", "waiting_s"} <= set(x)
    assert doc["ranks"][0]["waiting_s"] == 12.0 and doc["ranks"][0]["rss_bytes"] == 1 << 30


def test_once_table_names_the_stuck_rank(tmp_path, running):
    root, _, job_id = running
    write_view(root, job_id)
    r = cli(tmp_path, "top", "demo", "--once")
    assert r.returncode == 0, r.stderr
    assert "stuck" in r.stdout and "STUCK: node n2 rank 1 stuck in train.py:55 <module>" in r.stdout
    assert "all_reduce #7" in r.stdout


def test_no_view_yet_or_an_earlier_attempts_is_an_empty_list(tmp_path, running):
    root, _, job_id = running
    assert json.loads(cli(tmp_path, "top", "demo", "--once", "-o", "json").stdout) == {"ranks": []}
    write_view(root, job_id, attempt=0)
    assert json.loads(cli(tmp_path, "top", "demo", "--once", "-o", "json").stdout) == {"ranks": []}
    assert "no rank view yet" in cli(tmp_path, "top", "demo", "--once").stdout


def test_unknown_job_is_exit_2_and_an_ended_or_unsupervised_one_exit_1(tmp_path):
    root = paths.ensure_state_dir(tmp_path / "state")
    r = cli(tmp_path, "top", "nosuch", "--once")
    assert r.returncode == 2 and "no job with id or name 'nosuch'" in r.stderr and "Traceback" not in r.stderr
    with Store(paths.db_path(root)) as store:
        ledger = Ledger(store)
        job_id = ledger.job_recorded("gone", json.dumps({"spec": {"name": "gone", "script": "t.py"}, "hosts": []}),
                                     None, None)
        ledger.attempt_started(job_id, 1, "n1", ["n1"], None, "attempt 1")
        ledger.attempt_running(job_id, 1)
    r = cli(tmp_path, "top", "gone", "--once", "-o", "json")
    assert r.returncode == 1 and "no live supervisor" in r.stderr and "resume gone" in r.stderr
    with Store(paths.db_path(root)) as store:
        store.set_state(job_id, JobState.SUCCEEDED, "done")
    r = cli(tmp_path, "top", "gone", "--once")
    assert r.returncode == 1 and "is SUCCEEDED: no rank runs" in r.stderr
