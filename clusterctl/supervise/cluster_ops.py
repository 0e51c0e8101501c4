"""Applies launch plans to the cluster: the real ``NodeOps`` behind the supervisor.

One persistent transport per node (reconnected after a failure), every remote call with a timeout, and all
per-node work fanned out in parallel. A start that fails on some nodes removes what it started on the others.
"""
from __future__ import annotations

import json
import os
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
from clusterctl.errors import CommandTimeout, DeadlineExceeded, TransportError
from clusterctl.launch import runtimes
from clusterctl.launch.plan import LaunchPlan, build_plan
from clusterctl.model import causes
from clusterctl.model.ranks import RankView
from clusterctl.model.verdicts import ErrorKind, NodeError, NodeStarted, Observation, Started
from clusterctl.store import paths
from clusterctl.store.logcopy import LogSink
from clusterctl.store.state import JobState, Store
from clusterctl.supervise import probe, rankwatch, recovery
from clusterctl.supervise.recovery import CommandFailed
from clusterctl.supervise.observe import rendezvous_peers, startup
from clusterctl.supervise.watch import Mux, Watch, Watches
from clusterctl.transport import ConnectOptions, HostResult, Transport, connect, fan_out
from clusterctl.transport.base import readable
from clusterctl.transport.pool import Pool
from clusterctl.transport.streams import StreamMux, open_stream

# exit 0 when the node has InfiniBand verbs devices (clusterctl_infiniband: auto); a glob, no process per file
HAS_INFINIBAND = 'for f in /dev/infiniband/uverbs*; do [ -e "$f" ] && exit 0; done; exit 1'


def node_error(node: str, error: BaseException) -> NodeError:
    """A start/stop failure as a value: its kind from the exception, its text as before (``str(error)``)."""
    if isinstance(error, (DeadlineExceeded, CommandTimeout)):
        kind = ErrorKind.TIMEOUT
    elif isinstance(error, TransportError):
        kind = ErrorKind.UNREACHABLE
    elif isinstance(error, CommandFailed):
        kind = ErrorKind.COMMAND_FAILED
    else:
        kind = ErrorKind.ERROR
    return NodeError(node, kind, str(error))


