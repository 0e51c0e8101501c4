"""clusterctl.store.state and clusterctl.store.paths: the SQLite store and the state directory."""
from __future__ import annotations

import multiprocessing
import os
import re
import sqlite3
import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from clusterctl.errors import ClusterctlError, UserError
from clusterctl.store import paths
from clusterctl.store.state import (
    SCHEMA_VERSION,
    SUPERVISOR_STALE_S,
    TRANSITIONS,
    Attempt,
    Event,
    InvalidTransition,
    Job,
    JobActive,
    JobNotFound,
    JobState,
    NodeStatus,
    Store,
    is_terminal,
    redact,
)

SPEC = '{"name": "llm", "env": {"secrets": ["HF_TOKEN"]}}'


class FakeClock:
    def __init__(self, start: float = 1_767_225_600.0):   # 2026-01-01 00:00:00 UTC
        self.now = start

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture
def root(tmp_path: Path) -> Path:
    return paths.ensure_state_dir(tmp_path / "state")


@pytest.fixture
def store(root: Path) -> Store:
    with Store(paths.db_path(root), clock=FakeClock()) as s:
        yield s


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


# -- paths ---------------------------------------------------------------------------------------------------------

def test_state_dir_precedence(tmp_path: Path) -> None:
    env = {paths.ENV_VAR: str(tmp_path / "env")}
    assert paths.state_dir(str(tmp_path / "flag"), environ=env) == tmp_path / "flag"
    assert paths.state_dir(None, environ=env) == tmp_path / "env"
    default = paths.state_dir(None, environ={paths.ENV_VAR: ""})
    assert default.is_absolute() and "clusterctl" in str(default)
    assert not (tmp_path / "flag").exists()   # state_dir creates nothing


