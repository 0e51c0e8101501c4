"""The supervisor: observe every node, classify what happened, act (relaunch from the latest valid checkpoint).

The loop is small and explicit, like torch.distributed.elastic's agent monitor loop: ``classify`` is a pure
function of the observations, and every side effect goes through the ``NodeOps`` passed in, so tests drive the
loop with a fake fed a scripted sequence of observations.
"""
from __future__ import annotations

import dataclasses
import math
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from dataclasses import dataclass, field, replace
from typing import Callable, Protocol, Sequence

from clusterctl.model import budget, causes
from clusterctl.model.ranks import RankView
from clusterctl.model.events import EventKind, Relaunch, StragglerSeen
from clusterctl.model.verdicts import INFRA, Decision, NodeError, Observation, Started, Verdict, node_state
from clusterctl.store.ledger import Ledger, Note, note
from clusterctl.store.state import ACTIVE_STATES, InvalidTransition, JobState, Store, StoreError
from clusterctl.supervise import jobdir
from clusterctl.supervise.ranklook import Look, RankWatch

RANKS_EVERY_S = 1.9  # ranks.json at most this often (``top`` refreshes every 2 s), and whenever a rank is newly named
PEER_SETTLE = 4     # a rank that failed because a peer went away waits this many settle_s for the peer's node
STARTUP_EVERY_S = 2.0   # an attempt's start-up is said when it changes, at most this often within one phase
GPU_RECHECK_S = 10.0    # a node left out for a GPU error whose GPU check failed is checked again after this


@dataclass(frozen=True)
class Charged:
    """A failure charged to a budget, recorded with the attempt's end: its ``progress``/``budget`` notes, the
    budget's new use (infra?, used) and, when that exhausts it, the job's end reason."""
    notes: list[Note]
    budget: tuple[bool, int]
    exhausted: str | None = None


class Preempted(Exception):
    """The job left the supervisor's hands between two of its steps: `clusterctl stop` (or another writer, e.g.
    ``status`` reconciling a supervisor it took for dead) ended it first. The supervisor cleans up and exits."""


@dataclass
class Health:
    """Per-attempt memory of the monitor: consecutive probe failures and time of last progress."""

    started: float
    last_progress: float
    failures: dict[str, int] = field(default_factory=dict)
    failed_since: float | None = None   # when a rank's non-zero exit was first seen (user error not yet confirmed)
    first_checkpoint: bool = False      # the attempt wrote its first new checkpoint
    first_progress: bool = False        # the attempt made its first progress: its ranks' first output or a new
                                        # checkpoint (before it: first_progress_timeout_s is the hang bound)
    startup: tuple[str, str, float] | None = None   # the start-up's (phase, message, when) said last
    started_up: bool = False            # its first step was seen: nothing more to say of its start-up


def classify(obs: Sequence[Observation], health: Health, *, rdzv_host: str, probe_failures: int,
             hang_timeout_s: float, now: float, settle_s: float = 0.0,
             first_progress_timeout_s: float | None = None) -> Decision:
    """Pure: what the latest round of observations means for the attempt.

    A lost node wins over a non-zero exit: when a node dies, the survivors' ranks fail too (gloo "connection
    closed", c10d ``RendezvousConnectionError``), often before the dead node is seen. So a non-zero exit is a
    user error only once it has been seen for ``settle_s`` with every other node answering and none lost (or at
    once when no node is left running); ``PEER_SETTLE`` x ``settle_s`` when every failed rank says a peer went away.

    Hung: no progress (the ranks' output, a new checkpoint; torchrun's own lines are not progress) for
    ``hang_timeout_s``; until the attempt's first progress for ``first_progress_timeout_s`` (at least
    ``hang_timeout_s``): torch.compile, NCCL's init at scale or a large checkpoint load make a silent first step.
    """
    for o in obs:
        if o.state != "probe_error":       # a bug of ours says nothing about the node: the count stands
            health.failures[o.node] = health.failures.get(o.node, 0) + 1 if o.state == "unreachable" else 0
        if o.progress:
            health.last_progress = now
            health.first_progress = True
    lost = [o for o in obs if o.state == "missing" or (o.exit_code == 137 and o.rank is None)
            or health.failures.get(o.node, 0) >= probe_failures]
    if lost:
        names = tuple(o.node for o in lost)
        first = lost[0]
        verdict = Verdict.RDZV_LOST if rdzv_host in names else Verdict.NODE_LOST
        why = {"missing": "its container/process is gone", "unreachable":
               f"unreachable for {probe_failures} consecutive probes"}.get(first.state, f"killed by {first.signal}")
        unreachable = tuple(o.node for o in lost if o.state == "unreachable")
        return Decision(verdict, names, first.node, first.exit_code, first.signal,
                        f"node {first.node} lost: {why}", first.error_tail, first.rank, unreachable)
    failed = [o for o in obs if o.state == "exited" and o.exit_code not in (0, None)]
    if failed and health.failed_since is None:
        health.failed_since = now
    if any(o.state in ("unreachable", "probe_error") for o in obs):
        return Decision(Verdict.CONTINUE)  # one failed probe is not a lost node (SkyPilot's lesson)
    gpu = next((o for o in failed if o.gpu_error), None)
    if gpu is not None:     # the evidence names the node: no need to wait for a peer (the others failed because of it)
        where = f"node {gpu.node}" + (f" rank {gpu.rank}" if gpu.rank is not None else "")
        return Decision(Verdict.GPU_ERROR, (gpu.node,), gpu.node, gpu.exit_code, gpu.signal,
                        f"{where}: GPU error: {gpu.gpu_error} (the node is left out of the relaunch)",
                        gpu.error_tail, gpu.rank)
    if failed:
        # is a peer about to be found dead? (then it is not a user error). When every failed rank says a peer went
        # away (gloo "Connection closed by peer"), the cause is on a node still running: its torchrun may still be
        # stopping its other ranks before it exits with the killed rank's signal. Wait longer for it (bounded).
        wait = settle_s * (PEER_SETTLE if all(causes.peer_failure(o.error_tail) for o in failed) else 1)
        if any(o.state == "running" for o in obs) and now - health.failed_since < wait:
            return Decision(Verdict.CONTINUE)
        cfg = next((o for o in failed if o.config_error), None)
        if cfg is not None:
            return Decision(Verdict.CONFIG_ERROR, (), cfg.node, cfg.exit_code, cfg.signal, cfg.config_error,
                            cfg.error_tail, cfg.rank)
        # the culprit: a rank that failed on its own (not because a peer went away), killed by a signal first (the
        # others failed because of it); else a rank killed by a signal, else the first. A peer aborted by NCCL's
        # watchdog (SIGABRT) is a victim: its error says so (causes.peer_failure), while the culprit exits 1
        own = [o for o in failed if not causes.peer_failure(o.error_tail)]
        f = (next((o for o in own if o.signal), None) or (own[0] if own else None)
             or next((o for o in failed if o.signal), failed[0]))
        where = f"node {f.node}" + (f" rank {f.rank}" if f.rank is not None else "")
        if f.signal and f.rank is not None:
            why = " by the OOM killer (out of memory)" if f.oom else ""
            return Decision(Verdict.KILLED, (), f.node, f.exit_code, f.signal,
                            f"{where} was killed by {f.signal}{why}", f.error_tail, f.rank, oom=f.oom)
        return Decision(Verdict.USER_ERROR, (), f.node, f.exit_code, f.signal,
                        f"{where} exited with code {f.exit_code}", f.error_tail, f.rank)
    if obs and all(o.state == "exited" and o.exit_code == 0 for o in obs):
        return Decision(Verdict.SUCCESS, message="every node finished with exit code 0")
    limit, key = hang_timeout_s, "supervisor.hang_timeout_s"
    if not health.first_progress and first_progress_timeout_s is not None and first_progress_timeout_s > limit:
        limit, key = first_progress_timeout_s, "supervisor.first_progress_timeout_s: before the attempt's first progress"
    if now - health.last_progress > limit:
        return Decision(Verdict.HANG, message=f"no progress (log output or checkpoint) for {limit:g}s ({key})")
    return Decision(Verdict.CONTINUE)


