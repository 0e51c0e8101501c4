"""What one probe round means (pure): a node's watch and its runtime's listing -> an ``Observation``.

``probe.observe`` (probe.py, for ``ClusterOps.observe``) does the I/O: it reads the watch a node's persistent
connection feeds, runs the runtime's listing, and asks the node the one question these functions may leave open
(``Confirm``: is a container listed as running really running? ``Explain``: why did it fail?). Everything decided
here is decided without a remote command, so it is tested with plain values (tests/unit/supervise/test_observe.py).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, Sequence

from clusterctl.launch.runtimes import Instance, Ref, Runtime
from clusterctl.model import causes
from clusterctl.model.verdicts import Observation

# a container whose init the watch has seen gone this long while the runtime still lists it as running was killed
# with its conmon (a normal exit is recorded by conmon within milliseconds)
GONE_CONFIRM_S = 0.5

RUNNING_STATES = ("running", "created", "restarting", "paused")


class WatchState(Protocol):
    """What a node's watch has heard (``watch.Watch``): a line a second from the node, and one at once
    when what it says changes."""

    attempt: int
    last: float | None       # time of the last line (the watch's clock); None before the first
    alive: bool              # the attempt's main process (container init / bare runner) is alive
    gone_at: float | None    # time of the first "gone" line after it was seen alive


def heard(node: str, watch: WatchState, *, limit: float, now: float) -> Observation | None:
    """What the watch alone says: silent for longer than ``limit`` s -> unreachable (a probe would only hang until
    its timeout); fresh and alive -> running (``progress`` is the caller's to fill in); otherwise None: probe
    the node (its process ended, or no line yet)."""
    if watch.last is None:
        return None
    age = now - watch.last
    if age > limit:
        return Observation(node, "unreachable", error_tail=f"no heartbeat for {age:.1f}s (limit {limit:.1f}s)")
    if watch.alive:
        return Observation(node, "running")
    return None


@dataclass(frozen=True)
class Confirm:
    """Listed as running, but the listing may lag (podman keeps saying "Up" when conmon and the container's init
    were SIGKILLed): run ``argv`` on the node; exit 3 -> ``gone``, anything else -> ``running``."""

    argv: list[str]
    gone: Observation
    running: Observation


@dataclass(frozen=True)
class Explain:
    """Exited with a failure: why (the node's own log, the OOM killer) takes the node (``probe.ended``)."""

    instance: Instance


def interpret(node: str, instances: Sequence[Instance], attempt: int, *, runtime: Runtime, job_id: str,
              watch: WatchState | None, now: float, progress: bool) -> Observation | Confirm | Explain:
    """The runtime's listing of a node (``runtime.parse_list``) for ``attempt``: missing, running, a clean exit,
    or the one question left (``Confirm``, ``Explain``). ``watch``: the node's watch, when it has one (a container
    whose init it saw gone ``GONE_CONFIRM_S`` ago is not believed "running")."""
    mine = [i for i in instances if i.attempt == attempt]
    if not mine:
        return Observation(node, "missing", progress=progress)
    inst = mine[0]
    if inst.state in RUNNING_STATES:
        running = Observation(node, "running", progress=progress)
        argv = (runtime.init_gone_argv(Ref(inst.name, "", None, job_id), GONE_CONFIRM_S)
                if inst.state == "running" else None)
        if argv is None:
            return running
        gone = Observation(node, "missing", progress=progress,
                           error_tail="the container's processes are gone (killed) although "
                                      f"{runtime.name} still lists it as running")
        gone_s = now - watch.gone_at if watch and watch.attempt == attempt and watch.gone_at else 0.0
        return gone if gone_s >= GONE_CONFIRM_S else Confirm(argv, gone, running)
    if inst.state == "dead":
        return Observation(node, "missing", progress=progress)
    if not inst.exit_code:
        return Observation(node, "exited", exit_code=inst.exit_code, signal=causes.signal_of(inst.exit_code),
                           progress=progress)
    return Explain(inst)


# ------------------------------------------------------------------------------ an attempt's start-up (issue 39)
STARTUP_PHASES = ("rendezvous", "ranks", "started", "first_step")   # "started": every rank printed (a script
                                                                      # without `step N` lines ends there)


def startup(nodes: int, joined: int | None, ranks: int, world: int, step: int | None) -> tuple[str, str] | None:
    """Where an attempt's start-up stands, as ``(phase, message)`` (None: nothing known yet): the nodes whose torchrun
    agent reached the rendezvous (``joined`` of ``nodes``), the ranks that printed their first line (``ranks`` of
    ``world``), the first ``step N`` of a rank."""
    if step is not None:
        return "first_step", f"first step: step {step} ({ranks}/{world} ranks started)"
    if ranks >= world > 0:
        return "started", f"ranks started: {ranks}/{world} (every rank printed)"
    if ranks:
        return "ranks", f"ranks started: {ranks}/{world} (the ranks that printed)"
    if joined is not None:
        return "rendezvous", f"waiting for rendezvous: {min(joined, nodes)}/{nodes} nodes joined"
    return None


def rendezvous_peers(ss_output: str) -> int:
    """Distinct peer hosts of ``ss -Htn state established '( sport = :PORT )'`` (the lines: Recv-Q Send-Q Local
    Peer): the nodes whose torchrun agent holds a connection to the c10d store on the rendezvous host."""
    peers = set()
    for line in ss_output.splitlines():
        fields = line.split()
        if len(fields) >= 4 and ":" in fields[-1]:
            peers.add(fields[-1].rsplit(":", 1)[0].strip("[]"))
    return len(peers)