def test_ensure_state_dir_is_private(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        created = paths.ensure_state_dir(tmp_path / "a" / "b")
        assert mode(created) == 0o700
        loose = tmp_path / "loose"
        loose.mkdir(mode=0o755)
        paths.ensure_state_dir(loose)
        assert mode(loose) == 0o700
    finally:
        os.umask(old)
    (tmp_path / "file").write_text("")
    with pytest.raises(UserError, match="not a directory"):
        paths.ensure_state_dir(tmp_path / "file")


def test_job_paths(root: Path) -> None:
    assert paths.db_path(root) == root / "state.db"
    assert paths.supervisor_log_path(root, "llm-1") == root / "jobs" / "llm-1" / "supervisor.log"
    assert paths.supervisor_pid_path(root, "llm-1") == root / "jobs" / "llm-1" / "supervisor.pid"
    assert mode(paths.ensure_job_dir(root, "llm-1")) == 0o700
    for bad in ("../x", "a/b", ".hidden", "a..b", ""):
        with pytest.raises(UserError):
            paths.job_dir(root, bad)


# -- schema --------------------------------------------------------------------------------------------------------

def test_schema_file_modes_and_wal(tmp_path: Path) -> None:
    old = os.umask(0o022)
    try:
        root = paths.ensure_state_dir(tmp_path / "state")
        db = paths.db_path(root)
        store = Store(db)
        store.create_job("llm", SPEC, None, None)   # forces -wal / -shm into existence
        assert mode(root) == 0o700
        for f in [db, *root.glob("state.db-*")]:
            assert mode(f) == 0o600, f
        assert (root / "state.db-wal").exists()
        raw = sqlite3.connect(db)
        assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert raw.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
        tables = {r[0] for r in raw.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"jobs", "attempts", "nodes", "events"} <= tables
        raw.close()
        store.close()
    finally:
        os.umask(old)


def test_existing_loose_db_is_tightened_and_reopen_keeps_data(root: Path) -> None:
    db = paths.db_path(root)
    Store(db).create_job("llm", SPEC, None, None)
    db.chmod(0o644)
    again = Store(db)
    assert mode(db) == 0o600
    assert [j.name for j in again.list_jobs()] == ["llm"]


def test_newer_schema_is_refused(root: Path) -> None:
    db = paths.db_path(root)
    Store(db).close()
    raw = sqlite3.connect(db)
    raw.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    raw.close()
    with pytest.raises(ClusterctlError, match="newer"):
        Store(db)


# -- jobs ----------------------------------------------------------------------------------------------------------

def test_create_and_get_job(store: Store) -> None:
    job_id = store.create_job("llm", SPEC, "/inv.yaml", "/job.yaml")
    assert re.fullmatch(r"llm-20260101-000001-[0-9a-f]{12}", job_id)   # 48 random bits (issue 24)
    job = store.get_job(job_id)
    assert isinstance(job, Job)
    assert (job.name, job.state, job.attempt, job.reason, job.supervisor_pid) == ("llm", JobState.PENDING, 0, None, None)
    assert (job.spec_json, job.inventory_path, job.job_path) == (SPEC, "/inv.yaml", "/job.yaml")
    assert (job.failures_used, job.node_failures_used) == (0, 0)
    assert job.created_at == job.updated_at == 1_767_225_601.0
    assert store.get_job("llm") == job
    assert store.job_state(job_id) == JobState.PENDING
    store.set_state(job_id, JobState.STARTING)
    assert store.job_state(job_id) == store.get_job(job_id).state == JobState.STARTING
    with pytest.raises(JobNotFound):
        store.get_job("nope")
    with pytest.raises(JobNotFound):
        store.job_state("llm")            # an id, not a name: the supervisor knows its job's id
    assert store.find_job("nope") is None
    with pytest.raises(UserError, match="invalid job name"):
        store.create_job("../evil", SPEC, None, None)


def test_name_resolves_to_newest_and_launch_is_exclusive(store: Store) -> None:
    first = store.create_job("llm", SPEC, None, None)
    assert store.active_job("llm").job_id == first
    with pytest.raises(JobActive, match=first):
        store.create_job("llm", SPEC, None, None)
    store.set_state(first, JobState.FAILED, "boom")
    assert store.active_job("llm") is None
    second = store.create_job("llm", SPEC, None, None)
    assert store.get_job("llm").job_id == second
    assert store.get_job(first).job_id == first
    other = store.create_job("other", SPEC, None, None)
    assert [j.job_id for j in store.list_jobs()] == [other, second, first]
    assert [j.job_id for j in store.list_jobs(name="llm")] == [second, first]


def test_state_transitions(store: Store) -> None:
    job_id = store.create_job("llm", SPEC, None, None)
    path = [JobState.STARTING, JobState.RUNNING, JobState.RECOVERING, JobState.STARTING, JobState.RUNNING]
    for state in path:
        store.set_state(job_id, state)
    assert store.set_state(job_id, "RUNNING", "still") == JobState.RUNNING   # same state: reason update
    assert store.get_job(job_id).reason == "still"
    assert store.set_state(job_id, JobState.STOPPED, "user") == JobState.RUNNING
    job = store.get_job(job_id)
    assert job.state is JobState.STOPPED and job.terminal and job.reason == "user"
    with pytest.raises(InvalidTransition):
        store.set_state(job_id, JobState.RUNNING)   # a late supervisor update after `stop`
    store.set_state(job_id, JobState.STARTING)       # resume
    store.set_state(job_id, JobState.SUCCEEDED)
    for state in JobState:
        if state is not JobState.SUCCEEDED:
            with pytest.raises(InvalidTransition):
                store.set_state(job_id, state)
    with pytest.raises(JobNotFound):
        store.set_state("nope", JobState.RUNNING)


def test_state_enum_helpers() -> None:
    assert {s for s in JobState if is_terminal(s)} == {JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED}
    assert is_terminal("FAILED") and not is_terminal("RUNNING")
    assert str(JobState.RUNNING) == "RUNNING" and JobState("RUNNING") == "RUNNING"
    assert set(TRANSITIONS) == set(JobState)


def test_update_job(store: Store) -> None:
    job_id = store.create_job("llm", SPEC, None, None)
    before = store.get_job(job_id).updated_at
    store.update_job(job_id, failures_used=2, node_failures_used=1, supervisor_pid=123)
    job = store.get_job(job_id)
    assert (job.failures_used, job.node_failures_used, job.supervisor_pid) == (2, 1, 123)
    assert job.updated_at > before
    with pytest.raises(TypeError):
        store.update_job(job_id, state="RUNNING")
    with pytest.raises(TypeError):
        store.update_job(job_id, **{"name = 'x'; --": 1})
    with pytest.raises(JobNotFound):
        store.update_job("nope", attempt=1)


# -- attempts, nodes, events ---------------------------------------------------------------------------------------

def test_attempts_and_nodes(store: Store) -> None:
    job_id = store.create_job("llm", SPEC, None, None)
    a1 = store.start_attempt(job_id, 1, "node0", "rdzv-1", ["node0", "node1"], None, None)
    assert isinstance(a1, Attempt) and a1.nodes == ("node0", "node1") and a1.ended_at is None
    store.end_attempt(job_id, 1, "node_lost")
    store.start_attempt(job_id, 2, "node1", "rdzv-2", ["node1", "node2"], "/ckpt/step-100", 100)
    assert store.get_job(job_id).attempt == 2
    attempts = store.attempts(job_id)
    assert [(a.attempt, a.result, a.checkpoint_step) for a in attempts] == [(1, "node_lost", None), (2, None, 100)]
    assert attempts[0].ended_at is not None
    with pytest.raises(ClusterctlError):
        store.end_attempt(job_id, 9, "failed")

    store.set_node(job_id, 1, "node0", rank=0, state="lost")
    store.set_node(job_id, 2, "node2", address="10.0.0.2", container="c2", rank=1, state="running")
    n = store.set_node(job_id, 2, "node1", address="10.0.0.1", rank=0, state="running")
    assert isinstance(n, NodeStatus) and n.container is None
    updated = store.set_node(job_id, 2, "node1", state="exited", exit_code=137, signal="SIGKILL")
    assert (updated.address, updated.state, updated.exit_code, updated.signal) == ("10.0.0.1", "exited", 137, "SIGKILL")
    assert [x.node for x in store.nodes(job_id)] == ["node1", "node2"]          # current attempt, by rank
    assert [x.node for x in store.nodes(job_id, attempt=1)] == ["node0"]
    with pytest.raises(TypeError):
        store.set_node(job_id, 2, "node1", bogus=1)


def test_events_keep_order(store: Store) -> None:
    job_id = store.create_job("llm", SPEC, None, None)
    other = store.create_job("other", SPEC, None, None)
    for i in range(5):
        store.add_event(job_id, "tick", f"event {i}", attempt=1)
        store.add_event(other, "tick", "noise")
    e = store.add_event(job_id, "node_failed", "node1 exited 137", attempt=1, klass="node", node="node1", rank=1,
                        exit_code=137, signal="SIGKILL", checkpoint_step=100)
    assert isinstance(e, Event) and (e.klass, e.node, e.rank, e.exit_code, e.checkpoint_step) == ("node", "node1", 1, 137, 100)
    events = store.events(job_id)
    assert [x.message for x in events] == [f"event {i}" for i in range(5)] + ["node1 exited 137"]
    assert [x.time for x in events] == sorted(x.time for x in events)
    assert [x.message for x in store.events(job_id, after_id=events[3].id)] == ["event 4", "node1 exited 137"]
    assert len(store.events(job_id, limit=2)) == 2
    with pytest.raises(TypeError):
        store.add_event(job_id, "x", "y", time=1.0)


# -- concurrency ---------------------------------------------------------------------------------------------------

N_WRITES = 150


def _writer(db: str, job_id: str, tag: str, start: "multiprocessing.synchronize.Event", errors) -> None:
    try:
        store = Store(db, busy_timeout_s=30)
        start.wait(10)
        for i in range(N_WRITES):
            store.add_event(job_id, "tick", f"{tag} {i}")
            store.set_node(job_id, 1, tag, state="running", rank=i)
            store.update_job(job_id, failures_used=i)
            store.get_job(job_id)
            store.events(job_id, limit=5)
        store.close()
    except BaseException as exc:   # pragma: no cover - reported to the parent
        errors.put(f"{tag}: {exc!r}")
        raise


def test_two_processes_write_concurrently(root: Path) -> None:
    db = str(paths.db_path(root))
    job_id = Store(db).create_job("llm", SPEC, None, None)
    ctx = multiprocessing.get_context("fork")
    start, errors = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_writer, args=(db, job_id, f"p{i}", start, errors)) for i in range(2)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0], errors.get(timeout=1) if not errors.empty() else ""
    store = Store(db)
    events = store.events(job_id)
    assert len(events) == 2 * N_WRITES
    for tag in ("p0", "p1"):   # each writer's events stay in its own order
        assert [e.message for e in events if e.message.startswith(tag)] == [f"{tag} {i}" for i in range(N_WRITES)]
    assert {n.node for n in store.nodes(job_id, attempt=1)} == {"p0", "p1"}


