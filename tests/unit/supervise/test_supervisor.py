"""The supervisor loop driven by a fake cluster fed scripted observations (no network, no sleeps)."""
import itertools
from collections import deque

import pytest

from clusterctl.model.verdicts import ErrorKind, NodeError, NodeStarted, Observation, Started, Verdict
from clusterctl.store.state import JobState, Store
from clusterctl.supervise.supervisor import Health, NodeOps, PEER_SETTLE, Policy, Supervisor, classify

R, E, M, U = "running", "exited", "missing", "unreachable"


def obs(**states):
    out = []
    for node, st in states.items():
        if isinstance(st, tuple):
            out.append(Observation(node, st[0], exit_code=st[1], signal=st[2] if len(st) > 2 else None))
        else:
            out.append(Observation(node, st, exit_code=0 if st == E else None, progress=st == R))
    return out


def test_classify_needs_k_failed_probes_before_a_node_is_lost():
    h = Health(0, 0)
    kw = dict(rdzv_host="a", probe_failures=3, hang_timeout_s=100)
    assert classify(obs(a=R, b=U), h, now=1, **kw).verdict == Verdict.CONTINUE
    assert classify(obs(a=R, b=U), h, now=2, **kw).verdict == Verdict.CONTINUE
    assert classify(obs(a=R, b=R), h, now=3, **kw).verdict == Verdict.CONTINUE   # a success resets the count
    for t in (4, 5):
        assert classify(obs(a=R, b=U), h, now=t, **kw).verdict == Verdict.CONTINUE
    d = classify(obs(a=R, b=U), h, now=6, **kw)
    assert (d.verdict, d.lost) == (Verdict.NODE_LOST, ("b",))


@pytest.mark.parametrize("states,verdict", [
    (dict(a=(E, 0), b=(E, 0)), Verdict.SUCCESS),
    (dict(a=R, b=(E, 1)), Verdict.USER_ERROR),
    (dict(a=(E, 1), b=M), Verdict.NODE_LOST),                 # survivors' errors are consequences
    (dict(a=(E, 137, "SIGKILL"), b=(E, 1)), Verdict.RDZV_LOST),
    (dict(a=R, b=(E, 0)), Verdict.CONTINUE),
])
def test_classify(states, verdict):
    assert classify(obs(**states), Health(0, 0), rdzv_host="a", probe_failures=3, hang_timeout_s=100,
                    now=1).verdict == verdict


def test_classify_hang_without_progress():
    h = Health(0, 0)
    quiet = [Observation("a", R), Observation("b", R)]
    assert classify(quiet, h, rdzv_host="a", probe_failures=3, hang_timeout_s=10, now=5).verdict == Verdict.CONTINUE
    assert classify(quiet, h, rdzv_host="a", probe_failures=3, hang_timeout_s=10, now=11).verdict == Verdict.HANG


class FakeOps(NodeOps):
    def __init__(self, script, reachable=None, checkpoint=("", 0)):
        self.script = deque(script)          # one list of observations per probe round
        self.started, self.stopped = [], []
        self.reach = reachable
        self.checkpoint = checkpoint

    def start(self, attempt, nodes, rdzv_host, resume):
        self.started.append((attempt, tuple(nodes), rdzv_host, resume))
        return Started()

    def observe(self, attempt, nodes):
        return [o for o in self.script.popleft() if o.node in nodes]

    def stop(self, attempt, nodes):
        self.stopped.append((attempt, tuple(nodes)))
        return {}

    def reachable(self, nodes):
        return [n for n in nodes if self.reach is None or n in self.reach]

    def latest_checkpoint(self, nodes):
        return self.checkpoint

    def stop_requested(self):
        return False


@pytest.fixture
def store(tmp_path):
    s = Store(tmp_path / "state.db")
    yield s
    s.close()


def run(store, ops, **policy):
    job_id = store.create_job("demo", "{}", None, None)
    pol = Policy(**{"min_nodes": 2, "max_nodes": 3, "backoff_s": 0, **policy})
    sleeps = []
    sup = Supervisor(job_id, store, ops, pol, ["a", "b", "c"], clock=iter(range(10**6)).__next__,
                     sleep=sleeps.append)
    return job_id, sup.run(), sleeps


def test_node_lost_relaunches_without_it_with_new_rendezvous_host(store):
    ops = FakeOps([obs(a=R, b=R, c=R), obs(a=M, b=(E, 1), c=R), obs(b=(E, 0), c=(E, 0))],
                  checkpoint=("/ck/step-000000010", 10))
    job_id, state, _ = run(store, ops)
    assert state == JobState.SUCCEEDED
    assert [s[:3] for s in ops.started] == [(1, ("a", "b", "c"), "a"), (2, ("b", "c"), "b")]
    assert ops.started[1][3] == ("/ck/step-000000010", 10)
    assert ops.stopped[0] == (1, ("a", "b", "c"))    # gang-stop: survivors + the lost node's dead container
    job = store.get_job(job_id)
    assert (job.node_failures_used, job.failures_used) == (1, 0)
    kinds = [e.klass for e in store.events(job_id) if e.kind == "verdict"]
    assert kinds == ["rendezvous_lost", "success"]


