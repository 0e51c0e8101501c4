"""The supervisor and the rank view (issue 37): a stuck rank makes the attempt a hang naming its node and rank
(after its flight-recorder dumps are kept), a busy rank never does, stragglers are events and status's list, and
``stragglers: relaunch`` replaces a straggler's node by a spare. A fake cluster fed scripted rank views."""
import json

import pytest

from clusterctl.model.events import EventKind
from clusterctl.model.ranks import RankView
from clusterctl.store.state import JobState, Store
from clusterctl.supervise.supervisor import Policy, Supervisor
from clusterctl.views import status as status_view

from tests.unit.supervise.test_supervisor import FakeOps, obs

R, E = "running", "exited"
AR = {"pg": "0", "seq": 12, "op": "all_reduce"}


def rank(node, r, **kw):
    d = {"rank": r, "pid": 100 + r, "step": 40, "step_age_s": 0.3, "colls": 80, "coll_age_s": 0.2, "cpu_s": 9.0,
         "where": "train.py:40 step", "state": "training", "peers": {}}
    d.update(kw)
    return RankView.from_json(d, node=node)


def waiting(node, r, for_s):
    return rank(node, r, state="waiting", step_age_s=for_s, coll_age_s=for_s, **{"in": dict(AR, for_s=for_s)})


def round_(t, culprit=None, busy=None):
    """One round of a 3-node x 2-rank job, ``t`` s after rank 1's last step: rank 1 (node a) sleeps (``culprit``),
    or computes (``busy``), while every other rank waits in all_reduce #12."""
    out = {}
    for i, node in enumerate("abc"):
        for r in (2 * i, 2 * i + 1):
            if r == 1 and culprit:
                v = rank(node, r, state="still", step_age_s=t, coll_age_s=t, where="train.py:55 <module> sleep")
            elif r == 1 and busy:
                v = rank(node, r, state="busy", step_age_s=t, coll_age_s=t, cpu_s=9.0 + t)
            else:
                v = waiting(node, r, t - 0.5)
            out.setdefault(node, {})[r] = v
    return out


class RankOps(FakeOps):
    def __init__(self, script, views, **kw):
        super().__init__(script, **kw)
        self.views = list(views)
        self.rounds = 0
        self.dumped = []
        self.calls = []

    def observe(self, attempt, nodes):
        self.rounds += 1
        return super().observe(attempt, nodes)

    def rank_views(self, attempt):
        i = self.rounds - 1
        return self.views[i] if i < len(self.views) else {}

    def dump_ranks(self, attempt, nodes, dest_dir):
        self.calls.append("dump")
        self.dumped.append((attempt, tuple(nodes), dest_dir))
        import os
        os.makedirs(dest_dir, exist_ok=True)
        for r in range(6):
            open(os.path.join(dest_dir, f"fr-{r}"), "wb").close()
        return {}

    def stacks(self, attempt, nodes):
        self.calls.append("stacks")
        return "ranks 0,2-5: all_reduce"

    def stop(self, attempt, nodes):
        self.calls.append("stop")
        return super().stop(attempt, nodes)


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def run(store, ops, tmp_path, nodes=("a", "b", "c"), clock=None, **policy):
    job_id = store.create_job("demo", "{}", None, None)
    pol = Policy(**{"min_nodes": 3, "max_nodes": 3, "backoff_s": 0, "hang_timeout_s": 10**4, **policy})
    sup = Supervisor(job_id, store, ops, pol, list(nodes), clock=clock or iter(range(10**6)).__next__,
                     sleep=lambda s: None, job_dir=tmp_path, wall=lambda: 1000.0)
    return job_id, sup.run()


