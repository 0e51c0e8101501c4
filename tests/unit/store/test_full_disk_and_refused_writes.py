"""A full disk or a refusing state database (issue 24 item 6): the real SQLite error is reported (not "cannot
rollback"), the supervisor survives refused bookkeeping writes, ends the job loudly when it cannot go on, and the
controller's log copy is bounded (rotation) and never fails silently."""
from __future__ import annotations

import errno
import os

import pytest

from clusterctl.model.verdicts import Observation, Started
from clusterctl.store.logcopy import LogSink, rotated
from clusterctl.store.state import JobState, Store, StoreError
from clusterctl.supervise import controller
from clusterctl.supervise.supervisor import NodeOps, Policy, Supervisor
from tests.fakes.ops import QuietOps


def fill(store: Store) -> None:
    """The database file may not grow any more: SQLite's own "database or disk is full" on the next page."""
    with store._locked() as db:
        pages = db.execute("PRAGMA page_count").fetchone()[0]
        db.execute(f"PRAGMA max_page_count = {pages}")


def test_a_full_database_reports_sqlites_error_not_a_failed_rollback(tmp_path):
    store = Store(tmp_path / "state.db")
    job_id = store.create_job("demo", "{}", None, None)
    fill(store)
    with pytest.raises(StoreError) as e:
        for i in range(2000):
            store.add_event(job_id, "note", "x" * 2000)
    assert "full" in str(e.value) and "rollback" not in str(e.value)
    assert store.get_job(job_id).state == JobState.PENDING      # reads still work


def test_the_supervisor_survives_refused_node_rows_and_finishes_the_job(tmp_path, capsys):
    store = Store(tmp_path / "state.db")
    job_id = store.create_job("demo", "{}", None, None)

    class Ops(QuietOps):
        rounds = [[Observation("a", "running", progress=True)]] * 3 + [[Observation("a", "exited", exit_code=0)]]

        def __init__(self):
            self.script = list(self.rounds)

        def start(self, *a):
            store.set_node = refuse          # from now on every node row is refused (a full disk)
            return Started()

        def observe(self, attempt, nodes):
            return self.script.pop(0)

    def refuse(*a, **k):
        raise StoreError("state.db: cannot write the state database: database or disk is full")

    sup = Supervisor(job_id, store, Ops(), Policy(min_nodes=1, max_nodes=1), ["a"],
                     clock=iter(range(10**6)).__next__, sleep=lambda s: None)
    assert sup.run() == JobState.SUCCEEDED
    assert capsys.readouterr().err.count("disk is full") == 1      # said once a minute, not once a round


def test_a_supervisor_that_cannot_go_on_stops_the_nodes_fails_the_job_and_notifies(tmp_path, capsys):
    store = Store(tmp_path / "state.db")
    job_id = store.create_job("demo", "{}", None, None)
    store.set_state(job_id, JobState.STARTING)
    stopped, told = [], []

    class Ops(NodeOps):
        def stop(self, attempt, nodes):
            stopped.append((attempt, tuple(nodes)))
            return {}

    class Notifier:
        def on_state(self, job_id, old, new):
            told.append(new)

    store.on_state = Notifier().on_state
    try:
        raise RuntimeError("a bug")
    except RuntimeError as e:
        bug = e
    state = controller._end_on_error(store, Ops(), Notifier(), job_id, ["a", "b"], bug)
    assert state == JobState.FAILED and stopped == [(None, ("a", "b"))] and told == [JobState.FAILED]
    job = store.get_job(job_id)
    assert job.state == JobState.FAILED and "the supervisor failed: RuntimeError: a bug" in job.reason
    assert "Traceback" in capsys.readouterr().err
    # the database refuses even that: the `failed` notification goes out anyway
    job2 = store.create_job("demo2", "{}", None, None)
    store.set_state(job2, JobState.STARTING)
    told.clear()
    store.set_state = lambda *a, **k: (_ for _ in ()).throw(StoreError("disk is full"))
    assert controller._end_on_error(store, Ops(), Notifier(), job2, ["a"], StoreError("disk is full")) \
        == JobState.FAILED
    assert told == [JobState.FAILED]


def test_the_log_copy_rotates_at_its_size_and_logs_reads_both(tmp_path):
    from clusterctl.views import logs

    path = tmp_path / "output.log"
    sink = LogSink(path, max_bytes=4096)
    for i in range(200):
        sink.write("n1", [f"[0]:line {i:04d} ".encode() + b"x" * 40])
    sink.close()
    assert path.stat().st_size <= 4096 and rotated(path).stat().st_size <= 4096
    lines = logs.read(path, logs.Selection())
    assert lines[-1].startswith("[n1/0] line 0199") and len(lines) < 200       # older ones were dropped
    assert [int(ln.split()[2]) for ln in lines] == sorted(int(ln.split()[2]) for ln in lines)


def test_a_log_copy_write_that_fails_is_said_and_dropped_not_raised(tmp_path, capsys, monkeypatch):
    sink = LogSink(tmp_path / "output.log")
    real = os.write

    def full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    sink.write("n1", [b"[0]:a", b"[0]:b"])
    sink.write("n1", [b"[0]:c"])
    assert sink.dropped == 3 and sink.trouble.errno == errno.ENOSPC
    assert capsys.readouterr().err.count("No space left on device") == 1
    monkeypatch.setattr(os, "write", real)
    sink.write("n1", [b"[0]:d"])
    assert sink.trouble is None and "3 lines were dropped" in capsys.readouterr().err
    sink.close()
    assert (tmp_path / "output.log").read_text() == "[n1/0] d\n"


def test_the_attached_view_shows_an_event_after_the_rank_lines_the_log_copy_brings_later(tmp_path):
    """The supervisor records "latest valid checkpoint" as soon as it sees it; the rank's own "checkpoint" line
    reaches the log copy up to a second later. `follow` holds an event until the copy has caught up."""
    import threading
    import time

    from clusterctl.store import paths

    root = paths.ensure_state_dir(tmp_path / "state")
    store = Store(paths.db_path(root))
    job_id = store.create_job("demo", "{}", None, None)
    log = paths.ensure_job_dir(root, job_id) / "output.log"
    log.write_text("[n1/0] step 19\n")
    store.add_event(job_id, "checkpoint", "latest valid checkpoint: /ck/step-000000020")

    def node_side():
        time.sleep(0.6)
        with open(log, "a") as f:
            f.write("[n1/0] checkpoint 20 saved\n")
        time.sleep(1.6)
        store.set_state(job_id, JobState.FAILED, "end")

    threading.Thread(target=node_side, daemon=True).start()
    lines: list[str] = []
    assert controller.follow(root, store, job_id, lines.append, poll_s=0.1) == JobState.FAILED
    assert lines == ["[n1/0] step 19", "[n1/0] checkpoint 20 saved",
                     "clusterctl: latest valid checkpoint: /ck/step-000000020"]