def test_a_steady_job_reads_the_stop_request_every_third_round_and_a_verdict_at_once(store):
    class StopAfter(FakeOps):
        """``stop`` was run before round ``at``; its processes ended (or not: ``ended``) in that round."""

        def __init__(self, script, at):
            super().__init__(script)
            self.at, self.rounds, self.asked = at, 0, []

        def observe(self, attempt, nodes):
            self.rounds += 1
            return super().observe(attempt, nodes)

        def stop_requested(self):
            self.asked.append(self.rounds)
            return self.rounds >= self.at - 1

    steady = [obs(a=R, b=R, c=R)] * 9
    ops = StopAfter(steady, at=5)                   # nodes unreachable for `stop`: nothing ends
    _, state, _ = run(store, ops)
    assert state == JobState.STOPPED
    assert ops.asked == [0, 3, 6] and ops.rounds == 6    # a DB read per 3 rounds: seen within 3 probe intervals
    killed = [obs(a=R, b=R, c=R)] * 4 + [obs(a=(E, 143, "SIGTERM"), b=(E, 143, "SIGTERM"), c=(E, 143, "SIGTERM"))]
    ops = StopAfter(killed, at=5)                   # `stop` ended the processes: the watches say so at once
    _, state, _ = run(store, ops)
    assert state == JobState.STOPPED
    assert ops.asked == [0, 3, 5] and ops.rounds == 5


def test_user_errors_spend_their_own_budget_then_fail(store):
    rounds = [obs(a=(E, 1), b=(E, 1), c=(E, 1))] * 5
    job_id, state, sleeps = run(store, FakeOps(rounds), max_failures=2, backoff_s=1)
    assert state == JobState.FAILED
    job = store.get_job(job_id)
    assert job.failures_used == 3 and job.node_failures_used == 0
    assert "restarts.max_failures" in job.reason and "exited with code 1" in job.reason
    assert sleeps.count(1) >= 1 and 2 in sleeps                # exponential backoff


def test_below_min_nodes_waits_then_fails(store):
    ops = FakeOps([obs(a=R, b=R, c=R), obs(a=R, b=M, c=M)], reachable={"a"})
    ops.reach = None
    orig = ops.reachable
    calls = {"n": 0}

    def reachable(nodes):
        calls["n"] += 1
        return orig(nodes) if calls["n"] == 1 else [n for n in nodes if n == "a"]
    ops.reachable = reachable
    job_id, state, _ = run(store, ops, wait_for_nodes_s=5, probe_interval_s=1)
    assert state == JobState.FAILED
    assert "fewer than 2 healthy nodes" in store.get_job(job_id).reason


def test_a_failed_rank_waits_for_a_dying_peer_before_calling_it_a_user_error():
    """Killing a node makes the survivors' ranks exit 1 (gloo/c10d errors), often before the dead node is seen."""
    h = Health(0, 0)
    kw = dict(rdzv_host="a", probe_failures=2, hang_timeout_s=100, settle_s=3)
    assert classify(obs(a=(E, 1), b=R, c=R), h, now=1, **kw).verdict == Verdict.CONTINUE
    d = classify(obs(a=(E, 1), b=M, c=R), h, now=2, **kw)
    assert (d.verdict, d.lost, d.unreachable) == (Verdict.NODE_LOST, ("b",), ())


def test_a_failed_rank_with_an_unreachable_peer_waits_for_k_probes():
    h = Health(0, 0)
    kw = dict(rdzv_host="a", probe_failures=2, hang_timeout_s=100, settle_s=1)
    assert classify(obs(a=U, b=(E, 1), c=(E, 1)), h, now=1, **kw).verdict == Verdict.CONTINUE
    d = classify(obs(a=U, b=(E, 1), c=(E, 1)), h, now=9, **kw)
    assert (d.verdict, d.lost, d.unreachable) == (Verdict.RDZV_LOST, ("a",), ("a",))


