"""The job's entry point on each host: ``torchrun`` (bare runtime) and ``script`` (where the host can see it).

Both fail a job at every attempt if they are wrong, so preflight (and the quick preflight of ``launch``) checks
them before anything starts. A check that does not apply to a host (torchrun inside a container image, a script
that is not under a mounted host path) is not reported for it.

``torchrun`` is found on the PATH a non-interactive SSH session gets (no ``~/.bashrc`` venv/conda activation, the
usual cause) and its ``#!`` interpreter must exist: that is what "runs" needs without importing torch on every host.
"""
from __future__ import annotations

import posixpath
import shlex
from typing import TYPE_CHECKING, Any

from clusterctl.checks.job import PreflightJob
from clusterctl.checks.model import Check, HostProbe, Probe, section
from clusterctl.checks.results import CheckResult, failed, passed
from clusterctl.launch import runtimes

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host

SECTION = "entry"


def host_script(host: "Host", job: PreflightJob | None) -> str | None:
    """Where the job's script is on the host's own filesystem, when the host can see it: bare (relative to the
    workdir), or a container whose script lies under a mounted host directory; else None."""
    if job is None or not job.script:
        return None
    if not runtimes.containerized(host.runtime):
        return job.script if job.script.startswith("/") else posixpath.join(job.workdir or ".", job.script)
    inside = job.script if job.script.startswith("/") else (
        posixpath.join(job.container_workdir, job.script) if job.container_workdir else None)
    if inside is None:
        return None
    for mount in job.mounts:
        parts = mount.split(":")
        if len(parts) >= 2 and parts[0].startswith("/"):
            src, dst = parts[0].rstrip("/") or "/", parts[1].rstrip("/") or "/"
            if inside == dst or inside.startswith(dst + "/"):
                return src + inside[len(dst):]
    return None


def applies(host: "Host", job: PreflightJob | None) -> bool:
    return job is not None and (not runtimes.containerized(host.runtime) or host_script(host, job) is not None)


def snippet(host: "Host", job: PreflightJob, timeout_s: float) -> str:
    """Shell text printing ``workdir=``, ``torchrun=``, ``interpreter=``, ``script=`` lines (values quoted)."""
    lines = []
    if not runtimes.containerized(host.runtime):
        wd = shlex.quote(job.workdir or ".")
        tr = shlex.quote(job.torchrun[0] if job.torchrun else "torchrun")
        lines.append(f"(cd {wd} 2>/dev/null && echo workdir=ok || echo workdir=missing; "
                     f"t=$(command -v {tr} 2>/dev/null); "
                     'if [ -n "$t" ] && [ -x "$t" ]; then echo "torchrun=$t"; l=$(head -n 1 "$t" 2>/dev/null); '
                     "case $l in '#!'*) i=${l#??}; set -- $i; "
                     'if [ -x "$1" ]; then echo "interpreter=ok $1"; else echo "interpreter=missing $1"; fi;; esac; '
                     "else echo torchrun=missing; fi)")
    script = host_script(host, job)
    if script is not None:
        lines.append(f"if [ -f {shlex.quote(script)} ]; then echo script=found; else echo script=missing; fi")
    return "; ".join(lines) or "true"


def parse_entry(output: str, rc: int = 0) -> dict[str, Any]:
    """``key=value`` lines -> {"workdir", "torchrun", "interpreter", "script"} (pure)."""
    out: dict[str, Any] = {}
    for line in output.splitlines():
        key, sep, value = line.partition("=")
        if sep and key in ("workdir", "torchrun", "interpreter", "script"):
            out[key] = value.strip()
    return out


def check_torchrun(probe: HostProbe) -> CheckResult | None:
    host, job = probe.host, probe.job
    if job is None or runtimes.containerized(host.runtime):
        return None
    facts = parse_entry(probe.sections[SECTION].output) if SECTION in probe.sections else {}
    name = job.torchrun[0] if job.torchrun else "torchrun"
    if host.connection == "local":      # the embedded default / a local host: this shell's PATH, not sshd's
        fix = ("torchrun runs on this machine with clusterctl's own PATH: activate the venv that has torch "
               "(`source .venv/bin/activate`), install clusterctl and torch into one (README, Install), or set "
               "the job's `torchrun:` to its full path, e.g. `torchrun: [/path/to/venv/bin/torchrun]`")
    else:
        fix = (f"install torch on {host.name} where a non-interactive SSH session finds it (PATH from sshd, no "
               f"~/.bashrc), or set the job's `torchrun:` to its full path, e.g. "
               f"`torchrun: [/opt/venv/bin/torchrun]`")
    if facts.get("workdir") == "missing":
        return failed("torchrun", f"workdir {job.workdir} does not exist on {host.name}",
                      f"create it on {host.name}, or fix `workdir:` in the job file", workdir=job.workdir)
    where = facts.get("torchrun", "missing")
    if where == "missing" or not where:
        return failed("torchrun", f"{name} not found on {host.name}'s PATH (bare runtime)", fix, torchrun=name)
    interp = facts.get("interpreter", "")
    if interp.startswith("missing"):
        return failed("torchrun", f"{where} exists but its interpreter {interp.split(' ', 1)[-1]} does not "
                                  f"(a venv moved or deleted?)", fix, torchrun=where)
    return passed("torchrun", f"{where}", torchrun=where)


def check_script(probe: HostProbe) -> CheckResult | None:
    host, job = probe.host, probe.job
    path = host_script(host, job)
    if path is None:
        return None
    facts = parse_entry(probe.sections[SECTION].output) if SECTION in probe.sections else {}
    if facts.get("script") == "found":
        return passed("script", path, path=path)
    return failed("script", f"the job's script {job.script} is not on {host.name} ({path}: no such file)",
                  "fix `script:` in the job file (relative paths start at `workdir`; the bare runtime's default "
                  "workdir is the job file's directory), or copy the script to every node / shared storage",
                  path=path)


# ------------------------------------------------------------------------------------------------ probes, checks
ENTRY = Probe(SECTION, lambda host, job, o: section(SECTION, snippet(host, job, o.probe_timeout_s)),
              applies=lambda host, job, o: applies(host, job))
TORCHRUN = Check("torchrun", "entry", check_torchrun, (SECTION,), label="torchrun", launch=True)
SCRIPT = Check("script", "entry", check_script, (SECTION,), label="script", launch=True)
