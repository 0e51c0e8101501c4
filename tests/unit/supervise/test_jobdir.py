"""supervise.jobdir: the job dir's steps.jsonl (from the log copy's `step N` lines), events.jsonl (every event,
once, append-only) and goodput.json; a report from the dir alone once the database forgot the job."""
from __future__ import annotations

import json

import pytest

from clusterctl.model.events import Relaunch
from clusterctl.store import paths
from clusterctl.store.ledger import Ledger, note
from clusterctl.store.logcopy import LogSink
from clusterctl.store.state import JobState, Store
from clusterctl.supervise import jobdir


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def test_the_tap_records_each_new_step_of_an_attempt_from_the_log_copy(tmp_path):
    times = iter(range(100, 200))
    tap = jobdir.StepTap(tmp_path / "steps.jsonl", attempt=0, clock=lambda: float(next(times)))
    sink = LogSink(tmp_path / "output.log", echo=tap)
    sink.begin("n1", 1)
    sink.begin("n2", 1)
    sink.feed("n1", b"[0]:starting from scratch\n[0]:step 1/10 loss 0.5\n[0]:step 2/10 loss 0.4\n")
    sink.feed("n2", b"[1]:step 2/10 loss 0.4\n")              # another rank printing the same step: not again
    sink.feed("n1", b"[0]:steps per epoch 96\n[0]:step 3/10 loss 0.3\n")   # "steps" is not a step line
    sink.begin("n1", 2)
    sink.feed("n1", b"[0]:resumed from /c/step-2 at step 2\n[0]:step 3/10 loss 0.3\n")
    tap.close()
    got = [(s.attempt, s.step, s.time) for s in jobdir.read_steps(tmp_path / "steps.jsonl")]
    assert got == [(1, 1, 100.0), (1, 2, 101.0), (1, 3, 102.0), (2, 3, 103.0)]


def test_a_tap_started_by_a_supervisor_that_re_attached_uses_the_current_attempt(tmp_path):
    tap = jobdir.StepTap(tmp_path / "steps.jsonl", attempt=3, clock=lambda: 5.0)
    tap("[n1/0] step 7/10 loss 0.1")
    tap.close()
    assert jobdir.read_steps(tmp_path / "steps.jsonl")[0].attempt == 3


def run_a_job(store, root) -> str:
    ledger = Ledger(store)
    job_id = ledger.job_recorded("demo", "{}", None, None)
    paths.ensure_job_dir(root, job_id)
    mirror = jobdir.EventMirror(store, job_id, paths.job_dir(root, job_id) / jobdir.EVENTS)
    store.on_state = mirror.chain(None)
    ledger.attempt_started(job_id, 1, "n1", ["n1", "n2"], None, "attempt 1")
    ledger.attempt_running(job_id, 1)
    ledger.checkpoint_seen(job_id, 1, "/c/step-10", 10)           # no state change: mirrored with the next one
    ledger.event(job_id, jobdir_kind("verdict"), "lost n2", attempt=1, klass="node", node="n2")
    ledger.attempt_ended(job_id, 1, "node", to=JobState.RECOVERING)
    ledger.attempt_started(job_id, 2, "n1", ["n1"], ("/c/step-10", 10), "attempt 2")
    ledger.attempt_running(job_id, 2, [Relaunch(2, "n1", "warm", "its zygote answered")])
    return job_id


def jobdir_kind(value):
    from clusterctl.model.events import EventKind
    return EventKind(value)


def test_every_event_reaches_events_jsonl_once_and_a_new_mirror_appends_only_the_rest(store, tmp_path):
    job_id = run_a_job(store, tmp_path)
    path = paths.job_dir(tmp_path, job_id) / jobdir.EVENTS
    kinds = [m.kind for m in jobdir.read_marks(path)]
    assert kinds == ["start", "checkpoint", "verdict", "start", "relaunch"]
    before = path.read_text()
    store.on_state = None                                  # that supervisor exited; one that re-attached:
    again = jobdir.EventMirror(store, job_id, path)
    Ledger(store).job_ended(job_id, JobState.SUCCEEDED, "done")
    again.sync()
    assert path.read_text().startswith(before)             # append-only
    marks = jobdir.read_marks(path)
    assert [m.kind for m in marks][-1] == "end" and len({m.id for m in marks}) == len(marks)
    assert [m.id for m in marks] == [e.id for e in store.events(job_id)]


