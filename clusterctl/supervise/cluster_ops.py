"""Applies launch plans to the cluster: the real ``NodeOps`` behind the supervisor.

One persistent transport per node (reconnected after a failure), every remote call with a timeout, and all
per-node work fanned out in parallel. A start that fails on some nodes removes what it started on the others.
ClusterOps is the plumbing (pool, watches, plan, ``run``/``runtime``/``ref``), start (each node by the job's
``recovery`` strategy), stop, reachability and checkpoint lookup; the probe round is ``probe``, the diagnoses
``diagnose``. It writes nothing: ``start`` returns ``Started``, which the supervisor's ledger writes.
"""
from __future__ import annotations

import json
import re
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from concurrent.futures import TimeoutError as FuturesTimeout
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Sequence

from clusterctl import checkpoint as checkpoint_mod
from clusterctl.config.inventory import Host
from clusterctl.config.spec import JobSpec
from clusterctl.launch import runtimes
from clusterctl.launch.plan import LaunchPlan, build_plan
from clusterctl.model.ranks import RankView
from clusterctl.model.verdicts import NodeError, NodeStarted, Observation, Started
from clusterctl.store.logcopy import LogSink
from clusterctl.store.state import JobState, Store
from clusterctl.slurm import allocation as slurm_nodes
from clusterctl.supervise import diagnose, probe, rankwatch, recovery
from clusterctl.supervise.recovery import CommandFailed, node_errors
from clusterctl.supervise.watch import Mux, Watch, Watches
from clusterctl.transport import ConnectOptions, Transport, connect, fan_out
from clusterctl.transport.pool import Pool
from clusterctl.transport.streams import StreamMux, open_stream