def test_threads_share_one_store(store: Store) -> None:
    job_id = store.create_job("llm", SPEC, None, None)
    failures: list[BaseException] = []

    def work(tag: int) -> None:
        try:
            for i in range(50):
                store.add_event(job_id, "tick", f"{tag}-{i}")
                store.nodes(job_id)
        except BaseException as exc:   # pragma: no cover
            failures.append(exc)

    threads = [threading.Thread(target=work, args=(t,)) for t in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not failures
    assert len(store.events(job_id)) == 200


def _use_inherited(store: Store, job_id: str) -> None:
    store.add_event(job_id, "child", "from child")
    os._exit(0)


def test_store_survives_fork(store: Store) -> None:
    job_id = store.create_job("llm", SPEC, None, None)
    proc = multiprocessing.get_context("fork").Process(target=_use_inherited, args=(store, job_id))
    proc.start()
    proc.join(30)
    assert proc.exitcode == 0
    store.add_event(job_id, "parent", "from parent")
    assert [e.kind for e in store.events(job_id)] == ["child", "parent"]


# -- supervisor claim ----------------------------------------------------------------------------------------------

def test_claim_supervisor(store: Store) -> None:
    job_id = store.create_job("llm", SPEC, None, None)
    me, gone = os.getpid(), dead_pid()
    store.update_job(job_id, supervisor_pid=gone)
    assert store.claim_supervisor(job_id, me)                  # recorded pid is dead: take over
    assert store.get_job(job_id).supervisor_pid == me
    assert store.claim_supervisor(job_id, me)                  # idempotent for the holder
    assert not store.claim_supervisor(job_id, me + 100_000)    # a live holder wins
    assert not store.release_supervisor(job_id, me + 100_000)  # only the holder releases
    assert store.get_job(job_id).supervisor_pid == me
    assert store.release_supervisor(job_id, me)
    assert store.get_job(job_id).supervisor_pid is None
    assert store.claim_supervisor(job_id, gone)                # nothing recorded: anyone may claim
    with pytest.raises(JobNotFound):
        store.claim_supervisor("nope", me)


def test_claim_uses_injected_liveness(root: Path) -> None:
    store = Store(paths.db_path(root), pid_alive=lambda pid: pid == 1)
    job_id = store.create_job("llm", SPEC, None, None)
    assert store.claim_supervisor(job_id, 1)
    assert not store.claim_supervisor(job_id, 2)
    store.update_job(job_id, supervisor_pid=3)
    assert store.claim_supervisor(job_id, 2)


def _claimer(db: str, job_id: str, start, results, done) -> None:
    start.wait(10)
    results.put(Store(db).claim_supervisor(job_id, os.getpid()))
    done.wait(30)   # stay alive so the winner's pid is live while the other one checks


def test_resume_twice_starts_one_supervisor(root: Path) -> None:
    db = str(paths.db_path(root))
    job_id = Store(db).create_job("llm", SPEC, None, None)
    ctx = multiprocessing.get_context("fork")
    start, done, results = ctx.Event(), ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_claimer, args=(db, job_id, start, results, done)) for _ in range(2)]
    for p in procs:
        p.start()
    start.set()
    outcomes = sorted([results.get(timeout=30), results.get(timeout=30)])
    done.set()
    for p in procs:
        p.join(30)
    assert outcomes == [False, True]
    assert Store(db).get_job(job_id).supervisor_pid in {p.pid for p in procs}