def node_errors(results: Sequence[HostResult]) -> dict[str, NodeError]:
    """The failed hosts of a fan-out, by name."""
    return {r.host.name: node_error(r.host.name, r.error) for r in results if r.error is not None}


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
                          infiniband=self._infiniband,
                          resume_from=resume[0],
                          resume_step=resume[1])

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
        self._ask_infiniband(nodes)
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

    def _ask_infiniband(self, nodes: Sequence[str]) -> None:
        """``clusterctl_infiniband: auto``: does each container node not asked yet have /dev/infiniband/uverbs*?
        One short command per node, once (a node that does not answer is asked again at its next start). Not asked
        of CPU hosts (``clusterctl_gpus: 0``): gloo does not use the verbs devices."""
        todo = [self.hosts[n] for n in nodes if n not in self._infiniband and self.hosts[n].infiniband is None
                and self.hosts[n].gpus != 0 and self.runtime(n).containerized]
        if not todo:
            return

        def ask(host: Host) -> bool:
            return self.run(host.name, ["sh", "-c", HAS_INFINIBAND], timeout=self.probe_timeout_s).exit_code == 0

        for r in fan_out(todo, ask, host_timeout=self.options.connect_timeout + self.probe_timeout_s + 5):
            if r.ok:
                self._infiniband[r.host.name] = r.value

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

    def read_log(self, node: str, attempt: int, timeout: float, on_data: Callable[[bytes], None]) -> None:
        """The node's own log of ``attempt``, whole (stdout and stderr), passed to ``on_data`` in pieces as it comes
        (a stream: at most 64 KiB at a time in memory; ``run`` held it whole, or over SSH only its last 8 MiB):
        what ``logs`` and ``resume`` complete the controller's copy from. ``CommandTimeout`` after ``timeout``."""
        argv = self.runtime(node).logs_argv(self.ref(node, attempt))
        stream = open_stream(self.transport(node), ["sh", "-c", '"$@" 2>&1', "clusterctl-logs", *argv])
        deadline = time.monotonic() + timeout
        try:
            while (data := stream.read()) != b"":
                if data:
                    on_data(data)
                elif (left := deadline - time.monotonic()) <= 0:
                    raise CommandTimeout(node, f"reading its log took over {timeout:g}s")
                else:
                    readable(stream.fileno(), min(left, 0.5))
        finally:
            stream.close()

    def socket_fallback(self, attempt: int) -> list[tuple[str, str]]:
        """(node, line) for each node of ``attempt`` with InfiniBand on (the plan) whose NCCL said it uses sockets
        (``causes.nccl_network`` over the lines a grep of its log finds; one bounded command per such node)."""
        if self._plan is None or self._plan.attempt != attempt:
            return []

        def look(host: Host) -> tuple[str, str] | None:
            argv = self.runtime(host.name).logs_argv(self.ref(host.name, attempt))
            r = self.run(host.name, ["sh", "-c", '"$@" 2>&1 | grep -m 50 -E "NCCL INFO (Using network|NET/)"',
                                      "clusterctl-net", *argv], timeout=self.probe_timeout_s)
            got = causes.nccl_network(causes.node_lines(r.stdout, host.name))
            return (host.name, got[1]) if got and got[0].lower() == "socket" else None

        ib = [self.hosts[n.host] for n in self._plan.nodes if n.infiniband]
        return [r.value for r in fan_out(ib, look, host_timeout=self.probe_timeout_s + 5) if r.ok and r.value]

    def startup(self, attempt: int) -> tuple[str, str] | None:
        """Where ``attempt``'s start-up stands (``observe.startup``): the nodes whose torchrun agent reached the
        rendezvous (distinct peers connected to the c10d store's port on the rendezvous host: one bounded ``ss``
        there, asked only until a rank printed), the ranks that printed (the log copy), its first ``step N``."""
        plan = self._plan
        if plan is None or plan.attempt != attempt:
            return None
        ranks = sum(self.sink.ranks(n.host) for n in plan.nodes)
        world = sum(n.nproc for n in plan.nodes)
        step = self.first_step(attempt) if self.first_step is not None else None
        joined = None
        if not ranks and step is None:
            rdzv = next(n.host for n in plan.nodes if n.is_rdzv_host)
            port = plan.rdzv_endpoint.rsplit(":", 1)[-1]
            try:
                r = self.run(rdzv, ["ss", "-Htn", "state", "established", f"( sport = :{port} )"],
                              timeout=self.probe_timeout_s)
                joined = rendezvous_peers(r.stdout) if r.ok else None
            except TransportError:
                pass
        return startup(len(plan.nodes), joined, ranks, world, step)

    def gpu_check(self, nodes: Sequence[str]) -> dict[str, str]:
        """{node: why} for each of ``nodes`` that fails the GPU part of launch's quick preflight (gpu_driver,
        gpu_count, gpu_health: ``checks.registry.GPU_CHECKS``, one probe per node over a fresh connection); a node
        that passes is absent. What a node left out for a GPU error passes before it is used again."""
        from clusterctl.checks.job import PreflightJob
        from clusterctl.checks.preflight import run_preflight
        from clusterctl.checks.registry import GPU_CHECKS

        report = run_preflight([self.hosts[n] for n in nodes], connect=lambda h: self.connect(h, self.options),
                               job=PreflightJob.from_spec(self.spec), only=GPU_CHECKS)
        return {h.host: "; ".join(f"{c.id}: {c.detail}" + (f" (fix: {c.hint})" if c.hint else "")
                                  for c in h.checks if c.status == "fail")
                for h in report.hosts if any(c.status == "fail" for c in h.checks)}

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

    def rank_views(self, attempt: int) -> dict[str, dict[int, RankView]]:
        """node -> rank -> what every rank of ``attempt`` is doing, as the watches last heard it (``rankwatch``)."""
        return rankwatch.rank_views(self._watches, list(self._plan_nodes), attempt)

    def dump_ranks(self, attempt: int, nodes: Sequence[str], dest_dir: str) -> dict[str, str]:
        """Every rank's flight-recorder dump and stack copied into ``dest_dir`` (``rankwatch.dump_ranks``, one
        bounded command per node); node -> why not, for the nodes that sent less."""
        views = {n: runtimes.view_dir(self.ref(n, attempt).node_dir) for n in nodes}
        return rankwatch.dump_ranks(lambda n, argv, timeout: self.run(n, argv, timeout=timeout), views,
                                    self.hosts, dest_dir, connect_timeout_s=self.options.connect_timeout)

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

    def under_slurm(self) -> bool:
        return any(h.connection == "srun" for h in self.hosts.values()) or bool(os.environ.get("SLURM_JOB_ID"))

    def slurm_drained(self, nodes: Sequence[str]) -> set[str]:
        """Under Slurm: those of ``nodes`` that Slurm reports drained, down or not responding (relaunches skip
        them); an unanswered ``scontrol`` skips none."""
        if not self.under_slurm():
            return set()
        from clusterctl.errors import UserError
        from clusterctl.slurm import allocation as slurm

        try:
            return slurm.drained(slurm.node_records(list(nodes))) & set(nodes)
        except UserError:
            return set()

    def slurm_drain(self, node: str, reason: str) -> tuple[bool, str]:
        from clusterctl.errors import UserError
        from clusterctl.slurm import allocation as slurm

        if not self.under_slurm():
            return False, "the job does not run under Slurm"
        try:
            return slurm.drain(node, reason)
        except UserError as e:
            return False, str(e)

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

    def stacks(self, attempt: int, nodes: Sequence[str]) -> str:
        """Where every rank waits (py-spy, see ``stacks``): one line per group of ranks; the full stacks are kept
        as JSON in the job's directory (``stacks-<attempt>.json``)."""
        from clusterctl.launch import stacks

        found, errors = stacks.collect(nodes, lambda n: lambda argv, **kw: self.run(n, argv, **kw),
                                       self.job_id, attempt, host_timeout=60)
        try:
            paths.write_private(self.sink.path.parent / f"stacks-{attempt}.json", stacks.dump_json(found, errors))
        except OSError:
            pass
        return stacks.hang_record(found, errors)

    # ------------------------------------------------------------------------------------------ logs
    def _follow(self, attempt: int, node: str) -> None:
        """Copy the node's log of ``attempt`` into the sink (``watch.Watches.follow``)."""
        self._watches.follow(attempt, node, self.runtime(node).logs_argv(self.ref(node, attempt), follow=True))