@dataclass
class ClusterOps:
    """``supervisor.NodeOps`` over real transports."""

    spec: JobSpec
    hosts: Mapping[str, Host]
    job_id: str
    store: Store
    sink: LogSink
    options: ConnectOptions = field(default_factory=ConnectOptions)
    secrets: Mapping[str, str] = field(default_factory=dict)
    interfaces: Mapping[str, str] = field(default_factory=dict)
    gpu_flags: Mapping[str, str] = field(default_factory=dict)     # host -> "gpus" | "cdi" (preflight)
    connect: Callable[[Host, ConnectOptions], Transport] = connect
    probe_timeout_s: float = 5.0
    heartbeat_timeout_s: float = 2.0       # a node silent for longer counts as one failed probe (raised per node by
                                           # its own jitter: see clusterctl.supervise.heartbeat)
    stop_grace_s: float = 10.0
    checkpoint_override: str | None = None   # `resume --checkpoint PATH`: used by the first attempt only
    clock: Callable[[], float] = time.monotonic    # the watches' times and the probe round's "now"
    mux: Callable[[], Mux] = StreamMux             # makes the one mux every watch and log follower runs on
    first_step: Callable[[int], int | None] | None = None   # attempt -> its first `step N` seen (jobdir.StepTap)

    def __post_init__(self) -> None:
        # one kept connection per node; connect reads self.connect/hosts/options when it connects
        self._pool = Pool(lambda node: self.connect(self.hosts[node], self.options),   # a connect (and its jump
                          wait_s=2 * self.options.connect_timeout + 5)                    # host's) is bounded
        self._watches = Watches(self.sink, open_stream=lambda node, argv: open_stream(self.transport(node), argv),
                                drop=self.drop, heartbeat_timeout_s=self.heartbeat_timeout_s, now=self.clock,
                                mux=self.mux)
        self._set_plan(None)
        self._unhealthy: set[str] = set()     # nodes whose last probe failed (asked for nothing else meanwhile)
        self._removed: set[str] = set()       # nodes whose job containers ``stop`` removed, nothing started since
        self._infiniband: dict[str, bool] = {}  # node -> /dev/infiniband/uverbs* there (asked once per node)

    @property
    def plan(self) -> LaunchPlan | None:
        """The plan of the attempt started or adopted last (``start``/``adopt`` set it; nothing else does)."""
        return self._plan

    @property
    def watches(self) -> Watches:
        """The nodes' watches and log followers (read them; ``start``/``attach``/``stop`` drive them)."""
        return self._watches

    def _set_plan(self, plan: LaunchPlan | None) -> LaunchPlan | None:
        self._plan = plan
        # host -> NodePlan (LaunchPlan.node is a linear search: O(N^2) over a round at 1,000+ nodes)
        self._plan_nodes = {n.host: n for n in plan.nodes} if plan is not None else {}
        return plan

    def _plan_node(self, node: str):
        return self._plan_nodes[node]

    # ------------------------------------------------------------------------------------------ plumbing
    def transport(self, node: str) -> Transport:
        """The node's kept connection, made on first use (``transport.pool.Pool``)."""
        return self._pool.get(node)

    def run(self, node: str, argv: Sequence[str], *, timeout: float, stdin: bytes | None = None):
        return self._pool.run(node, argv, timeout=timeout, stdin=stdin)

    def drop(self, node: str) -> None:
        self._pool.drop(node)

    def close(self) -> None:
        self._watches.close()
        self._pool.close()
        self.sink.close()

    def runtime(self, node: str):
        return runtimes.get(self.hosts[node].runtime)

    @staticmethod
    def jobs_root(node: str) -> str:
        return runtimes.jobs_root_for(runtimes.DEFAULT_JOBS_ROOT, node)   # as in the plan (per node)

    # ------------------------------------------------------------------------------------------ NodeOps
    def make_plan(self, attempt: int, nodes: Sequence[str], rdzv_host: str, resume: tuple[str, int]) -> LaunchPlan:
        return build_plan(self.spec, [self.hosts[n] for n in nodes], job_id=self.job_id, attempt=attempt,
                          rdzv_host=self.hosts[rdzv_host], interfaces=self.interfaces, gpu_flags=self.gpu_flags,
                          infiniband=self._infiniband, resume_from=resume[0], resume_step=resume[1])

    def adopt(self, attempt: int, nodes: Sequence[str], rdzv_host: str) -> LaunchPlan:
        """Take over an attempt that was started earlier (by another supervisor, or before a ``stop``)."""
        return self._set_plan(self.make_plan(attempt, nodes, rdzv_host, ("", 0)))

    def attach(self, attempt: int) -> None:
        """Follow the logs and watch every node of the adopted/started attempt."""
        if self._plan is None or self._plan.attempt != attempt:
            raise ValueError(f"attach({attempt}): start or adopt attempt {attempt} first")
        for n in self._plan.nodes:
            self._follow(attempt, n.host)
            self.watch(attempt, n.host)

    def start(self, attempt: int, nodes: Sequence[str], rdzv_host: str, resume: tuple[str, int]) -> Started:
        """Start the attempt: each node's leftovers removed, then the job's recovery strategy starts it. Writes
        nothing: the nodes started (their rows, warm or cold and why) or their errors come back as values."""
        self._infiniband.update(probe.infiniband(self, [n for n in nodes if n not in self._infiniband]))
        self._set_plan(self.make_plan(attempt, nodes, rdzv_host, resume))

        # each command's bound is the job's (a slow node, a saturated host gets what the job allows); a node's
        # whole start: its connection, then those commands
        timeout = self.spec.supervisor.start_timeout_s
        commands = 6 if attempt > 1 else 2   # leftovers, zygote ping, start (again cold); a zygote (re)start

        strategy = recovery.get(self.spec.recovery)
        started: dict[str, NodeStarted] = {}

        def start_one(host: Host) -> None:
            rt = self.runtime(host.name)
            # the previous attempt's leftovers (a new job id has none, and a node this supervisor's ``stop`` just
            # cleaned neither: a command less per node on the way back)
            if attempt > 1 and host.name not in self._removed:
                self.run(host.name, rt.remove_job_argv(self.job_id, jobs_root=self.jobs_root(host.name)),
                         timeout=timeout)
            self._removed.discard(host.name)
            node = self._plan_node(host.name)
            mode, why = strategy.start(recovery.NodeStart(
                host.name, attempt, self.job_id, node, rt, self.jobs_root(host.name), timeout, self.secrets,
                lambda argv, **kw: self.run(host.name, argv, **kw)))
            started[host.name] = NodeStarted(host.address, node.container_name, mode, why)

        self._watches.keep(nodes)   # nodes left out of this attempt
        results = fan_out([self.hosts[n] for n in nodes], start_one,
                          host_timeout=self.options.connect_timeout + commands * timeout + 5)
        errors = node_errors(results)
        if errors:
            self.stop(attempt, nodes)   # roll back what this attempt started (by job id), half-created ones too
            return Started(errors=errors)
        self.attach(attempt)
        return Started(nodes={n: started[n] for n in nodes})

    def observe(self, attempt: int, nodes: Sequence[str], *, watch: bool = True,
                deadline_s: float | None = None) -> list[Observation]:
        """One probe round (``probe.observe``); a node found unreachable is asked over a fresh connection next."""
        found = probe.observe(self, attempt, nodes, watch=watch, deadline_s=deadline_s)
        for o in found:
            (self._unhealthy.add if o.state == "unreachable" else self._unhealthy.discard)(o.node)
        return found

    def ref(self, node: str, attempt: int, name: str | None = None) -> runtimes.Ref:
        if self._plan is not None and self._plan.attempt == attempt and node in self._plan_nodes:
            p = self._plan_node(node)
            return runtimes.Ref(name or p.container_name, p.node_dir, p.log_path, self.job_id)
        ndir = runtimes.node_dir_of(node, self.job_id, attempt)
        return runtimes.Ref(name or runtimes.container_name(self.job_id, node), ndir,
                            self.runtime(node).log_path(ndir), self.job_id)

    # the diagnoses (``diagnose``: each over this plumbing) and Slurm's view of the nodes
    def read_log(self, node: str, attempt: int, timeout: float, on_data: Callable[[bytes], None]) -> None:
        probe.read_log(self, node, attempt, timeout, on_data)

    def socket_fallback(self, attempt: int) -> list[tuple[str, str]]:
        return diagnose.socket_fallback(self, attempt)

    def startup(self, attempt: int) -> tuple[str, str] | None:
        return diagnose.startup(self, attempt)

    def gpu_check(self, nodes: Sequence[str]) -> dict[str, str]:
        return diagnose.gpu_check(self, nodes)

    def rank_views(self, attempt: int) -> dict[str, dict[int, RankView]]:
        return rankwatch.rank_views(self._watches, list(self._plan_nodes), attempt)

    def dump_ranks(self, attempt: int, nodes: Sequence[str], dest_dir: str) -> dict[str, str]:
        return diagnose.dump_ranks(self, attempt, nodes, dest_dir)

    def stacks(self, attempt: int, nodes: Sequence[str]) -> str:
        return diagnose.stacks(self, attempt, nodes)

    def slurm_drained(self, nodes: Sequence[str]) -> set[str]:
        return slurm_nodes.drained_among(self.hosts.values(), nodes)

    def slurm_drain(self, node: str, reason: str) -> tuple[bool, str]:
        return slurm_nodes.drain_if_under(self.hosts.values(), node, reason)

    def checkpoint_hint(self) -> int | None:
        """The newest checkpoint step any watch has seen on the shared storage (cheap, unverified)."""
        return self._watches.checkpoint_hint()

    # ------------------------------------------------------------------------------------------ watch
    def watch(self, attempt: int, node: str) -> Watch:
        """The node's watch for ``attempt`` (started on first use; a new attempt replaces the old one)."""
        return self._watches.watch(attempt, node, lambda: (
            runtimes.watch_argv(self.runtime(node), self._plan_node(node), self.spec.checkpoint.dir,
                                runtimes.view_dir(self._plan_node(node).node_dir))
            if self._plan else None))

    def wait_for_change(self, seconds: float) -> bool:
        """Sleep between probe rounds; wake early when a watched process ends (True then)."""
        return self._watches.wait_for_change(seconds)

    def stop(self, attempt: int | None, nodes: Sequence[str], grace_s: float = 0.0) -> dict[str, NodeError]:
        """Stop this job on ``nodes``: TERM + grace when ``grace_s``, then kill and remove by label/job id."""
        self._watches.stop_followers(nodes)
        self._watches.stop(nodes)

        def stop_one(host: Host) -> None:
            rt = self.runtime(host.name)
            if grace_s and self._plan is not None and host.name in self._plan_nodes:
                self.run(host.name, rt.stop_argv(self._plan_node(host.name), "TERM"), timeout=15)
                deadline = time.monotonic() + grace_s
                while time.monotonic() < deadline:
                    r = self.run(host.name, rt.list_argv(self.job_id, jobs_root=self.jobs_root(host.name)),
                                  timeout=self.probe_timeout_s)
                    if not any(i.state == "running" for i in rt.parse_list(r.stdout)):
                        break
                    time.sleep(0.5)
            r = self.run(host.name, rt.remove_job_argv(self.job_id, jobs_root=self.jobs_root(host.name)),
                          timeout=60)
            if not r.ok:
                raise CommandFailed(r.stderr.strip()[-300:] or f"exit code {r.exit_code}")
            self._removed.add(host.name)
            if attempt is None:         # every attempt of the job: what its recovery keeps goes too (zygote)
                self._teardown(host.name)

        results = fan_out([self.hosts[n] for n in nodes], stop_one, host_timeout=grace_s + 75)
        return node_errors(results)

    def teardown(self, nodes: Sequence[str]) -> dict[str, NodeError]:
        """The job ended: remove what its recovery strategy keeps on ``nodes`` (warm: zygotes and warm dirs)."""
        return node_errors(fan_out([self.hosts[n] for n in nodes], lambda h: self._teardown(h.name),
                                   host_timeout=75))

    def _teardown(self, node: str) -> None:
        recovery.get(self.spec.recovery).teardown(node, self.job_id, self.runtime(node),
                                                  lambda argv, **kw: self.run(node, argv, **kw))

    def known(self, nodes: Sequence[str]) -> list[str]:
        """``nodes`` that are hosts of the job's record (one `resume --exclude` took out has no address)."""
        return [n for n in nodes if n in self.hosts]

    def reachable(self, nodes: Sequence[str]) -> list[str]:
        """The nodes that run a command now. A node that failed its last probe is asked over a fresh connection:
        the kept one may be dead (its server dropped the session) or stalled in TCP's retransmission backoff
        after a partition, so a healed node would not answer on it within the timeout. A node that answers has
        passed a probe (``latest_checkpoint`` asks it again)."""
        def answers(h: Host) -> bool:
            if h.name in self._unhealthy:
                self.drop(h.name)
            return self.run(h.name, ["true"], timeout=self.probe_timeout_s).ok

        results = fan_out([self.hosts[n] for n in nodes], answers,
                          host_timeout=self.probe_timeout_s + self.options.connect_timeout + 1)
        up = [r.host.name for r in results if r.ok and r.value]
        self._unhealthy.difference_update(up)
        return up

    def latest_checkpoint(self, nodes: Sequence[str]) -> tuple[str, int] | None:
        """The latest valid checkpoint (checkpoints live on the nodes' shared storage): ``(path, step)``,
        ``("", 0)`` when there is none, ``None`` when no node could tell (never read as "start from scratch").

        Asks every given node that passed its last probe, in parallel; the first answer wins, and nothing waits
        longer than the probe timeout (a node that just lost its link cannot stall the supervisor). Verifying
        sha256 sums reads whole checkpoints, so that mode gets more time."""
        if self.checkpoint_override:
            path, self.checkpoint_override = self.checkpoint_override, None
            m = re.search(r"step-(\d+)", path)
            return path, int(m.group(1)) if m else 0
        root = self.spec.checkpoint.dir
        if not root:
            return "", 0
        candidates = [n for n in nodes if n not in self._unhealthy]
        if not candidates:
            return None
        deadline = self.probe_timeout_s if self.spec.checkpoint.verify != "sha256" else max(self.probe_timeout_s, 120)
        source = Path(checkpoint_mod.__file__).read_bytes()
        argv = ["python3", "-", "latest", "--root", root, "--verify", self.spec.checkpoint.verify, "--json",
                "--job", self.spec.name]      # another job's checkpoints in a shared dir are never resumed from

        def ask(node: str) -> tuple[str, int]:
            r = self.run(node, argv, timeout=deadline, stdin=source)
            if not r.ok:
                raise RuntimeError(r.stderr.strip()[-200:])
            info = json.loads(r.stdout or "{}")
            return (info["path"], int(info.get("step") or 0)) if info.get("path") else ("", 0)

        pool = ThreadPoolExecutor(max_workers=len(candidates), thread_name_prefix="checkpoint")
        try:
            for fut in as_completed([pool.submit(ask, n) for n in candidates], timeout=deadline + 1):
                try:
                    return fut.result()
                except Exception:  # noqa: BLE001 - that node could not tell; another may
                    continue
        except FuturesTimeout:
            pass
        finally:
            pool.shutdown(wait=False, cancel_futures=True)
        return None

    def stop_requested(self) -> bool:
        return self.store.job_state(self.job_id) == JobState.STOPPED

    def sleep_unless_stopped(self, seconds: float, poll_s: float = 0.5) -> None:
        """The supervisor's backoff sleep: returns early once `clusterctl stop` is requested (a stop during a
        30 s backoff ends the job within ``poll_s``, not after the backoff)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0 and not self.stop_requested():
            time.sleep(min(left, poll_s))

    # ------------------------------------------------------------------------------------------ logs
    def _follow(self, attempt: int, node: str) -> None:
        """Copy the node's log of ``attempt`` into the sink (``watch.Watches.follow``)."""
        self._watches.follow(attempt, node, self.runtime(node).logs_argv(self.ref(node, attempt), follow=True))
