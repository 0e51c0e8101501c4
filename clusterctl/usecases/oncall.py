"""On the hosts and a job's nodes (``cli.oncall``): ``exec``, ``shell``, ``stacks``. The hosts come from the
inventory (``exec --limit``) or from where the job runs now (``oncall.jobnodes``); the work is ``oncall/``'s."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from clusterctl.errors import UserError
from clusterctl.transport import ConnectOptions
from clusterctl.transport import connect as default_connect
from clusterctl.usecases.base import Connect, load_inventory, open_workspace
from clusterctl.usecases.context import check_key_files


@dataclass(frozen=True)
class ExecRequest:
    command: tuple[str, ...]
    inventory_path: str | None = None
    limit: str | None = None
    job_ref: str | None = None           # on this job's nodes (its current attempt) instead of the inventory's
    node: str | None = None              # with job_ref: only this node
    in_container: bool = False           # with job_ref: inside the job's container (bare: in its directory)
    timeout_s: float = 60.0
    options: ConnectOptions = field(default_factory=ConnectOptions)


def exec_on(state_dir: str | None, request: ExecRequest, *, connect: Connect = default_connect,
            notes: Callable[[str], None] = lambda note: None) -> list:
    """``exec``: the command on every selected host (``oncall.remote_exec.HostExecResult`` each). ``notes``:
    the inventory's notes (without ``job_ref``). The job's state is read only with ``job_ref``."""
    from clusterctl.oncall import remote_exec

    wrap = None
    if request.job_ref:      # (imports per branch: the job's record needs pydantic, a plain exec does not)
        from clusterctl.oncall import jobnodes

        if request.limit or request.inventory_path:
            raise UserError("--job takes its hosts from the job: use --node instead of --limit/-i")
        jn = jobnodes.load(open_workspace(state_dir).store, request.job_ref)
        hosts = [jn.host(n) for n in jn.pick(request.node)]
        if request.in_container:
            wrap = lambda h, argv: jobnodes.in_job_argv(jn, h.name, argv)  # noqa: E731
    else:
        from clusterctl.config import hostpattern

        if request.node or request.in_container:
            raise UserError("--node and --in-container need --job")
        hosts = hostpattern.select(load_inventory(request.inventory_path, notes), request.limit)
    check_key_files(hosts)
    return remote_exec.run(hosts, list(request.command), connect=connect, options=request.options,
                           timeout=request.timeout_s, wrap=wrap)


def shell(state_dir: str | None, job_ref: str, node: str | None, options: ConnectOptions, *, tty: bool,
          connect: Connect = default_connect) -> int:
    """``shell``: an interactive shell in the job's container on ``node`` (default: the current attempt's
    rendezvous host; bare: on the host, in the job's directory), on this terminal (``tty``) or this process's
    stdin/stdout; the shell's exit code."""
    from clusterctl.oncall import jobnodes
    from clusterctl.oncall import shell as shell_mod

    jn = jobnodes.load(open_workspace(state_dir).store, job_ref)
    target = jn.pick(node or jn.rdzv_host)[0]
    host = jn.host(target)
    check_key_files([host])
    t = connect(host, options)
    try:
        return shell_mod.run(t, shell_mod.argv(jn, target, tty=tty), tty=tty)
    finally:
        t.close()


@dataclass(frozen=True)
class Stacks:
    found: list                          # launch.stacks' RankStack, one per rank
    errors: dict[str, str]               # node -> why its ranks' stacks are missing


def stacks(state_dir: str | None, job_ref: str, node: str | None, options: ConnectOptions, *,
           connect: Connect = default_connect) -> Stacks:
    """``stacks``: the Python stack of every rank of the job's current attempt (py-spy), ``node``'s only."""
    from clusterctl.launch import stacks as stacks_mod
    from clusterctl.oncall import jobnodes

    jn = jobnodes.load(open_workspace(state_dir).store, job_ref)
    nodes = jn.pick(node)
    check_key_files([jn.host(n) for n in nodes])
    transports: dict = {}

    def run_on(n):
        transports[n] = connect(jn.host(n), options)
        return transports[n].run

    try:
        found, errors = stacks_mod.collect(nodes, run_on, jn.job.job_id, jn.attempt)
    finally:
        for t in transports.values():
            t.close()
    return Stacks(found, errors)
