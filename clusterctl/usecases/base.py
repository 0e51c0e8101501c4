"""What every use case shares: the state dir and its store (``Workspace``), the injected dependencies' types
(``Connect``, ``Spawn``, ``Progress``), the inventory with its notes, and the names shell completion offers
(``cli.base``). Light to import: a command that reads no job state (``exec``, ``preflight``) loads no supervisor."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from clusterctl.config.inventory import Host, Inventory
from clusterctl.store.state import Store
from clusterctl.transport import ConnectOptions, Transport

Connect = Callable[[Host, ConnectOptions], Transport]
Spawn = Callable[..., int]                 # controller.spawn_supervisor(root, job_id, *, accept_new, adopt=False)
Progress = Callable[[int, int, str], None]


@dataclass(frozen=True)
class Workspace:
    """The state dir and its store."""
    root: Path
    store: Store


def open_workspace(state_dir: str | None) -> Workspace:
    from clusterctl.supervise import controller

    return Workspace(*controller.open_store(state_dir))


def load_inventory(path: str | None, notes: Callable[[str], None] = lambda note: None) -> Inventory:
    """``-i``: an inventory file, ``slurm[:OVERLAY]`` or the embedded default; ``notes(note)`` for each of its
    notes (Ansible vars accepted but not used)."""
    from clusterctl.slurm.allocation import load_hosts

    inv = load_hosts(path)
    for note in inv.notes:
        notes(note)
    return inv


def job_node_names(state_dir: str | None, job_ref: str | None) -> list[str]:
    """Shell completion of --node: the nodes of ``job_ref``'s latest attempt, or (None: the shell's words did not
    say which job) of every job's, newest first; none without a database."""
    from clusterctl.store.paths import db_path
    from clusterctl.store.paths import state_dir as resolve

    root = resolve(state_dir)
    if not db_path(root).exists():
        return []
    with Store(db_path(root)) as store:
        found = store.find_job(job_ref) if job_ref else None
        chosen = [found] if found is not None else [] if job_ref else store.list_jobs()
        attempts = [store.attempts(j.job_id) for j in chosen]
    return list(dict.fromkeys(n for a in attempts if a for n in a[-1].nodes))


def job_names(state_dir: str | None) -> list[str]:
    """Every job's name and id in the state dir (shell completion); none when it has no database yet."""
    from clusterctl.store.paths import db_path
    from clusterctl.store.paths import state_dir as resolve

    root = resolve(state_dir)
    if not db_path(root).exists():
        return []
    with Store(db_path(root)) as store:
        jobs = store.list_jobs()
    return list(dict.fromkeys([j.name for j in jobs] + [j.job_id for j in jobs]))


def state_root(state_dir: str | None) -> Path:
    """The state dir ``--state-dir`` (or its default) names."""
    from clusterctl.store.paths import state_dir as resolve

    return resolve(state_dir)