def test_a_failed_rank_is_a_user_error_after_settling_or_when_nothing_runs():
    kw = dict(rdzv_host="a", probe_failures=2, hang_timeout_s=100, settle_s=3)
    h = Health(0, 0)
    assert classify(obs(a=(E, 1), b=R), h, now=1, **kw).verdict == Verdict.CONTINUE
    assert classify(obs(a=(E, 1), b=R), h, now=3, **kw).verdict == Verdict.CONTINUE
    assert classify(obs(a=(E, 1), b=R), h, now=4, **kw).verdict == Verdict.USER_ERROR
    assert classify(obs(a=(E, 1), b=(E, 1)), Health(0, 0), now=1, **kw).verdict == Verdict.USER_ERROR


GLOO_PEER = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:534] "
             "Connection closed by peer [10.220.0.12]:41234")


def test_a_rank_failed_by_its_peer_waits_longer_for_the_peers_node_then_charges_its_killed_rank():
    """ci15: a rank SIGKILLed on b; a's rank fails at once with gloo's "Connection closed by peer" while b's
    torchrun still stops b's other rank. The verdict waits (bounded) for b, and charges b's signal, not a."""
    kw = dict(rdzv_host="a", probe_failures=2, hang_timeout_s=100, settle_s=3)
    a_failed = Observation("a", E, exit_code=1, error_tail=GLOO_PEER, rank=0)
    h = Health(0, 0)
    assert classify([a_failed, Observation("b", R)], h, now=1, **kw).verdict == Verdict.CONTINUE
    assert classify([a_failed, Observation("b", R)], h, now=5, **kw).verdict == Verdict.CONTINUE   # > settle_s
    d = classify([a_failed, Observation("b", E, exit_code=1, signal="SIGKILL", rank=3)], h, now=6, **kw)
    assert (d.verdict, d.node, d.signal, d.rank) == (Verdict.KILLED, "b", "SIGKILL", 3)
    # bounded: a peer that never ends leaves the failed rank a user error after PEER_SETTLE x settle_s
    assert classify([a_failed, Observation("b", R)], h, now=1 + 3 * PEER_SETTLE, **kw).verdict == \
        Verdict.USER_ERROR
    # a rank that failed on its own (no peer message) waits settle_s only, as before
    own = Observation("a", E, exit_code=1, error_tail="ValueError: bad batch", rank=0)
    h = Health(0, 0)
    assert classify([own, Observation("b", R)], h, now=1, **kw).verdict == Verdict.CONTINUE
    assert classify([own, Observation("b", R)], h, now=5, **kw).verdict == Verdict.USER_ERROR


def test_a_user_error_is_charged_to_the_rank_that_failed_on_its_own_not_to_its_peers():
    """b's rank raised; a's rank then failed with gloo's "Connection closed by peer" and a is first in the
    listing: the verdict names b, its rank and its own error."""
    kw = dict(rdzv_host="a", probe_failures=2, hang_timeout_s=100, settle_s=3)
    a = Observation("a", E, exit_code=1, error_tail=GLOO_PEER, rank=0)
    b = Observation("b", E, exit_code=1, error_tail="ValueError: bad batch", rank=2)
    d = classify([a, b], Health(0, 0), now=1, **kw)
    assert (d.verdict, d.node, d.rank, d.error_tail) == (Verdict.USER_ERROR, "b", 2, "ValueError: bad batch")


def test_unreachable_lost_node_is_not_stopped_now_but_cleaned_up_at_the_end_when_back(store):
    ops = FakeOps([obs(a=R, b=R, c=R), obs(a=R, b=R, c=U), obs(a=R, b=R, c=U), obs(a=(E, 0), b=(E, 0))],
                  checkpoint=("/ck/step-000000020", 20))
    job_id, state, sleeps = run(store, ops, probe_failures=2, backoff_s=5)
    assert state == JobState.SUCCEEDED
    assert ops.stopped[0] == (1, ("a", "b"))                     # c does not answer: not waited for
    assert [s[:3] for s in ops.started] == [(1, ("a", "b", "c"), "a"), (2, ("a", "b"), "a")]
    assert 5 not in sleeps                                       # first infrastructure failure: no backoff
    assert (None, ("c",)) in ops.stopped                         # c answers again at the end: leftovers removed
    ev = [(e.kind, e.klass, e.node) for e in store.events(job_id)]
    assert ("verdict", "node_lost", "c") in ev and ("cleanup", None, None) in ev


def test_unreachable_lost_node_still_down_at_the_end_is_reported(store):
    ops = FakeOps([obs(a=R, b=R, c=U), obs(a=R, b=R, c=U), obs(a=(E, 0), b=(E, 0))])
    orig = ops.reachable
    ops.reachable = lambda nodes: [n for n in orig(nodes) if n != "c" or len(ops.started) == 0]
    job_id, state, _ = run(store, ops, probe_failures=2)
    assert state == JobState.SUCCEEDED
    assert all("c" not in nodes for _, nodes in ops.stopped)
    pending = [e for e in store.events(job_id) if e.kind == "cleanup_pending"]
    assert pending and pending[0].node == "c" and "clusterctl stop" in pending[0].message