def test_goodput_json_is_kept_and_the_dir_alone_gives_the_report_after_forget(store, tmp_path):
    job_id = run_a_job(store, tmp_path)
    d = paths.job_dir(tmp_path, job_id)
    Ledger(store).job_ended(job_id, JobState.SUCCEEDED, "done")
    start = store.events(job_id)[0].time
    (d / jobdir.STEPS).write_text("".join(json.dumps({"time": start + t, "attempt": a, "step": s}) + "\n"
                                          for t, a, s in [(1, 1, 1), (2, 1, 2), (3, 2, 11)]) + "{cut")
    jobdir.keep(store, tmp_path, job_id, jobdir.EventMirror(store, job_id, d / jobdir.EVENTS), now=start + 99)
    kept = json.loads((d / jobdir.GOODPUT).read_text())
    assert kept["job_id"] == job_id and kept["name"] == "demo" and kept["state"] == "SUCCEEDED"
    assert kept["steps"]["first"] == 1 and kept["steps"]["last"] == 11
    assert [x["verdict"] for x in kept["disruptions"]] == ["node"]
    Ledger(store).forgotten(job_id)
    again = jobdir.report_from_dir(d, now=start + 500)
    assert again == kept
    (d / jobdir.EVENTS).unlink()
    assert jobdir.report_from_dir(d, now=0) == kept         # goodput.json alone
    assert jobdir.report_from_dir(tmp_path / "nothing", now=0) is None


def test_the_supervisor_keeps_steps_events_and_goodput_json_in_the_job_dir(tmp_path, monkeypatch):
    """controller.supervise wires them: the log copy's step lines -> steps.jsonl, each state change -> events.jsonl,
    its exit -> goodput.json (the same report `clusterctl report` computes)."""
    from clusterctl.config.spec import loads_job
    from clusterctl.supervise import controller
    from clusterctl.transport import ConnectOptions

    root = paths.ensure_state_dir(tmp_path / "state")
    store = Store(paths.db_path(root))
    job_id = Ledger(store).job_recorded("j", "{}", None, "/j.yaml")
    sink = LogSink(paths.output_log(root, job_id))

    class Ops:
        secrets: dict = {}
        spec = loads_job("name: j\nnodes: 1\nnproc_per_node: 1\nscript: t.py\n")

        def __init__(self):
            self.sink = sink

        def wait_for_change(self, timeout):
            pass

        def sleep_unless_stopped(self, seconds):
            pass

        def close(self):
            pass

    class Sup:
        def __init__(self, job_id, store, ops, policy, nodes, wait, sleep, on_event, job_dir=None):
            self.job_id, self.store, self.ops = job_id, store, ops

        def run(self, adopt_attempt=None, adopt_note=""):
            ledger = Ledger(self.store)
            ledger.attempt_started(self.job_id, 1, "n1", ["n1"], None, "attempt 1")
            ledger.attempt_running(self.job_id, 1)
            self.ops.sink.begin("n1", 1)
            self.ops.sink.feed("n1", b"[0]:step 1/3 loss 1\n[0]:step 2/3 loss 1\n[0]:step 3/3 loss 1\n")
            ledger.event(self.job_id, jobdir_kind("verdict"), "ok", attempt=1, klass="success")
            ledger.attempt_ended(self.job_id, 1, "succeeded", to=JobState.SUCCEEDED,
                                 notes=[note(jobdir_kind("end"), "job SUCCEEDED")])
            return JobState.SUCCEEDED

    monkeypatch.setattr(controller, "build_ops", lambda root, store, job_id, options: (Ops(), None, ["n1"]))
    monkeypatch.setattr(controller, "Supervisor", Sup)
    assert controller.supervise(root, job_id, ConnectOptions(), echo=lambda m: None) == JobState.SUCCEEDED
    d = paths.job_dir(root, job_id)
    assert [s.step for s in jobdir.read_steps(d / jobdir.STEPS)] == [1, 2, 3]
    assert [m.kind for m in jobdir.read_marks(d / jobdir.EVENTS)] == ["start", "verdict", "end"]
    kept = json.loads((d / jobdir.GOODPUT).read_text())
    assert kept["state"] == "SUCCEEDED" and kept["steps"]["last"] == 3 and kept["disruptions"] == []
    store.close()
