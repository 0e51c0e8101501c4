"""On-call truth, without a cluster: the log copy across reconnects and re-attaches, `logs` selections, the job
record and its migration, the verdict on an attempt nobody supervised, supervisor liveness, and a checkpoint
lookup that a dead node cannot stall."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time

import pytest

from clusterctl.config.inventory import Host
from clusterctl.config.spec import loads_job
from clusterctl.errors import UserError
from clusterctl.model import record
from clusterctl.model.verdicts import Observation, Verdict
from clusterctl.store.ledger import Ledger
from clusterctl.store.logcopy import LogSink
from clusterctl.store.state import JobState, Store
from clusterctl.supervise import controller
from clusterctl.supervise.cluster_ops import ClusterOps
from clusterctl.supervise.reconcile import judge
from clusterctl.supervise.supervisor import NodeOps
from clusterctl.transport import ConnectOptions
from clusterctl.transport.base import CommandResult
from clusterctl.views import logs

JOB = """
name: j
nodes: "2:3"
nproc_per_node: 2
script: train.py
restarts: {max_failures: 7}
container: {ulimits: {}}
"""
HOSTS = tuple(Host(name=f"n{i}", address=f"10.0.0.{i}", runtime="podman", gpus=0) for i in (1, 2, 3))


# ------------------------------------------------------------------------------------------- log copy
def test_log_sink_continues_a_section_without_repeating_lines(tmp_path):
    path = tmp_path / "out.log"
    sink = LogSink(path)
    assert sink.begin("n1", 1) == 0
    sink.feed("n1", b"[0]:a\n[0]:b\n[1]:c")            # "c" is not complete yet
    sink.restart("n1")                                   # reconnect: the whole log streams again
    sink.feed("n1", b"[0]:a\n[0]:b\n[1]:c\n[0]:d\n")
    # a new supervisor (resume re-attached): a fresh sink over the same file continues the section
    again = LogSink(path)
    assert again.begin("n1", 1) == 4
    again.feed("n1", b"[0]:a\n[0]:b\n[1]:c\n[0]:d\n[0]:e\n")
    assert path.read_text().splitlines() == ["[n1/-] === attempt 1 ===", "[n1/0] a", "[n1/0] b", "[n1/1] c",
                                             "[n1/0] d", "[n1/0] e"]
    assert again.begin("n1", 2) == 0 and path.read_text().splitlines()[-1] == "[n1/-] === attempt 2 ==="


def test_logs_read_selects_attempt_node_rank_and_tail(tmp_path):
    path = tmp_path / "out.log"
    path.write_text("\n".join(["[n1/-] === attempt 1 ===", "[n1/0] a1", "[n2/-] === attempt 1 ===", "[n2/2] b1",
                               "[n1/-] === attempt 2 ===", "[n1/0] a2", "[n1/1] a3"]) + "\n")
    assert logs.read(path, logs.Selection(attempt=2)) == ["[n1/-] === attempt 2 ===", "[n1/0] a2", "[n1/1] a3"]
    assert logs.read(path, logs.Selection(node="n1", rank=0)) == ["[n1/0] a1", "[n1/0] a2"]
    assert logs.read(path, logs.Selection(), tail=2) == ["[n1/0] a2", "[n1/1] a3"]
    assert logs.read(path, logs.Selection(), tail=0) == []


def _store_with_job(tmp_path, spec_text=JOB) -> tuple[Store, str]:
    spec = loads_job(spec_text, str(tmp_path / "job.yaml"))
    store = Store(tmp_path / "state.db")
    rec = record.JobRecord(spec=spec, source=str(tmp_path / "job.yaml"), hosts=HOSTS, interfaces={"n1": "eth0"})
    job_id = store.create_job("j", rec.to_json(), None, str(tmp_path / "job.yaml"))
    return store, job_id


def test_logs_selection_refuses_what_the_job_never_had(tmp_path):
    store, job_id = _store_with_job(tmp_path)
    store.start_attempt(job_id, 1, "n1", f"{job_id}-1", ["n1", "n2", "n3"])
    job = store.get_job(job_id)
    assert logs.Selection.check(store, job, node="n2", rank=5, attempt=1) == logs.Selection("n2", 5, 1)
    with pytest.raises(UserError, match=r"nodes: n1, n2, n3"):
        logs.Selection.check(store, job, node="n9", rank=None, attempt=None)
    with pytest.raises(UserError, match=r"ranks: 0-5"):
        logs.Selection.check(store, job, node=None, rank=6, attempt=None)
    with pytest.raises(UserError, match=r"attempts: 1"):
        logs.Selection.check(store, job, node=None, rank=None, attempt=3)


# ------------------------------------------------------------------------------------------- job record
def test_job_record_round_trips_with_resolved_hosts(tmp_path):
    store, job_id = _store_with_job(tmp_path)
    rec = record.from_job(store.get_job(job_id))
    assert rec.host_names == ["n1", "n2", "n3"] and rec.hosts_by_name["n2"].address == "10.0.0.2"
    assert rec.spec.restarts.max_failures == 7 and rec.interfaces == {"n1": "eth0"}
    assert json.loads(store.get_job(job_id).spec_json)["version"] == record.VERSION


def test_a_version_1_row_is_migrated_with_the_inventory_it_was_launched_with(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text("all:\n  hosts:\n    n1: {ansible_host: 10.1.0.1}\n    n2: {ansible_host: 10.1.0.2}\n")
    spec = loads_job(JOB, str(tmp_path / "job.yaml"))
    v1 = json.dumps({"spec": spec.model_dump(mode="json"), "source": str(tmp_path / "job.yaml"),
                     "interfaces": {}, "hosts": ["n2", "n1"]})
    store = Store(tmp_path / "state.db")
    job_id = store.create_job("j", v1, str(inv), None)
    assert record.outdated(store.get_job(job_id))
    rec = Ledger(store).record(store.get_job(job_id))     # read, and rewritten in the current version
    assert [(h.name, h.address) for h in rec.hosts] == [("n2", "10.1.0.2"), ("n1", "10.1.0.1")]
    stored = json.loads(store.get_job(job_id).spec_json)
    assert stored["version"] == 2 and stored["hosts"][0]["address"] == "10.1.0.2"
    inv.write_text("all:\n  hosts:\n    other: {}\n")          # edited since: the record no longer depends on it
    assert record.from_job(store.get_job(job_id)).hosts_by_name["n1"].address == "10.1.0.1"


def test_status_shows_the_jobs_own_budgets(tmp_path):
    from clusterctl.views import status

    store, job_id = _store_with_job(tmp_path)
    v = status.job_view(store, store.get_job(job_id))
    assert v["restarts"]["max_failures"] == 7 and v["restarts"]["max_node_failures"] == 10


# ------------------------------------------------------------------------------------------- judging
def o(node, state, code=None, signal=None, rank=None):
    return Observation(node, state, exit_code=code, signal=signal, rank=rank)


def test_judge_an_unsupervised_attempt():
    now = 100.0
    assert judge([o("a", "running"), o("b", "running")], rdzv_host="a", now=now) is None
    assert judge([o("a", "running"), o("b", "exited", 0)], rdzv_host="a", now=now) is None
    assert judge([o("a", "running"), o("b", "unreachable")], rdzv_host="a", now=now) is None
    assert judge([o("a", "exited", 0), o("b", "exited", 0)], rdzv_host="a", now=now).verdict == Verdict.SUCCESS
    d = judge([o("a", "running"), o("b", "exited", 1, "SIGKILL", 3)], rdzv_host="a", now=now)
    assert (d.verdict, d.node, d.rank, d.signal) == (Verdict.KILLED, "b", 3, "SIGKILL")
    assert judge([o("a", "exited", 1), o("b", "missing")], rdzv_host="a", now=now).verdict == Verdict.NODE_LOST
    assert judge([o("a", "missing"), o("b", "exited", 1)], rdzv_host="a", now=now).verdict == Verdict.RDZV_LOST


# ------------------------------------------------------------------------------------------- liveness
def test_supervision_says_unsupervised_when_the_pid_is_dead_or_the_heartbeat_is_old(tmp_path):
    store, job_id = _store_with_job(tmp_path)
    root = tmp_path
    job = store.get_job(job_id)
    assert controller.supervision(root, job)["supervised"] is False             # nobody ever claimed it
    fake = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "_supervise", job_id])
    try:
        deadline = time.monotonic() + 10          # until the child has exec'd (its cmdline is its own)
        while b"_supervise" not in open(f"/proc/{fake.pid}/cmdline", "rb").read() and time.monotonic() < deadline:
            time.sleep(0.05)
        store.claim_supervisor(job_id, fake.pid)
        store.set_state(job_id, JobState.STARTING)
        job = store.get_job(job_id)
        sup = controller.supervision(root, job, now=job.supervisor_seen_at + 1)
        assert sup == {"pid": fake.pid, "alive": True, "last_seen": job.supervisor_seen_at, "supervised": True,
                       "host": store.host[0], "elsewhere": False}
        old = controller.supervision(root, job, now=job.supervisor_seen_at + controller.STALE_S + 1)
        assert old["supervised"] is False          # alive but silent: a hung supervisor is no supervisor
    finally:
        fake.kill()
        fake.wait()
    job = store.get_job(job_id)
    assert controller.supervision(root, job, now=job.supervisor_seen_at + 1)["alive"] is False


# ------------------------------------------------------------------------------------------- no stall
class _Transport:
    def __init__(self, host, hang: bool):
        self.host, self.hang = host, hang

    def run(self, argv, *, timeout, stdin=None):
        if self.hang:                       # a node whose link just went down: the command never answers
            time.sleep(timeout)
            raise TimeoutError("no answer")
        return CommandResult(tuple(argv), 0, json.dumps({"path": "/ck/step-000000060", "step": 60}), "", 0.01)

    def close(self):
        pass


def test_latest_checkpoint_first_answer_wins_within_the_probe_timeout(tmp_path):
    spec = loads_job(JOB.replace("script: train.py", "script: train.py\ncheckpoint: {dir: /ck}"), "job.yaml")
    hosts = {h.name: h for h in HOSTS}
    ts = {"n1": _Transport(hosts["n1"], True), "n2": _Transport(hosts["n2"], False),
          "n3": _Transport(hosts["n3"], True)}
    ops = ClusterOps(spec=spec, hosts=hosts, job_id="j-1", store=None, sink=LogSink(tmp_path / "o.log"),
                     connect=lambda h, _o: ts[h.name], probe_timeout_s=3.0)
    t = time.monotonic()
    assert ops.latest_checkpoint(["n1", "n2", "n3"]) == ("/ck/step-000000060", 60)
    assert time.monotonic() - t < 1.0                # n1 (the rendezvous host, first) hangs: not waited for
    ops._unhealthy = {"n2"}
    t = time.monotonic()
    assert ops.latest_checkpoint(["n1", "n2", "n3"]) is None     # only hanging nodes left: unknown, not "none"
    assert time.monotonic() - t <= 3.0 + 1.5
    ops._unhealthy = {"n1", "n2", "n3"}
    assert ops.latest_checkpoint(["n1", "n2", "n3"]) is None


class _Stale(_Transport):
    """A connection kept from before a partition: the node is back, but this session was dropped by the server."""

    def run(self, argv, *, timeout, stdin=None):
        from clusterctl.errors import TransportError
        raise TransportError(self.host.name, "SSH session closed")


def test_reachable_asks_a_node_that_failed_its_last_probe_over_a_fresh_connection(tmp_path):
    """After a partition the kept connection is dead or stalled in TCP backoff: a healed node is readmitted in
    the same round (fresh connection), and once it answered the checkpoint lookup may ask it again."""
    spec = loads_job(JOB.replace("script: train.py", "script: train.py\ncheckpoint: {dir: /ck}"), "job.yaml")
    hosts = {h.name: h for h in HOSTS}
    made: list[str] = []

    def connect(h, _o):
        made.append(h.name)
        return _Stale(h, False) if made.count(h.name) == 1 and h.name == "n3" else _Transport(h, False)

    ops = ClusterOps(spec=spec, hosts=hosts, job_id="j-1", store=None, sink=LogSink(tmp_path / "o.log"),
                     connect=connect, probe_timeout_s=3.0)
    ops.transport("n3")                            # kept from before the partition
    ops._unhealthy = {"n1", "n2", "n3"}            # every node failed its last probe
    assert ops.latest_checkpoint(["n1", "n2", "n3"]) is None
    assert ops.reachable(["n1", "n2", "n3"]) == ["n1", "n2", "n3"]
    assert made.count("n3") == 2                   # the kept session dropped, a fresh one made
    assert ops._unhealthy == set()
    assert ops.latest_checkpoint(["n1", "n2", "n3"]) == ("/ck/step-000000060", 60)


def test_a_node_that_cannot_connect_does_not_hold_up_the_others(tmp_path):
    """Connecting to a node whose link is down takes the connect timeout; the other nodes' connections are made
    meanwhile (one lock per node, not one for all)."""
    spec = loads_job(JOB, "job.yaml")
    hosts = {h.name: h for h in HOSTS}

    def connect(h, _o):
        if h.name == "n1":
            time.sleep(2.0)
            raise TimeoutError("connect timed out")
        return _Transport(h, False)

    ops = ClusterOps(spec=spec, hosts=hosts, job_id="j-1", store=None, sink=LogSink(tmp_path / "o.log"),
                     connect=connect, probe_timeout_s=1.0)
    slow = threading.Thread(target=lambda: pytest.raises(TimeoutError, ops.transport, "n1"))
    slow.start()
    time.sleep(0.2)
    t = time.monotonic()
    assert ops.transport("n2") is not None and ops.transport("n3") is not None
    assert time.monotonic() - t < 0.5
    slow.join()


def test_log_sink_skips_per_rank_when_a_reread_interleaves_the_ranks_differently(tmp_path):
    """podman logs merges stdout and stderr: a re-read (re-attach) may put torchrun's own lines and the ranks'
    lines in another order. Each rank's lines stay in order, so the sink skips per rank: no line lost or doubled."""
    path = tmp_path / "out.log"
    sink = LogSink(path)
    sink.begin("n1", 1)
    sink.feed("n1", b"[0]:tick 1\nW agent header\n[1]:tick 1\n[0]:tick 2\n")
    again = LogSink(path)
    assert again.begin("n1", 1) == 4
    again.feed("n1", b"W agent header\n[0]:tick 1\n[0]:tick 2\n[1]:tick 1\n[0]:tick 3\n[1]:tick 2\nW done\n")
    body = path.read_text().splitlines()[1:]
    assert sorted(body) == sorted(["[n1/0] tick 1", "[n1/-] W agent header", "[n1/1] tick 1", "[n1/0] tick 2",
                                   "[n1/0] tick 3", "[n1/1] tick 2", "[n1/-] W done"])
    assert [ln for ln in body if ln.startswith("[n1/0]")] == ["[n1/0] tick 1", "[n1/0] tick 2", "[n1/0] tick 3"]


