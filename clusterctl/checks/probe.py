"""The probe script: one shell script per host that runs the registered probes the selected checks need.

Each probe prints ``@@cc<NAME``, its output (stderr merged), then ``@@cc>NAME RC``. The controller splits the
output with :func:`split_sections` and hands each section to a pure parser. Every user value (image, paths,
addresses) enters the script through ``shlex.quote``; everything else is fixed text in the check modules.
"""
from __future__ import annotations

import shlex
from typing import TYPE_CHECKING

from clusterctl.checks import registry
from clusterctl.checks.job import PreflightJob, PreflightOptions
from clusterctl.checks.model import MARKERS, Section, first_line, is_ip, split_sections, tool_error

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host

__all__ = ["NONCE_PREFIX", "Section", "build_probe_script", "first_line", "is_ip", "nonce_path", "parse_sections",
           "split_sections", "tool_error", "wanted_sections"]

NONCE_PREFIX = ".clusterctl-preflight-"

_PRELUDE = ("if command -v timeout >/dev/null 2>&1; then to() { t=$1; shift; timeout \"$t\" \"$@\"; }\n"
            "else to() { shift; \"$@\"; }; fi\n" + MARKERS + "b clock0; date +%s.%N; e clock0 $?\n")
_EPILOGUE = "b clock1; date +%s.%N; e clock1 $?\n"


def nonce_path(checkpoint_dir: str, nonce: str) -> str:
    return checkpoint_dir.rstrip("/") + "/" + NONCE_PREFIX + nonce


def wanted_sections(host: "Host", job: PreflightJob | None, options: PreflightOptions) -> set[str]:
    """The probes this host runs: those the selected checks need, where they apply to the host."""
    need = {n for c in registry.CHECKS if options.wants(c.id) for n in c.needs}
    return {p.name for p in registry.PROBES if p.name in need and p.applies(host, job, options)}


def build_probe_script(host: "Host", job: PreflightJob | None, options: PreflightOptions, *,
                       nonce: str | None = None) -> str:
    """The phase-1 script for one host. ``nonce``: write the shared-storage nonce file (rendezvous host only)."""
    want = wanted_sections(host, job, options)
    parts = [_PRELUDE] + [p.snippet(host, job, options) for p in registry.PROBES if p.name in want]
    if nonce and job is not None and job.checkpoint_dir:
        d = shlex.quote(job.checkpoint_dir)
        p = shlex.quote(nonce_path(job.checkpoint_dir, nonce))
        parts.append(f"b nonce_write; if [ -d {d} ]; then (printf '%s' {shlex.quote(nonce)} > {p}) 2>&1; "
                     f"else echo 'no such directory'; false; fi; e nonce_write $?\n")
    parts.append(_EPILOGUE)
    return "".join(parts)


def parse_sections(output: str, rc: int = 0) -> dict[str, dict]:
    """Fixture-friendly form of :func:`split_sections`."""
    return {k: {"output": v.output, "rc": v.rc} for k, v in split_sections(output).items()}
