"""Preflight results are values: per-host ``CheckResult``s, cluster-wide ``ClusterCheck``s, one report."""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal, Mapping, Sequence

Status = Literal["pass", "warn", "fail", "skip"]
STATUSES: tuple[str, ...] = ("pass", "warn", "fail", "skip")


@dataclass(frozen=True)
class CheckResult:
    id: str
    status: Status
    detail: str
    hint: str | None = None
    data: Mapping[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "detail": self.detail, "hint": self.hint,
                "data": dict(self.data)}


def passed(id: str, detail: str, /, **data: Any) -> CheckResult:
    return CheckResult(id, "pass", detail, None, data)


def warned(id: str, detail: str, hint: str, /, **data: Any) -> CheckResult:
    return CheckResult(id, "warn", detail, hint, data)


def failed(id: str, detail: str, hint: str, /, **data: Any) -> CheckResult:
    return CheckResult(id, "fail", detail, hint, data)


def skipped(id: str, detail: str, /, **data: Any) -> CheckResult:
    return CheckResult(id, "skip", detail, None, data)


@dataclass(frozen=True)
class HostReport:
    host: str
    address: str
    checks: tuple[CheckResult, ...]

    def get(self, check_id: str) -> CheckResult | None:
        for c in self.checks:
            if c.id == check_id:
                return c
        return None

    def to_dict(self) -> dict[str, Any]:
        return {"host": self.host, "address": self.address, "checks": [c.to_dict() for c in self.checks]}


@dataclass(frozen=True)
class ClusterCheck:
    id: str
    status: Status
    detail: str
    hint: str | None = None
    hosts: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"id": self.id, "status": self.status, "detail": self.detail, "hint": self.hint,
                "hosts": list(self.hosts)}


def summarize(hosts: Sequence[HostReport], cluster: Sequence[ClusterCheck]) -> dict[str, int]:
    counts = dict.fromkeys(STATUSES, 0)
    for h in hosts:
        for c in h.checks:
            counts[c.status] += 1
    for c in cluster:
        counts[c.status] += 1
    return counts


@dataclass(frozen=True)
class PreflightReport:
    ok: bool                                  # no check failed (warnings allowed)
    hosts: tuple[HostReport, ...]
    cluster: tuple[ClusterCheck, ...]
    summary: Mapping[str, int]
    duration_s: float

    @classmethod
    def build(cls, hosts: Sequence[HostReport], cluster: Sequence[ClusterCheck], duration_s: float
              ) -> "PreflightReport":
        summary = summarize(hosts, cluster)
        return cls(ok=summary["fail"] == 0, hosts=tuple(hosts), cluster=tuple(cluster), summary=summary,
                   duration_s=round(duration_s, 3))

    def host(self, name: str) -> HostReport:
        for h in self.hosts:
            if h.host == name:
                return h
        raise KeyError(name)

    def interfaces(self) -> dict[str, str]:
        """host name -> NIC carrying its inventory address (for NCCL_SOCKET_IFNAME / GLOO_SOCKET_IFNAME).
        Hosts whose interface check did not find an up NIC are absent."""
        out: dict[str, str] = {}
        for h in self.hosts:
            c = h.get("interface")
            if c is not None and c.status in ("pass", "warn") and c.data.get("name"):
                out[h.host] = str(c.data["name"])
        return out

    def gpu_flags(self) -> dict[str, str]:
        """host name -> how its containers get GPUs (``"gpus"`` | ``"cdi"``), as nvidia_toolkit found it. Hosts
        whose check did not pass (CPU hosts, bare, failed) are absent: the runtime's default applies."""
        out: dict[str, str] = {}
        for h in self.hosts:
            c = h.get("nvidia_toolkit")
            if c is not None and c.status in ("pass", "warn") and c.data.get("gpu_flags"):
                out[h.host] = str(c.data["gpu_flags"])
        return out

    def failures(self) -> list[tuple[str, CheckResult | ClusterCheck]]:
        """(host name or "cluster", check) for every fail and warn, fails first."""
        items: list[tuple[str, CheckResult | ClusterCheck]] = []
        for status in ("fail", "warn"):
            for h in self.hosts:
                items += [(h.host, c) for c in h.checks if c.status == status]
            items += [("cluster", c) for c in self.cluster if c.status == status]
        return items

    def to_dict(self) -> dict[str, Any]:
        return {"ok": self.ok, "hosts": [h.to_dict() for h in self.hosts],
                "cluster": [c.to_dict() for c in self.cluster], "summary": dict(self.summary),
                "duration_s": self.duration_s}

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)


def exit_code(report: PreflightReport, strict: bool = False) -> int:
    """0: nothing failed (and, with ``strict``, nothing warned); 1 otherwise."""
    if not report.ok:
        return 1
    if strict and report.summary.get("warn", 0):
        return 1
    return 0
