"""Issue 39 item 11: progress while an attempt starts ("waiting for rendezvous: 1/2 nodes joined", ranks started,
first step) from what the supervisor knows: the c10d store's connections on the rendezvous host, the log copy's
ranks, the first ``step N`` line. As ``startup`` events (an attached `launch` prints every event) and in `status`."""
from __future__ import annotations

import json

from clusterctl.config.inventory import Host
from clusterctl.config.spec import loads_job
from clusterctl.model.events import EventKind
from clusterctl.model.verdicts import Observation, Started
from clusterctl.store.ledger import Ledger
from clusterctl.store.logcopy import LogSink
from clusterctl.store.state import ACTIVE_STATES, JobState, Store
from clusterctl.supervise import observe
from clusterctl.supervise.cluster_ops import ClusterOps
from clusterctl.supervise.jobdir import StepTap
from clusterctl.supervise.supervisor import Policy, Supervisor
from clusterctl.transport.base import CommandResult
from clusterctl.views import status
from tests.fakes.ops import QuietOps
from tests.unit.supervise.test_cluster_ops import JOB, Mux
from tests.unit.supervise.test_cluster_ops import Store as FakeStore

SS = ("0      0      10.0.0.1:29400 10.0.0.1:41230\n"      # the rendezvous host's own agent
      "0      0      10.0.0.1:29400 10.0.0.2:50112\n"
      "0      0      10.0.0.1:29400 10.0.0.2:50114\n")     # a second connection of the same node


def test_the_startup_phases_and_the_rendezvous_peers_are_pure():
    assert observe.rendezvous_peers(SS) == 2 and observe.rendezvous_peers("") == 0
    assert observe.rendezvous_peers("0 0 [fd00::1]:29400 [fd00::2]:4000\n") == 1
    assert observe.startup(3, None, 0, 6, None) is None
    assert observe.startup(3, 1, 0, 6, None) == ("rendezvous", "waiting for rendezvous: 1/3 nodes joined")
    assert observe.startup(3, 3, 4, 6, None) == ("ranks", "ranks started: 4/6 (the ranks that printed)")
    assert observe.startup(3, 3, 6, 6, None) == ("started", "ranks started: 6/6 (every rank printed)")
    assert observe.startup(3, None, 6, 6, 1) == ("first_step", "first step: step 1 (6/6 ranks started)")


class Ops(QuietOps):
    """Two nodes; ``said``: what ``startup`` answers, one per probe round; the attempt ends (exit 0) after as many
    rounds."""

    def __init__(self, said):
        self.said, self.asked, self.rounds = list(said), 0, 0

    def start(self, attempt, nodes, rdzv_host, resume):
        return Started()

    def observe(self, attempt, nodes):
        self.rounds += 1
        running = self.rounds <= len(self.said)
        return [Observation(n, "running", progress=True) if running else Observation(n, "exited", exit_code=0)
                for n in nodes]

    def startup(self, attempt):
        self.asked += 1
        return self.said[self.asked - 1] if self.asked <= len(self.said) else self.said[-1]


def _supervise(tmp_path, ops, adopt=False):
    store = Store(tmp_path / "state.db")
    job_id = store.create_job("demo", "{}", None, None)
    if adopt:
        Ledger(store).attempt_started(job_id, 1, "a", ["a", "b"], None, "start", expect=ACTIVE_STATES)
    t = [0.0]          # the supervisor's clock: 1 s per probe round (probe_interval_s)
    sup = Supervisor(job_id, store, ops, Policy(min_nodes=2, max_nodes=2), ["a", "b"], clock=lambda: t[0],
                     sleep=lambda s: None, wait=lambda s: t.__setitem__(0, t[0] + s))
    state = sup.run(adopt_attempt=1 if adopt else None)
    return store, job_id, state


def test_the_supervisor_says_the_start_up_when_it_changes_until_the_first_step(tmp_path):
    r = observe.startup
    said = [None, r(2, 1, 0, 2, None), r(2, 1, 0, 2, None), r(2, 2, 0, 2, None), r(2, 2, 1, 2, None),
            r(2, 2, 2, 2, None), r(2, 2, 2, 2, None), r(2, 2, 2, 2, None), r(2, 2, 2, 2, 1), r(2, 2, 2, 2, 9)]
    ops = Ops(said)
    store, job_id, state = _supervise(tmp_path, ops)
    assert state == JobState.SUCCEEDED
    ups = [e for e in store.events(job_id) if e.kind == EventKind.STARTUP]
    assert [e.klass for e in ups] == ["rendezvous", "rendezvous", "ranks", "started", "first_step"]
    assert ups[0].message == "attempt 1: waiting for rendezvous: 1/2 nodes joined"
    assert ups[1].message == "attempt 1: waiting for rendezvous: 2/2 nodes joined"     # 2 rounds later (1 s each)
    assert ups[3].message == "attempt 1: ranks started: 2/2 (every rank printed)"
    assert ups[4].message.startswith("attempt 1: first step: step 1 (2/2 ranks started), ") and "s after the start" \
        in ups[4].message
    assert ops.asked == 9                              # not asked again after the first step


