"""The job record: what `launch` decided, stored once (``jobs.spec_json``), read by everything after it.

``stop``, ``resume``, ``status`` and the supervisor read the job through ``JobRecord`` and nothing else: the spec,
the job file it came from, the resolved hosts (so an inventory edited since the launch is not quietly re-read), the
NICs and GPU flags preflight found, and a one-shot checkpoint override (``resume --checkpoint``).

Versioned JSON. Version 1 (before this module) stored host *names* and was re-resolved in the inventory at every
read; ``from_json`` still reads it that way, and ``load`` rewrites such a row as version 2 the first time it is read.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from clusterctl.config import inventory as inventory_mod
from clusterctl.config.inventory import Host
from clusterctl.config.spec import JobSpec, parse_job
from clusterctl.errors import UserError

VERSION = 2
_HOST_FIELDS = tuple(f.name for f in dataclasses.fields(Host) if f.name != "origin")


@dataclass(frozen=True)
class JobRecord:
    spec: JobSpec
    source: str                                   # absolute path of the job file
    hosts: tuple[Host, ...]                       # the job's hosts, resolved at launch, in order
    interfaces: Mapping[str, str] = field(default_factory=dict)   # host name -> NIC (from preflight)
    gpu_flags: Mapping[str, str] = field(default_factory=dict)    # host name -> "gpus" | "cdi" (from preflight)
    checkpoint_override: str | None = None        # `resume --checkpoint PATH`, used by the next attempt only

    @property
    def host_names(self) -> list[str]:
        return [h.name for h in self.hosts]

    @property
    def hosts_by_name(self) -> dict[str, Host]:
        return {h.name: h for h in self.hosts}

    def replace(self, **changes: Any) -> "JobRecord":
        return dataclasses.replace(self, **changes)

    def to_json(self) -> str:
        return json.dumps({
            "version": VERSION,
            "spec": self.spec.model_dump(mode="json"),
            "source": self.source,
            "hosts": [_host_to_dict(h) for h in self.hosts],
            "interfaces": dict(self.interfaces),
            "gpu_flags": dict(self.gpu_flags),
            "checkpoint_override": self.checkpoint_override,
        })

    @classmethod
    def from_json(cls, text: str, *, inventory_path: str | None = None) -> "JobRecord":
        """Parse a stored record. Version 1 rows name their hosts only: they are resolved in ``inventory_path``
        (None: the embedded default), as they were when that version was current."""
        data = json.loads(text)
        spec = parse_job(data["spec"], data.get("source") or "<job record>")
        if data.get("version", 1) == 1:
            hosts = _resolve(data["hosts"], inventory_path)
        else:
            hosts = tuple(_host_from_dict(h) for h in data["hosts"])
        return cls(spec=spec, source=data.get("source") or "", hosts=hosts,
                   interfaces=dict(data.get("interfaces") or {}),
                   gpu_flags=dict(data.get("gpu_flags") or {}),
                   checkpoint_override=data.get("checkpoint_override"))


def spec_of(job) -> JobSpec:
    """Only the spec of a stored job (any version; no inventory is read)."""
    data = json.loads(job.spec_json)
    return parse_job(data["spec"], data.get("source") or "<job record>")


def from_job(job) -> JobRecord:
    """The record of ``job`` (a ``state.Job``), as stored (``store.ledger.Ledger.record`` also rewrites an old
    version as the current one)."""
    return JobRecord.from_json(job.spec_json, inventory_path=job.inventory_path)


def outdated(job) -> bool:
    """Is ``job``'s record stored in an older version than this release writes?"""
    return json.loads(job.spec_json).get("version", 1) != VERSION


def _host_to_dict(h: Host) -> dict[str, Any]:
    return {name: (list(v) if isinstance(v, tuple) else dict(v) if name == "vars" else v)
            for name in _HOST_FIELDS for v in [getattr(h, name)]}


def _host_from_dict(d: Mapping[str, Any]) -> Host:
    values = {k: d[k] for k in _HOST_FIELDS if k in d}
    values["groups"] = tuple(values.get("groups") or ())
    values["vars"] = dict(values.get("vars") or {})
    return Host(**values)


def _resolve(names: list[str], inventory_path: str | None,
             load: Callable[[str], inventory_mod.Inventory] = inventory_mod.load) -> tuple[Host, ...]:
    inv = load(inventory_path) if inventory_path else inventory_mod.default_inventory()
    by_name = {h.name: h for h in inv.hosts}
    missing = [n for n in names if n not in by_name]
    if missing:
        raise UserError(f"hosts {', '.join(missing)} are no longer in the inventory {inv.source}")
    return tuple(by_name[n] for n in names)