def test_exec_in_container_names_the_container_the_launch_created(tmp_path):
    """exec --in-container / shell reach the container by the name plan.build_plan gave it (job id + node)."""
    from clusterctl.config.inventory import Host as H
    from clusterctl.launch.plan import build_plan
    from clusterctl.oncall import jobnodes

    store, job_id = _store_with_job(tmp_path)
    store.start_attempt(job_id, 1, "n1", f"{job_id}-1", ["n1", "n2"])
    jn = jobnodes.load(store, job_id)
    argv = jobnodes.in_job_argv(jn, "n2", ["true"])
    plan = build_plan(jn.spec, [H(name="n1", address="10.0.0.1", runtime="podman", gpus=0),
                                H(name="n2", address="10.0.0.2", runtime="podman", gpus=0)], job_id=job_id, attempt=1)
    name = plan.node("n2").container_name
    assert argv[3:] == ["podman", job_id, name, "true"] and argv[:2] == ["sh", "-c"]


@pytest.mark.parametrize("tty", [False, True])
def test_exec_in_container_selects_the_container_by_the_jobs_label(tmp_path, tty):
    """Issue 24 item 14: ``exec --in-container``/``shell`` enter the container that carries the job's label and
    the name, as ``stop`` does: another job's container of that name is never entered."""
    import subprocess

    from clusterctl.launch.runtimes import LABEL_JOB_ID
    from clusterctl.oncall import jobnodes

    store, job_id = _store_with_job(tmp_path)
    store.start_attempt(job_id, 1, "n1", f"{job_id}-1", ["n1", "n2"])
    jn = jobnodes.load(store, job_id)
    argv = jobnodes.in_job_argv(jn, "n2", ["echo", "a b"], interactive=True, tty=tty)
    fake, calls = tmp_path / "podman", tmp_path / "calls"
    fake.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