class NodeOps(Protocol):
    """Everything the supervisor does to the cluster: the whole port (the loop asks nothing else of ``ops``). The
    real one is ``cluster_ops.ClusterOps``; the tests' fakes implement the same port. An implementation subclasses
    ``NodeOps`` and inherits the capabilities a cluster may lack, below the first block, which answer None ("not
    here": the loop does without) or nothing; ``Supervisor`` refuses one short of a member (``port_problems``)."""

    def start(self, attempt: int, nodes: Sequence[str], rdzv_host: str, resume: tuple[str, int]) -> Started:
        """Start the attempt on ``nodes``, writing nothing: the nodes started (rows, warm or cold and why), or the
        errors of the nodes that failed to start (what started on the others rolled back)."""
        raise NotImplementedError

    def observe(self, attempt: int, nodes: Sequence[str]) -> list[Observation]:
        raise NotImplementedError

    def stop(self, attempt: int | None, nodes: Sequence[str]) -> dict[str, NodeError]:
        """Gang-stop (TERM, grace, KILL, remove). attempt None = every attempt of the job. {node: error}."""
        raise NotImplementedError

    def reachable(self, nodes: Sequence[str]) -> list[str]:
        raise NotImplementedError

    def latest_checkpoint(self, nodes: Sequence[str]) -> tuple[str, int] | None:
        """(path, step); ("", 0) when there is none; None when no node could tell."""
        raise NotImplementedError

    def stop_requested(self) -> bool:
        raise NotImplementedError

    # ------------------------------------------------------------- what a cluster may lack: None, "not here"
    def checkpoint_hint(self) -> int | None:
        """The newest checkpoint step seen (unverified), so a new one is verified at once; None: ask every
        ``checkpoint_every_probes`` rounds."""
        return None

    def gpu_check(self, nodes: Sequence[str]) -> dict[str, str] | None:
        """node -> why, for the ``nodes`` that fail launch's GPU checks; a node left out for a GPU error passes
        them before it is used again. None: no check here (reachable is enough)."""
        return None

    def rank_views(self, attempt: int) -> dict | None:
        """node -> rank -> ``model.ranks.RankView``: what every rank is doing ({} when the node side writes none);
        None: no rank view here."""
        return None

    def dump_ranks(self, attempt: int, nodes: Sequence[str], dest_dir: str) -> dict[str, str] | None:
        """Every rank's flight-recorder dump and stack copied into ``dest_dir``; node -> why not. None: none here."""
        return None

    def socket_fallback(self, attempt: int) -> list[tuple[str, str]] | None:
        """(node, NCCL's line) for each node whose NCCL fell back to sockets where InfiniBand is expected."""
        return None

    def stacks(self, attempt: int, nodes: Sequence[str]) -> str | None:
        """Where every rank waits (one line per group of ranks), taken on a hang before the gang-stop and stored as
        a ``stacks`` event. None: no stacks here."""
        return None

    def teardown(self, nodes: Sequence[str]) -> dict[str, NodeError] | None:
        """The job ended: remove what its recovery strategy keeps on ``nodes`` (warm: the zygotes and warm dirs);
        {node: error}. None: nothing kept here."""
        return None

    def known(self, nodes: Sequence[str]) -> list[str]:
        """Those of ``nodes`` this cluster can reach by name (the job's record: one `resume --exclude` took out
        is not); all of them unless the cluster says otherwise."""
        return list(nodes)

    def startup(self, attempt: int) -> tuple[str, str] | None:
        """Where ``attempt``'s start-up stands: (phase, message), e.g. ("rendezvous", "waiting for rendezvous: 1/2
        nodes joined"), phase "first_step" once it stepped; None: nothing (new) to say."""
        return None

    def slurm_drained(self, nodes: Sequence[str]) -> set[str]:
        """Those of ``nodes`` that Slurm reports drained, down or not responding (none outside Slurm)."""
        return set()

    def slurm_drain(self, node: str, reason: str) -> tuple[bool, str] | None:
        """Drain ``node`` in Slurm: (done, Slurm's message). None: not under Slurm."""
        return None


