"""The probe script: one fixed shell script per host that runs every probe, with section markers.

Each probe prints ``@@cc<NAME``, its output (stderr merged), then ``@@cc>NAME RC``. The controller splits the
output with :func:`split_sections` and hands each section to a pure parser. Every user value (image, paths,
addresses) enters the script through ``shlex.quote``; everything else is fixed text written here.
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from typing import TYPE_CHECKING, Mapping

from clusterctl.checks import entry
from clusterctl.checks.job import DEFAULT_IMAGE, PreflightJob, PreflightOptions

if TYPE_CHECKING:
    from clusterctl.inventory import Host

NVIDIA_SMI_QUERY = ("index,name,driver_version,memory.total,ecc.errors.uncorrected.volatile.total,"
                    "retired_pages.pending,uuid")
NVIDIA_SMI_ARGV = ("nvidia-smi", f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits")
IMAGE_FORMAT = "{{.Id}} {{json .RepoDigests}}"
NONCE_PREFIX = ".clusterctl-preflight-"
RUNTIME_INFO_ARGV = {
    "docker": ("docker", "info", "--format", "{{json .}}"),
    "podman": ("podman", "info", "--format", "json"),
}

# Which sections each check reads (the script only runs what the selected checks need).
NEEDS: Mapping[str, tuple[str, ...]] = {
    "gpu_driver": ("nvidia_smi",), "gpu_count": ("nvidia_smi",), "gpu_health": ("nvidia_smi",),
    "container_runtime": ("runtime_info",), "nvidia_toolkit": ("runtime_info", "nvidia_ctk", "cdi_list"),
    "image": ("runtime_info", "image"), "ports": ("ss",), "disk": ("runtime_info", "df_checkpoint", "df_runtime"),
    "clock": ("timedatectl",), "interface": ("ip_addr", "ip_link", "ssh_conn", "getent"),
    "hostnames": ("hostname",), "consistency": ("nvidia_smi", "runtime_info", "image"),
    "rendezvous_exposure": ("ip_addr", "ip_link", "ssh_conn", "getent"),
}

_PRELUDE = """\
if command -v timeout >/dev/null 2>&1; then to() { t=$1; shift; timeout "$t" "$@"; }
else to() { shift; "$@"; }; fi
b() { printf '@@cc<%s\\n' "$1"; }
e() { printf '\\n@@cc>%s %d\\n' "$1" "$2"; }
b clock0; date +%s.%N; e clock0 $?
"""
_EPILOGUE = "b clock1; date +%s.%N; e clock1 $?\n"

_SECTION_RE = re.compile(r"^@@cc<(\w+)\n(.*?)\n@@cc>\1 (-?\d+)$", re.S | re.M)


@dataclass(frozen=True)
class Section:
    output: str
    rc: int


def is_ip(address: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(address.split("%", 1)[0])
        return True
    except ValueError:
        return False


def nonce_path(checkpoint_dir: str, nonce: str) -> str:
    return checkpoint_dir.rstrip("/") + "/" + NONCE_PREFIX + nonce


def wanted_sections(host: "Host", job: PreflightJob | None, options: PreflightOptions) -> set[str]:
    ids = [i for i in NEEDS if options.wants(i)]
    out = {s for i in ids for s in NEEDS[i]}
    if host.gpus == 0:
        out -= {"nvidia_smi", "nvidia_ctk", "cdi_list"}
    if host.runtime not in RUNTIME_INFO_ARGV:
        out -= {"runtime_info", "image", "nvidia_ctk", "cdi_list", "df_runtime"}
    if job is None or not job.checkpoint_dir:
        out.discard("df_checkpoint")
    if is_ip(host.address) or host.interface:
        out.discard("getent")
    if (options.wants("torchrun") or options.wants("script")) and entry.applies(host, job):
        out.add(entry.SECTION)
    return out


def _cmd(timeout: float, argv: tuple[str, ...] | list[str]) -> str:
    return f"to {timeout:g} {shlex.join(argv)} </dev/null 2>&1"


def build_probe_script(host: "Host", job: PreflightJob | None, options: PreflightOptions, *,
                       nonce: str | None = None) -> str:
    """The phase-1 script for one host. ``nonce``: write the shared-storage nonce file (rendezvous host only)."""
    want = wanted_sections(host, job, options)
    t = options.probe_timeout_s
    rt = host.runtime
    image = (job.image if job else None) or DEFAULT_IMAGE
    parts = [_PRELUDE]
    add = parts.append
    if "hostname" in want:
        add("b hostname; (hostname || uname -n) 2>&1; e hostname $?\n")
    if "nvidia_smi" in want:
        add(f"b nvidia_smi; {_cmd(t, NVIDIA_SMI_ARGV)}; e nvidia_smi $?\n")
    if "runtime_info" in want:
        add(f"b runtime_info; ri=$({_cmd(t, RUNTIME_INFO_ARGV[rt])}); rc=$?; printf '%s' \"$ri\"; "
            "e runtime_info $rc\n")
    if "nvidia_ctk" in want:
        add(f"b nvidia_ctk; {_cmd(t, ('nvidia-ctk', '--version'))}; e nvidia_ctk $?\n")
    if "cdi_list" in want:
        add(f"b cdi_list; {_cmd(t, ('nvidia-ctk', 'cdi', 'list'))}; e cdi_list $?\n")
    if "image" in want:
        if options.pull:
            add(f"b image_pull; {_cmd(options.pull_timeout_s, (rt, 'pull', '-q', '--', image))}; e image_pull $?\n")
        add(f"b image; {_cmd(t, (rt, 'image', 'inspect', '--format', IMAGE_FORMAT, '--', image))}; e image $?\n")
    if "ss" in want:
        add(f"b ss; {_cmd(t, ('ss', '-Hltn'))}; e ss $?\n")
    if "df_checkpoint" in want:
        assert job is not None and job.checkpoint_dir
        add(f"b df_checkpoint; d={shlex.quote(job.checkpoint_dir)}; "
            "while [ ! -e \"$d\" ] && [ \"$d\" != / ] && [ \"$d\" != . ]; do d=$(dirname -- \"$d\"); done; "
            f"to {t:g} df -P -B1 -- \"$d\" </dev/null 2>&1; e df_checkpoint $?\n")
    if "df_runtime" in want:
        if "runtime_info" not in want:  # pragma: no cover - NEEDS keeps them together
            add("ri=''\n")
        add("root=$(printf '%s' \"$ri\" | sed -n -e 's/.*\"DockerRootDir\": *\"\\([^\"]*\\)\".*/\\1/p' "
            "-e 's/.*\"graphRoot\": *\"\\([^\"]*\\)\".*/\\1/p' | head -n 1)\n"
            f"b df_runtime; if [ -n \"$root\" ]; then to {t:g} df -P -B1 -- \"$root\" </dev/null 2>&1; "
            "else echo 'container storage root unknown'; false; fi; e df_runtime $?\n")
    if "timedatectl" in want:
        add(f"b timedatectl; {_cmd(t, ('timedatectl', 'show', '-p', 'NTPSynchronized', '--value'))}; "
            "e timedatectl $?\n")
    if "ip_addr" in want:
        add(f"b ip_addr; {_cmd(t, ('ip', '-o', 'addr', 'show'))}; e ip_addr $?\n")
    if "ip_link" in want:
        add(f"b ip_link; {_cmd(t, ('ip', '-o', 'link', 'show'))}; e ip_link $?\n")
    if "ssh_conn" in want:
        add("b ssh_conn; printf '%s' \"${SSH_CONNECTION:-}\"; e ssh_conn 0\n")
    if "getent" in want:
        add(f"b getent; {_cmd(t, ('getent', 'hosts', host.address))}; e getent $?\n")
    if entry.SECTION in want:
        assert job is not None
        add(f"b {entry.SECTION}; {entry.snippet(host, job, t)}; e {entry.SECTION} $?\n")
    if nonce and job is not None and job.checkpoint_dir:
        d = shlex.quote(job.checkpoint_dir)
        p = shlex.quote(nonce_path(job.checkpoint_dir, nonce))
        add(f"b nonce_write; if [ -d {d} ]; then (printf '%s' {shlex.quote(nonce)} > {p}) 2>&1; "
            f"else echo 'no such directory'; false; fi; e nonce_write $?\n")
    parts.append(_EPILOGUE)
    return "".join(parts)


def split_sections(stdout: str) -> dict[str, Section]:
    """``@@cc<NAME`` ... ``@@cc>NAME RC`` blocks -> {NAME: Section(output, rc)}. Pure."""
    return {m.group(1): Section(m.group(2).rstrip("\n"), int(m.group(3))) for m in _SECTION_RE.finditer(stdout)}


def parse_sections(output: str, rc: int = 0) -> dict[str, dict]:
    """Fixture-friendly form of :func:`split_sections`."""
    return {k: {"output": v.output, "rc": v.rc} for k, v in split_sections(output).items()}


def tool_error(tool: str, section: Section | None, timeout_s: float | None = None) -> str | None:
    """A one-line message when a probe did not run cleanly (missing, timed out, failed), else None."""
    if section is None:
        return f"{tool}: no output (probe did not run)"
    if section.rc == 0:
        return None
    if section.rc == 127:
        return f"{tool} not found"
    if section.rc == 124:
        return f"{tool} timed out" + (f" after {timeout_s:g}s" if timeout_s else "")
    first = first_line(section.output)
    return f"{tool} failed (exit {section.rc})" + (f": {first}" if first else "")


def first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:300]
    return ""