case "$1" in
  ps) case "$*" in *"label={LABEL_JOB_ID}=$OWNER "*) echo "c0ffee $NAME";; esac ;;
esac
""")
    fake.chmod(0o755)
    name = jn.container("n2")
    run = lambda owner: subprocess.run([*argv[:3], str(fake), *argv[4:]], capture_output=True, text=True,  # noqa: E731
                                       env={"PATH": "/usr/bin:/bin", "OWNER": owner, "NAME": name}, timeout=10)
    r = run(job_id)
    assert r.returncode == 0, r.stderr
    assert calls.read_text().splitlines()[-1] == "exec -i" + (" -t" if tty else "") + " c0ffee echo a b"
    calls.unlink()
    r = run("other-job-20260101-000000-abcd")        # only another job's container carries that name
    assert r.returncode == 1 and f"no container {name} of job {job_id}" in r.stderr
    assert not any(line.startswith("exec") for line in calls.read_text().splitlines())


@pytest.mark.parametrize("token_set", [True, False])
def test_status_reconciling_stores_error_tails_only_redacted(tmp_path, monkeypatch, token_set):
    """Issue 24 item 14: ``status`` of an unsupervised job records the nodes' error tails after redacting the
    job's secret_env values; when this shell lacks one, the tails are withheld (never stored in the clear)."""
    from clusterctl.transport import ConnectOptions

    store, job_id = _store_with_job(tmp_path, JOB + "secret_env: [HF_TOKEN]\n")
    store.start_attempt(job_id, 1, "n1", f"{job_id}-1", ["n1", "n2"])
    store.set_state(job_id, JobState.STARTING)
    store.set_state(job_id, JobState.RUNNING)
    if token_set:
        monkeypatch.setenv("HF_TOKEN", "hf-TOPSECRET")
    else:
        monkeypatch.delenv("HF_TOKEN", raising=False)
    tail = "[n2/1] Traceback\n[n2/1] ValueError: bad token hf-TOPSECRET"
    monkeypatch.setattr(ClusterOps, "observe", lambda self, attempt, nodes, **kw: [
        Observation("n1", "running"), Observation("n2", "exited", exit_code=1, error_tail=tail, rank=1)])
    monkeypatch.setattr(ClusterOps, "latest_checkpoint", lambda self, nodes: ("", 0))
    monkeypatch.setattr(ClusterOps, "stop", lambda self, attempt, nodes, grace_s=0.0: {})      # the job's end:
    monkeypatch.setattr(controller, "complete_logs", lambda *a, **k: {})                     # no node is asked
    controller.reconcile_job(tmp_path, store, job_id, ConnectOptions())
    stored = {n.node: n.error_tail for n in store.nodes(job_id, 1)}["n2"]
    assert "TOPSECRET" not in stored
    if token_set:
        assert stored == tail.replace("hf-TOPSECRET", "***")
    else:
        assert "withheld" in stored and "HF_TOKEN" in stored


