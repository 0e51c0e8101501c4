"""Job history: --since/--state parsing, which jobs the list shows, and tables that fit 80 columns."""
import datetime

import pytest

from clusterctl.errors import UserError
from clusterctl.store.state import JobState, Store
from clusterctl.views import history
from clusterctl.views.columns import Column, fit

NOW = 1_800_000_000.0


@pytest.mark.parametrize("text,expected", [
    ("2h", NOW - 7200), ("30m", NOW - 1800), ("45s", NOW - 45), ("3d", NOW - 3 * 86400), ("1w", NOW - 7 * 86400),
    ("1.5h", NOW - 5400),
    ("2026-12-01", datetime.datetime(2026, 12, 1, tzinfo=datetime.timezone.utc).timestamp()),
    ("2026-12-01T08:30", datetime.datetime(2026, 12, 1, 8, 30, tzinfo=datetime.timezone.utc).timestamp()),
])
def test_parse_since(text, expected):
    assert history.parse_since(text, NOW) == expected


@pytest.mark.parametrize("text", ["2x", "yesterday", "12-01", "", "-2h"])
def test_parse_since_errors_say_what_is_accepted(text):
    with pytest.raises(UserError, match="duration .* or a UTC date"):
        history.parse_since(text, NOW)


def test_parse_states():
    assert history.parse_states(["failed", "RUNNING,stopped", "FAILED"]) == (
        JobState.FAILED, JobState.RUNNING, JobState.STOPPED)
    with pytest.raises(UserError, match="one of PENDING"):
        history.parse_states(["done"])


@pytest.fixture
def store(tmp_path):
    t = {"now": NOW - 100 * 3600}
    s = Store(tmp_path / "state.db", clock=lambda: t["now"])
    s.tick = t
    yield s
    s.close()


def _finish(store, job_id, state):
    store.set_state(job_id, JobState.STARTING)
    store.set_state(job_id, state, f"{state.value.lower()} because of a very long reason\nsecond line")
    store.add_event(job_id, "end", "done")


def test_select_active_then_20_newest_finished_and_filters(store):
    ids = []
    for i in range(25):
        store.tick["now"] += 3600
        j = store.create_job(f"job{i}", "{}", None, None)
        if i not in (3, 24):
            _finish(store, j, JobState.FAILED if i % 2 else JobState.SUCCEEDED)
        ids.append(j)
    jobs = store.list_jobs()
    shown = history.select(store, jobs)
    assert [j.job_id for j in shown[:2]] == [ids[24], ids[3]]          # active first, newest first
    assert len(shown) == 2 + 20 and ids[0] not in [j.job_id for j in shown]
    assert len(history.select(store, jobs, show_all=True)) == 25
    failed = history.select(store, jobs, states=[JobState.FAILED], show_all=True)
    assert failed and all(j.state == JobState.FAILED for j in failed)
    recent = history.select(store, jobs, since=NOW - 100 * 3600 + 22.5 * 3600)
    # jobs 22, 23 (finished after) + the active ones, whenever they started
    assert {j.job_id for j in recent} == {ids[22], ids[23], ids[24], ids[3]}


def test_row_has_the_columns_and_a_one_line_reason(store):
    j = store.create_job("demo", "{}", None, None)
    store.start_attempt(j, 1, "n1", "r", ["n1", "n2"])
    store.tick["now"] += 65
    _finish(store, j, JobState.FAILED)
    r = history.row(store, store.get_job(j), NOW)
    assert (r["job_id"], r["name"], r["state"], r["attempt"], r["nodes"]) == (j, "demo", "FAILED", 1, ["n1", "n2"])
    assert r["elapsed_s"] == 65 and r["ended_at"] - r["started_at"] == 65
    assert "\n" not in r["short_reason"] and r["short_reason"].startswith("failed because")
    assert history.duration(3725) == "1h02m" and history.duration(59) == "59s"


def test_fit_keeps_ids_whole_at_80_columns_and_never_drops_a_column():
    cols = [Column("job"), Column("name", min=4), Column("state"), Column("attempt", right=True, short="att"),
            Column("nodes", min=5), Column("started", short="start"), Column("ended"),
            Column("elapsed", right=True, short="took"),
            Column("reason", min=16, max=60)]
    reason = "node node2 lost: unreachable for 2 consecutive probes " * 3
    short = ["qs-20261201-062711-6866", "qs", "FAILED", "1", "n1", "06:27", "06:28", "11s", reason]
    lines = fit(cols, [short], 100, shrink_order=[(8, 24)], spill=8)
    assert len(lines) == 2 and all(len(line) <= 100 for line in lines)      # fits: the reason stays in the row
    assert lines[1].startswith(short[0] + " ") and lines[1].endswith("…") and "reason" in lines[0]
    job_id = "vit-pretrain-20261201-062711-6866"
    long = [job_id, "vit-pretrain", "RECOVERING", "2", "node1,node2,node3", "06:27", "-", "1h02m", reason]
    lines = fit(cols, [long, short], 80, shrink_order=[(8, 24), (4, 12)], spill=8)
    # too narrow for every column: the reason goes, on one line, under its row; the id stays whole
    assert len(lines) == 5 and all(len(line) <= 80 for line in lines)
    assert lines[1].startswith(job_id + " ") and lines[3].startswith(short[0] + " ")
    assert lines[2].startswith("  node node2 lost") and lines[2].endswith("…")
    assert lines[0].split() == ["job", "name", "state", "att", "nodes", "start", "ended", "took"]
    assert "RECOVERING" in lines[1] and "1h02m" in lines[1]
    wide = fit(cols, [long], 200, spill=8)
    assert len(wide) == 2 and "node1,node2,node3" in wide[1] and len(wide[1]) <= 200
