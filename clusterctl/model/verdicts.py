"""The words the supervisor, the views and the cluster side share: what one probe of a node saw (``Observation``),
what a round of them means (``Verdict``, ``Decision``), and why an operation on a node failed (``NodeError``).

Values only: the loop that produces them is ``supervise.supervisor``; ``views`` read them without importing it.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Mapping


class Verdict(str, Enum):
    CONTINUE = "continue"
    SUCCESS = "success"
    USER_ERROR = "user_error"        # a rank exited non-zero while every node is healthy
    KILLED = "killed"                # a rank was killed by a signal (e.g. SIGKILL from the OOM killer)
    CONFIG_ERROR = "config_error"    # no retry can help: torchrun/the entry point missing, the script can't be opened
    NODE_LOST = "node_lost"          # unreachable K times, container/process gone, killed by a signal
    RDZV_LOST = "rendezvous_lost"    # the lost node was the rendezvous host
    HANG = "hang"                    # no progress for hang_timeout
    GPU_ERROR = "gpu_error"          # a rank died of its GPU (ECC, Xid, "GPU is lost", CUDA 802, ...): node left out
    STOPPED = "stopped"              # someone ran `clusterctl stop`
    STRAGGLER = "straggler"          # supervisor.stragglers: relaunch: a straggler's node is replaced by a spare


INFRA = (Verdict.NODE_LOST, Verdict.RDZV_LOST, Verdict.HANG, Verdict.GPU_ERROR,     # charged to the node budget
         Verdict.STRAGGLER)


@dataclass(frozen=True)
class Observation:
    """One probe of one node. ``state``: running | exited | missing (no container/process) | unreachable |
    probe_error (the probe itself failed on this side, e.g. a parser bug: never counted against the node)."""

    node: str
    state: str
    exit_code: int | None = None
    signal: str | None = None
    progress: bool = False           # new log output or a new checkpoint since the last probe
    error_tail: str = ""
    rank: int | None = None          # the failing rank (torchrun's "Root Cause" summary), when known
    config_error: str | None = None  # what no retry can fix, and the fix (causes.config_error)
    oom: bool = False                # the OOM killer sent the signal
    gpu_error: str | None = None     # the evidence that a GPU failed: the rank's error line or the kernel's Xid line


def node_state(o: Observation) -> str:
    """The state shown for a node: running | exited | killed (by a signal) | gone (no container/process) |
    unreachable."""
    if o.state == "missing":
        return "gone"
    if o.state == "exited" and o.signal:
        return "killed"
    return o.state


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    lost: tuple[str, ...] = ()
    node: str | None = None
    exit_code: int | None = None
    signal: str | None = None
    message: str = ""
    error_tail: str = ""
    rank: int | None = None
    unreachable: tuple[str, ...] = ()   # the lost nodes that were lost by not answering (cannot be cleaned up now)
    oom: bool = False



class ErrorKind(str, Enum):
    """Why an operation on one node failed."""

    UNREACHABLE = "unreachable"          # no working connection (connect, authentication, host key, link lost)
    TIMEOUT = "timeout"                  # the node did not answer within the command's or the fan-out's deadline
    COMMAND_FAILED = "command_failed"    # the node ran the command and it failed (the runtime refused)
    ERROR = "error"                      # anything else (a bug on this side)


@dataclass(frozen=True)
class NodeError:
    """One node's failure to start or stop; ``message`` is the text events and the CLI show."""

    node: str
    kind: ErrorKind
    message: str

    def __str__(self) -> str:
        return self.message


@dataclass(frozen=True)
class NodeStarted:
    """A node whose start succeeded: its node row (address, container) and how it started, ``mode`` warm or cold
    and ``why`` (a relaunch's ``relaunch`` event: its class and text)."""

    address: str
    container: str
    mode: str = "cold"
    why: str = ""

    def row(self) -> dict[str, Any]:
        return dict(address=self.address, container=self.container, state="running")


@dataclass(frozen=True)
class Started:
    """What a start did, as values (the ledger writes them; the start writes nothing): every node started
    (``nodes``), or the ``errors`` of those that failed (what started on the others was rolled back)."""

    nodes: Mapping[str, NodeStarted] = field(default_factory=dict)
    errors: Mapping[str, NodeError] = field(default_factory=dict)