def port_problems(impl: object) -> list[str]:
    """The members of ``NodeOps`` that ``impl`` lacks (an implementation that does not subclass it lacks the
    capabilities it would inherit): checked once, when a ``Supervisor`` is made."""
    own = [n for n, v in vars(NodeOps).items() if callable(v) and not n.startswith("_")]
    return [m for m in (*NodeOps.__annotations__, *own) if not hasattr(impl, m)]


@dataclass(frozen=True)
class Policy:
    min_nodes: int
    max_nodes: int
    max_failures: int = 3
    max_node_failures: int = 10
    backoff_s: float = 1.0
    backoff_max_s: float = 30.0
    probe_interval_s: float = 1.0
    probe_failures: int = 2
    hang_timeout_s: float = 300.0
    first_progress_timeout_s: float | None = None   # the hang bound until the attempt's first progress (None: hang's)
    wait_for_nodes_s: float = 300.0
    checkpoint_every_probes: int = 5     # without a hint from the ops: look for a new checkpoint every N rounds
    stop_every_probes: int = 3           # a steady job looks for `stop` (a DB read) every N rounds; any verdict looks
                                         # at once, and `stop` ends the processes, which the watches report at once
    checkpoint_lookup_tries: int = 10    # a relaunch waits this many probe intervals for a node to read the storage
    checkpoint_dir: str | None = None    # for messages only
    settle_s: float = 3.0                # a non-zero exit waits this long for a dead peer before it is a user error
    window_s: float | None = 86400.0     # budgets count failures within this window; None: since the last progress
    progress_after_s: float = 600.0      # an attempt with output for this long made progress (resets the backoff)
    cordon_after: int = 3                # infrastructure failures (INFRA) of a host in 24 h before it is cordoned (0: never)
    slurm_drain: bool = False            # a cordon also drains the node in Slurm (ops.slurm_drain)
    stuck_timeout_s: float = 20.0        # a stuck rank this long without progress: the attempt is a hang (0: off)
    stragglers: str = "warn"             # warn | relaunch (a straggler's node replaced by a spare when one exists)