# -- secrets -------------------------------------------------------------------------------------------------------

def test_redact() -> None:
    assert redact("token=abc123 and abc123", ["abc123"]) == "token=*** and ***"
    assert redact("key=abcdef", ["abc", "abcdef"]) == "key=***"   # longest first, no leftovers
    assert redact("nothing", ["", "zzz"]) == "nothing"
    assert redact(None, ["x"]) is None


def test_store_redacts_free_text(root: Path) -> None:
    secret = "hf_SuperSecretValue42"
    db = paths.db_path(root)
    store = Store(db, secrets=[secret, ""])
    job_id = store.create_job("llm", SPEC, None, None)
    e = store.add_event(job_id, "node_failed", f"401 for token {secret}")
    assert e.message == "401 for token ***"
    n = store.set_node(job_id, 1, "node0", error_tail=f"Traceback...\nHF_TOKEN={secret}\n")
    assert n.error_tail == "Traceback...\nHF_TOKEN=***\n"
    store.set_state(job_id, JobState.FAILED, f"auth failed with {secret}")
    store.update_job(job_id, reason=f"again {secret}")
    assert secret not in (store.get_job(job_id).reason or "")
    store.close()
    stored = b"".join(f.read_bytes() for f in root.glob("state.db*"))
    assert secret.encode() not in stored