HOSTILE_LINE = "[n1/0] a\x1b]0;owned\x07b\x1b[2J\x9b31mc\u202ed\r"


def test_logs_neutralise_escape_sequences_but_keep_the_stored_bytes(tmp_path):
    """Issue 24 item 14: a rank's escape sequences reach the operator's terminal as visible text (``logs``);
    the stored log file keeps what the rank printed."""
    from click.testing import CliRunner

    from clusterctl.cli import app
    from clusterctl.store import paths

    spec = loads_job(JOB, str(tmp_path / "job.yaml"))
    store = Store(paths.db_path(paths.ensure_state_dir(tmp_path / "state")))
    rec = record.JobRecord(spec=spec, source=str(tmp_path / "job.yaml"), hosts=HOSTS, interfaces={})
    job_id = store.create_job("j", rec.to_json(), None, str(tmp_path / "job.yaml"))
    log = paths.ensure_job_dir(tmp_path / "state", job_id) / "output.log"
    raw = ("[n1/-] === attempt 1 ===\n" + HOSTILE_LINE + "\n").encode()
    log.write_bytes(raw)
    r = CliRunner().invoke(app, ["--state-dir", str(tmp_path / "state"), "logs", job_id])
    assert r.exit_code == 0, r.output
    assert "\x1b" not in r.output and "\x07" not in r.output and "\x9b" not in r.output and "\u202e" not in r.output
    assert "[n1/0] a\\x1b]0;owned\\x07b\\x1b[2J\\x9b31mc\\u202ed" in r.output
    assert log.read_bytes() == raw