def test_repeated_infrastructure_failures_back_off(store):
    rounds = [obs(a=R, b=R, c=M), obs(a=R, b=M), obs(a=M, b=R)]
    ops = FakeOps(rounds, reachable=None)
    ops.reachable = lambda nodes: list(nodes)
    job_id, state, sleeps = run(store, ops, max_node_failures=1, backoff_s=2)
    assert state == JobState.FAILED
    assert "restarts.max_node_failures" in store.get_job(job_id).reason
    assert 2 not in sleeps                                       # the first one was relaunched at once


def test_a_config_error_fails_after_one_attempt_without_a_retry(store):
    bad = [Observation(n, E, exit_code=1, rank=0, error_tail="can't open file",
                       config_error="python can't open the job's script 'tran.py'. Fix: fix `script:`")
           for n in ("a", "b", "c")]
    ops = FakeOps([bad] * 5)
    job_id, state, sleeps = run(store, ops, max_failures=3, backoff_s=1)
    assert state == JobState.FAILED and len(ops.started) == 1 and not sleeps
    job = store.get_job(job_id)
    assert "tran.py" in job.reason and "config_error" in job.reason and job.failures_used == 0
    assert [e.klass for e in store.events(job_id) if e.kind == "verdict"] == ["config_error"]


def test_a_rank_killed_by_a_signal_is_class_killed_and_spends_the_user_budget(store):
    killed = [Observation("a", R), Observation("b", E, exit_code=1, signal="SIGKILL", rank=3, oom=True),
              Observation("c", R)]
    ops = FakeOps([obs(a=R, b=R, c=R), killed, obs(a=(E, 0), b=(E, 0), c=(E, 0))])
    job_id, state, _ = run(store, ops, settle_s=0)
    assert state == JobState.SUCCEEDED
    v = [e for e in store.events(job_id) if e.kind == "verdict"][0]
    assert (v.klass, v.node, v.rank, v.signal, v.oom) == ("killed", "b", 3, "SIGKILL", True)
    assert "out of memory" in v.message
    job = store.get_job(job_id)
    assert (job.failures_used, job.node_failures_used) == (1, 0)


def test_an_unknown_checkpoint_is_asked_again_never_taken_as_none(store):
    ops = FakeOps([obs(a=(E, 0), b=(E, 0), c=(E, 0))])
    answers = itertools.chain([None, None], itertools.repeat(("/ck/step-000000040", 40)))
    ops.latest_checkpoint = lambda nodes: next(answers)
    job_id, state, sleeps = run(store, ops, probe_interval_s=1)
    assert state == JobState.SUCCEEDED and ops.started[0][3] == ("/ck/step-000000040", 40)
    assert sleeps.count(1) == 2


class FailingOps(FakeOps):
    """``start`` fails on the nodes in ``start_errors`` (the starts numbered in ``fail_starts``, from 1), ``stop``
    on those in ``stop_errors``: typed ``NodeError`` values."""

    def __init__(self, script, *, start_errors=(), stop_errors=(), fail_starts=(1,), **kw):
        super().__init__(script, **kw)
        self.start_errors, self.stop_errors, self.fail_starts = start_errors, stop_errors, fail_starts

    def start(self, attempt, nodes, rdzv_host, resume):
        super().start(attempt, nodes, rdzv_host, resume)
        if len(self.started) not in self.fail_starts:
            return Started()
        return Started(errors={e.node: e for e in self.start_errors if e.node in nodes})

    def stop(self, attempt, nodes):
        super().stop(attempt, nodes)
        return {e.node: e for e in self.stop_errors if e.node in nodes}


def test_a_first_start_that_fails_ends_the_job_with_the_nodes_message(store):
    ops = FailingOps([], start_errors=[NodeError("b", ErrorKind.COMMAND_FAILED, "Error: image not known")])
    job_id, state, _ = run(store, ops)
    assert state == JobState.FAILED
    assert store.get_job(job_id).reason == ("launch failed: b could not start: Error: image not known (what started "
                                            "on the other nodes was removed)")
    ev = [(e.kind, e.node, e.message) for e in store.events(job_id) if e.kind == "start_failed"]
    assert ev == [("start_failed", "b", "attempt 1: b failed to start: Error: image not known")]


