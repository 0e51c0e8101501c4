"""The ledger (clusterctl/store/ledger.py): each method one transaction, all of it or none, the transitions
enforced there, listeners told after the commit, and payloads read back as values."""
from __future__ import annotations

import pytest

from clusterctl.model.events import EventKind, checkpoint_of, relaunch_of
from clusterctl.store.ledger import Ledger, note
from clusterctl.store.state import ACTIVE_STATES, InvalidTransition, JobState, Store
from clusterctl.views.status import job_view


@pytest.fixture
def led(tmp_path):
    store = Store(tmp_path / "state.db")
    job_id = Ledger(store).job_recorded("j", "{}", None, None)
    return Ledger(store), store, job_id


def _running(ledger, job_id, attempt=1, nodes=("n1", "n2")):
    ledger.attempt_started(job_id, attempt, nodes[0], nodes, ("/ckpt/step-4", 4), "start", expect=ACTIVE_STATES)
    ledger.attempt_running(job_id, attempt, expect=ACTIVE_STATES)


def test_an_attempts_end_after_a_stop_records_nothing_of_it(led):
    """A `stop` that came first wins: the supervisor's end of the attempt (node rows, events, attempt result,
    RECOVERING) is refused as a whole, so `_preempted` can end the attempt as stopped."""
    ledger, store, job_id = led
    _running(ledger, job_id)
    ledger.stop_requested(job_id)
    before = len(store.events(job_id))
    with pytest.raises(InvalidTransition):
        ledger.attempt_ended(job_id, 1, "node_lost", to=JobState.RECOVERING, reason="n2 lost", expect=ACTIVE_STATES,
                             nodes={"n2": {"state": "unreachable"}}, notes=[note(EventKind.GANG_STOP, "stopping")])
    assert store.get_job(job_id).state == JobState.STOPPED
    assert store.attempts(job_id)[-1].result is None and store.attempts(job_id)[-1].ended_at is None
    assert store.nodes(job_id, 1) == [] and len(store.events(job_id)) == before


def test_a_start_after_a_stop_leaves_no_attempt_row(led):
    ledger, store, job_id = led
    ledger.stop_requested(job_id)
    with pytest.raises(InvalidTransition):
        ledger.attempt_started(job_id, 1, "n1", ["n1"], None, "start", expect=ACTIVE_STATES)
    assert store.attempts(job_id) == [] and store.get_job(job_id).attempt == 0
    assert [e.kind for e in store.events(job_id)] == [EventKind.STOP]


def test_the_end_of_an_attempt_is_one_transaction_with_its_next_state(led):
    ledger, store, job_id = led
    _running(ledger, job_id)
    ledger.attempt_ended(job_id, 1, "node_lost", to=JobState.RECOVERING, reason="n2 lost", expect=ACTIVE_STATES,
                         nodes={"n2": {"state": "unreachable"}}, notes=[note(EventKind.GANG_STOP, "stopping n1")])
    a = store.attempts(job_id)[-1]
    assert (a.result, store.get_job(job_id).state) == ("node_lost", JobState.RECOVERING)
    assert [(n.node, n.state) for n in store.nodes(job_id, 1)] == [("n2", "unreachable")]
    assert store.events(job_id)[-1].kind == EventKind.GANG_STOP


def test_listeners_hear_a_state_change_after_its_commit_and_never_a_rolled_back_one(led):
    ledger, store, job_id = led
    heard = []

    def listener(jid, old, new):      # reads the row it is told about: it must be committed
        heard.append((old, new, Store(store.path).get_job(jid).state))
    store.on_state = listener
    _running(ledger, job_id)
    assert heard == [(JobState.PENDING, JobState.STARTING, JobState.STARTING),
                     (JobState.STARTING, JobState.RUNNING, JobState.RUNNING)]
    ledger.stop_requested(job_id)
    heard.clear()
    with pytest.raises(InvalidTransition):
        ledger.attempt_ended(job_id, 1, "hang", to=JobState.RECOVERING, expect=ACTIVE_STATES)
    assert heard == []


def test_status_reads_the_checkpoint_and_relaunches_as_values(led):
    """A checkpoint path with ': ' in it came back cut when status split the message; the payload reads it whole."""
    ledger, store, job_id = led
    _running(ledger, job_id)
    ledger.checkpoint_seen(job_id, 1, "/mnt/ckpt: run 2/step-12", 12)
    ledger.attempt_ended(job_id, 1, "node_lost", to=JobState.RECOVERING, expect=ACTIVE_STATES)
    ledger.attempt_started(job_id, 2, "n1", ["n1"], ("/mnt/ckpt: run 2/step-12", 12), "start", expect=ACTIVE_STATES)
    from clusterctl.model.events import Relaunch
    ledger.attempt_running(job_id, 2, [Relaunch(2, "n1", "warm", "its zygote answered: forked")], expect=ACTIVE_STATES)
    view = job_view(store, store.get_job(job_id))
    assert view["checkpoint"]["path"] == "/mnt/ckpt: run 2/step-12" and view["checkpoint"]["step"] == 12
    assert view["relaunches"] == [{"attempt": 2, "node": "n1", "recovery": "warm",
                                   "why": "its zygote answered: forked"}]
    kinds = [e.kind for e in store.events(job_id)]
    assert EventKind.CHECKPOINT in kinds and all(isinstance(k, EventKind) for k in kinds)
    assert [c.path for c in map(checkpoint_of, store.events(job_id)) if c] == ["/mnt/ckpt: run 2/step-12"]
    assert [r.mode for r in map(relaunch_of, store.events(job_id)) if r] == ["warm"]


def test_a_kind_this_release_does_not_know_reads_back_as_its_string(led):
    ledger, store, job_id = led
    store.add_event(job_id, "from_the_future", "written by a newer clusterctl")
    assert store.events(job_id)[-1].kind == "from_the_future"


def test_an_attempts_end_is_its_verdict_its_budget_and_its_next_state_together(led):
    """Issue 36: ending an attempt (the verdict, the budget it spends, the attempt's result, RECOVERING) is one
    transaction; refused (a `stop` came first), none of it is recorded, the budget's use neither."""
    ledger, store, job_id = led
    _running(ledger, job_id)
    ledger.attempt_ended(job_id, 1, "node_lost", to=JobState.RECOVERING, expect=ACTIVE_STATES, budget=(True, 2),
                         notes=[note(EventKind.VERDICT, "node n2 lost", klass="node_lost"),
                                note(EventKind.BUDGET, "infra restart budget: 2 of 3 used", klass="infra")])
    job = store.get_job(job_id)
    assert (job.node_failures_used, job.failures_used, job.state) == (2, 0, JobState.RECOVERING)
    assert [(e.kind, e.klass) for e in store.events(job_id)][-2:] == [(EventKind.VERDICT, "node_lost"),
                                                                       (EventKind.BUDGET, "infra")]
    ledger.attempt_started(job_id, 2, "n1", ["n1"], None, "start", expect=ACTIVE_STATES)
    ledger.stop_requested(job_id)
    before = len(store.events(job_id))
    with pytest.raises(InvalidTransition):
        ledger.attempt_ended(job_id, 2, "user_error", to=JobState.RECOVERING, expect=ACTIVE_STATES, budget=(False, 1),
                             notes=[note(EventKind.BUDGET, "user restart budget: 1 of 3 used", klass="user")])
    assert store.get_job(job_id).failures_used == 0 and len(store.events(job_id)) == before
