"""Disk space: ``df -P -B1`` parser (pure) and the disk check.

Thresholds (``PreflightOptions``): **fail** when free < 2 % **or** free < 5 GiB; **warn** when free < 10 %
**and** free < 50 GiB (a large filesystem with 8 % free is fine; a small one with 40 GiB free is fine).
"""
from __future__ import annotations

import shlex
from typing import TYPE_CHECKING, Any

from clusterctl.checks.job import GIB, PreflightJob, PreflightOptions
from clusterctl.checks.model import Check, HostProbe, Probe, tool_error
from clusterctl.checks.results import CheckResult, failed, passed, skipped, warned
from clusterctl.checks.runtime import in_container
from clusterctl.launch import runtimes

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host


def parse_df(output: str, rc: int = 0) -> list[dict[str, Any]]:
    """``df -P -B1 PATH...`` -> [{"filesystem", "size", "used", "available", "capacity_pct", "mount"}]."""
    out = []
    for line in output.splitlines():
        cols = line.split()
        for i in range(1, len(cols) - 4):   # FILESYSTEM (may hold spaces) SIZE USED AVAIL CAP% MOUNT (may too)
            size, used, avail, cap = cols[i:i + 4]
            if size.isdigit() and used.isdigit() and avail.isdigit() and cap.endswith("%"):
                out.append({"filesystem": " ".join(cols[:i]), "size": int(size), "used": int(used),
                            "available": int(avail),
                            "capacity_pct": int(cap[:-1]) if cap[:-1].isdigit() else None,
                            "mount": " ".join(cols[i + 4:])})
                break
    return out


def _fmt(n: int) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB else f"{n / 1024 ** 2:.0f} MiB"


def _judge(label: str, path: str, fs: dict[str, Any], p: HostProbe) -> tuple[str, str, dict[str, Any]]:
    o = p.options
    size, free = fs["size"], fs["available"]
    pct = 100.0 * free / size if size else 100.0
    info = {"path": path, "mount": fs["mount"], "free_bytes": free, "size_bytes": size, "free_pct": round(pct, 1)}
    text = f"{label} {path}: {_fmt(free)} free ({pct:.0f}%)"
    if size and (pct < o.disk_fail_pct or free < o.disk_fail_bytes):
        return "fail", text, info
    if size and pct < o.disk_warn_pct and free < o.disk_warn_bytes:
        return "warn", text, info
    return "pass", text, info


def check_disk(p: HostProbe) -> CheckResult:
    targets = []
    if p.job is not None and p.job.checkpoint_dir:
        targets.append(("checkpoints", p.job.checkpoint_dir, "df_checkpoint"))
    if runtimes.containerized(p.host.runtime) and "df_runtime" in p.sections:
        targets.append((f"{p.host.runtime} storage", None, "df_runtime"))
    if not targets:
        return skipped("disk", "no checkpoint dir and no container storage to check")
    results, problems, seen = [], [], set()
    for label, path, section in targets:
        sec = p.sections.get(section)
        err = tool_error("df", sec, p.options.probe_timeout_s)
        fs = parse_df(sec.output) if sec is not None else []
        if err or not fs:
            problems.append(f"{label}: {err or 'df printed nothing'}")
            continue
        if path is None:
            path = fs[0]["mount"]
        if fs[0]["mount"] in seen:
            continue
        seen.add(fs[0]["mount"])
        results.append(_judge(label, path, fs[0], p))
    data: dict[str, Any] = {"paths": [r[2] for r in results]}
    worst = next((s for s in ("fail", "warn") if any(r[0] == s for r in results)), "pass")
    detail = "; ".join(r[1] for r in results)
    o = p.options
    if worst == "fail":
        bad = "; ".join(r[1] for r in results if r[0] == "fail")
        return failed("disk", bad, f"free space (needs >= {o.disk_fail_pct:g}% and >= {_fmt(o.disk_fail_bytes)}): "
                      "delete old checkpoints / `docker system prune`, or point checkpoint.dir elsewhere", **data)
    if problems:
        return warned("disk", "; ".join(problems + ([detail] if detail else [])),
                      "make sure `df -P -B1` works on the host and the path is readable", **data)
    if worst == "warn":
        bad = "; ".join(r[1] for r in results if r[0] == "warn")
        return warned("disk", bad, f"free space soon (warns below {o.disk_warn_pct:g}% and "
                      f"{_fmt(o.disk_warn_bytes)}): delete old checkpoints or images", **data)
    return passed("disk", detail, **data)


# ------------------------------------------------------------------------------------------------ probes, checks
def _df_checkpoint(host: "Host", job: PreflightJob | None, o: PreflightOptions) -> str:
    """``df`` of the checkpoint dir, or of its nearest existing parent."""
    assert job is not None and job.checkpoint_dir
    return (f"b df_checkpoint; d={shlex.quote(job.checkpoint_dir)}; "
            "while [ ! -e \"$d\" ] && [ \"$d\" != / ] && [ \"$d\" != . ]; do d=$(dirname -- \"$d\"); done; "
            f"to {o.probe_timeout_s:g} df -P -B1 -- \"$d\" </dev/null 2>&1; e df_checkpoint $?\n")


def _df_runtime(host: "Host", job: PreflightJob | None, o: PreflightOptions) -> str:
    """``df`` of the container storage root, read from ``$ri`` (the ``runtime_info`` probe runs before)."""
    return ("root=$(printf '%s' \"$ri\" | sed -n -e 's/.*\"DockerRootDir\": *\"\\([^\"]*\\)\".*/\\1/p' "
            "-e 's/.*\"graphRoot\": *\"\\([^\"]*\\)\".*/\\1/p' | head -n 1)\n"
            f"b df_runtime; if [ -n \"$root\" ]; then to {o.probe_timeout_s:g} df -P -B1 -- \"$root\" </dev/null 2>&1; "
            "else echo 'container storage root unknown'; false; fi; e df_runtime $?\n")


DF_CHECKPOINT = Probe("df_checkpoint", _df_checkpoint,
                      applies=lambda host, job, o: job is not None and bool(job.checkpoint_dir))
DF_RUNTIME = Probe("df_runtime", _df_runtime, applies=in_container)
DISK = Check("disk", "host", check_disk, ("runtime_info", "df_checkpoint", "df_runtime"), label="disk")