def test_a_later_start_that_fails_leaves_the_node_out_and_a_failed_cleanup_is_pending(store):
    timeout = NodeError("c", ErrorKind.TIMEOUT, "c: no answer within 90s")
    ops = FailingOps([obs(a=M, b=R, c=R), obs(b=(E, 0))], start_errors=[timeout], fail_starts=(2,),
                     stop_errors=[NodeError("a", ErrorKind.UNREACHABLE, "a: connection lost: EOF")])
    ops.reachable = lambda nodes: [n for n in nodes if n != "a" or len(ops.started) < 2]
    job_id, state, _ = run(store, ops, min_nodes=1)
    assert state == JobState.SUCCEEDED
    assert [s[1] for s in ops.started] == [("a", "b", "c"), ("b", "c"), ("b",)]     # c left out after failing
    msgs = [(e.kind, e.message) for e in store.events(job_id) if e.kind in ("start_failed", "cleanup_pending")]
    assert ("start_failed", "attempt 2: c failed to start: c: no answer within 90s") in msgs
    assert ("cleanup_pending", "could not clean up a: a: connection lost: EOF (run `clusterctl stop` when it is "
                               "reachable again)") in msgs


# ------------------------------------------------------------------ `stop` wins at every point of the loop
class UserStops(FakeOps):
    """A fake cluster whose ``clusterctl stop`` (the CLI's write: state STOPPED) lands at a chosen moment:
    ``during="backoff"`` (while the supervisor sleeps before the next attempt), ``"start"`` (while the nodes
    start: containers started after the stop), ``"verdict"`` (between the last probe round and RECOVERING)."""

    def __init__(self, script, store, job_id, during):
        super().__init__(script)
        self.store, self.job_id, self.during = store, job_id, during
        self.states_at_stop = []

    def user_stop(self):
        if self.store.job_state(self.job_id) != JobState.STOPPED:
            self.store.set_state(self.job_id, JobState.STOPPED, "stopped by user")

    def start(self, attempt, nodes, rdzv_host, resume):
        out = super().start(attempt, nodes, rdzv_host, resume)
        if self.during == "start" and attempt == 2:
            self.user_stop()
        return out

    def observe(self, attempt, nodes):
        got = super().observe(attempt, nodes)
        if self.during == "verdict" and any(o.state == M for o in got):
            self.user_stop()
        return got

    def stop(self, attempt, nodes):
        self.states_at_stop.append(self.store.job_state(self.job_id))
        return super().stop(attempt, nodes)

    def stop_requested(self):
        return self.store.job_state(self.job_id) == JobState.STOPPED


@pytest.mark.parametrize("during", ["backoff", "start", "verdict"])
def test_a_stop_between_two_steps_wins_and_the_supervisor_cleans_up(store, during):
    job_id = store.create_job("demo", "{}", None, None)
    lost_then_steady = [obs(a=R, b=R, c=R), obs(a=M, b=R, c=R)] + [obs(b=R, c=R)] * 5
    failing = [obs(a=(E, 1), b=(E, 1), c=(E, 1))] * 5         # user errors: a relaunch waits a backoff
    ops = UserStops(failing if during == "backoff" else lost_then_steady, store, job_id, during)
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        if during == "backoff":
            ops.user_stop()

    sup = Supervisor(job_id, store, ops, Policy(min_nodes=2, max_nodes=3, backoff_s=5),
                     ["a", "b", "c"], clock=iter(range(10**6)).__next__, sleep=sleep, wait=lambda s: None)
    assert sup.run() == JobState.STOPPED                       # returned: no InvalidTransition escaped
    job = store.get_job(job_id)
    assert job.state == JobState.STOPPED and job.reason == "stopped by user"
    started = [s[0] for s in ops.started]
    assert started == {"backoff": [1], "start": [1, 2], "verdict": [1]}[during]   # none after the stop
    assert len(sleeps) == (1 if during == "backoff" else 0)
    assert ops.stopped[-1] == (None, ("a", "b", "c"))          # everything removed, what started after the stop too
    assert all(a.ended_at is not None for a in store.attempts(job_id))
    if during == "start":
        assert store.attempts(job_id)[-1].result == "stopped"
    assert [e.kind for e in store.events(job_id)][-1] == "end"


def test_success_is_recorded_before_the_containers_are_removed(store):
    """A supervisor killed between the cleanup and the end must not leave a finished job that `resume` re-runs."""
    job_id = store.create_job("demo", "{}", None, None)
    ops = UserStops([obs(a=R, b=R, c=R), obs(a=E, b=E, c=E)], store, job_id, during=None)
    sup = Supervisor(job_id, store, ops, Policy(min_nodes=2, max_nodes=3), ["a", "b", "c"],
                     clock=iter(range(10**6)).__next__, sleep=lambda s: None)
    assert sup.run() == JobState.SUCCEEDED
    assert ops.states_at_stop == [JobState.SUCCEEDED]


