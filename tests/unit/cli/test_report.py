"""`clusterctl report JOB` (issue 38): text, --output json with the issue's fields, --plot PNG/SVG (and the
error naming the extra without matplotlib), a job the database forgot read from its kept dir, no step signal."""
from __future__ import annotations

import json
import sys

import pytest

from clusterctl.cli import main
from clusterctl.model.events import EventKind, Relaunch
from clusterctl.store import paths
from clusterctl.store.ledger import Ledger
from clusterctl.store.state import JobState, Store
from clusterctl.supervise import jobdir

DISRUPTION_FIELDS = {"attempt", "verdict", "node", "fault_at", "detected_at", "stopped_at", "restarted_at",
                     "first_step_at", "recovery", "lost_steps", "lost_s", "cordoned"}
BUCKETS = {"program_startup", "wasted_progress_from_disruption", "infrastructure_recovery_from_disruption",
           "unproductive_checkpoint_save_time", "unproductive_checkpoint_restore_time", "data_loading", "other",
           "hang_detection", "backoff", "waiting_for_nodes"}


def cli(capsys, *args) -> tuple[int, str, str]:
    with pytest.raises(SystemExit) as e:
        main(list(args))
    o = capsys.readouterr()
    return e.value.code, o.out, o.err


@pytest.fixture
def state(tmp_path):
    root = paths.ensure_state_dir(tmp_path / "state")
    clock = iter([100.0 + i * 0.5 for i in range(200)]).__next__
    store = Store(paths.db_path(root), clock=lambda: clock())
    yield root, store
    store.close()


def record_job(root, store, *, steps: bool) -> str:
    """Attempt 1 on n1+n2 trains, n2 is lost, attempt 2 on n1 resumes from step 4 (warm) and succeeds."""
    ledger = Ledger(store)
    job_id = ledger.job_recorded("demo", "{}", None, None)
    paths.ensure_job_dir(root, job_id)
    ledger.attempt_started(job_id, 1, "n1", ["n1", "n2"], None, "attempt 1")      # 100.5 ...
    ledger.attempt_running(job_id, 1)
    ledger.checkpoint_seen(job_id, 1, "/c/step-4", 4)
    ledger.event(job_id, EventKind.VERDICT, "n2 lost", attempt=1, klass="node", node="n2")
    ledger.attempt_ended(job_id, 1, "node", to=JobState.RECOVERING)
    ledger.event(job_id, EventKind.GANG_STOP, "attempt 1: stopping n1", attempt=1)
    ledger.event(job_id, EventKind.BUDGET, "budget", attempt=1)
    ledger.attempt_started(job_id, 2, "n1", ["n1"], ("/c/step-4", 4), "attempt 2")
    ledger.attempt_running(job_id, 2, [Relaunch(2, "n1", "warm", "its zygote answered")])
    ledger.job_ended(job_id, JobState.SUCCEEDED, "done")
    if steps:
        start1, start2 = (e.time for e in store.events(job_id) if e.kind == "start")
        rows = [(start1 + k * 0.1, 1, k) for k in range(1, 8)]           # steps 1..7, before the verdict
        rows += [(start2 + 0.05 * k, 2, 4 + k) for k in range(1, 5)]      # steps 5..8
        (paths.job_dir(root, job_id) / jobdir.STEPS).write_text(
            "".join(json.dumps({"time": t, "attempt": a, "step": s}) + "\n" for t, a, s in rows))
    return job_id