def test_a_stuck_rank_is_a_hang_naming_its_node_and_rank_with_every_ranks_dump_kept(store, tmp_path):
    ages = [1, 2, 5, 9, 14, 19, 20.5]          # rank 1's last progress, round by round
    views = [round_(t, culprit=t >= 5) for t in ages]
    steady = [obs(a=R, b=R, c=R)] * len(ages) + [obs(a=(E, 0), b=(E, 0), c=(E, 0))]
    ops = RankOps(steady, views)
    job_id, state = run(store, ops, tmp_path)
    assert state == JobState.SUCCEEDED and len(ops.started) == 2          # the job recovered and finished
    assert ops.rounds == len(ages) + 1                                    # the hang at 20.5 s, not before
    events = store.events(job_id)
    verdict = next(e for e in events if e.kind == EventKind.VERDICT)
    assert (verdict.klass, verdict.node, verdict.rank) == ("hang", "a", 1)
    assert "node a rank 1 stuck in train.py:55 <module> sleep" in verdict.message
    assert "while its peers wait in all_reduce #12" in verdict.message
    stuck = [e for e in events if e.kind == EventKind.STUCK]              # named rounds before the verdict
    assert stuck[0].id < verdict.id and (stuck[0].node, stuck[0].rank, stuck[0].klass) == ("a", 1, "stuck")
    assert ops.calls[:3] == ["stacks", "dump", "stop"]                    # both before the gang-stop
    assert ops.dumped == [(1, ("a", "b", "c"), str(tmp_path / "hang-1"))]
    kept = next(e for e in events if e.kind == EventKind.STACKS and e.klass == "dump")
    assert str(tmp_path / "hang-1") in kept.message and "6 files" in kept.message
    doc = json.loads((tmp_path / "ranks.json").read_text())
    row = next(r for r in doc["ranks"] if r["rank"] == 1)
    assert (doc["attempt"], row["node"], row["state"]) == (1, "a", "stuck")
    assert [r["state"] for r in doc["ranks"] if r["rank"] != 1] == ["waiting"] * 5


def test_status_names_the_stuck_rank_before_the_verdict(store, tmp_path):
    views = [round_(t, culprit=True) for t in (5, 6)]
    ops = RankOps([obs(a=R, b=R, c=R)] * 2 + [obs(a=(E, 0), b=(E, 0), c=(E, 0))], views)
    job_id = store.create_job("demo", "{}", None, None)
    pol = Policy(min_nodes=3, max_nodes=3, backoff_s=0, hang_timeout_s=10**4)
    seen = []

    class Peek(Supervisor):
        def _look_at_ranks(self, attempt, nodes, o, now):
            d = super()._look_at_ranks(attempt, nodes, o, now)
            seen.append(status_view.job_view(self.store, self.store.get_job(self.job_id)))
            return d

    Peek(job_id, store, ops, pol, ["a", "b", "c"], clock=iter(range(10**6)).__next__, sleep=lambda s: None,
         job_dir=tmp_path).run()
    v = seen[0]
    assert [(x["node"], x["rank"]) for x in v["stuck"]] == [("a", 1)]
    text = "\n".join(status_view.text(v))
    assert "STUCK     node a rank 1 stuck in train.py:55 <module> sleep" in text and "all_reduce #12" in text
    end = status_view.job_view(store, store.get_job(job_id))
    assert end["stuck"] == [] and end["stragglers"] == []          # the job ended: nothing is stuck now


def test_a_busy_rank_computing_silently_is_never_a_hang(store, tmp_path):
    ages = [1, 20, 60, 120, 200]
    views = [round_(t, busy=True) for t in ages]
    ops = RankOps([obs(a=R, b=R, c=R)] * len(ages) + [obs(a=(E, 0), b=(E, 0), c=(E, 0))], views)
    job_id, state = run(store, ops, tmp_path)
    assert state == JobState.SUCCEEDED and len(ops.started) == 1          # one attempt
    assert not [e for e in store.events(job_id) if e.kind in (EventKind.STUCK,)]
    assert [e.klass for e in store.events(job_id) if e.kind == EventKind.VERDICT] == ["success"]


def test_stuck_timeout_0_is_off(store, tmp_path):
    views = [round_(t, culprit=True) for t in (5, 30, 60)]
    ops = RankOps([obs(a=R, b=R, c=R)] * 3 + [obs(a=(E, 0), b=(E, 0), c=(E, 0))], views)
    _, state = run(store, ops, tmp_path, stuck_timeout_s=0)
    assert state == JobState.SUCCEEDED and len(ops.started) == 1


def straggling(slow_rank=3, late=0.1, n=32, colls=80):
    out = {}
    for i, node in enumerate("abc"):
        for r in (2 * i, 2 * i + 1):
            arr = [[s, 10**12 + int((s * 0.2 + (late if r == slow_rank else 0)) * 1e9)] for s in range(n)]
            out.setdefault(node, {})[r] = rank(node, r, arrivals=arr, colls=colls)
    return out


def rounds(k, **kw):
    """``k`` rounds of ``straggling`` views whose collectives go on completing (a round's ``colls`` more)."""
    return [straggling(colls=80 + 50 * i, **kw) for i in range(k)]