def test_an_attempt_recorded_succeeded_makes_the_job_succeeded_not_relaunched(store):
    """The supervisor died between recording the attempt's success and the job's end: `status`/`resume`
    (reconcile) finish the job instead of judging the (removed) containers and relaunching."""
    from clusterctl.supervise.reconcile import reconcile

    job_id = store.create_job("demo", "{}", None, None)
    store.set_state(job_id, JobState.STARTING)
    store.start_attempt(job_id, 1, "a", f"{job_id}-1", ["a", "b"])
    store.set_state(job_id, JobState.RUNNING)
    store.end_attempt(job_id, 1, "succeeded")

    class NoNodes(NodeOps):
        def observe(self, *a, **k):
            return [Observation("a", M), Observation("b", M)]    # the containers were already removed

        def latest_checkpoint(self, nodes):
            return ("", 0)

        def stop(self, attempt, nodes, grace_s=0.0):     # the job's end removes its leftovers (zygotes, warm dirs)
            return {}

    found = reconcile(store, job_id, NoNodes(), deadline_s=1)
    assert found.state == JobState.SUCCEEDED
    assert store.get_job(job_id).state == JobState.SUCCEEDED


def test_a_probe_that_raises_is_a_probe_error_never_a_lost_node(capsys):
    """A bug in a probe (here a parser's KeyError) is not a node that does not answer: it is logged with its
    traceback and never counted towards `node_lost`; a transport error still is."""
    from clusterctl.errors import ConnectError
    from clusterctl.supervise.probe import probe_failed

    def parse(text):
        return {}["state"]

    try:
        parse("x")
    except KeyError as e:
        bug = e
    o = probe_failed("b", bug)
    assert o.state == "probe_error" and "KeyError" in o.error_tail
    err = capsys.readouterr().err
    assert "Traceback" in err and "in parse" in err
    assert probe_failed("b", ConnectError("b", "connection lost")).state == U
    h = Health(0, 0)
    for t in range(1, 20):
        d = classify([Observation("a", R, progress=True), o], h, rdzv_host="a", probe_failures=2,
                     hang_timeout_s=100, now=t)
        assert d.verdict == Verdict.CONTINUE


ECC = "[c/2] RuntimeError: CUDA error: uncorrectable ECC error encountered"


def gpu_failed(node, rank=2, evidence=ECC):
    return Observation(node, E, exit_code=1, rank=rank, error_tail=evidence, gpu_error=evidence)


def test_a_rank_that_died_of_its_gpu_is_a_gpu_error_at_once_naming_node_rank_and_evidence():
    """The peers fail because of it (gloo/NCCL), before or after it: the evidence decides, no settling."""
    kw = dict(rdzv_host="a", probe_failures=2, hang_timeout_s=100, settle_s=3)
    peer = "[a/0] RuntimeError: [gloo/transport/tcp/pair.cc:534] Connection closed by peer [10.0.0.3]:4242"
    d = classify([Observation("a", E, exit_code=1, rank=0, error_tail=peer), Observation("b", R), gpu_failed("c")],
                 Health(0, 0), now=1, **kw)
    assert (d.verdict, d.node, d.rank, d.lost) == (Verdict.GPU_ERROR, "c", 2, ("c",))
    assert "node c rank 2" in d.message and "uncorrectable ECC error encountered" in d.message
    # without the evidence the same exit is a user error (after settling), as before
    d = classify([Observation("a", R), Observation("c", E, exit_code=1, rank=2, error_tail=ECC)], Health(0, 0),
                 now=10, **kw)
    assert d.verdict != Verdict.GPU_ERROR
    # a lost node still wins (its node is gone: the GPU error may be a consequence)
    d = classify([Observation("a", M), gpu_failed("c")], Health(0, 0), now=1, **kw)
    assert d.verdict == Verdict.RDZV_LOST


def test_gpu_error_spends_the_node_budget_relaunches_without_the_node_and_counts_for_cordon(store):
    xid = "kernel: Xid 79 on PCI:0000:86:00: [ 5702.8] NVRM: Xid (PCI:0000:86:00): 79, GPU has fallen off the bus."
    ops = FakeOps([obs(a=R, b=R, c=R), [Observation("a", R), Observation("b", R), gpu_failed("c", 5, xid)],
                   obs(a=(E, 0), b=(E, 0))], checkpoint=("/ck/step-000000010", 10))
    job_id, state, _ = run(store, ops, cordon_after=1)
    assert state == JobState.SUCCEEDED
    assert [s[:3] for s in ops.started] == [(1, ("a", "b", "c"), "a"), (2, ("a", "b"), "a")]
    job = store.get_job(job_id)
    assert (job.node_failures_used, job.failures_used) == (1, 0)        # restarts.max_node_failures
    v = next(e for e in store.events(job_id) if e.kind == "verdict")
    assert (v.klass, v.node, v.rank) == ("gpu_error", "c", 5) and "Xid 79" in v.message
    assert "c" in store.cordons()                                       # cordon_after counts it


