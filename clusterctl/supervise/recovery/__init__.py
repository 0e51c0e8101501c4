"""Recovery strategies: how each node of an attempt starts, found by the job's ``recovery:`` name.

A strategy is one module, ``clusterctl/supervise/recovery/<name>.py``, whose ``STRATEGY`` implements ``Strategy``,
and one registry line: its name in ``config.spec.RECOVERIES`` (the job schema's ``recovery:`` choices come from
it). ``ClusterOps.start`` removes the previous attempt's leftovers, then hands each node to the job's strategy;
``ClusterOps.stop`` of every attempt (and the job's end, ``teardown``) asks it to remove what it keeps on a node.
``cold``: every start is fresh; ``warm``: a zygote per node that relaunches fork from (docs/design.md). Here too:
what a start or stop that failed on a node is, as a value (``node_error``: ``model.verdicts.NodeError``).
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Mapping, Protocol, Sequence

from clusterctl import checkpoint as checkpoint_mod
from clusterctl.config.spec import RECOVERIES
from clusterctl.errors import CommandTimeout, DeadlineExceeded, TransportError
from clusterctl.launch import runtimes
from clusterctl.launch.plan import NODE_MODULES, NodePlan, checkpoint_installer
from clusterctl.model.verdicts import ErrorKind, NodeError
from clusterctl.transport import CommandResult, HostResult

# `from clusterctl import checkpoint` works on every node, in containers too (see plan.checkpoint_installer)
_PKG = Path(checkpoint_mod.__file__).parent
CHECKPOINT_INSTALLER = checkpoint_installer((_PKG / "checkpoint.py").read_text(),
                                            {n: (_PKG / n).read_text() for n in NODE_MODULES if n != "checkpoint.py"})


class CommandFailed(RuntimeError):
    """A node ran a start/stop command and it failed; the message is the command's own error (its tail)."""


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


def what_failed(r: CommandResult) -> str:
    """A failed command's own words: its stderr, else its stdout, else its exit code."""
    return r.stderr.strip() or r.stdout.strip() or f"exit code {r.exit_code}"


@dataclass(frozen=True)
class NodeStart:
    """One node of an attempt, as a strategy starts it: its plan, its runtime, and a bounded command on it."""
    node: str
    attempt: int
    job_id: str
    plan: NodePlan
    runtime: runtimes.Runtime
    jobs_root: str
    timeout: float                                   # each command's bound (supervisor.start_timeout_s)
    secrets: Mapping[str, str] = field(repr=False)
    run: Callable[..., CommandResult] = field(repr=False)   # run(argv, timeout=, stdin=): ClusterOps.run on this node

    def start_cold(self, prelude: str = CHECKPOINT_INSTALLER) -> None:
        """The attempt's container/process started fresh (``runtime_argv``); ``CommandFailed`` when it is not."""
        r = self.run(self.plan.runtime_argv, timeout=self.timeout, stdin=self.plan.env_script(self.secrets, prelude))
        if not r.ok:
            raise CommandFailed(what_failed(r)[-500:])


class Strategy(Protocol):
    def start(self, n: NodeStart) -> tuple[str, str]:
        """Start ``n``'s attempt (its leftovers are gone); ("warm" | "cold", why): the ``relaunch`` event's class
        and text. ``CommandFailed`` (or a transport error) when the node did not start."""
        raise NotImplementedError

    def teardown(self, node: str, job_id: str, runtime: runtimes.Runtime,
                 run: Callable[..., CommandResult]) -> None:
        """The job ended: remove what the strategy keeps on ``node`` (``CommandFailed`` when it could not)."""
        raise NotImplementedError


def get(name: str) -> Strategy:
    """The strategy registered as ``name`` (``config.spec.RECOVERIES``; its module is named after it)."""
    if name not in RECOVERIES:
        raise ValueError(f"unknown recovery {name!r} (one of {', '.join(RECOVERIES)})")
    return importlib.import_module(f"{__name__}.{name}").STRATEGY


def names() -> Sequence[str]:
    return RECOVERIES
