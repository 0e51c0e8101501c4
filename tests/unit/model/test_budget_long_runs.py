"""Long runs against a scripted fake cluster on a fake clock (shared by the supervisor and the store): restart
budgets count failures per window, and progress resets the backoff (issue 16)."""
from __future__ import annotations

import json

import pytest

from clusterctl.model.verdicts import Observation, Started
from clusterctl.store.state import JobState, Store
from clusterctl.supervise.supervisor import Policy, Supervisor
from clusterctl.views import status as status_mod
from tests.fakes.ops import QuietOps

HOUR, DAY = 3600.0, 86400.0
NODES = ["a", "b", "c", "d"]


class Clock:
    def __init__(self) -> None:
        self.t = 1_000_000.0

    def __call__(self) -> float:
        return self.t

    def advance(self, seconds: float) -> None:
        self.t += seconds


class LongCluster(QuietOps):
    """Every attempt answers ``rounds - 1`` probe rounds with all nodes running (output each round; with
    ``checkpoints`` a new valid checkpoint each round), then fails: ``fault`` = "node" (its last node is gone) or
    "user" (a rank exits 1 on every node). After ``failures`` failures the next attempt finishes (exit 0).
    Lost nodes heal at once: every node always answers ``reachable``."""

    def __init__(self, *, failures: int, rounds: int, checkpoints: bool = True, output: bool = True,
                 fault: str = "node"):
        self.failures, self.rounds, self.checkpoints, self.output, self.fault = (failures, rounds, checkpoints,
                                                                                 output, fault)
        self.started: list[tuple[int, tuple[str, ...], tuple[str, int]]] = []
        self.step = 0
        self.round = 0

    def start(self, attempt, nodes, rdzv_host, resume):
        self.started.append((attempt, tuple(nodes), resume))
        self.round = 0
        return Started()

    def observe(self, attempt, nodes):
        self.round += 1
        if self.round < self.rounds:
            if self.checkpoints:
                self.step += 10
            return [Observation(n, "running", progress=self.output) for n in nodes]
        if self.failures == 0:
            return [Observation(n, "exited", exit_code=0) for n in nodes]
        self.failures -= 1
        self.round = 0
        if self.fault == "user":
            return [Observation(n, "exited", exit_code=1, rank=0) for n in nodes]
        return [Observation(n, "missing" if n == nodes[-1] else "running") for n in nodes]

    def latest_checkpoint(self, nodes):
        return (f"/ck/step-{self.step:09d}", self.step) if self.step else ("", 0)


@pytest.fixture
def clock():
    return Clock()


@pytest.fixture
def store(tmp_path, clock):
    s = Store(tmp_path / "state.db", clock=clock)
    yield s
    s.close()


def supervise(store, clock, cluster, *, window="24h", **policy):
    from clusterctl.model.budget import window_seconds
    payload = {"spec": {"name": "longrun", "script": "train.py",
                        "restarts": {"max_failures": policy.get("max_failures", 3),
                                     "max_node_failures": policy.get("max_node_failures", 10), "window": window}}}
    job_id = store.create_job("longrun", json.dumps(payload), None, None)
    pol = Policy(**{"min_nodes": 2, "max_nodes": 4, "backoff_s": 5, "backoff_max_s": 300,
                    "probe_interval_s": 3000, "checkpoint_every_probes": 1, "window_s": window_seconds(window),
                    **policy})
    sleeps: list[float] = []

    def sleep(s):
        sleeps.append(s)
        clock.advance(s)

    sup = Supervisor(job_id, store, cluster, pol, NODES, clock=clock, sleep=sleep, wait=clock.advance)
    return job_id, sup, sleeps


def backoffs(store, job_id) -> list[str]:
    return [e.message for e in store.events(job_id) if e.kind == "backoff"]


@pytest.mark.parametrize("progress", ["checkpoint", "output"])
def test_three_weeks_with_100_spaced_node_failures_keep_running_and_relaunch_at_once(store, clock, progress):
    """100 node failures ~5 h apart, each attempt made progress (a new checkpoint, or 4 h of output): the job
    never exhausts max_node_failures (10 per 24 h), and every relaunch waits what the first one waited."""
    cluster = LongCluster(failures=100, rounds=7, checkpoints=progress == "checkpoint")
    t0 = clock()
    job_id, sup, sleeps = supervise(store, clock, cluster, progress_after_s=4 * HOUR)
    assert sup.run() == JobState.SUCCEEDED
    assert clock() - t0 >= 21 * DAY
    assert len(cluster.started) == 101
    job = store.get_job(job_id)
    assert 1 <= job.node_failures_used <= 5            # the failures of the last 24 h only
    assert sleeps == [] and backoffs(store, job_id) == []   # the first relaunch went at once, and so did each one
    assert sum(e.kind == "progress" for e in store.events(job_id)) == 100
    if progress == "checkpoint":                        # each relaunch resumed from the newest checkpoint
        assert all(resume[1] > prev[2][1] for prev, (_, _, resume) in zip(cluster.started, cluster.started[1:]))