def test_gpu_error_node_comes_back_when_fewer_than_min_nodes_remain(store):
    ops = FakeOps([obs(a=R, b=R), [Observation("a", R), gpu_failed("b")], obs(a=(E, 0), b=(E, 0))])
    job_id = store.create_job("demo", "{}", None, None)
    sup = Supervisor(job_id, store, ops, Policy(min_nodes=2, max_nodes=2, backoff_s=0), ["a", "b"],
                     clock=iter(range(10**6)).__next__, sleep=lambda s: None)
    assert sup.run() == JobState.SUCCEEDED
    assert [s[1] for s in ops.started] == [("a", "b"), ("a", "b")]     # MIN 2: b is used again


WATCHDOG = ("[b/1] [rank1]:[E1218 20:27:21.433063423 ProcessGroupNCCL.cpp:629] [Rank 1] Watchdog caught collective "
            "operation timeout: WorkNCCL(SeqNum=9, OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) ran "
            "for 600081 milliseconds before timing out.\n[b/1] terminate called after throwing an instance of "
            "'c10::DistBackendError'")


@pytest.mark.parametrize("order", ["culprit first", "victim first"])
def test_with_nccl_the_rank_that_exited_1_is_the_culprit_not_the_peer_its_watchdog_aborted(order):
    """NCCL: the rank that failed exits 1; its peers wait in the collective until the watchdog aborts them
    (SIGABRT). A signal alone used to make the victim the culprit (`killed` by SIGABRT on the wrong node)."""
    culprit = Observation("a", E, exit_code=1, rank=0, error_tail="[a/0] ValueError: bad batch")
    victim = Observation("b", E, exit_code=134, signal="SIGABRT", rank=1, error_tail=WATCHDOG)
    o = [culprit, victim] if order == "culprit first" else [victim, culprit]
    d = classify(o, Health(0, 0), rdzv_host="a", probe_failures=2, hang_timeout_s=1000, now=1, settle_s=3)
    assert (d.verdict, d.node, d.rank) == (Verdict.USER_ERROR, "a", 0)
    # a victim alone (the culprit's node still running): it waits PEER_SETTLE x settle_s for it
    h = Health(0, 0)
    kw = dict(rdzv_host="a", probe_failures=2, hang_timeout_s=1000, settle_s=3)
    assert classify([Observation("a", R), victim], h, now=1, **kw).verdict == Verdict.CONTINUE
    assert classify([Observation("a", R), victim], h, now=1 + 3 * PEER_SETTLE - 1, **kw).verdict == Verdict.CONTINUE


def test_a_silent_first_step_has_its_own_bound_until_the_attempts_first_progress():
    """torch.compile / NCCL init / a large checkpoint load: the ranks are silent (torchrun's own start-up lines are
    not progress: LogSink.lines). Before the attempt's first progress (its ranks' first output, or a checkpoint)
    first_progress_timeout_s is the bound."""
    kw = dict(rdzv_host="a", probe_failures=2, hang_timeout_s=10, first_progress_timeout_s=50)
    talk, quiet = [Observation("a", R, progress=True)], [Observation("a", R)]
    h = Health(0, 0)
    assert classify(quiet, h, now=40, **kw).verdict == Verdict.CONTINUE       # silent first step: not a hang yet
    d = classify(quiet, h, now=53, **kw)
    assert d.verdict == Verdict.HANG and "for 50s" in d.message and "first_progress_timeout_s" in d.message
    h = Health(0, 0)
    classify(talk, h, now=12, **kw)                                            # the ranks' first output
    assert classify(quiet, h, now=20, **kw).verdict == Verdict.CONTINUE
    d = classify(quiet, h, now=23, **kw)
    assert d.verdict == Verdict.HANG and "for 10s (supervisor.hang_timeout_s)" in d.message
    h = Health(0, 0)                                                           # a bound below hang's: hang's
    assert classify(quiet, h, now=11, **{**kw, "first_progress_timeout_s": 5}).verdict == Verdict.HANG


def test_a_checkpoint_ends_the_first_progress_bound(store):
    class Ckpt(FakeOps):
        def checkpoint_hint(self):
            return 10

    quiet = [Observation(n, R) for n in "abc"]
    ops = Ckpt([quiet] * 30, checkpoint=("/ck/step-000000010", 10))
    job_id, state, _ = run(store, ops, hang_timeout_s=5, first_progress_timeout_s=100, max_node_failures=0)
    v = next(e for e in store.events(job_id) if e.kind == "verdict")
    assert v.klass == "hang" and "for 5s (supervisor.hang_timeout_s)" in v.message     # not 100 s: it checkpointed