def test_status_error_tails_are_shown_neutralised():
    from clusterctl.views import status

    assert logs.for_terminal("ok\ttab") == "ok\ttab"
    assert logs.for_terminal(HOSTILE_LINE) == "[n1/0] a\\x1b]0;owned\\x07b\\x1b[2J\\x9b31mc\\u202ed\\x0d"
    v = {"job_id": "j-1", "name": "j", "state": "FAILED", "reason": None, "attempt": 1, "started_at": None,
         "supervised": False,
         "rendezvous_host": None, "nodes": [], "checkpoint": None, "supervisor": {"pid": None, "alive": False,
                                                                                   "last_seen": None},
         "restarts": {"failures_used": 1, "max_failures": 3, "node_failures_used": 0, "max_node_failures": 3},
         "failures": [{"attempt": 1, "class": "user_error", "node": "n1", "rank": 0, "exit_code": 1,
                       "signal": None, "message": "m", "error_tail": HOSTILE_LINE}]}
    text = "\n".join(status.text(v))
    assert "\x1b" not in text and "\\x1b]0;owned" in text


# ------------------------------------------------------------------------------------------- a reconcile's end
class _Ops(NodeOps):
    """The nodes of an unsupervised job: what they say, and what removing the job's leftovers does."""

    def __init__(self, obs=None, errors=None):
        self.obs, self.errors, self.stopped = obs, errors or {}, []

    def observe(self, attempt, nodes, **kw):
        assert self.obs is not None, "an attempt whose end is recorded was looked at again"
        return self.obs

    def latest_checkpoint(self, nodes):
        return ("/ck/step-000000020", 20)

    def stop(self, attempt, nodes, grace_s=0.0):
        self.stopped.append((attempt, list(nodes)))
        return self.errors


def _running_job(tmp_path, nodes=("n1", "n2", "n3")):
    store, job_id = _store_with_job(tmp_path)
    Ledger(store).attempt_started(job_id, 1, nodes[0], list(nodes), None, "attempt 1")
    store.set_state(job_id, JobState.RUNNING)
    return store, job_id


def test_a_reconcile_that_ends_a_warm_job_removes_its_leftovers_or_says_what_it_left(tmp_path):
    """Issue 34 item 5: the zygotes (~300 MB each), warm dirs and the survivors' containers of a job that `status`
    ended go on every node (``stop(None, ...)``: every attempt, the zygote too), or a ``cleanup_pending`` event
    names each node that still has them."""
    from clusterctl.supervise.reconcile import reconcile
    from clusterctl.model.verdicts import NodeError

    store, job_id = _running_job(tmp_path)
    ops = _Ops([Observation("n1", "running"), Observation("n2", "running"), Observation("n3", "running")])
    assert reconcile(store, job_id, ops, deadline_s=1).state == JobState.RUNNING
    assert ops.stopped == []                            # a look that ends nothing removes nothing
    ops.obs = [Observation("n1", "running"), Observation("n2", "exited", exit_code=1, signal="SIGKILL", rank=1),
               Observation("n3", "running")]
    ops.errors = {"n3": NodeError("n3", "unreachable", "connection timed out")}
    found = reconcile(store, job_id, ops, deadline_s=1)
    assert found.state == JobState.FAILED and found.leftovers == ("n3",)
    assert ops.stopped == [(None, ["n1", "n2", "n3"])]
    events = store.events(job_id)
    done = [e for e in events if e.kind == "cleanup"]
    assert len(done) == 1 and "n1, n2" in done[0].message and "zygotes and warm dirs" in done[0].message
    pending = [e for e in events if e.kind == "cleanup_pending"]
    assert [(e.node, "connection timed out" in e.message) for e in pending] == [("n3", True)]