def test_an_adopted_attempts_start_up_is_not_said_again(tmp_path):
    ops = Ops([observe.startup(2, None, 2, 2, None)] * 3)
    store, job_id, _ = _supervise(tmp_path, ops, adopt=True)
    assert ops.asked == 0 and not [e for e in store.events(job_id) if e.kind == EventKind.STARTUP]


def test_cluster_ops_startup_reads_the_stores_peers_then_the_ranks_then_the_first_step(tmp_path):
    class Node:
        def __init__(self):
            self.runs = []

        def run(self, argv, *, timeout, stdin=None) -> CommandResult:
            self.runs.append(list(argv))
            return CommandResult(tuple(argv), 0, SS if argv[0] == "ss" else "[]", "", 0.01)

        def close(self):
            pass

    hosts = {f"n{i}": Host(f"n{i}", f"10.0.0.{i}", runtime="podman", gpus=0) for i in (1, 2, 3)}
    nodes = {n: Node() for n in hosts}
    tap = StepTap(tmp_path / "steps.jsonl")
    sink = LogSink(tmp_path / "o.log", echo=tap)
    ops = ClusterOps(spec=loads_job(JOB.replace("nproc_per_node: 1", "nproc_per_node: 2"), "job.yaml"), hosts=hosts,
                     job_id="j-1", store=FakeStore(), sink=sink, connect=lambda h, o: nodes[h.name], mux=Mux,
                     first_step=tap.first_step)
    try:
        assert ops.startup(1) is None                           # nothing started
        ops.start(1, list(hosts), "n1", ("", 0))
        assert ops.startup(1) == ("rendezvous", "waiting for rendezvous: 2/3 nodes joined")
        ss = [r for r in nodes["n1"].runs if r[0] == "ss"]
        assert ss == [["ss", "-Htn", "state", "established", "( sport = :29400 )"]]
        assert not any(r[0] == "ss" for n in ("n2", "n3") for r in nodes[n].runs)    # the rendezvous host only
        sink.begin("n2", 1)
        sink.feed("n2", b"[2]:loading data\n[3]:loading data\n")
        assert ops.startup(1) == ("ranks", "ranks started: 2/6 (the ranks that printed)")
        assert len([r for r in nodes["n1"].runs if r[0] == "ss"]) == 1     # a rank printed: no more ss
        sink.feed("n2", b"[2]:step 1 loss 0.5\n")
        assert ops.startup(1) == ("first_step", "first step: step 1 (2/6 ranks started)")
    finally:
        ops.close()
        tap.close()


def test_status_shows_where_the_start_up_stands_until_the_first_step(tmp_path):
    store = Store(tmp_path / "state.db")
    ledger = Ledger(store)
    job_id = store.create_job("demo", "{}", None, None)
    ledger.attempt_started(job_id, 1, "n1", ["n1", "n2"], None, "start", expect=ACTIVE_STATES)
    said = "attempt 1: waiting for rendezvous: 1/2 nodes joined"
    ledger.event(job_id, EventKind.STARTUP, said, attempt=1, klass="rendezvous")
    v = json.loads(json.dumps(status.job_view(store, store.get_job(job_id))))
    assert (v["startup"]["phase"], v["startup"]["message"]) == ("rendezvous", said)
    assert any(line.startswith("startup   " + said) for line in status.text(v))
    ledger.event(job_id, EventKind.STARTUP, "attempt 1: first step: step 1 (2/2 ranks started), 3.0s after the start",
                 attempt=1, klass="first_step")
    v = status.job_view(store, store.get_job(job_id))
    assert v["startup"]["phase"] == "first_step" and not any(line.startswith("startup") for line in status.text(v))
    ledger.event(job_id, EventKind.STARTUP, "attempt 1: ranks started: 2/2 (every rank printed)", attempt=1,
                 klass="started")              # a script without `step N` lines: its start-up ends here
    v = status.job_view(store, store.get_job(job_id))
    assert v["startup"]["phase"] == "started" and not any(line.startswith("startup") for line in status.text(v))
    store.close()