def test_nccl_on_sockets_where_infiniband_is_expected_is_a_loud_event_once_per_attempt(store):
    class Net(FakeOps):
        asked = 0

        def checkpoint_hint(self):
            return len(self.script)          # a new step every round

        def latest_checkpoint(self, nodes):
            return (f"/ck/step-{100 - len(self.script)}", 100 - len(self.script))

        def socket_fallback(self, attempt):
            self.asked += 1
            return [("b", "[b/1] b:42:42 [0] NCCL INFO Using network Socket")]

    ops = Net([obs(a=R, b=R, c=R)] * 4 + [obs(a=(E, 0), b=(E, 0), c=(E, 0))])
    job_id, state, _ = run(store, ops)
    assert state == JobState.SUCCEEDED and ops.asked == 1      # at the attempt's first checkpoint, once
    net = [e for e in store.events(job_id) if e.kind == "network"]
    assert len(net) == 1 and net[0].node == "b" and "WARNING" in net[0].message
    assert "InfiniBand" in net[0].message and "Using network Socket" in net[0].message


def test_the_port_is_whole_or_refused(tmp_path):
    """``NodeOps`` declares everything the loop asks of ``ops`` (issue 36): an implementation that does not
    subclass it (and so lacks the capabilities a cluster may not have) is refused when the supervisor is made, not
    met by an AttributeError mid-recovery; ClusterOps has every member."""
    from clusterctl.supervise.cluster_ops import ClusterOps
    from clusterctl.supervise.supervisor import port_problems

    class Bare:          # the six methods of the first block only
        def start(self, *a): return Started()
        def observe(self, *a): return []
        def stop(self, *a, **kw): return {}
        def reachable(self, nodes): return list(nodes)
        def latest_checkpoint(self, nodes): return ("", 0)
        def stop_requested(self): return False

    store = Store(tmp_path / "s.db")
    job_id = store.create_job("j", "{}", None, None)
    with pytest.raises(TypeError, match="Bare is not a whole NodeOps: it lacks checkpoint_hint"):
        Supervisor(job_id, store, Bare(), Policy(min_nodes=1, max_nodes=1), ["a"])
    assert port_problems(FakeOps([])) == []
    assert [m for m in port_problems(object()) if not hasattr(ClusterOps, m)] == []


def test_ending_an_attempt_is_one_transaction_verdict_budget_result_and_next_state(store):
    """Issue 36 (docs/design.md, the ledger): the verdict event, the budget it spends (the job row's count and the
    ``budget`` event), the attempt's result and RECOVERING are written in one transaction (they were three: a
    supervisor killed between them left a verdict without its attempt's end, or an end without its charge); the
    relaunch's node rows go with RUNNING. Each write is tagged with the outermost transaction it joined."""
    import contextlib

    count, tagged = [0], []
    transaction = store.transaction

    @contextlib.contextmanager
    def counted():
        if store._tx is None:
            count[0] += 1
        with transaction():
            yield
    store.transaction = counted
    for name in ("add_event", "update_job", "end_attempt", "set_state", "set_node"):
        def spy(*a, _name=name, _real=getattr(store, name), **kw):
            what = a[1] if _name == "add_event" else ",".join(sorted(kw)) if _name == "update_job" else ""
            tagged.append((_name, str(what), count[0] if store._tx is not None else None))
            return _real(*a, **kw)
        setattr(store, name, spy)

    class Rows(FakeOps):
        def start(self, attempt, nodes, rdzv_host, resume):
            super().start(attempt, nodes, rdzv_host, resume)
            return Started(nodes={n: NodeStarted(f"10.0.0.{i}", f"c-{n}") for i, n in enumerate(nodes)})

    ops = Rows([obs(a=R, b=R, c=R), obs(a=R, b=M, c=R), obs(a=(E, 0), c=(E, 0))])
    job_id, state, _ = run(store, ops)
    assert state == JobState.SUCCEEDED
    end = [t for t in tagged if t[1] in ("verdict", "budget", "node_failures_used") or t[0] == "end_attempt"]
    assert [t[:2] for t in end[:4]] == [("update_job", "node_failures_used"), ("add_event", "verdict"),
                                        ("add_event", "budget"), ("end_attempt", "")]
    assert len({t[2] for t in end[:4]}) == 1 and end[0][2] is not None
    assert store.get_job(job_id).node_failures_used == 1
    running = [t for t in tagged if t[0] == "set_node" and t[2] is not None]
    assert {n.node: n.container for n in store.nodes(job_id, 2)} == {"a": "c-a", "c": "c-c"}
    assert running and all(t[2] is not None for t in running)