def test_a_job_that_status_ends_keeps_its_report_in_its_dir(tmp_path, monkeypatch):
    """Issue 38 item 3: `status` finds the supervisor gone and a node's rank killed: the job ends FAILED, and its
    dir holds `goodput.json` (the report of the ended job, as a supervisor's exit writes it) and `events.jsonl`
    (every event, the reconcile's end included); a look that ends nothing writes neither."""
    from clusterctl.store import paths
    from clusterctl.supervise import jobdir

    store, job_id = _running_job(tmp_path)
    directory = paths.job_dir(tmp_path, job_id)
    directory.mkdir(parents=True)
    obs = [Observation("n1", "running"), Observation("n2", "running"), Observation("n3", "running")]
    monkeypatch.setattr(ClusterOps, "observe", lambda self, attempt, nodes, **kw: obs)
    monkeypatch.setattr(ClusterOps, "latest_checkpoint", lambda self, nodes: ("", 0))
    monkeypatch.setattr(ClusterOps, "stop", lambda self, attempt, nodes, grace_s=0.0: {})
    monkeypatch.setattr(controller, "complete_logs", lambda *a, **k: {})
    assert controller.reconcile_job(tmp_path, store, job_id, ConnectOptions()).state == JobState.RUNNING
    assert not (directory / jobdir.GOODPUT).exists()
    obs[1] = Observation("n2", "exited", exit_code=137, signal="SIGKILL", rank=1)
    assert controller.reconcile_job(tmp_path, store, job_id, ConnectOptions()).state == JobState.FAILED
    kept = json.loads((directory / jobdir.GOODPUT).read_text())
    assert (kept["job_id"], kept["state"]) == (job_id, "FAILED") and kept["ended_at"] is not None
    assert kept["wall_s"] == jobdir.report(store, tmp_path, job_id, now=time.time() + 999)["wall_s"]
    mirrored = jobdir.read_marks(directory / jobdir.EVENTS)
    assert [m.id for m in mirrored] == [e.id for e in store.events(job_id)]
    assert "reconciled" in {m.kind for m in mirrored}


def test_reconcile_never_judges_an_attempt_that_has_ended_again(tmp_path):
    """Issue 34 item 11: the supervisor recorded attempt 1's end (node_lost) and died before attempt 2: a later
    look does not observe it again nor overwrite its result (nodes that now read exit 0 do not make it a
    success); the job is FAILED with the recorded cause, and its leftovers go."""
    from clusterctl.supervise.reconcile import reconcile

    store, job_id = _running_job(tmp_path, ("n1", "n2"))
    Ledger(store).attempt_ended(job_id, 1, "node_lost", to=JobState.RECOVERING)
    ops = _Ops(None)
    found = reconcile(store, job_id, ops, deadline_s=1)
    assert found.state == JobState.FAILED and found.decision is None
    assert store.attempts(job_id)[-1].result == "node_lost"
    assert "attempt 1 had ended (node_lost)" in store.get_job(job_id).reason
    assert ops.stopped == [(None, ["n1", "n2"])]
    # nor does anyone else overwrite a recorded result: the store writes an attempt's end once
    assert not store.end_attempt(job_id, 1, "success")
    assert store.attempts(job_id)[-1].result == "node_lost"


def test_a_stop_during_a_start_leaves_no_node_running_and_a_stopped_node_stays_stopped(tmp_path):
    """Issue 34 item 11 / issue 39 item 4: `stop` ends attempt 1 while its start still runs; a node that then
    reports itself started does not read `running` under the STOPPED job, and the exit 1 that torchrun made of
    the stop's SIGTERM (recorded by a supervisor after the stop) does not turn a stopped node into exited(1)."""
    store, job_id = _running_job(tmp_path, ("n1", "n2"))
    ledger = Ledger(store)
    ledger.stop_requested(job_id)
    ledger.attempt_ended(job_id, 1, "stopped", nodes={"n1": {"state": "stopped"}})
    ledger.nodes_changed(job_id, 1, {"n1": {"state": "running", "address": "10.0.0.1"},     # the late start
                                     "n2": {"state": "running", "address": "10.0.0.2"}})
    ledger.nodes_changed(job_id, 1, {"n1": {"state": "exited", "exit_code": 1}})           # the SIGTERM's exit
    rows = {n.node: (n.state, n.exit_code, n.address) for n in store.nodes(job_id, 1)}
    assert rows == {"n1": ("stopped", None, "10.0.0.1"), "n2": ("stopped", None, "10.0.0.2")}
    ledger.attempt_ended(job_id, 1, "node_lost")            # a supervisor's later verdict: the stop's stands
    assert store.attempts(job_id)[-1].result == "stopped"
    # the stop came before the supervisor recorded attempt 2's nodes as started; the supervisor, preempted, ends
    # the attempt stopped (its node rows not given): none of them reads running
    store.set_state(job_id, JobState.RECOVERING)
    Ledger(store).attempt_started(job_id, 2, "n1", ["n1", "n2"], None, "attempt 2")
    ledger.nodes_changed(job_id, 2, {"n1": {"state": "running"}, "n2": {"state": "running"}})
    ledger.stop_requested(job_id)
    ledger.attempt_ended(job_id, 2, "stopped")
    assert {n.node: n.state for n in store.nodes(job_id, 2)} == {"n1": "stopped", "n2": "stopped"}


