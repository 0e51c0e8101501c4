"""SQLite store for jobs, attempts, nodes and events.

One ``Store`` holds one connection, guarded by a lock, so threads may share it (the supervisor thread and the
CLI). Several processes (a detached supervisor and ``clusterctl status``) may use the same file at once: on a local
file system WAL lets readers run beside the single writer; on a network file system (NFS, Lustre, GPFS, ...: where
``sbatch`` puts a shared state dir) WAL does not work (its index is memory the hosts do not share), so the database
uses a rollback journal there (``journal_mode``: DELETE, synchronous FULL; its locks are the file system's POSIX
locks). Every write is a ``BEGIN IMMEDIATE`` transaction (so it waits on the busy timeout instead of failing on a
lock upgrade), and a store used after ``fork`` reopens its connection.

The supervisor's claim records its host (hostname and boot id, ``this_host``) with its pid: a supervisor on another
host (a shared state dir) is judged by its heartbeat, never by this machine's process table.

Secret VALUES are never stored: ``spec_json`` holds secret names only (the caller's duty), and free text
(event messages, node error tails, reasons) passes through ``redact`` with the secrets given to ``Store``.
Times are float epoch seconds (UTC) from the injected ``clock``.
"""
from __future__ import annotations

import json
import os
import secrets as _secrets
import socket
import sqlite3
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from dataclasses import fields as dataclass_fields
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Sequence

from clusterctl.config.ids import ID_RANDOM_BYTES, JOB_NAME_RE
from clusterctl.errors import ClusterctlError, UserError
from clusterctl.model.events import EventKind, kind_of

SCHEMA_VERSION = 4
BUSY_TIMEOUT_S = 30.0
# a supervisor whose last heartbeat is older than this is gone (it beats every 3 s: ``controller.HEARTBEAT_S``)
SUPERVISOR_STALE_S = 10.0
REDACTED = "***"


class JobState(str, Enum):
    """A job's lifecycle. SUCCEEDED, FAILED and STOPPED are terminal; FAILED and STOPPED may be resumed."""

    PENDING = "PENDING"        # created, nothing launched yet
    STARTING = "STARTING"      # an attempt is being launched
    RUNNING = "RUNNING"        # every node of the current attempt is up
    RECOVERING = "RECOVERING"  # an attempt ended badly; tearing down / waiting before the next one
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    STOPPED = "STOPPED"        # stopped by the user

    @property
    def terminal(self) -> bool:
        return self in TERMINAL_STATES

    def __str__(self) -> str:
        return self.value


TERMINAL_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED})
ACTIVE_STATES = frozenset(JobState) - TERMINAL_STATES

# state -> states it may move to. Setting the current state again is always allowed (updates the reason).
TRANSITIONS: dict[JobState, frozenset[JobState]] = {
    JobState.PENDING: frozenset({JobState.STARTING, JobState.FAILED, JobState.STOPPED}),
    JobState.STARTING: frozenset({JobState.RUNNING, JobState.RECOVERING, JobState.SUCCEEDED, JobState.FAILED,
                                  JobState.STOPPED}),
    JobState.RUNNING: frozenset({JobState.RECOVERING, JobState.SUCCEEDED, JobState.FAILED, JobState.STOPPED}),
    JobState.RECOVERING: frozenset({JobState.STARTING, JobState.FAILED, JobState.STOPPED}),
    JobState.FAILED: frozenset({JobState.STARTING, JobState.RECOVERING}),    # resume
    JobState.STOPPED: frozenset({JobState.STARTING, JobState.RECOVERING}),   # resume
    JobState.SUCCEEDED: frozenset(),
}


def is_terminal(state: JobState | str) -> bool:
    return JobState(state) in TERMINAL_STATES


class JobNotFound(UserError):
    def __init__(self, ref: str):
        self.ref = ref
        super().__init__(f"no job with id or name {ref!r} (see `clusterctl status`)")


class AmbiguousJob(UserError):
    def __init__(self, ref: str, job_ids: list[str]):
        self.ref, self.job_ids = ref, job_ids
        shown = ", ".join(job_ids[:20]) + (", ..." if len(job_ids) > 20 else "")
        super().__init__(f"{ref!r} is ambiguous: it starts {'more than 20' if len(job_ids) > 20 else len(job_ids)} "
                         f"job ids: {shown}; give more of the id")


class JobActive(UserError):
    def __init__(self, job: "Job"):
        self.job = job
        super().__init__(f"job {job.name!r} is already {job.state} as {job.job_id}; "
                         f"stop it first (`clusterctl stop {job.job_id}`)")


class StoreError(ClusterctlError):
    """A write to the state database failed (disk full, I/O error): the SQLite error, never a rollback's."""


class InvalidTransition(ClusterctlError):
    def __init__(self, job_id: str, old: JobState, new: JobState):
        self.job_id, self.old, self.new = job_id, old, new
        super().__init__(f"job {job_id}: cannot go from {old} to {new}")


