"""What a preflight check is, as data: a ``Probe`` (one section of the per-host probe script), a ``Check`` (an id,
the sections it reads, a pure function of them, its report label) and the ``HostProbe`` every host check reads.

Each check module (``system``, ``gpu``, ``runtime``, ``network``, ``storage``, ``entry``, ``cluster``) defines its
parsers, its check functions and their ``Probe``/``Check`` records; ``registry.py`` lists the records once, in
report order, and ``probe.py``/``preflight.py`` assemble the script and the run from it. This module imports no
check module (no cycles): it also holds the section framing every script shares (markers, ``Section``,
``split_sections``, the one-line error of a probe that did not run cleanly).
"""
from __future__ import annotations

import re
import shlex
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Literal, Mapping

from clusterctl.checks.job import PreflightJob, PreflightOptions

if TYPE_CHECKING:
    from clusterctl.checks.results import CheckResult
    from clusterctl.config.inventory import Host

# Section markers: ``b NAME`` prints ``@@cc<NAME``, ``e NAME RC`` prints ``@@cc>NAME RC`` (shell functions, fixed text).
MARKERS = "b() { printf '@@cc<%s\\n' \"$1\"; }\ne() { printf '\\n@@cc>%s %d\\n' \"$1\" \"$2\"; }\n"
_OPEN_RE = re.compile(r"@@cc<(\w+)")
_CLOSE_RE = re.compile(r"@@cc>(\w+) (-?\d+)")


@dataclass(frozen=True)
class Section:
    output: str
    rc: int


def split_sections(stdout: str) -> dict[str, Section]:
    """``@@cc<NAME`` ... ``@@cc>NAME RC`` blocks -> {NAME: Section(output, rc)}. Pure, and linear in the output
    (issue 24: one lazy ``(.*?)`` regex over the whole output was quadratic in unclosed markers): a line at a
    time; a closer ends the section of its name opened last before it (openers with no closer are ignored)."""
    out: dict[str, Section] = {}
    lines = stdout.split("\n")
    opened: dict[str, int] = {}
    for i, line in enumerate(lines):
        if not line.startswith("@@cc"):
            continue
        m = _OPEN_RE.fullmatch(line)
        if m:
            opened[m.group(1)] = i
            continue
        m = _CLOSE_RE.fullmatch(line)
        if m and m.group(1) in opened:
            start = opened[m.group(1)]
            if i > start + 1:        # ``e`` prints ``\n@@cc>``: a section has at least one (empty) line
                out[m.group(1)] = Section("\n".join(lines[start + 1:i]).rstrip("\n"), int(m.group(2)))
                opened.clear()
    return out


def section(name: str, body: str) -> str:
    """One section of a script: ``body``'s output and exit code between the markers."""
    return f"b {name}; {body}; e {name} $?\n"


def tool_cmd(timeout: float, argv: tuple[str, ...] | list[str]) -> str:
    """``argv`` (quoted) under the script's ``to`` timeout wrapper, stdin closed, stderr merged."""
    return f"to {timeout:g} {shlex.join(argv)} </dev/null 2>&1"


def first_line(text: str) -> str:
    for line in text.splitlines():
        line = line.strip()
        if line:
            return line[:300]
    return ""


def tool_error(tool: str, sec: Section | None, timeout_s: float | None = None) -> str | None:
    """A one-line message when a probe did not run cleanly (missing, timed out, failed), else None."""
    if sec is None:
        return f"{tool}: no output (probe did not run)"
    if sec.rc == 0:
        return None
    if sec.rc == 127:
        return f"{tool} not found"
    if sec.rc == 124:
        return f"{tool} timed out" + (f" after {timeout_s:g}s" if timeout_s else "")
    first = first_line(sec.output)
    return f"{tool} failed (exit {sec.rc})" + (f": {first}" if first else "")


def is_ip(address: str) -> bool:
    import ipaddress

    try:
        ipaddress.ip_address(address.split("%", 1)[0])
        return True
    except ValueError:
        return False


def parse_epoch(output: str, rc: int = 0) -> float | None:
    """``date +%s.%N`` -> seconds. Without %N support (busybox prints ``...N`` or nothing) whole seconds."""
    text = output.strip().splitlines()[0].strip() if output.strip() else ""
    head, _, frac = text.partition(".")
    if not head.isdigit():
        return None
    return float(f"{head}.{frac}") if frac.isdigit() else float(head)


# ------------------------------------------------------------------------------------------------ records
Applies = Callable[["Host", "PreflightJob | None", PreflightOptions], bool]


def always(host: "Host", job: "PreflightJob | None", options: PreflightOptions) -> bool:
    return True


@dataclass(frozen=True)
class Probe:
    """One section of the per-host probe script. ``snippet(host, job, options)``: the shell text that prints the
    section (``section(name, ...)``; user values through ``shlex.quote``); ``applies``: whether this host runs it
    at all (a CPU host runs no ``nvidia-smi``). Probes run in registry order: one may use a shell variable an
    earlier one set (``df_runtime`` reads ``runtime_info``'s ``$ri``)."""
    name: str
    snippet: Callable[["Host", "PreflightJob | None", PreflightOptions], str]
    applies: Applies = always


@dataclass(frozen=True)
class Check:
    """One check. ``kind``: ``host`` (every host; skipped where ssh failed), ``entry`` (only hosts it applies to:
    ``fn`` returns None elsewhere) or ``cluster`` (judged over all hosts by ``preflight``; ``fn`` is None).
    ``needs``: the probe sections it reads. ``launch``: part of the quick preflight of every ``launch``.
    ``label``: its column header in the report table (short enough that a full table fits 80 columns)."""
    id: str
    kind: Literal["host", "entry", "cluster"]
    fn: Callable[["HostProbe"], "CheckResult | None"] | None = None
    needs: tuple[str, ...] = ()
    label: str = ""
    launch: bool = False


@dataclass(frozen=True)
class HostProbe:
    """Everything phase 1 learned about one host: the input of every per-host check."""

    host: "Host"
    job: PreflightJob | None
    options: PreflightOptions
    sections: Mapping[str, Section]
    exit_code: int = 0
    stderr: str = ""
    connect_s: float = 0.0
    rtt_s: float = 0.0          # the probe command, controller side
    sent: float = 0.0           # controller wall clock before / after the command
    received: float = 0.0
    transport: Any = field(default=None, compare=False, repr=False)

    @property
    def image(self) -> str:
        return (self.job or PreflightJob()).image

    @property
    def rdzv_port(self) -> int:
        return (self.job or PreflightJob()).rdzv_port

    @property
    def script_s(self) -> float:
        a, b = self.sections.get("clock0"), self.sections.get("clock1")
        t0, t1 = (parse_epoch(a.output) if a else None), (parse_epoch(b.output) if b else None)
        return max(0.0, t1 - t0) if t0 is not None and t1 is not None else 0.0


def has_gpus(host: "Host", job: "PreflightJob | None", options: PreflightOptions) -> bool:
    return host.gpus != 0