class Clock:
    """Each round takes 10 s (the supervisor reads the clock several times a round: only observe moves it)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self):
        return self.t


def test_a_straggler_is_an_event_and_in_status_and_cleared_when_it_recovers(store, tmp_path):
    clock = Clock()
    views = rounds(8) + [straggling(late=0.0, colls=500 + 50 * i) for i in range(8)]

    class Timed(RankOps):
        def observe(self, attempt, nodes):
            clock.t += 10
            return super().observe(attempt, nodes)

    ops = Timed([obs(a=R, b=R, c=R)] * 16 + [obs(a=(E, 0), b=(E, 0), c=(E, 0))], views)
    job_id = store.create_job("demo", "{}", None, None)
    pol = Policy(min_nodes=3, max_nodes=3, backoff_s=0, hang_timeout_s=10**4)
    seen = []

    class Peek(Supervisor):
        def _look_at_ranks(self, attempt, nodes, o, now):
            d = super()._look_at_ranks(attempt, nodes, o, now)
            job = self.store.get_job(self.job_id)
            seen.append(status_view.job_view(self.store, job)["stragglers"])
            return d

    state = Peek(job_id, store, ops, pol, ["a", "b", "c"], clock=clock, sleep=lambda s: None, job_dir=tmp_path).run()
    assert state == JobState.SUCCEEDED and len(ops.started) == 1         # warn: no action
    named = [e for e in store.events(job_id) if e.kind == EventKind.STRAGGLER]
    assert [(e.klass, e.node, e.rank) for e in named] == [("named", "b", 3), ("recovered", "b", 3)]
    assert "2.00x slower" in named[0].message
    assert seen[0] == [] and seen[7] == [{"node": "b", "rank": 3, "slowdown": 2.0}] and seen[-1] == []


def test_a_long_pause_with_one_late_arrival_in_the_window_is_no_straggler(store, tmp_path):
    """Every rank waits for one that computes silently (or writes a checkpoint) for minutes: no collective completes,
    the arrivals' window stands still with its late arrival in it. That is a pause, not a rank every step waits for
    (the soak named every rank a straggler so before); once collectives complete again the window moves on."""
    clock = Clock()

    class Timed(RankOps):
        def observe(self, attempt, nodes):
            clock.t += 10
            return super().observe(attempt, nodes)

    pause = [straggling(late=1.0)] * 20           # 200 s, its collectives' count standing still
    ops = Timed([obs(a=R, b=R, c=R)] * 20 + [obs(a=(E, 0), b=(E, 0), c=(E, 0))], pause)
    job_id = store.create_job("demo", "{}", None, None)
    pol = Policy(min_nodes=3, max_nodes=3, backoff_s=0, hang_timeout_s=10**4)
    state = Supervisor(job_id, store, ops, pol, ["a", "b", "c"], clock=clock, sleep=lambda s: None,
                       job_dir=tmp_path).run()
    assert state == JobState.SUCCEEDED
    assert [e for e in store.events(job_id) if e.kind == EventKind.STRAGGLER] == []


def test_stragglers_relaunch_replaces_its_node_by_a_spare(store, tmp_path):
    clock = Clock()

    class Timed(RankOps):
        def observe(self, attempt, nodes):
            clock.t += 10
            return super().observe(attempt, nodes)

    ops = Timed([obs(a=R, b=R, c=R)] * 8 + [obs(a=(E, 0), c=(E, 0), d=(E, 0))], rounds(8))
    job_id = store.create_job("demo", "{}", None, None)
    pol = Policy(min_nodes=3, max_nodes=3, backoff_s=0, hang_timeout_s=10**4, stragglers="relaunch")
    state = Supervisor(job_id, store, ops, pol, ["a", "b", "c", "d"], clock=clock, sleep=lambda s: None,
                       job_dir=tmp_path).run()
    assert state == JobState.SUCCEEDED
    assert [s[1] for s in ops.started] == [("a", "b", "c"), ("a", "c", "d")]
    v = next(e for e in store.events(job_id) if e.kind == EventKind.VERDICT)
    assert (v.klass, v.node, v.rank) == ("straggler", "b", 3) and "relaunching with d in its place" in v.message


def test_stragglers_relaunch_without_a_spare_only_warns(store, tmp_path):
    clock = Clock()

    class Timed(RankOps):
        def observe(self, attempt, nodes):
            clock.t += 10
            return super().observe(attempt, nodes)

    ops = Timed([obs(a=R, b=R, c=R)] * 8 + [obs(a=(E, 0), b=(E, 0), c=(E, 0))], rounds(8))
    job_id = store.create_job("demo", "{}", None, None)
    pol = Policy(min_nodes=3, max_nodes=3, backoff_s=0, hang_timeout_s=10**4, stragglers="relaunch")
    state = Supervisor(job_id, store, ops, pol, ["a", "b", "c"], clock=clock, sleep=lambda s: None,
                       job_dir=tmp_path).run()
    assert state == JobState.SUCCEEDED and len(ops.started) == 1