# ------------------------------------------------------------------------------------------- followers
def test_followers_say_unsupervised_at_once_and_go_on_from_the_nodes(tmp_path, monkeypatch):
    """Issue 39 item 2: after the supervisor died, `events -f` and `logs -f` print the UNSUPERVISED line `status`
    prints (within a round, not never), `logs -f` goes on with what the nodes print (their own logs), and both
    end once a look at the nodes ends the job (none hangs silently)."""
    from clusterctl.usecases import base
    from clusterctl.usecases import views as uviews
    from clusterctl.store import paths

    root = paths.ensure_state_dir(tmp_path / "state")
    store = Store(paths.db_path(root))
    spec = loads_job(JOB, str(tmp_path / "job.yaml"))
    rec = record.JobRecord(spec=spec, source=str(tmp_path / "job.yaml"), hosts=HOSTS, interfaces={})
    job_id = store.create_job("j", rec.to_json(), None, str(tmp_path / "job.yaml"))
    Ledger(store).attempt_started(job_id, 1, "n1", ["n1", "n2"], None, "attempt 1")
    store.set_state(job_id, JobState.RUNNING)
    store.claim_supervisor(job_id, 999_999_999)          # SIGKILLed: its pid is gone
    ws = base.Workspace(root, store)
    log = paths.ensure_job_dir(root, job_id) / "output.log"
    log.write_text("[n1/-] === attempt 1 ===\n[n1/0] step 1\n")
    looks = []

    def fill_logs(root_, store_, job_id_, options, attempt=None, **kw):     # the nodes printed on meanwhile
        with open(log, "a") as f:
            f.write(f"[n1/0] step {len(looks) + 2}\n")
        return {}

    def reconcile_job(root_, store_, job_id_, options, **kw):               # the third look: the job ended
        looks.append(job_id_)
        if len(looks) == 3:
            Ledger(store_).attempt_ended(job_id_, 1, "succeeded", to=JobState.SUCCEEDED, reason="done")
        return None

    monkeypatch.setattr(controller, "fill_logs", fill_logs)
    monkeypatch.setattr(controller, "reconcile_job", reconcile_job)
    monkeypatch.setattr(uviews.Watchdog, "__init__", _quick(uviews.Watchdog.__init__))    # every_s: 0.05 s
    said: list[str] = []
    got = uviews.logs(ws, job_id, ConnectOptions())
    t = time.monotonic()
    got.follow(said.append)
    assert time.monotonic() - t < 10
    assert said[0].startswith(f"UNSUPERVISED: job {job_id} is RUNNING but clusterctl's supervisor is not running "
                              "(pid 999999999") and said[0].endswith("Run: clusterctl resume j")
    assert [s for s in said if s.startswith("[n1/0]")] == ["[n1/0] step 2", "[n1/0] step 3", "[n1/0] step 4"]
    assert len(looks) == 3 and store.get_job(job_id).state == JobState.SUCCEEDED
    # events -f: the same line (where `say` puts it), then the events until the look that ended the job
    job2 = store.create_job("k", rec.to_json(), None, None)
    Ledger(store).attempt_started(job2, 1, "n1", ["n1"], None, "attempt 1")
    store.claim_supervisor(job2, 999_999_998)
    looks.clear()
    shown, lines = [], []
    uviews.follow_events(ws, job2, shown.append, follow=True, poll_s=0.01, say=lines.append)
    assert len(lines) == 1 and lines[0].startswith("UNSUPERVISED: job " + job2) and len(looks) == 3
    assert [e.kind for e in shown][-1] in ("start", "reconciled", "end") and store.get_job(job2).terminal


def _quick(init):
    def quick(self, *a, **kw):
        kw["every_s"] = 0.05
        init(self, *a, **kw)
    return quick


# ------------------------------------------------------------------------------------------- fresh facts
def test_status_of_an_unsupervised_job_states_fresh_facts(tmp_path):
    """Issue 39 item 4: once the supervisor is gone, a look at the nodes records the checkpoint their storage
    holds now (not the one the supervisor saw last), and a ``supervisor_lost`` event says since when the job runs
    unsupervised, once per lost supervisor; `resume` (relaunch or re-attach) says for how long it ran so."""
    from clusterctl.supervise.reconcile import reconcile, unsupervised_span
    from clusterctl.views import status

    store, job_id = _running_job(tmp_path, ("n1", "n2"))
    store.claim_supervisor(job_id, 999_999_999)
    Ledger(store).checkpoint_seen(job_id, 1, "/ck/step-000000010", 10)
    ops = _Ops([Observation("n1", "running"), Observation("n2", "running")])
    reconcile(store, job_id, ops, deadline_s=1)
    reconcile(store, job_id, ops, deadline_s=1)                       # a second look: nothing new to say
    v = status.job_view(store, store.get_job(job_id))
    assert (v["checkpoint"]["path"], v["checkpoint"]["step"]) == ("/ck/step-000000020", 20)
    assert [e.kind for e in store.events(job_id)].count("checkpoint") == 2
    lost = [e for e in store.events(job_id) if e.kind == "supervisor_lost"]
    assert len(lost) == 1 and "pid 999999999" in lost[0].message and "last heartbeat was at" in lost[0].message
    job = store.get_job(job_id)
    span = unsupervised_span(job, job.supervisor_seen_at + 75)
    assert span.startswith("; it ran unsupervised from ") and span.endswith("(75 s)")
    store.claim_supervisor(job_id, os.getpid())                      # a new supervisor, lost in its turn
    store.release_supervisor(job_id, os.getpid())
    store.claim_supervisor(job_id, 999_999_998)
    reconcile(store, job_id, ops, deadline_s=1)
    assert [e.kind for e in store.events(job_id)].count("supervisor_lost") == 2