def test_a_claim_records_the_host_and_a_supervisor_elsewhere_is_judged_by_its_heartbeat(root: Path) -> None:
    """Issue 34 item 3: a shared state dir. The pid of a supervisor on another host (or an earlier boot) says
    nothing here: its claim stands while its heartbeat is fresh, whatever this machine's /proc says."""
    t = {"now": 1_800_000_000.0}
    here = Store(paths.db_path(root), clock=lambda: t["now"], host=("login1", "boot-a"), pid_alive=lambda p: False)
    there = Store(paths.db_path(root), clock=lambda: t["now"], host=("login2", "boot-b"),
                  pid_alive=lambda p: pytest.fail("a pid of another host looked up here"))
    job_id = here.create_job("llm", SPEC, None, None)
    assert there.claim_supervisor(job_id, 77)
    job = here.get_job(job_id)
    assert (job.supervisor_pid, job.supervisor_host, job.supervisor_boot) == (77, "login2", "boot-b")
    t["now"] += 8
    assert not here.heartbeat(job_id, 77)            # the same pid here is another process: not its beat
    assert there.heartbeat(job_id, 77)
    t["now"] += 9
    assert not here.claim_supervisor(job_id, 78)     # its beat is 9 s old: it lives (here its pid looks dead)
    assert not here.release_supervisor(job_id, 77)   # only the holder, on its host, releases
    t["now"] += SUPERVISOR_STALE_S
    assert here.claim_supervisor(job_id, 78)         # silent for longer than the limit: gone
    assert (here.get_job(job_id).supervisor_host, here.get_job(job_id).supervisor_boot) == ("login1", "boot-a")
    rebooted = Store(paths.db_path(root), clock=lambda: t["now"], host=("login1", "boot-c"),
                     pid_alive=lambda p: pytest.fail("a pid of an earlier boot looked up"))
    assert not rebooted.claim_supervisor(job_id, 79)   # login1's earlier boot beat just now (clock unchanged)


def test_the_journal_is_wal_on_a_local_disk_and_a_rollback_journal_on_a_network_file_system(tmp_path: Path) -> None:
    """Issue 34 item 3: https://sqlite.org/wal.html -- WAL does not work over a network file system."""
    from clusterctl.store.state import journal_mode

    mounts = ("/dev/sda1 / ext4 rw 0 0\n"
              "nas:/export /shared nfs4 rw,vers=4.2 0 0\n"
              "mds@tcp:/lfs /lustre lustre rw,flock 0 0\n"
              "tmpfs /shared/tmp tmpfs rw 0 0\n"
              "nas:/x /mnt/with\\040space nfs rw 0 0\n")
    assert journal_mode("/shared/u/state/state.db", mounts) == "delete"
    assert journal_mode("/lustre/state/state.db", mounts) == "delete"
    assert journal_mode("/mnt/with space/state.db", mounts) == "delete"
    assert journal_mode("/shared/tmp/state.db", mounts) == "wal"       # a local mount below a network one
    assert journal_mode("/home/u/state.db", mounts) == "wal"
    assert journal_mode("/sharedx/state.db", mounts) == "wal"          # a prefix of the name is not the mount
    assert paths.filesystem_type("/x", "") is None
    db = tmp_path / "state.db"
    store = Store(db, journal="delete")                                # what a network file system gets
    job_id = store.create_job("llm", SPEC, None, None)
    other = Store(db, journal="delete")
    other.add_event(job_id, "x", "from another process")
    assert [e.message for e in store.events(job_id)] == ["from another process"]
    raw = sqlite3.connect(db)
    assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    raw.close()
    assert not list(tmp_path.glob("state.db-wal")) and not list(tmp_path.glob("state.db-shm"))
    store.close()
    other.close()
    # a database another process (an older clusterctl) still holds in WAL mode: refused with the reason, not
    # opened half-way; once that one ends, the switch happens and the history is kept
    wal = Store(tmp_path / "old.db", journal="wal", busy_timeout_s=0.5)
    wal.create_job("llm", SPEC, None, None)
    with pytest.raises(ClusterctlError, match="network file system, where SQLite's WAL does not work"):
        Store(tmp_path / "old.db", journal="delete", busy_timeout_s=0.5)
    wal.close()
    assert [j.name for j in Store(tmp_path / "old.db", journal="delete").list_jobs()] == ["llm"]