@dataclass(frozen=True)
class Job:
    job_id: str
    name: str
    state: JobState
    spec_json: str
    inventory_path: str | None
    job_path: str | None
    created_at: float
    updated_at: float
    attempt: int                    # current attempt number, 0 before the first launch
    reason: str | None              # why the job is in its state (redacted)
    supervisor_pid: int | None
    failures_used: int              # restarts spent on user errors
    node_failures_used: int         # restarts spent on lost nodes / infrastructure
    supervisor_seen_at: float | None = None   # the supervisor's last heartbeat (epoch s)
    supervisor_host: str | None = None        # where the supervisor runs: its hostname ...
    supervisor_boot: str | None = None        # ... and that host's boot id (None: claimed before schema 4)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL_STATES


@dataclass(frozen=True)
class Attempt:
    job_id: str
    attempt: int
    rdzv_host: str | None
    rdzv_id: str | None
    nodes: tuple[str, ...]          # decoded nodes_json, in rank order
    started_at: float
    ended_at: float | None
    result: str | None
    checkpoint_path: str | None     # checkpoint this attempt resumed from
    checkpoint_step: int | None


@dataclass(frozen=True)
class NodeStatus:
    job_id: str
    attempt: int
    node: str
    address: str | None
    container: str | None
    state: str | None
    exit_code: int | None
    signal: str | None              # e.g. "SIGKILL"
    rank: int | None
    error_tail: str | None          # redacted
    updated_at: float


@dataclass(frozen=True)
class Cordon:
    host: str
    active: bool                    # False: uncordoned at ``since`` (kept so old failures do not count again)
    reason: str
    since: float
    by: str                         # "user" or "supervisor (job <id>)"


@dataclass(frozen=True)
class Event:
    id: int
    job_id: str
    time: float
    attempt: int | None
    kind: EventKind | str           # str: a kind this release does not know (written by a newer one)
    klass: str | None               # failure classification, e.g. "user" / "node"
    node: str | None
    rank: int | None
    exit_code: int | None
    signal: str | None
    checkpoint_step: int | None
    message: str                    # redacted
    oom: bool | None = None         # a kill the kernel's OOM killer did (seen in its log / the memory cgroup)


JOB_FIELDS = frozenset({"spec_json", "inventory_path", "job_path", "attempt", "reason", "supervisor_pid",
                        "failures_used", "node_failures_used", "supervisor_seen_at", "supervisor_host",
                        "supervisor_boot"})
NODE_FIELDS = ("address", "container", "state", "exit_code", "signal", "rank", "error_tail")
EVENT_FIELDS = frozenset({"attempt", "klass", "node", "rank", "exit_code", "signal", "checkpoint_step", "oom"})

_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (  # 0 -> 1
        """CREATE TABLE jobs (
            job_id TEXT PRIMARY KEY, name TEXT NOT NULL, state TEXT NOT NULL, spec_json TEXT NOT NULL,
            inventory_path TEXT, job_path TEXT, created_at REAL NOT NULL, updated_at REAL NOT NULL,
            attempt INTEGER NOT NULL DEFAULT 0, reason TEXT, supervisor_pid INTEGER,
            failures_used INTEGER NOT NULL DEFAULT 0, node_failures_used INTEGER NOT NULL DEFAULT 0)""",
        "CREATE INDEX jobs_name ON jobs(name, created_at)",
        """CREATE TABLE attempts (
            job_id TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE, attempt INTEGER NOT NULL,
            rdzv_host TEXT, rdzv_id TEXT, nodes_json TEXT NOT NULL, started_at REAL NOT NULL, ended_at REAL,
            result TEXT, checkpoint_path TEXT, checkpoint_step INTEGER, PRIMARY KEY (job_id, attempt))""",
        """CREATE TABLE nodes (
            job_id TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE, attempt INTEGER NOT NULL,
            node TEXT NOT NULL, address TEXT, container TEXT, state TEXT, exit_code INTEGER, signal TEXT,
            rank INTEGER, error_tail TEXT, updated_at REAL NOT NULL, PRIMARY KEY (job_id, attempt, node))""",
        """CREATE TABLE events (
            id INTEGER PRIMARY KEY AUTOINCREMENT,
            job_id TEXT NOT NULL REFERENCES jobs(job_id) ON DELETE CASCADE, time REAL NOT NULL, attempt INTEGER,
            kind TEXT NOT NULL, klass TEXT, node TEXT, rank INTEGER, exit_code INTEGER, signal TEXT,
            checkpoint_step INTEGER, message TEXT NOT NULL)""",
        "CREATE INDEX events_job ON events(job_id, id)",
    ),
    (  # 1 -> 2: the supervisor's heartbeat; OOM kills on events
        "ALTER TABLE jobs ADD COLUMN supervisor_seen_at REAL",
        "ALTER TABLE events ADD COLUMN oom INTEGER",
    ),
    (  # 2 -> 3: cordoned hosts (`clusterctl cordon`, the supervisor's own cordons); active 0 = uncordoned at ``since``
        """CREATE TABLE IF NOT EXISTS cordons (
            host TEXT PRIMARY KEY, active INTEGER NOT NULL, reason TEXT NOT NULL, since REAL NOT NULL,
            by TEXT NOT NULL)""",
        "CREATE INDEX IF NOT EXISTS events_node ON events(node, time)",
    ),
    (  # 3 -> 4: the supervisor's host (a shared state dir: a supervisor elsewhere is judged by its heartbeat)
        "ALTER TABLE jobs ADD COLUMN supervisor_host TEXT",
        "ALTER TABLE jobs ADD COLUMN supervisor_boot TEXT",
    ),
)
assert len(_MIGRATIONS) == SCHEMA_VERSION


