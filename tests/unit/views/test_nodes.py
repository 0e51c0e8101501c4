"""Cordons: the store table (schema 2), the per-host view, launch-time exclusion and the supervisor's own cordon."""
import sqlite3

import pytest

from clusterctl.errors import UserError
from clusterctl.store.state import SCHEMA_VERSION, JobState, Store
from clusterctl.supervise.supervisor import Policy, Supervisor
from clusterctl.views import nodes as nodehealth
from tests.unit.supervise.test_supervisor import E, FakeOps, M, R, obs


@pytest.fixture
def store(tmp_path):
    t = {"now": 1_800_000_000.0}
    s = Store(tmp_path / "state.db", clock=lambda: t["now"])
    s.tick = t
    yield s
    s.close()


def test_schema_2_database_is_migrated(tmp_path):
    path = tmp_path / "old.db"
    Store(path).close()
    raw = sqlite3.connect(path)
    raw.execute("DROP TABLE cordons")
    raw.execute("DROP INDEX events_node")
    raw.execute("PRAGMA user_version = 2")
    raw.commit()
    raw.close()
    s = Store(path)
    s.cordon("n1", "bad")
    assert list(s.cordons()) == ["n1"] and SCHEMA_VERSION >= 3
    s.close()


def test_cordon_uncordon_keeps_since_and_resets_the_failure_count(store):
    c = store.cordon("n1", "ECC errors")
    store.tick["now"] += 10
    again = store.cordon("n1", "ECC errors on GPU 3")
    assert again.since == c.since and again.reason == "ECC errors on GPU 3" and again.by == "user"
    job = store.create_job("demo", "{}", None, None)
    for _ in range(3):
        store.add_event(job, "verdict", "lost", klass="node_lost", node="n1")
    store.add_event(job, "verdict", "user", klass="user_error", node="n1")
    klasses = ("node_lost", "rendezvous_lost", "hang")
    assert store.host_failures("n1", klasses, 86400) == 3
    store.tick["now"] += 1
    assert store.uncordon("n1") is True and store.uncordon("n1") is False
    assert store.cordons() == {} and store.host_failures("n1", klasses, 86400) == 0
    store.tick["now"] += 1
    store.add_event(job, "verdict", "lost", klass="hang", node="n1")
    assert store.host_failures("n1", klasses, 86400) == 1
    store.tick["now"] += 2 * 86400
    assert store.host_failures("n1", klasses, 86400) == 0


def test_node_rows(store):
    j1 = store.create_job("a", "{}", None, None)
    store.start_attempt(j1, 1, "n1", "r", ["n1", "n2"])
    store.add_event(j1, "verdict", "node n2 lost", klass="node_lost", node="n2")
    store.add_event(j1, "verdict", "rank failed", klass="user_error", node="n2")
    store.cordon("n3", "flaky NIC")
    rows = nodehealth.node_rows(["n1", "n2"], store.cordons(), store.all_attempts(), store.node_events(),
                                store.tick["now"])
    by = {r["host"]: r for r in rows}
    assert by["n1"]["state"] == "ok" and by["n1"]["jobs"] == 1 and by["n1"]["failures_7d"] == {}
    assert by["n2"]["failures_7d"] == {"node_lost": 1, "user_error": 1}
    assert by["n2"]["last_failure"]["class"] == "user_error" and by["n2"]["last_failure"]["job_id"] == j1
    assert by["n3"]["state"] == "cordoned" and by["n3"]["reason"] == "flaky NIC" and not by["n3"]["in_inventory"]


def test_split_and_too_few_names_the_cordoned_hosts(store):
    store.cordon("n2", "bad GPU")
    usable, excluded = nodehealth.split(["n1", "n2", "n3"], store.cordons())
    assert usable == ["n1", "n3"] and excluded == [("n2", "bad GPU")]
    e = nodehealth.too_few(3, 2, excluded)
    assert isinstance(e, UserError) and e.exit_code == 2 and "n2 (bad GPU)" in str(e) and "uncordon n2" in str(e)


def _sup(store, ops, nodes=("a", "b", "c"), **policy):
    job_id = store.create_job("demo", "{}", None, None)
    pol = Policy(**{"min_nodes": 1, "max_nodes": 3, "backoff_s": 0, **policy})
    return job_id, Supervisor(job_id, store, ops, pol, list(nodes), clock=iter(range(10**6)).__next__,
                              sleep=lambda s: None)


def test_relaunch_skips_a_host_cordoned_meanwhile(store):
    ops = FakeOps([obs(a=R, b=R, c=R), obs(a=R, b=(E, 1), c=R), obs(a=(E, 0), c=(E, 0))])
    job_id, sup = _sup(store, ops, settle_s=0)
    orig = ops.observe

    def observe(attempt, nodes):       # the on-call cordons b while attempt 1 runs
        if attempt == 1:
            store.cordon("b", "by hand")
        return orig(attempt, nodes)
    ops.observe = observe
    assert sup.run() == JobState.SUCCEEDED
    assert [s[1] for s in ops.started] == [("a", "b", "c"), ("a", "c")]


def test_supervisor_cordons_a_host_after_cordon_after_failures(store):
    # node b is lost once in each of three jobs; the third loss cordons it, and the next job runs without it
    for i in range(3):
        ops = FakeOps([obs(a=R, b=M, c=R), obs(a=(E, 0), c=(E, 0))])
        job_id, sup = _sup(store, ops, cordon_after=3)
        assert sup.run() == JobState.SUCCEEDED
        assert ("b" in store.cordons()) == (i == 2)
    cordon = store.cordons()["b"]
    assert cordon.by == f"supervisor (job {job_id})" and cordon.reason.startswith(
        "3 infrastructure failures within 24 h (node_lost, rendezvous_lost, hang, gpu_error, straggler; last: "
        "node_lost in job ")
    ev = [e for e in store.events(job_id) if e.kind == "cordon"]
    assert len(ev) == 1 and ev[0].node == "b" and "clusterctl uncordon b" in ev[0].message
    ops = FakeOps([obs(a=(E, 0), c=(E, 0))])
    _, sup = _sup(store, ops, cordon_after=3)
    assert sup.run() == JobState.SUCCEEDED and [s[1] for s in ops.started] == [("a", "c")]


def test_cordon_after_zero_never_cordons(store):
    for _ in range(4):
        ops = FakeOps([obs(a=R, b=M, c=R), obs(a=(E, 0), c=(E, 0))])
        _, sup = _sup(store, ops, cordon_after=0)
        assert sup.run() == JobState.SUCCEEDED
    assert store.cordons() == {}