class Supervisor:
    def __init__(self, job_id: str, store: Store, ops: NodeOps, policy: Policy, nodes: Sequence[str], *,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep,
                 wait: Callable[[float], None] | None = None, on_event: Callable[[str], None] | None = None,
                 job_dir: Path | None = None, wall: Callable[[], float] = time.time):
        """``sleep``: backoff and waiting for nodes; ``wait``: between probe rounds (may return early when a
        node's process ends, e.g. ``ClusterOps.wait_for_change``; default ``sleep``). ``job_dir``: where the
        rank view (``ranks.json``, for ``top``) and a hang's flight-recorder dumps (``hang-<attempt>/``) go."""
        missing = port_problems(ops)
        if missing:
            raise TypeError(f"{type(ops).__qualname__} is not a whole NodeOps: it lacks {', '.join(missing)} "
                            "(subclass clusterctl.supervise.supervisor.NodeOps)")
        self.job_id, self.store, self.ops, self.policy = job_id, store, ops, policy
        self.ledger = Ledger(store)     # every lifecycle write goes through it; the store is read directly
        self.all_nodes = list(nodes)
        self.clock, self.sleep, self.wait = clock, sleep, wait or sleep
        self.on_event = on_event or (lambda msg: None)
        self._last_checkpoint_step: int | None = None
        self._last_hint: int | None = None
        self._unclean: set[str] = set()   # nodes not cleaned up yet (unreachable, or the runtime refused)
        self._charges: list[budget.Charge] = []   # failures charged to the budgets (self.clock times)
        self._health: Health | None = None        # the monitor's memory of the attempt that just ended
        self._rows: dict[tuple[int, str], tuple] = {}   # (attempt, node) -> the node row last written
        self._attempt: int | None = None          # the attempt being started or run (for a preempted end)
        self._store_trouble_at = -math.inf        # when a refused write was last said in the log
        self.job_dir, self.wall = job_dir, wall
        self._ranks: RankWatch | None = None      # the attempt's rank view (issue 37)
        self._ranks_written = -math.inf           # when ranks.json was last written (self.clock)
        self._gpu_suspect: dict[str, tuple[str, float]] = {}   # node left out for a GPU error -> (why its last
                                                               # GPU check failed, when), until it passes one

    def event(self, kind: EventKind, message: str, **fields) -> None:
        self.ledger.event(self.job_id, kind, message, **fields)
        self.on_event(message)

    @contextmanager
    def _unless_preempted(self):
        """A lifecycle write that moves the job on: a transition refused because someone else ended the job
        first (`stop` during a backoff or a start) ends this supervisor's work (``Preempted``)."""
        try:
            yield
        except InvalidTransition:
            raise Preempted() from None

    # -------------------------------------------------------------------------------------------- the loop
    def run(self, *, adopt_attempt: int | None = None, adopt_note: str = "") -> JobState:
        """Supervise until the job ends. ``adopt_attempt``: an attempt already running (controller restart);
        ``adopt_note``: appended to the ``adopt`` event (how long the attempt ran unsupervised)."""
        job = self.store.get_job(self.job_id)
        attempt = adopt_attempt if adopt_attempt is not None else job.attempt
        excluded: set[str] = set()
        running = adopt_attempt is not None
        nodes: list[str] = []
        rdzv = ""
        first_attempt = attempt + 1
        if running:
            a = self.store.attempts(self.job_id)[-1]
            nodes, rdzv = list(a.nodes), a.rdzv_host
            self.event(EventKind.ADOPT, f"controller restarted: re-attached to attempt {attempt} on {', '.join(nodes)}"
                       + adopt_note, attempt=attempt, klass="controller_restart")
        self._charges = self._charged_before()
        self._attempt = attempt if running else None
        try:
            while True:
                if not running:
                    attempt += 1
                    started = self._start_attempt(attempt, excluded, first=attempt == first_attempt)
                    if started is None:
                        return self.store.get_job(self.job_id).state
                    nodes, rdzv, attempt = started
                    running = True
                decision = self._monitor(attempt, nodes, rdzv, adopted=attempt == adopt_attempt)
                running = False
                end = self._act(decision, attempt, nodes, excluded)
                if end is not None:
                    return end
        except Preempted:
            return self._preempted()

    def _preempted(self) -> JobState:
        """The job was ended by someone else while this supervisor worked (`stop` during a backoff, a start or a
        recovery): end the open attempt, remove what it started (containers started after the stop included),
        say so, and exit. Never raises for a transition it lost."""
        job = self.store.get_job(self.job_id)
        stopped = job.state == JobState.STOPPED
        a = self._attempt
        if a is not None and any(x.attempt == a and x.ended_at is None for x in self.store.attempts(self.job_id)):
            self.ledger.attempt_ended(self.job_id, a, "stopped" if stopped else "abandoned")
        if stopped or not job.terminal:
            self._cleanup(None, self.all_nodes)
        self._cleanup_unclean()
        message = (f"job {job.state.value}: {job.reason or 'ended by another command'}"
                   + (f" (during attempt {a}: what it started was removed)" if a is not None and stopped else ""))
        if stopped:   # the same state again: the reason stays the user's, and the notifier hears "stopped"
            self.ledger.job_ended(self.job_id, JobState.STOPPED, job.reason or "stopped by user", note_text=message)
            self.on_event(message)
        else:
            self.event(EventKind.END, message)
        return job.state

    def _start_attempt(self, attempt: int, excluded: set[str],
                       first: bool = False) -> tuple[list[str], str, int] | None:
        p = self.policy
        while True:
            candidates = [n for n in self._uncordoned(self.all_nodes) if n not in excluded]
            healthy = self.ops.reachable(candidates)
            if len(healthy) < p.min_nodes:
                healthy = self._wait_for_nodes(excluded)
                if healthy is None:
                    return None
            nodes = healthy[: p.max_nodes]
            rdzv = nodes[0]
            checkpoint = self._checkpoint_for_start(nodes)
            if checkpoint is None:
                return None
            path, step = checkpoint
            self._attempt = attempt
            message = (f"attempt {attempt}: starting on {', '.join(nodes)} (rendezvous {rdzv}); "
                       + (f"resuming from {path} (step {step})" if path else "no checkpoint yet"))
            with self._unless_preempted():      # after a `stop` (e.g. during the backoff): Preempted
                self.ledger.attempt_started(self.job_id, attempt, rdzv, nodes, (path, step), message,
                                            expect=ACTIVE_STATES)
            self.on_event(message)
            started = self.ops.start(attempt, nodes, rdzv, (path, step))
            errors = started.errors
            if not errors:
                relaunches = [] if first else self._relaunches(attempt, nodes, started)
                with self._unless_preempted():  # a `stop` during the start: Preempted removes what started
                    self.ledger.attempt_running(self.job_id, attempt, relaunches, expect=ACTIVE_STATES,
                                                nodes={n: s.row() for n, s in started.nodes.items()})
                for r in relaunches:
                    self.on_event(r.message())
                return nodes, rdzv, attempt
            failed = [note(EventKind.START_FAILED, f"attempt {attempt}: {node} failed to start: {e.message}",
                           attempt=attempt, node=node, klass="node_lost") for node, e in errors.items()]
            # a launch that cannot start is an error to show, not a failure to retry (charged to no budget)
            charged = None if first else self._charge(Verdict.NODE_LOST, f"{len(errors)} node(s) failed to start")
            self.ledger.attempt_ended(self.job_id, attempt, "start_failed", notes=failed + self._said(charged),
                                      budget=charged and charged.budget)
            for n in failed:
                self.on_event(n.message)
            self._tell(charged)
            if charged is None:
                node, e = next(iter(errors.items()))
                self._finish(JobState.FAILED, f"launch failed: {node} could not start: {e.message} "
                                              "(what started on the other nodes was removed)")
                return None
            excluded.update(errors)
            if not self._spend(charged):
                return None
            attempt += 1

    @staticmethod
    def _relaunches(attempt: int, nodes: list[str], started: Started) -> list[Relaunch]:
        """How each node of a relaunch started: warm or cold, and why (``Started.nodes``; a node it does not
        name is cold)."""
        return [Relaunch(attempt, node, s.mode, s.why) if (s := started.nodes.get(node)) is not None
                else Relaunch(attempt, node, "cold", "the node runtime has no warm path") for node in nodes]

    def _checkpoint_for_start(self, nodes: list[str]) -> tuple[str, int] | None:
        """The checkpoint a new attempt resumes from. An unknown answer is asked again, never taken as "none":
        starting from scratch would train over the job's progress."""
        for _ in range(self.policy.checkpoint_lookup_tries):
            found = self.ops.latest_checkpoint(nodes)
            if found is not None:
                return found
            if self.ops.stop_requested():
                raise Preempted()
            self.sleep(self.policy.probe_interval_s)
        self._finish(JobState.FAILED, f"no node of {', '.join(nodes)} could read the checkpoint directory "
                                      f"{self.policy.checkpoint_dir or ''} (shared storage down?); fix it, then "
                                      f"`clusterctl resume {self.job_id}`")
        return None

    def _wait_for_nodes(self, excluded: set[str]) -> list[str] | None:
        p = self.policy
        deadline = self.clock() + p.wait_for_nodes_s
        self.event(EventKind.WAITING, f"fewer than {p.min_nodes} healthy nodes: waiting up to {p.wait_for_nodes_s:g}s "
                                      "for lost nodes to come back", klass="node_lost")
        while self.clock() < deadline:
            if self.ops.stop_requested():
                raise Preempted()
            healthy = self._gpus_checked(self.ops.reachable(self._uncordoned(self.all_nodes)))
            if len(healthy) >= p.min_nodes:
                excluded.difference_update(healthy)
                return healthy
            self.sleep(p.probe_interval_s)
        self._finish(JobState.FAILED, f"fewer than {p.min_nodes} healthy nodes after waiting "
                                      f"{p.wait_for_nodes_s:g}s")
        return None

    def _gpus_checked(self, nodes: list[str]) -> list[str]:
        """``nodes`` without those left out for a GPU error that fail the GPU checks again
        (``NodeOps.gpu_check``; launch's quick preflight: gpu_driver, gpu_count, gpu_health): reachable is not enough.
        A node that fails stays out, with a ``waiting`` event saying why (again only when the reason changes; checked
        again after ``GPU_RECHECK_S``); one that passes is used again."""
        now = self.clock()
        due = [n for n in nodes if n in self._gpu_suspect and now - self._gpu_suspect[n][1] >= GPU_RECHECK_S]
        try:
            failing = self.ops.gpu_check(due) if due else {}
        except Exception as e:  # noqa: BLE001 - a check that cannot run proves nothing: the nodes stay out
            failing = {n: f"the GPU check could not run: {e}" for n in due}
        if failing is None:         # no GPU check here: reachable is enough
            return nodes
        for n in due:
            if n in failing:
                if failing[n] != self._gpu_suspect[n][0]:
                    self.event(EventKind.WAITING, f"{n} stays out: left out for a GPU error, it fails the GPU check "
                                                  f"again: {failing[n]}", node=n, klass="gpu_error")
                self._gpu_suspect[n] = (failing[n], now)
            else:
                del self._gpu_suspect[n]
                self.event(EventKind.WAITING, f"{n} passed the GPU check (gpu_driver, gpu_count, gpu_health) after "
                                              "its GPU error: it may be used again", node=n, klass="gpu_error")
        return [n for n in nodes if n not in self._gpu_suspect]

    def _monitor(self, attempt: int, nodes: list[str], rdzv: str, *, adopted: bool = False) -> Decision:
        """``adopted``: an attempt started by an earlier supervisor (its start-up is not this one's to say)."""
        now = self.clock()
        health = self._health = Health(started=now, last_progress=now, started_up=adopted)
        self._ranks = RankWatch(self.policy.stuck_timeout_s)
        rounds = 0
        while True:
            if rounds % self.policy.stop_every_probes == 0 and self.ops.stop_requested():
                return Decision(Verdict.STOPPED, message="stopped by user")
            obs = self.ops.observe(attempt, nodes)
            rounds += 1
            if self._checkpoint_due(rounds) and self._survive(self._checkpoint_progress, attempt, nodes):
                obs = [dataclasses.replace(o, progress=True) for o in obs]
                if not health.first_checkpoint:   # NCCL is up by now: on the network it should be?
                    health.first_checkpoint = True
                    self._check_network(attempt)
                health.first_progress = True      # a new valid checkpoint: the attempt is past its start-up
            now = self.clock()
            d = classify(obs, health, rdzv_host=rdzv, probe_failures=self.policy.probe_failures,
                         hang_timeout_s=self.policy.hang_timeout_s, now=now, settle_s=self.policy.settle_s,
                         first_progress_timeout_s=self.policy.first_progress_timeout_s)
            self._survive(self._record_nodes, attempt, obs)
            if not health.started_up:
                self._startup(attempt, health, now)
            if d.verdict == Verdict.CONTINUE:
                d = self._look_at_ranks(attempt, nodes, obs, now) or d
            if d.verdict != Verdict.CONTINUE:
                if self.ops.stop_requested():   # `clusterctl stop` killed the nodes: not a failure
                    return Decision(Verdict.STOPPED, message="stopped by user")
                if d.verdict == Verdict.SUCCESS:
                    self._checkpoint_progress(attempt, nodes)
                return d
            self.wait(self.policy.probe_interval_s)

    def _startup(self, attempt: int, health: Health, now: float) -> None:
        """Until the attempt's first step, say where its start-up stands when that changes
        (``NodeOps.startup(attempt) -> (phase, message) | None``; ``ClusterOps.startup``): "waiting for rendezvous:
        1/2 nodes joined", "ranks started: 4/4 ...", "first step: ...", as ``startup`` events (an attached
        `launch` prints them, `status` shows the latest); within one phase at most every ``STARTUP_EVERY_S``."""
        try:
            got = self.ops.startup(attempt)
        except Exception as e:  # noqa: BLE001 - a diagnosis: never in the way of the job
            print(f"clusterctl: could not tell the attempt's start-up: {e}", file=sys.stderr, flush=True)
            return
        last = health.startup
        if got is None or (last is not None and got[1] == last[1]):
            return
        phase, message = got
        if phase == "first_step":
            health.started_up = True
            message += f", {now - health.started:.1f}s after the start"
        elif last is not None and phase == last[0] and now - last[2] < STARTUP_EVERY_S:
            return
        health.startup = (phase, got[1], now)
        self._survive(lambda: self.event(EventKind.STARTUP, f"attempt {attempt}: {message}", attempt=attempt,
                                         klass=phase))

    def _survive(self, write: Callable, *args):
        """A record the monitor keeps (node rows, checkpoint events) that the state database refused (disk full,
        I/O error): said in the supervisor's log, at most once a minute, and the job goes on being supervised
        (the job's own state changes are not survived: the supervisor ends the job, see controller.supervise)."""
        try:
            return write(*args)
        except StoreError as e:
            now = self.clock()
            if now - self._store_trouble_at >= 60:
                self._store_trouble_at = now
                print(f"clusterctl: {e} (the job is still supervised; node rows and events wait for space)",
                      file=sys.stderr, flush=True)
            return None

    def _record_nodes(self, attempt: int, obs: Sequence[Observation]) -> None:
        """Write the node rows that changed since the last round (one SQLite transaction per node and round was
        most of the supervisor's CPU at 1,000 nodes; an unchanged row carries no news)."""
        changed = {}
        for o in obs:
            row = (node_state(o), o.exit_code, o.signal, o.error_tail or None, o.rank)
            if self._rows.get((attempt, o.node)) != row:
                changed[o.node] = row
        self.ledger.nodes_changed(self.job_id, attempt, {
            node: dict(state=row[0], exit_code=row[1], signal=row[2], error_tail=row[3], rank=row[4])
            for node, row in changed.items()})
        self._rows.update({(attempt, node): row for node, row in changed.items()})
        if len(self._rows) > 4 * len(obs) + 64:       # rows of earlier attempts are never written again
            self._rows = {k: v for k, v in self._rows.items() if k[0] == attempt}

    def _checkpoint_due(self, rounds: int) -> bool:
        """Verify the latest checkpoint now? When the watches saw a new step directory (so ``status`` shows it
        within a probe interval), else every ``checkpoint_every_probes`` rounds."""
        hint = self.ops.checkpoint_hint()
        if hint is None:
            return rounds % self.policy.checkpoint_every_probes == 0
        if hint != self._last_hint:
            self._last_hint = hint
            return True
        return False

    def _checkpoint_progress(self, attempt: int, nodes: list[str]) -> bool:
        """Record a new latest valid checkpoint as an event; True when there is one (progress)."""
        found = self.ops.latest_checkpoint(nodes)
        if found is None:
            return False
        path, step = found
        if path and step != self._last_checkpoint_step:
            self._last_checkpoint_step = step
            self.ledger.checkpoint_seen(self.job_id, attempt, path, step)
            return True
        return False

    def _act(self, d: Decision, attempt: int, nodes: list[str], excluded: set[str]) -> JobState | None:
        """The attempt's end: the verdict, the budget it spends (a failure to recover from) and the attempt's
        result with the job's next state, in one ledger transaction (``Ledger.attempt_ended``); then what it
        takes: stacks on a hang (before anything is stopped), a cordon, the gang stop, the backoff or the end."""
        said = d.message
        verdict = note(EventKind.VERDICT, said, attempt=attempt, klass=d.verdict.value, node=d.node,
                       exit_code=d.exit_code, signal=d.signal, rank=d.rank, oom=d.oom or None)
        if d.verdict == Verdict.SUCCESS:
            # the end is recorded before anything is removed: a supervisor killed in between leaves a SUCCEEDED
            # job with containers to clean up (`stop` removes them), never a finished job that `resume` re-runs
            end = f"job {JobState.SUCCEEDED.value}: {d.message}"
            with self._unless_preempted():
                self.ledger.attempt_ended(self.job_id, attempt, "succeeded", to=JobState.SUCCEEDED,
                                          reason=d.message, expect=ACTIVE_STATES | {JobState.SUCCEEDED},
                                          notes=[verdict, note(EventKind.END, end)])
            self.on_event(said)
            self.on_event(end)
            self._cleanup(attempt, nodes)
            self._cleanup_unclean()
            self._teardown()
            return JobState.SUCCEEDED
        if d.verdict in (Verdict.STOPPED, Verdict.CONFIG_ERROR):   # not retried: the same failure again, with the fix
            self.ledger.attempt_ended(self.job_id, attempt, d.verdict.value, notes=[verdict])
            self.on_event(said)
            self._cleanup(None, self.all_nodes)
            if d.verdict == Verdict.STOPPED:
                return self._finish(JobState.STOPPED, d.message)
            return self._finish(JobState.FAILED, f"{d.message} (config_error: not retried)")
        charged = self._charge(d.verdict, d.message)
        with self._unless_preempted():
            self.ledger.attempt_ended(self.job_id, attempt, d.verdict.value, to=JobState.RECOVERING,
                                      reason=d.message, expect=ACTIVE_STATES, notes=[verdict, *self._said(charged)],
                                      budget=charged.budget)
        self.on_event(said)
        self._tell(charged)
        if d.verdict == Verdict.HANG:
            self._take_stacks(attempt, nodes)      # where every rank waits: before anything is stopped
            self._dump_ranks(attempt, nodes)       # every rank's flight recorder and stack, kept in the job dir
        if d.verdict in INFRA and d.node:
            self._maybe_cordon(d.node, d.verdict)
        if d.verdict == Verdict.GPU_ERROR:
            self._gpu_suspect.update({n: ("", -math.inf) for n in d.lost})
        # every node that answers is stopped, the lost ones too when they answer (their processes died but the
        # runtime may still list the container); nodes lost by not answering are cleaned up when they answer again
        reachable = [n for n in nodes if n not in d.unreachable]
        self.event(EventKind.GANG_STOP, f"attempt {attempt}: stopping {', '.join(reachable) or 'nothing'}"
                   + (f"; {', '.join(d.unreachable)} unreachable (cleaned up when it answers again)"
                      if d.unreachable else ""), attempt=attempt)
        self._cleanup(attempt, reachable)
        self._unclean.update(d.unreachable)
        excluded.update(d.lost)
        if not self._spend(charged):
            self._cleanup(None, self.all_nodes)
            return self.store.get_job(self.job_id).state
        return None

    def _look_at_ranks(self, attempt: int, nodes: list[str], obs: Sequence[Observation],
                       now: float) -> Decision | None:
        """The rank view of this round (``NodeOps.rank_views``): say which rank is newly stuck or
        straggling (events), keep ``ranks.json`` for ``top``, and end the attempt as a hang when a stuck rank has
        made no progress for ``stuck_timeout_s`` (or, with ``stragglers: relaunch``, to replace a straggler's node
        by a spare)."""
        if self._ranks is None:
            return None
        try:
            views: dict[str, dict[int, RankView]] | None = self.ops.rank_views(attempt)
        except Exception as e:  # noqa: BLE001 - a diagnosis: never in the way of the job
            print(f"clusterctl: could not read the rank view: {e}", file=sys.stderr, flush=True)
            return None
        if not views:
            return None
        running = {o.node for o in obs if o.state == "running"}
        look = self._ranks.look(views, now=now, gone_nodes={o.node for o in obs if o.state in ("exited", "missing")},
                                all_running=bool(obs) and len(running) == len(obs))
        self._say_ranks(attempt, look)
        if self.job_dir is not None and (now - self._ranks_written >= RANKS_EVERY_S or look.stuck or look.named):
            self._ranks_written = now
            self._survive_io(jobdir.write_ranks, self.job_dir,
                             self._ranks.document(look, job_id=self.job_id, attempt=attempt, wall=self.wall()))
        c = look.culprit
        if c is not None:
            return Decision(Verdict.HANG, node=c.node, rank=c.rank, message=f"{c.message()} "
                            f"(supervisor.stuck_timeout_s {self.policy.stuck_timeout_s:g}s)")
        if look.named and self.policy.stragglers == "relaunch":
            return self._replace_straggler(nodes, look)
        return None

    def _say_ranks(self, attempt: int, look: Look) -> None:
        for s in look.stuck:
            self.event(EventKind.STUCK, s.message(), attempt=attempt, node=s.node, rank=s.rank, klass="stuck")
        for s in look.unstuck:
            self.event(EventKind.STUCK, f"node {s.node} rank {s.rank} is no longer stuck", attempt=attempt,
                       node=s.node, rank=s.rank, klass="recovered")
        for x, named in [(x, True) for x in look.named] + [(x, False) for x in look.recovered]:
            seen = StragglerSeen(attempt, x.node, x.rank, x.slowdown, named)
            self.event(EventKind.STRAGGLER, seen.message(), attempt=attempt, node=x.node, rank=x.rank,
                       klass="named" if named else "recovered")

    def _replace_straggler(self, nodes: list[str], look: Look) -> Decision | None:
        """``stragglers: relaunch``: end the attempt to replace the slowest named straggler's node, when a spare
        (a node of the job not in this attempt, not cordoned, reachable) can take its place."""
        worst = max(look.named, key=lambda x: x.slowdown)
        spares = self.ops.reachable([n for n in self._uncordoned(self.all_nodes) if n not in nodes])
        if not spares:
            self.on_event(f"straggler on {worst.node}: no spare node to replace it (supervisor.stragglers: relaunch)")
            return None
        return Decision(Verdict.STRAGGLER, (worst.node,), worst.node, rank=worst.rank,
                        message=f"node {worst.node} rank {worst.rank} is a straggler ({worst.slowdown:.2f}x slower): "
                                f"relaunching with {spares[0]} in its place (supervisor.stragglers: relaunch)")

    def _survive_io(self, write: Callable, *args) -> None:
        try:
            write(*args)
        except OSError as e:
            now = self.clock()
            if now - self._store_trouble_at >= 60:
                self._store_trouble_at = now
                print(f"clusterctl: could not write the rank view: {e}", file=sys.stderr, flush=True)

    def _dump_ranks(self, attempt: int, nodes: list[str]) -> None:
        """Keep every rank's flight-recorder dump and stack in ``<job dir>/hang-<attempt>/``
        (``NodeOps.dump_ranks``), said in a ``stacks`` event."""
        if self.job_dir is None:
            return
        dest = self.job_dir / f"hang-{attempt}"
        try:
            errors = self.ops.dump_ranks(attempt, nodes, str(dest))
        except Exception as e:  # noqa: BLE001 - a diagnosis: never in the way of the recovery
            errors = {n: str(e) for n in nodes}
        if errors is None:          # no dumps here
            return
        kept = sorted(p.name for p in dest.iterdir()) if dest.is_dir() else []
        text = (f"every rank's flight-recorder dump and stack kept in {dest} ({len(kept)} files; read with "
                f"`python -m torch.distributed.flight_recorder.fr_trace -p fr- {dest}`)")
        if errors:
            text += "; not from " + ", ".join(f"{n} ({e})" for n, e in sorted(errors.items()))
        self.event(EventKind.STACKS, text, attempt=attempt, klass="dump")

    def _check_network(self, attempt: int) -> None:
        """Where InfiniBand is expected and NCCL came up on sockets (10-100x slower), say so loudly: a ``network``
        event per node (``NodeOps.socket_fallback(attempt) -> [(node, NCCL's line)]``)."""
        try:
            found = self.ops.socket_fallback(attempt)
        except Exception as e:  # noqa: BLE001 - a diagnosis: never in the way of the job
            print(f"clusterctl: could not read NCCL's network choice: {e}", file=sys.stderr, flush=True)
            return
        for node, line in found or ():
            self.event(EventKind.NETWORK, f"WARNING: {node}: NCCL uses sockets where InfiniBand is expected (10-100x "
                                          f"slower; check the IB devices, port state and nvidia_peermem with "
                                          f"`clusterctl preflight`): {line}", attempt=attempt, node=node,
                       klass="socket")

    def _take_stacks(self, attempt: int, nodes: list[str]) -> None:
        """Record every rank's stack as a ``stacks`` event (``NodeOps.stacks(attempt, nodes) -> str``)."""
        try:
            text = self.ops.stacks(attempt, nodes)
        except Exception as e:  # noqa: BLE001 - the stacks are a diagnosis: never in the way of the recovery
            text = f"could not take the stacks: {e}"
        if text is not None:        # None: no stacks here
            self.event(EventKind.STACKS, text, attempt=attempt)

    def _charge(self, verdict: Verdict, message: str) -> Charged:
        """One failure charged to the matching budget, as values for the attempt's end (its ``progress`` and
        ``budget`` events, the budget's new use) and whether that exhausts it.

        A budget counts the failures within ``window_s`` (or since the last progress); an attempt that made
        progress starts the backoff over (see ``budget``)."""
        job, p = self.store.get_job(self.job_id), self.policy
        kind = budget.INFRA if verdict in INFRA else budget.USER
        notes = []
        progress = self._attempt_progress(job.attempt)
        if progress:
            notes.append(note(EventKind.PROGRESS, f"attempt {job.attempt} made progress ({progress}): the backoff "
                                                  "starts over", attempt=job.attempt))
        now = self.clock()
        self._charges.append(budget.Charge(now, kind, bool(progress)))
        used = budget.used(self._charges, kind, now=now, window_s=p.window_s)
        if kind == budget.INFRA:
            limit, key = p.max_node_failures, "restarts.max_node_failures"
        else:
            limit, key = p.max_failures, "restarts.max_failures"
        within = budget.describe(p.window_s)
        notes.append(note(EventKind.BUDGET, f"{kind} restart budget: {used} of {limit} used {within}",
                          attempt=job.attempt, klass=kind))
        exhausted = (f"{message}; {kind if kind == budget.INFRA else 'user-error'} restart budget exhausted "
                     f"({limit} {key} {within})") if used > limit else None
        return Charged(notes, (kind == budget.INFRA, used), exhausted)

    @staticmethod
    def _said(charged: Charged | None) -> list[Note]:
        return list(charged.notes) if charged is not None else []

    def _tell(self, charged: Charged | None) -> None:
        for n in self._said(charged):
            self.on_event(n.message)

    def _spend(self, charged: Charged) -> bool:
        """After a charge is recorded: the job's end when it exhausted its budget (False), else the backoff."""
        if charged.exhausted is not None:
            self._finish(JobState.FAILED, charged.exhausted)
            return False
        kind = budget.INFRA if charged.budget[0] else budget.USER
        p = self.policy
        delay = budget.backoff(kind, budget.streak(self._charges, kind), first_s=p.backoff_s, max_s=p.backoff_max_s)
        if delay:
            self.event(EventKind.BACKOFF, f"waiting {delay:g}s before the next attempt")
            self.sleep(delay)     # the controller's sleep returns early on `stop` (controller.supervise)
        if self.ops.stop_requested():
            raise Preempted()
        return True

    def _attempt_progress(self, attempt: int) -> str:
        """Why the attempt that just ended made progress ("" when it did not, or never ran): a new valid
        checkpoint beyond the one it resumed from, or output for ``progress_after_s``."""
        health, self._health = self._health, None
        if health is None:
            return ""
        mine = [a for a in self.store.attempts(self.job_id) if a.attempt == attempt]
        base = (mine[0].checkpoint_step or 0) if mine and mine[0].checkpoint_path else -1
        steps = [e.checkpoint_step for e in self.store.events(self.job_id) if e.kind == EventKind.CHECKPOINT
                 and e.attempt == attempt and e.checkpoint_step is not None and e.checkpoint_step > base]
        if steps:
            return f"new valid checkpoint at step {max(steps)}"
        ran = health.last_progress - health.started
        if ran >= self.policy.progress_after_s:
            return f"output for {ran:.0f}s"
        return ""

    def _charged_before(self) -> list[budget.Charge]:
        """The failures already charged to this job's budgets (a re-attached supervisor), since the last
        ``resume`` (which starts with fresh budgets), on this supervisor's clock."""
        wall, now = self.store.now(), self.clock()
        return [replace(c, time=now - (wall - c.time)) for c in budget.history(self.store.events(self.job_id))]

    def _cleanup_unclean(self) -> None:
        """Remove what is left of the job on nodes that could not be cleaned up earlier (unreachable, or the
        runtime refused) and answer now; record the others as ``cleanup_pending``."""
        if not self._unclean:
            return
        pending, self._unclean = sorted(self._unclean), set()
        back = self.ops.reachable(pending)
        errors = self.ops.stop(None, back) if back else {}
        done = [n for n in back if n not in errors]
        if done:
            self.ledger.event(self.job_id, EventKind.CLEANUP, f"removed the job's leftovers on {', '.join(done)}")
        for node in pending:
            if node not in done:
                why = f"cleanup failed: {errors[node].message}" if node in errors else "it is still unreachable"
                self.event(EventKind.CLEANUP_PENDING, f"{node}: containers of this job may still be there ({why}); "
                                                      "run `clusterctl stop` once it is reachable again", node=node)

    def _teardown(self) -> None:
        """The job ended: remove what its recovery keeps (warm zygotes) on every node that answers
        (``NodeOps.teardown``)."""
        for node, e in (self.ops.teardown(self.ops.reachable(self.all_nodes)) or {}).items():
            self.event(EventKind.CLEANUP_PENDING, f"could not remove the zygote on {node}: {e.message} (run "
                                                  "`clusterctl stop` when it is reachable again)", node=node)

    def _cleanup(self, attempt: int | None, nodes: Sequence[str]) -> None:
        errors = self.ops.stop(attempt, nodes) if nodes else {}
        self._unclean.update(errors)      # tried again when the job ends
        for node, e in errors.items():
            self.event(EventKind.CLEANUP_PENDING, f"could not clean up {node}: {e.message} (run `clusterctl stop` "
                                                  "when it is reachable again)", node=node)

    def _finish(self, state: JobState, reason: str) -> JobState:
        self._cleanup_unclean()
        with self._unless_preempted():
            self.ledger.job_ended(self.job_id, state, reason, expect=ACTIVE_STATES | {state})
        self.on_event(f"job {state.value}: {reason}")
        self._teardown()     # after the end is recorded: a crash here leaves only warm leftovers (`stop`)
        return state

    def _uncordoned(self, nodes: Sequence[str]) -> list[str]:
        """``nodes`` without the cordoned ones (`clusterctl cordon`, or cordoned here after repeated failures)."""
        cordoned = self.store.cordons()
        out = [n for n in nodes if n not in cordoned]
        if out:                 # under Slurm: drained/down nodes are skipped too
            gone = self.ops.slurm_drained(out)
            out = [n for n in out if n not in gone]
        return out

    def _maybe_cordon(self, node: str, verdict: Verdict) -> None:
        """Cordon ``node`` after ``cordon_after`` infrastructure failures (``INFRA``: node_lost, rendezvous_lost, hang,
        gpu_error, straggler) within 24 h (every job counts); the reason names the classes counted."""
        n = self.policy.cordon_after
        if not n or node in self.store.cordons():
            return
        count = self.store.host_failures(node, [v.value for v in INFRA], 24 * 3600)
        if count >= n:
            reason = (f"{count} infrastructure failures within 24 h ({', '.join(v.value for v in INFRA)}; last: "
                      f"{verdict.value} in job {self.job_id})")
            said = f"{node} cordoned: {reason}; launches skip it until `clusterctl uncordon {node}`"
            self.ledger.host_cordoned(node, reason, by=f"supervisor (job {self.job_id})", job_id=self.job_id,
                                      message=said)
            self.on_event(said)
            if self.policy.slurm_drain and (drained := self.ops.slurm_drain(node, reason)) is not None:
                ok, message = drained
                self.event(EventKind.SLURM_DRAIN,
                           f"{node} drained in Slurm (scontrol update NodeName={node} State=DRAIN)"
                           if ok else f"{node}: Slurm drain refused: {message}", node=node)