def test_report_json_has_the_issues_fields_and_the_text_says_the_same(state, capsys):
    root, store = state
    job_id = record_job(root, store, steps=True)
    rc, out, _ = cli(capsys, "--state-dir", str(root), "report", "demo", "-o", "json")
    assert rc == 0
    r = json.loads(out)
    assert {"wall_s", "productive_s", "goodput", "ettr", "badput_s", "disruptions", "steps"} <= set(r)
    assert set(r["badput_s"]) == BUCKETS
    assert abs(r["productive_s"] + sum(r["badput_s"].values()) - r["wall_s"]) <= 0.01 * r["wall_s"]
    (d,) = r["disruptions"]
    assert set(d) == DISRUPTION_FIELDS
    assert (d["attempt"], d["verdict"], d["node"], d["recovery"], d["lost_steps"]) == (1, "node", "n2", "warm", 3)
    assert set(r["steps"]) == {"first", "last", "median_s", "p90_s"}
    assert (r["steps"]["first"], r["steps"]["last"]) == (1, 8)
    assert r["job_id"] == job_id and 0 < r["goodput"] <= 1
    rc, out, _ = cli(capsys, "--state-dir", str(root), "report", job_id)
    assert rc == 0
    assert "goodput" in out and "attempt 1: node on n2" in out and "3 steps" in out and "(warm)" in out


def test_a_job_without_step_lines_says_what_it_cannot_tell(state, capsys):
    root, store = state
    record_job(root, store, steps=False)
    rc, out, _ = cli(capsys, "--state-dir", str(root), "report", "demo", "-o", "json")
    r = json.loads(out)
    assert rc == 0 and r["productive_s"] is None and r["goodput"] is None and r["steps"] is None
    assert r["disruptions"][0]["lost_steps"] is None and any("no step signal" in u for u in r["unknown"])
    rc, out, _ = cli(capsys, "--state-dir", str(root), "report", "demo")
    assert "goodput unknown" in out and "cannot tell: no step signal" in out


@pytest.mark.parametrize("ext,magic", [(".png", b"\x89PNG\r\n\x1a\n"), (".svg", b"<svg")])
def test_plot_writes_a_png_or_an_svg(state, capsys, tmp_path, ext, magic):
    root, store = state
    record_job(root, store, steps=True)
    f = tmp_path / f"run{ext}"
    rc, _, err = cli(capsys, "--state-dir", str(root), "report", "demo", "--plot", str(f))
    assert rc == 0 and f"wrote {f}" in err
    data = f.read_bytes()
    assert data.startswith(magic) if ext == ".png" else magic in data[:2000]


def test_plot_refuses_another_extension_and_names_the_extra_when_matplotlib_is_missing(state, capsys, tmp_path,
                                                                                        monkeypatch):
    root, store = state
    record_job(root, store, steps=True)
    rc, _, err = cli(capsys, "--state-dir", str(root), "report", "demo", "--plot", str(tmp_path / "x.pdf"))
    assert rc == 2 and ".png or .svg" in err
    rc, _, err = cli(capsys, "--state-dir", str(root), "report", "demo", "--plot", str(tmp_path / "no" / "x.png"))
    assert rc == 2 and "no directory" in err
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # `import matplotlib` raises ImportError
    rc, _, err = cli(capsys, "--state-dir", str(root), "report", "demo", "--plot", str(tmp_path / "x.png"))
    assert rc == 2 and "clusterctl[plot]" in err and "Traceback" not in err


def test_a_forgotten_job_is_reported_from_its_kept_dir_and_an_unknown_one_is_exit_2(state, capsys):
    root, store = state
    job_id = record_job(root, store, steps=True)
    d = paths.job_dir(root, job_id)
    mirror = jobdir.EventMirror(store, job_id, d / jobdir.EVENTS)
    jobdir.keep(store, root, job_id, mirror, now=1e9)
    rc, before, _ = cli(capsys, "--state-dir", str(root), "report", "demo", "-o", "json")
    Ledger(store).forgotten(job_id)
    for ref in (job_id, "demo"):
        rc, after, _ = cli(capsys, "--state-dir", str(root), "report", ref, "-o", "json")
        assert rc == 0 and json.loads(after) == json.loads(before)
    rc, _, err = cli(capsys, "--state-dir", str(root), "report", "nosuchjob")
    assert rc == 2 and "nosuchjob" in err


def test_sub_second_times_keep_their_digits():
    """A 20 ms step's median read `step time 0.0s median` (one decimal place for everything under a minute)."""
    from clusterctl.views.report import seconds
    assert [seconds(x) for x in (0.02, 0.123, 5.55, 61)] == ["0.02s", "0.12s", "5.5s", "1m01s"]