def redact(text: str | None, secrets: Iterable[str]) -> str | None:
    """``text`` with every occurrence of each non-empty secret value replaced by ``***`` (longest first)."""
    if not text:
        return text
    for value in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(value, REDACTED)
    return text


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists (it may belong to another user)."""
    if pid <= 0:
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def this_host() -> tuple[str, str]:
    """(hostname, boot id) of this machine: a pid means something only on the host and boot that recorded it.
    The boot id is empty where the kernel has none to read (not Linux)."""
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text().strip()
    except OSError:
        boot = ""
    return socket.gethostname(), boot


def journal_mode(path: str | os.PathLike[str], mounts: str | None = None) -> str:
    """``wal`` on a local file system, ``delete`` on a network one (https://sqlite.org/wal.html: WAL needs memory
    every process shares, so it "does not work over a network filesystem")."""
    from clusterctl.store.paths import on_network_fs

    return "delete" if on_network_fs(Path(path).parent, mounts) else "wal"


class Store:
    def __init__(self, path: str | os.PathLike[str], *, secrets: Iterable[str] = (),
                 clock: Callable[[], float] = time.time, pid_alive: Callable[[int], bool] = pid_alive,
                 busy_timeout_s: float = BUSY_TIMEOUT_S, host: tuple[str, str] | None = None,
                 journal: str | None = None):
        """``host``: (hostname, boot id) this store's claims record (default ``this_host()``); ``journal``: the
        SQLite journal mode (default ``journal_mode(path)``: wal, or delete on a network file system)."""
        self.path = Path(path)
        self.host = host or this_host()
        self.journal = journal or journal_mode(self.path)
        self._secrets = tuple(s for s in secrets if s)
        self._clock, self._pid_alive, self._busy_timeout_s = clock, pid_alive, busy_timeout_s
        self._lock = threading.RLock()
        self._inherited: list[sqlite3.Connection] = []   # connections from before a fork: never touched again
        # called as on_state(job_id, old, new) after every set_state (the supervisor's notifier); must not block
        self.on_state: Callable[[str, JobState, JobState], None] | None = None
        self._tx: sqlite3.Connection | None = None     # the open ``transaction()``, joined by every write in it
        self._after: list[Callable[[], None]] = []      # its listeners, called once it commits
        self._refuse_emptied()
        self._create_private_file()
        self._conn = self._connect()
        self._migrate()

    # -- connection ---------------------------------------------------------------------------------------------

    def _refuse_emptied(self) -> None:
        """A state.db of 0 bytes (a full disk, a truncating copy) is not taken for a new, empty history: SQLite
        would, and every job's record would be gone without a word. (A new database has its header written
        before ``Store()`` returns; in WAL mode its pages may still be in the -wal file.)"""
        try:
            if self.path.stat().st_size > 0 or os.path.getsize(f"{self.path}-wal") > 0:
                return
        except FileNotFoundError:
            if not self.path.exists():
                return
        raise UserError(f"{self.path}: 0 bytes: the job history it held is gone (a full disk? a truncating copy?); "
                        f"move it aside (mv {self.path} {self.path}.empty) to start a new history, or restore it "
                        "from a backup")

    def _create_private_file(self) -> None:
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError as exc:
            raise ClusterctlError(f"{self.path}: cannot open state database: {exc.strerror or exc}") from None
        try:
            info = os.fstat(fd)
            if (not hasattr(os, "getuid") or info.st_uid == os.getuid()) and info.st_mode & 0o077:
                os.fchmod(fd, 0o600)
        finally:
            os.close(fd)

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(self.path, timeout=self._busy_timeout_s, isolation_level=None,
                               check_same_thread=False)
        conn.row_factory = sqlite3.Row
        why = ("" if self.journal == "wal" else
               f" (it is on a network file system, where SQLite's WAL does not work, so clusterctl uses a "
               f"{self.journal.upper()} journal there; a process that still has it open in WAL mode, e.g. a "
               "supervisor of an older clusterctl, must end first, or keep the state dir on a local disk)")
        try:
            conn.execute(f"PRAGMA busy_timeout = {int(self._busy_timeout_s * 1000)}")
            mode = conn.execute(f"PRAGMA journal_mode = {self.journal.upper()}").fetchone()[0]
            if mode.lower() != self.journal:
                raise ClusterctlError(f"{self.path}: cannot switch the state database to {self.journal.upper()} "
                                      f"mode ({mode}){why}")
            # WAL: NORMAL is durable enough (a commit may be lost at a power cut, never the database); a rollback
            # journal needs FULL for that
            conn.execute("PRAGMA synchronous = NORMAL" if self.journal == "wal" else "PRAGMA synchronous = FULL")
            conn.execute("PRAGMA foreign_keys = ON")
        except sqlite3.DatabaseError as exc:
            conn.close()
            if "not a database" in str(exc) or "malformed" in str(exc):
                raise UserError(f"{self.path}: not a clusterctl state database ({exc}): move it aside (mv "
                                f"{self.path} {self.path}.corrupt) and rerun to start a new history") from None
            raise ClusterctlError(f"{self.path}: cannot open state database: {exc}{why}") from None
        self._pid = os.getpid()
        return conn

    @contextmanager
    def _locked(self) -> Iterator[sqlite3.Connection]:
        if self._pid != os.getpid():   # used after fork: neither the lock nor the connection may cross it
            self._inherited.append(self._conn)
            self._lock = threading.RLock()
            self._conn = self._connect()
        with self._lock:
            yield self._conn

    def _migrate(self) -> None:
        with self._write() as db:
            version = db.execute("PRAGMA user_version").fetchone()[0]
            if version > SCHEMA_VERSION:
                raise ClusterctlError(f"{self.path}: state database has schema {version}, newer than this "
                                      f"clusterctl understands ({SCHEMA_VERSION}); upgrade clusterctl")
            for statements in _MIGRATIONS[version:]:
                for statement in statements:
                    if not _has_column(db, statement):     # a column added again: the step is idempotent
                        db.execute(statement)
            if version != SCHEMA_VERSION:
                db.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")

    @contextmanager
    def transaction(self) -> Iterator[None]:
        """Several writes as one IMMEDIATE transaction (``store.ledger``'s methods): every write method called
        inside joins it, all commit or none does, and ``on_state`` hears of them after the commit. The store's
        lock is held throughout: another thread's writes wait for the end. Nested: joins the outer one."""
        with self._locked():
            if self._tx is not None:
                yield
                return
            after: list[Callable[[], None]] = []
            with self._write() as db:
                self._tx, self._after = db, after
                try:
                    yield
                finally:
                    self._tx = None
        for listener in after:          # reached only once the transaction committed
            listener()

    def _after_commit(self, listener: Callable[[], None]) -> None:
        if self._tx is not None:
            self._after.append(listener)
        else:
            listener()

    @contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One IMMEDIATE transaction: takes the write lock up front, waiting up to the busy timeout (inside a
        ``transaction()``: that one)."""
        with self._locked() as db:
            if self._tx is not None:
                yield db
                return
            try:
                db.execute("BEGIN IMMEDIATE")
            except sqlite3.OperationalError as exc:
                raise ClusterctlError(f"{self.path}: state database is busy: {exc}") from None
            try:
                yield db
                db.execute("COMMIT")
            except BaseException as exc:
                try:   # a failed statement or COMMIT may have ended the transaction already: its error is the news
                    db.execute("ROLLBACK")
                except sqlite3.Error:
                    pass
                if isinstance(exc, sqlite3.Error):
                    raise StoreError(f"{self.path}: cannot write the state database: {exc}"
                                     + (" (is the disk full?)" if "full" in str(exc) or "I/O" in str(exc)
                                        else "")) from exc
                raise

    def _read(self, sql: str, params: Sequence[Any] = ()) -> list[sqlite3.Row]:
        with self._locked() as db:
            return db.execute(sql, params).fetchall()

    def close(self) -> None:
        with self._lock:
            if self._pid == os.getpid():
                self._conn.close()

    def __enter__(self) -> "Store":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def now(self) -> float:
        """The store's clock: the time it writes on jobs, attempts and events."""
        return self._clock()

    def add_secrets(self, values: Iterable[str]) -> None:
        """Register more secret values to redact from free text (e.g. once the job's secret_env is read)."""
        self._secrets = tuple(dict.fromkeys(self._secrets + tuple(v for v in values if v)))

    def _redact(self, text: str | None) -> str | None:
        return redact(text, self._secrets) if self._secrets else text

    # -- jobs ---------------------------------------------------------------------------------------------------

    def create_job(self, name: str, spec_json: str, inventory_path: str | None, job_path: str | None, *,
                   exclusive: bool = True) -> str:
        """Insert a PENDING job and return its id ``<name>-<YYYYmmdd-HHMMSS>-<12 hex>`` (UTC; 48 random bits, so ids
        made in the same second by different state dirs, which share nodes and checkpoint dirs, do not collide).
        With ``exclusive``, raises ``JobActive`` if a non-terminal job of that name exists (checked atomically)."""
        if not JOB_NAME_RE.match(name):
            raise UserError(f"invalid job name {name!r}: lowercase letters, digits and '-' (at most 63)")
        now = self._clock()
        stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
        with self._write() as db:
            if exclusive:
                active = self._active(db, name)
                if active is not None:
                    raise JobActive(active)
            while True:
                job_id = f"{name}-{stamp}-{_secrets.token_hex(ID_RANDOM_BYTES)}"
                try:
                    db.execute("INSERT INTO jobs (job_id, name, state, spec_json, inventory_path, job_path,"
                               " created_at, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                               (job_id, name, JobState.PENDING.value, spec_json, _opt_str(inventory_path),
                                _opt_str(job_path), now, now))
                    return job_id
                except sqlite3.IntegrityError:   # same name, same second, same 12 hex: draw again
                    continue

    def find_job(self, job_id_or_name: str) -> Job | None:
        """The job with that id, else the newest job with that name, else None."""
        rows = self._read("SELECT * FROM jobs WHERE job_id = ? UNION ALL SELECT * FROM"
                          " (SELECT * FROM jobs WHERE name = ? ORDER BY created_at DESC, rowid DESC LIMIT 1)",
                          (job_id_or_name, job_id_or_name))
        return _job(rows[0]) if rows else None

    def get_job(self, job_id_or_name: str) -> Job:
        """Like ``find_job``, then a unique prefix of a job id (as docker and git take one); ``JobNotFound`` or,
        for a prefix of several ids, ``AmbiguousJob`` (both ``UserError``s)."""
        job = self.find_job(job_id_or_name)
        if job is not None:
            return job
        if job_id_or_name:
            rows = self._read("SELECT * FROM jobs WHERE substr(job_id, 1, ?) = ? ORDER BY created_at DESC, rowid DESC"
                              " LIMIT 21", (len(job_id_or_name), job_id_or_name))
            if len(rows) == 1:
                return _job(rows[0])
            if rows:
                raise AmbiguousJob(job_id_or_name, [r["job_id"] for r in rows])
        raise JobNotFound(job_id_or_name)

    def job_state(self, job_id: str) -> JobState:
        """Only the state of job ``job_id`` (the supervisor asks every probe round: one column, not the row)."""
        rows = self._read("SELECT state FROM jobs WHERE job_id = ?", (job_id,))
        if not rows:
            raise JobNotFound(job_id)
        return JobState(rows[0][0])

    def active_job(self, name: str) -> Job | None:
        """The newest non-terminal job named ``name``."""
        with self._locked() as db:
            return self._active(db, name)

    @staticmethod
    def _active(db: sqlite3.Connection, name: str) -> Job | None:
        marks = ",".join("?" * len(TERMINAL_STATES))
        row = db.execute(f"SELECT * FROM jobs WHERE name = ? AND state NOT IN ({marks})"
                         " ORDER BY created_at DESC, rowid DESC LIMIT 1",
                         (name, *(s.value for s in TERMINAL_STATES))).fetchone()
        return _job(row) if row else None

    def list_jobs(self, *, name: str | None = None) -> list[Job]:
        """All jobs (or those named ``name``), newest first."""
        where, params = ("WHERE name = ?", (name,)) if name is not None else ("", ())
        return [_job(r) for r in self._read(f"SELECT * FROM jobs {where} ORDER BY created_at DESC, rowid DESC",
                                            params)]

    def set_state(self, job_id: str, state: JobState | str, reason: str | None = None, *,
                  expect: Iterable[JobState] | None = None) -> JobState:
        """Move the job to ``state`` (reason replaces the old one) and return the previous state.
        Raises ``InvalidTransition`` if ``TRANSITIONS`` forbids it, e.g. a RUNNING update after a user's STOP, or
        when the job is not in one of the states the caller ``expect``s (the supervisor expects an active job: a
        `stop` that came first must not be overridden, although STOPPED -> RECOVERING is allowed for `resume`)."""
        new = JobState(state)
        allowed = None if expect is None else frozenset(JobState(s) for s in expect)
        with self._write() as db:
            row = db.execute("SELECT state FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(job_id)
            old = JobState(row["state"])
            if (new != old and new not in TRANSITIONS[old]) or (allowed is not None and old not in allowed):
                raise InvalidTransition(job_id, old, new)
            db.execute("UPDATE jobs SET state = ?, reason = ?, updated_at = ? WHERE job_id = ?",
                       (new.value, self._redact(reason), self._clock(), job_id))
        if self.on_state is not None:   # after the commit: a listener (notify.Notifier) reads the new row
            listener = self.on_state
            self._after_commit(lambda: listener(job_id, old, new))
        return old

    def update_job(self, job_id: str, **fields: Any) -> None:
        """Set columns in ``JOB_FIELDS`` (not ``state``: use ``set_state``)."""
        unknown = set(fields) - JOB_FIELDS
        if unknown:
            raise TypeError(f"update_job: cannot set {', '.join(sorted(unknown))}")
        if "reason" in fields:
            fields["reason"] = self._redact(fields["reason"])
        assignments = "".join(f"{key} = ?, " for key in fields)
        with self._write() as db:
            cur = db.execute(f"UPDATE jobs SET {assignments}updated_at = ? WHERE job_id = ?",
                             (*fields.values(), self._clock(), job_id))
            if cur.rowcount == 0:
                raise JobNotFound(job_id)

    # -- attempts and nodes -------------------------------------------------------------------------------------

    def start_attempt(self, job_id: str, attempt: int, rdzv_host: str | None, rdzv_id: str | None,
                      nodes: Sequence[str], checkpoint_path: str | None = None,
                      checkpoint_step: int | None = None) -> Attempt:
        """Record a new attempt (``nodes`` in rank order) and make it the job's current ``attempt``."""
        now = self._clock()
        with self._write() as db:
            cur = db.execute("UPDATE jobs SET attempt = ?, updated_at = ? WHERE job_id = ?", (attempt, now, job_id))
            if cur.rowcount == 0:
                raise JobNotFound(job_id)
            db.execute("INSERT INTO attempts (job_id, attempt, rdzv_host, rdzv_id, nodes_json, started_at,"
                       " checkpoint_path, checkpoint_step) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
                       (job_id, attempt, rdzv_host, rdzv_id, json.dumps(list(nodes)), now,
                        _opt_str(checkpoint_path), checkpoint_step))
            return _attempt(db.execute("SELECT * FROM attempts WHERE job_id = ? AND attempt = ?",
                                       (job_id, attempt)).fetchone())

    def end_attempt(self, job_id: str, attempt: int, result: str) -> bool:
        """Record the attempt's end and result, once: an attempt that has ended keeps its recorded result (a
        later writer, e.g. a supervisor that saw a `stop`'s effect, or a reconcile, never overwrites it). An
        attempt that ends ``stopped`` has no node left ``running`` (a `stop` during its start: the nodes that
        had started read stopped). Returns whether this call recorded it."""
        now = self._clock()
        with self._write() as db:
            cur = db.execute("UPDATE attempts SET ended_at = ?, result = ? WHERE job_id = ? AND attempt = ?"
                             " AND ended_at IS NULL", (now, result, job_id, attempt))
            if cur.rowcount == 0 and db.execute("SELECT 1 FROM attempts WHERE job_id = ? AND attempt = ?",
                                                (job_id, attempt)).fetchone() is None:
                raise ClusterctlError(f"job {job_id}: no attempt {attempt}")
            if cur.rowcount and result == "stopped":
                db.execute("UPDATE nodes SET state = 'stopped', updated_at = ? WHERE job_id = ? AND attempt = ?"
                           " AND state = 'running'", (now, job_id, attempt))
            return cur.rowcount > 0

    def attempts(self, job_id: str) -> list[Attempt]:
        return [_attempt(r) for r in self._read("SELECT * FROM attempts WHERE job_id = ? ORDER BY attempt",
                                                (job_id,))]

    def set_node(self, job_id: str, attempt: int, node: str, **fields: Any) -> NodeStatus:
        """Insert or update one node of an attempt; only the given ``NODE_FIELDS`` change. Two states settle:
        a node that reads ``stopped`` stays stopped (a `stop` ended it: the exit its processes made of the SIGTERM
        is not a failure), and no node reads ``running`` under an attempt that has ended (a start that finished
        after a `stop` ended the attempt)."""
        unknown = set(fields) - set(NODE_FIELDS)
        if unknown:
            raise TypeError(f"set_node: cannot set {', '.join(sorted(unknown))}")
        if "error_tail" in fields:
            fields["error_tail"] = self._redact(fields["error_tail"])
        with self._write() as db:
            if fields.get("state") is not None:
                fields = self._settled(db, job_id, attempt, node, fields)
            columns = ["job_id", "attempt", "node", *fields, "updated_at"]
            updates = ", ".join(f"{c} = excluded.{c}" for c in [*fields, "updated_at"])
            db.execute(f"INSERT INTO nodes ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})"
                       f" ON CONFLICT (job_id, attempt, node) DO UPDATE SET {updates}",
                       (job_id, attempt, node, *fields.values(), self._clock()))
            return _row(NodeStatus, db.execute("SELECT * FROM nodes WHERE job_id = ? AND attempt = ? AND node = ?",
                                               (job_id, attempt, node)).fetchone())

    @staticmethod
    def _settled(db: sqlite3.Connection, job_id: str, attempt: int, node: str, fields: dict) -> dict:
        """``fields`` without a state change that ``set_node``'s rules refuse."""
        prev = db.execute("SELECT state FROM nodes WHERE job_id = ? AND attempt = ? AND node = ?",
                          (job_id, attempt, node)).fetchone()
        if prev is not None and prev["state"] == "stopped":
            return {k: v for k, v in fields.items() if k not in ("state", "exit_code", "signal")}
        if fields["state"] == "running":
            ended = db.execute("SELECT result FROM attempts WHERE job_id = ? AND attempt = ? AND ended_at IS NOT"
                               " NULL", (job_id, attempt)).fetchone()
            if ended is not None:
                fields = {k: v for k, v in fields.items() if k != "state"}
                if ended["result"] == "stopped" and (prev is None or prev["state"] is None):
                    fields["state"] = "stopped"
        return fields

    def nodes(self, job_id: str, attempt: int | None = None) -> list[NodeStatus]:
        """Nodes of ``attempt`` (default: the job's current attempt), by rank then name."""
        if attempt is None:
            attempt = self.get_job(job_id).attempt
        rows = self._read("SELECT * FROM nodes WHERE job_id = ? AND attempt = ?"
                          " ORDER BY rank IS NULL, rank, node", (job_id, attempt))
        return [_row(NodeStatus, r) for r in rows]

    # -- events -------------------------------------------------------------------------------------------------

    def add_event(self, job_id: str, kind: str, message: str, **fields: Any) -> Event:
        """Append an event; ``fields`` among ``EVENT_FIELDS``. The message is redacted."""
        unknown = set(fields) - EVENT_FIELDS
        if unknown:
            raise TypeError(f"add_event: cannot set {', '.join(sorted(unknown))}")
        columns = ["job_id", "time", "kind", "message", *fields]
        with self._write() as db:
            cur = db.execute(f"INSERT INTO events ({', '.join(columns)}) VALUES ({', '.join('?' * len(columns))})",
                             (job_id, self._clock(), kind, self._redact(message) or "", *fields.values()))
            return _row(Event, db.execute("SELECT * FROM events WHERE id = ?", (cur.lastrowid,)).fetchone())

    def last_event(self, job_id: str, kind: str) -> Event | None:
        """The job's newest event of ``kind``."""
        rows = self._read("SELECT * FROM events WHERE job_id = ? AND kind = ? ORDER BY id DESC LIMIT 1",
                          (job_id, str(kind)))
        return _row(Event, rows[0]) if rows else None

    def events(self, job_id: str, *, after_id: int = 0, limit: int | None = None) -> list[Event]:
        """Events in the order they were added; ``after_id`` to follow new ones."""
        rows = self._read("SELECT * FROM events WHERE job_id = ? AND id > ? ORDER BY id LIMIT ?",
                          (job_id, after_id, -1 if limit is None else limit))
        return [_row(Event, r) for r in rows]

    # -- forgetting and cordons -----------------------------------------------------------------------------------

    def delete_job(self, job_id: str) -> None:
        """Delete a finished job's records (attempts, nodes, events go with it). ``JobActive`` if not terminal."""
        with self._write() as db:
            row = db.execute("SELECT * FROM jobs WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(job_id)
            if not JobState(row["state"]).terminal:
                raise JobActive(_job(row))
            db.execute("DELETE FROM jobs WHERE job_id = ?", (job_id,))

    def cordon(self, host: str, reason: str, by: str = "user") -> Cordon:
        """Mark ``host`` cordoned (a new reason replaces the old one; ``since`` is kept while it stays cordoned)."""
        now = self._clock()
        with self._write() as db:
            db.execute("INSERT INTO cordons (host, active, reason, since, by) VALUES (?, 1, ?, ?, ?)"
                       " ON CONFLICT (host) DO UPDATE SET reason = excluded.reason, by = excluded.by,"
                       " since = CASE WHEN active = 1 THEN since ELSE excluded.since END, active = 1",
                       (host, self._redact(reason) or "", now, by))
            return _cordon(db.execute("SELECT * FROM cordons WHERE host = ?", (host,)).fetchone())

    def uncordon(self, host: str) -> bool:
        """Clear the cordon of ``host``; False when it was not cordoned."""
        with self._write() as db:
            cur = db.execute("UPDATE cordons SET active = 0, since = ? WHERE host = ? AND active = 1",
                             (self._clock(), host))
            return cur.rowcount > 0

    def cordons(self, *, include_released: bool = False) -> dict[str, Cordon]:
        """host -> Cordon of every cordoned host (with ``include_released``: the uncordoned ones too)."""
        where = "" if include_released else " WHERE active = 1"
        return {r["host"]: _cordon(r) for r in self._read(f"SELECT * FROM cordons{where} ORDER BY host")}

    def host_failures(self, host: str, klasses: Iterable[str], window_s: float) -> int:
        """Failures of ``host`` (verdicts and start failures of these classes) within the last ``window_s``,
        counting only those after its last uncordon."""
        klasses = tuple(klasses)
        since = self._clock() - window_s
        released = self._read("SELECT since FROM cordons WHERE host = ? AND active = 0", (host,))
        if released:
            since = max(since, released[0]["since"])
        marks = ",".join("?" * len(klasses))
        rows = self._read(f"SELECT COUNT(*) AS n FROM events WHERE node = ? AND time > ? AND klass IN ({marks})"
                          " AND kind IN ('verdict', 'start_failed')", (host, since, *klasses))
        return int(rows[0]["n"])

    def node_events(self, *, since: float = 0.0) -> list[Event]:
        """Every job's classified events that name a node, from ``since`` on (for `clusterctl nodes`)."""
        return [_row(Event, r) for r in self._read("SELECT * FROM events WHERE time >= ? AND node IS NOT NULL"
                                                   " AND klass IS NOT NULL ORDER BY id", (since,))]

    def all_attempts(self) -> list[Attempt]:
        return [_attempt(r) for r in self._read("SELECT * FROM attempts ORDER BY job_id, attempt")]

    # -- supervisor ownership -----------------------------------------------------------------------------------

    def claim_supervisor(self, job_id: str, pid: int, *, is_live: Callable[[int], bool] | None = None,
                         stale_s: float = SUPERVISOR_STALE_S) -> bool:
        """Record ``pid`` on this store's host as the job's supervisor unless another live one is recorded. Atomic
        across processes (and hosts sharing the database). A recorded supervisor on this host and boot is live when
        ``is_live(pid)`` (is that pid still the job's supervisor, not a reused pid? default: the store's
        ``pid_alive``); one on another host (or boot) when its heartbeat is at most ``stale_s`` old."""
        hostname, boot = self.host
        with self._write() as db:
            row = db.execute("SELECT supervisor_pid, supervisor_host, supervisor_boot, supervisor_seen_at FROM jobs"
                             " WHERE job_id = ?", (job_id,)).fetchone()
            if row is None:
                raise JobNotFound(job_id)
            current = row["supervisor_pid"]
            now = self._clock()
            if current is not None:
                here = row["supervisor_host"] is None or (row["supervisor_host"], row["supervisor_boot"]) == self.host
                if here:
                    live = current != pid and (is_live or self._pid_alive)(current)
                else:
                    live = row["supervisor_seen_at"] is not None and now - row["supervisor_seen_at"] <= stale_s
                if live:
                    return False
            db.execute("UPDATE jobs SET supervisor_pid = ?, supervisor_host = ?, supervisor_boot = ?,"
                       " supervisor_seen_at = ?, updated_at = ? WHERE job_id = ?",
                       (pid, hostname, boot, now, now, job_id))
            return True

    def heartbeat(self, job_id: str, pid: int) -> bool:
        """The supervisor ``pid`` (on this store's host) is alive now (``status`` calls a job unsupervised when
        this gets old). False when it is no longer the job's supervisor."""
        with self._write() as db:
            cur = db.execute("UPDATE jobs SET supervisor_seen_at = ? WHERE job_id = ? AND supervisor_pid = ?"
                             " AND supervisor_host IS ? AND supervisor_boot IS ?",
                             (self._clock(), job_id, pid, *self.host))
            return cur.rowcount > 0

    def release_supervisor(self, job_id: str, pid: int) -> bool:
        """Clear the supervisor pid if it is still ``pid`` on this host; returns whether it was."""
        with self._write() as db:
            cur = db.execute("UPDATE jobs SET supervisor_pid = NULL, updated_at = ?"
                             " WHERE job_id = ? AND supervisor_pid = ? AND supervisor_host IS ?"
                             " AND supervisor_boot IS ?", (self._clock(), job_id, pid, *self.host))
            return cur.rowcount > 0


def _has_column(db: sqlite3.Connection, statement: str) -> bool:
    """``statement`` is ``ALTER TABLE t ADD COLUMN c ...`` and ``t`` has ``c`` already."""
    words = statement.split()
    if words[:2] != ["ALTER", "TABLE"] or words[3:5] != ["ADD", "COLUMN"]:
        return False
    return any(r["name"] == words[5] for r in db.execute(f"PRAGMA table_info({words[2]})"))


def _opt_str(value: Any) -> str | None:
    return None if value is None else os.fspath(value)


def _row(cls: type, row: sqlite3.Row) -> Any:
    values = {f.name: row[f.name] for f in dataclass_fields(cls)}
    if "oom" in values and values["oom"] is not None:
        values["oom"] = bool(values["oom"])
    if cls is Event:
        values["kind"] = kind_of(values["kind"])
    return cls(**values)


def _job(row: sqlite3.Row) -> Job:
    values = {f.name: row[f.name] for f in dataclass_fields(Job)}
    values["state"] = JobState(values["state"])
    return Job(**values)


def _cordon(row: sqlite3.Row) -> Cordon:
    return Cordon(host=row["host"], active=bool(row["active"]), reason=row["reason"], since=row["since"],
                  by=row["by"])


def _attempt(row: sqlite3.Row) -> Attempt:
    values = {f.name: row[f.name] for f in dataclass_fields(Attempt) if f.name != "nodes"}
    return Attempt(nodes=tuple(json.loads(row["nodes_json"])), **values)
