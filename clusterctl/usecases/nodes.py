"""The hosts across jobs (``cli.nodes``): ``nodes``, ``cordon``, ``uncordon``."""
from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Sequence

from clusterctl.config.inventory import Inventory
from clusterctl.slurm import allocation
from clusterctl.store.ledger import Ledger
from clusterctl.usecases.base import Workspace
from clusterctl.views import nodes as nodehealth


@dataclass(frozen=True)
class Cordoned:
    cordons: list                                  # state.Cordon per host, in the order asked
    unknown: list[str]                             # in no inventory clusterctl knows, nor any job's nodes
    replaced: dict[str, str]                       # host -> the reason its new one replaced
    drain_refused: tuple[str, str] | None = None   # (host, Slurm's message) with --slurm-drain


def cordon(ws: Workspace, hosts: Sequence[str], reason: str, inventory: Inventory, *,
           slurm_drain: bool = False) -> Cordoned:
    """Keep ``hosts`` out of every launch, resume and relaunch (and, ``slurm_drain``, drain them in Slurm)."""
    known = {h.name for h in inventory.hosts} | {n for a in ws.store.all_attempts() for n in a.nodes}
    before = ws.store.cordons()
    ledger = Ledger(ws.store)
    done = [ledger.host_cordoned(h, reason, by="user") for h in hosts]
    refused = None
    if slurm_drain:
        for c in done:
            ok, message = allocation.drain(c.host, c.reason)
            if not ok:
                refused = (c.host, message)
                break
    return Cordoned(done, [h for h in hosts if h not in known],
                    {h: before[h].reason for h in hosts if h in before}, refused)


def uncordon(ws: Workspace, hosts: Sequence[str]) -> dict[str, bool]:
    """host -> whether it was cordoned; its earlier failures no longer count toward an automatic cordon."""
    ledger = Ledger(ws.store)
    return {h: ledger.host_uncordoned(h) for h in hosts}


def node_rows(ws: Workspace, inventory: Inventory, now: float | None = None) -> list[dict]:
    """``nodes``: per host, ok or cordoned, jobs run, failures by class in the last 7 days, the last one."""
    now = time.time() if now is None else now
    return nodehealth.node_rows([h.name for h in inventory.hosts], ws.store.cordons(), ws.store.all_attempts(),
                                ws.store.node_events(), now)
