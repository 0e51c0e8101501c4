"""``preflight`` (``cli.preflight``): every host checked before a launch, against the job when one is given."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from clusterctl.transport import ConnectOptions
from clusterctl.transport import connect as default_connect
from clusterctl.usecases.base import Connect, Progress, load_inventory
from clusterctl.usecases.context import check_key_files, load_context


@dataclass(frozen=True)
class PreflightRequest:
    job_path: str | None = None          # checked against the job (nodes, nproc_per_node): its hosts, or all
    inventory_path: str | None = None
    limit: str | None = None             # hosts, groups, ranges, globs (``config.hostpattern``)
    pull: bool = False                   # pull the image where it is missing instead of failing
    options: ConnectOptions = field(default_factory=ConnectOptions)


def preflight(request: PreflightRequest, *, connect: Connect = default_connect, progress: Progress | None = None,
              notes: Callable[[str], None] = lambda note: None):
    """The ``checks.results.PreflightReport`` of the selected hosts. A job that does not fit the inventory is an
    input error at the job file's line (exit 2); ``notes``: the inventory's notes (without a job)."""
    from clusterctl.checks.job import PreflightJob, PreflightOptions
    from clusterctl.checks.preflight import run_preflight

    if request.job_path:
        jc = load_context(request.job_path, request.inventory_path)
        spec, inv = jc.spec, jc.inventory
        hosts = list(jc.hosts) if spec.hosts else list(inv.hosts)
    else:
        spec, inv = None, load_inventory(request.inventory_path, notes)
        hosts = list(inv.hosts)
    if request.limit:  # filters, keeping the job's (or inventory's) order: the first host stays the rendezvous host
        from clusterctl.config import hostpattern

        chosen = hostpattern.select(inv, request.limit)
        hosts = [h for h in hosts if h in chosen]
    check_key_files(hosts)
    return run_preflight(hosts, connect=lambda h: connect(h, request.options),
                         job=PreflightJob.from_spec(spec) if spec is not None else None,
                         options=PreflightOptions(pull=request.pull), progress=progress)