def test_the_same_failures_without_progress_back_off_and_spend_the_lifetime_window(store, clock):
    """The control: the same 100 spaced failures, but no attempt made progress (no checkpoint, output for less
    than progress_after_s) and a window longer than the run -> exponential backoff, FAILED at the budget."""
    cluster = LongCluster(failures=100, rounds=7, checkpoints=False)
    job_id, sup, sleeps = supervise(store, clock, cluster, window="30d", progress_after_s=24 * HOUR)
    assert sup.run() == JobState.FAILED
    assert "restarts.max_node_failures within 30d" in store.get_job(job_id).reason
    assert sleeps == [5, 10, 20, 40, 80, 160, 300, 300, 300]   # the first one went at once
    assert len(cluster.started) == 11


def test_spaced_failures_without_progress_age_out_of_the_window(store, clock):
    """Failures 5 h apart with a 12 h window: never more than 3 in the window, so a budget of 3 holds, while the
    backoff still grows (no progress in between)."""
    cluster = LongCluster(failures=30, rounds=7, checkpoints=False)
    job_id, sup, sleeps = supervise(store, clock, cluster, window="12h", max_node_failures=3,
                                    progress_after_s=24 * HOUR)
    assert sup.run() == JobState.SUCCEEDED
    assert sleeps[:4] == [5, 10, 20, 40] and max(sleeps) == 300


def test_crash_loop_without_progress_fails_at_max_failures_with_exponential_backoff(store, clock):
    cluster = LongCluster(failures=50, rounds=1, checkpoints=False, output=False, fault="user")
    job_id, sup, sleeps = supervise(store, clock, cluster, max_failures=4)
    assert sup.run() == JobState.FAILED
    job = store.get_job(job_id)
    assert "restarts.max_failures within 24h" in job.reason and "exited with code 1" in job.reason
    assert job.failures_used == 5 and len(cluster.started) == 5
    assert sleeps == [5, 10, 20, 40]
    assert backoffs(store, job_id) == [f"waiting {s}s before the next attempt" for s in (5, 10, 20, 40)]


@pytest.mark.parametrize("window,budget", [("24h", 5), ("progress", 1)])
def test_user_errors_after_progress_wait_the_first_backoff_each_time(store, clock, window, budget):
    """A script that crashes every 5 h after checkpointing (say a bad sample): each relaunch waits backoff_s,
    never more, and the budget is never exhausted by 20 such failures (at most 5 fall within 24 h; with
    ``window: progress`` each one is the first since progress)."""
    cluster = LongCluster(failures=20, rounds=7, fault="user")
    job_id, sup, sleeps = supervise(store, clock, cluster, window=window, max_failures=budget)
    assert sup.run() == JobState.SUCCEEDED
    assert sleeps == [5] * 20


def test_window_since_progress_fails_a_crash_loop_that_follows_a_healthy_week(store, clock):
    """window: progress — a week of spaced failures with progress, then the script breaks for good."""
    cluster = LongCluster(failures=30, rounds=7)
    job_id, sup, sleeps = supervise(store, clock, cluster, window="progress", max_node_failures=2)
    orig = cluster.observe

    def observe(attempt, nodes):
        if len(cluster.started) > 20:          # from the 21st attempt on: lost at once, no progress
            cluster.checkpoints, cluster.rounds = False, 1
        return orig(attempt, nodes)
    cluster.observe = observe
    assert sup.run() == JobState.FAILED
    # attempt 20 made progress (its failure is the 1st since progress), 21 and 22 did not: 3 > 2 -> FAILED
    assert len(cluster.started) == 22
    assert "since the last progress" in store.get_job(job_id).reason
    assert sleeps == [5]


def test_reattached_supervisor_keeps_the_window_and_status_shows_it(store, clock):
    """A supervisor started again (controller restart) counts the failures charged before; `status` shows the
    budget use within the window at the time asked, on the store's clock."""
    cluster = LongCluster(failures=3, rounds=1, checkpoints=False, output=False, fault="user")
    job_id, sup, sleeps = supervise(store, clock, cluster, max_failures=10, window="2h")
    assert sup.run() == JobState.SUCCEEDED
    view = status_mod.job_view(store, store.get_job(job_id), now=clock())
    assert view["restarts"] == {"failures_used": 3, "max_failures": 10, "node_failures_used": 0,
                                "max_node_failures": 10, "window": "2h", "window_s": 7200.0}
    later = status_mod.job_view(store, store.get_job(job_id), now=clock() + 3 * HOUR)
    assert later["restarts"]["failures_used"] == 0

    sup2 = Supervisor(job_id, store, cluster, sup.policy, NODES, clock=clock, sleep=lambda s: None)
    assert len(sup2._charged_before()) == 3
    clock.advance(3 * HOUR)
    assert len([c for c in sup2._charged_before() if clock() - c.time < 7200]) == 0
    store.add_event(job_id, "resume", "resumed by user")        # `clusterctl resume` starts with fresh budgets
    assert sup2._charged_before() == []