def test_the_job_list_reconciles_unsupervised_jobs(tmp_path, monkeypatch):
    """Issue 39 item 4: `status` without JOB says what the nodes say of an unsupervised job (it exited 0: it
    is SUCCEEDED in the list, not RUNNING), and a job whose nodes cannot be asked is listed as recorded."""
    from clusterctl.usecases import base
    from clusterctl.usecases import views as uviews
    from clusterctl.store import paths

    root = paths.ensure_state_dir(tmp_path / "state")
    store = Store(paths.db_path(root))
    spec = loads_job(JOB, str(tmp_path / "job.yaml"))
    rec = record.JobRecord(spec=spec, source=str(tmp_path / "job.yaml"), hosts=HOSTS, interfaces={})
    ids = [store.create_job(name, rec.to_json(), None, None) for name in ("done", "odd")]
    for job_id in ids:
        Ledger(store).attempt_started(job_id, 1, "n1", ["n1"], None, "attempt 1")
        store.set_state(job_id, JobState.RUNNING)
        store.claim_supervisor(job_id, 999_999_999)

    def reconcile_job(root_, store_, job_id, options, **kw):
        if job_id == ids[1]:
            raise UserError("key file gone")
        Ledger(store_).attempt_ended(job_id, 1, "succeeded", to=JobState.SUCCEEDED, reason="exit 0 everywhere")

    monkeypatch.setattr(controller, "reconcile_job", reconcile_job)
    ws = base.Workspace(root, store)
    listed = {v["name"]: v["state"] for v, _ in uviews.job_list(ws, options=ConnectOptions())}
    assert listed == {"done": "SUCCEEDED", "odd": "RUNNING"}


def test_logs_of_a_stopped_job_say_what_the_signal_traceback_is(tmp_path, monkeypatch):
    """Issue 39 item 4: after a `stop`, torchrun's SignalException traceback ends the log; `logs` says it was the
    stop, not a crash (and says nothing of the kind for a job that was not stopped)."""
    from clusterctl.usecases import base
    from clusterctl.usecases import views as uviews
    from clusterctl.store import paths

    root = paths.ensure_state_dir(tmp_path / "state")
    store = Store(paths.db_path(root))
    spec = loads_job(JOB, str(tmp_path / "job.yaml"))
    rec = record.JobRecord(spec=spec, source=str(tmp_path / "job.yaml"), hosts=HOSTS, interfaces={})
    job_id = store.create_job("j", rec.to_json(), None, None)
    Ledger(store).attempt_started(job_id, 1, "n1", ["n1"], None, "attempt 1")
    log = paths.ensure_job_dir(root, job_id) / "output.log"
    log.write_text("[n1/-] === attempt 1 ===\n[n1/0] step 5\n[n1/-] Traceback (most recent call last):\n"
                   "[n1/-] torch.distributed.elastic.multiprocessing.api.SignalException: Process 41 got signal: 15\n")
    ws = base.Workspace(root, store)
    monkeypatch.setattr(controller, "fill_logs", lambda *a, **k: {})     # the nodes have nothing more
    assert uviews.logs(ws, job_id, ConnectOptions()).lines[-1].startswith("[n1/-] torch.distributed")
    Ledger(store).stop_requested(job_id)
    got = uviews.logs(ws, job_id, ConnectOptions())
    assert got.lines[-1].startswith(f"clusterctl: job {job_id} was stopped by `clusterctl stop` at ")
    assert "SignalException traceback above is how it reports that, not a failure" in got.lines[-1]
    assert len(uviews.logs(ws, job_id, ConnectOptions(), tail=2).lines) == 2


def test_a_reconcile_after_resume_exclude_asks_and_cleans_only_the_jobs_hosts(tmp_path):
    """A node of the last attempt that `resume --exclude` took out of the record (which cleaned it up then), and the
    supervisor gone before the next attempt: `status`'s look raised KeyError (ClusterOps has no address for it);
    now it looks at, judges and cleans the job's hosts only."""
    from clusterctl.supervise.reconcile import reconcile

    store, job_id = _running_job(tmp_path, ("n1", "n2"))

    class Node:
        def __init__(self):
            self.runs = []

        def run(self, argv, *, timeout, stdin=None):
            self.runs.append(list(argv))
            return CommandResult(tuple(argv), 0, "[]", "", 0.01)     # the job's containers: none listed

        def close(self):
            pass

    n1 = Node()
    ops = ClusterOps(spec=loads_job(JOB, "job.yaml"), hosts={"n1": HOSTS[0]}, job_id=job_id, store=store,
                     sink=LogSink(tmp_path / "o.log"), connect=lambda h, o: n1)
    try:
        found = reconcile(store, job_id, ops, deadline_s=2)
    finally:
        ops.close()
    assert found.state == JobState.FAILED and [n for n, _ in found.nodes] == ["n1"], found
    assert found.decision.lost == ("n1",) and found.leftovers == ()
    assert any("rm" in " ".join(r) or "remove" in " ".join(r) for r in n1.runs), n1.runs   # n1 cleaned
