"""Where every rank is: the Python stack of each rank of a job's current attempt, by ``py-spy dump``.

Pure parts: ``parse_dump`` (py-spy's text output -> threads and frames), ``parse_node`` (one node's collection
output -> ``RankStack``s), ``group`` / ``summary`` / ``render`` (identical stacks grouped: "ranks 0-6: all_reduce
<- train_step train.py:88"). One thin I/O function, ``collect``, runs ``NODE_SCRIPT`` on each node.

On the node, ``NODE_SCRIPT`` finds the attempt's rank processes by their environment (``CLUSTERCTL_JOB_ID``,
``CLUSTERCTL_ATTEMPT``, ``CLUSTERCTL_NODE`` and torchrun's ``RANK``; a rank's own children, e.g. DataLoader workers, are skipped) in
``/proc`` -- host PIDs, so containerized ranks are found the same way -- and dumps each with py-spy. A rank forked
by a warm zygote (clusterctl/launch/zygote.py) has the zygote's environment in ``/proc``: it is found by the marker its
zygote wrote, ``<warm root>/<warm key>/s/ranks/<its pid in the zygote's namespace>`` ("ATTEMPT RANK"). A node without
``py-spy`` on its PATH gets the static binary from this machine's py-spy wheel on the command's stdin: it is
written to a private ``mktemp -d`` directory (0700) and removed when the command ends.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import sysconfig
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

from clusterctl.errors import UserError
from clusterctl.launch.runtimes import WARM_ROOT_SH, warm_key

ARROW = "\u2190"          # "all_reduce <- train_step train.py:88"
DUMP_TIMEOUT_S = 20       # per rank, on the node
MARK = "@@clusterctl-"

# $1 JOB_ID  $2 ATTEMPT  $3 py-spy to run ("-": the binary comes on stdin)  $4 timeout per rank  $5 NODE (the
# inventory name: CLUSTERCTL_NODE tells this node's ranks apart where nodes share a PID namespace, as test hosts
# on one machine do)  $6 the node's warm key (runtimes.warm_key). Only this user's processes are looked at (as
# root: not a process another user started with the job's CLUSTERCTL_* environment); a warm rank's client proxy
# (its command line names the warm dir's zygote.py) is not a rank: the rank is its fork by the zygote.
# Fixed text; values only as argv.
NODE_SCRIPT = WARM_ROOT_SH + r'''
jid=$1 att=$2 spy=$3 node=$5
if [ "$spy" = - ]; then
  d=$(umask 077 && mktemp -d) || exit 125
  trap 'rm -rf -- "$d"' EXIT
  trap 'exit 130' INT TERM HUP
  (umask 077 && cat >"$d/py-spy") && chmod 700 "$d/py-spy" || exit 125
  spy=$d/py-spy
elif ! command -v "$spy" >/dev/null 2>&1; then
  echo "@@clusterctl-no-py-spy"; exit 3
fi
T=; command -v timeout >/dev/null 2>&1 && T="timeout $4"
found=
w=
warm_root 2>/dev/null && [ -d "$r/$6/s/ranks" ] && w=$r/$6/s/ranks
for e in /proc/[0-9]*/environ; do
  p=${e#/proc/}; p=${p%/environ}
  [ -O "/proc/$p" ] || continue
  v=$(exec 2>/dev/null; tr '\0' '\n' <"$e") || continue
  if ! printf '%s\n' "$v" | grep -qxF "CLUSTERCTL_JOB_ID=$jid"; then
    [ -n "$w" ] || continue
    grep -qF "/$6/py/zygote.py" "/proc/$p/cmdline" 2>/dev/null || continue
    n=$(sed -n 's/^NSpid:.*[[:space:]]\([0-9][0-9]*\)$/\1/p' "/proc/$p/status" 2>/dev/null)
    [ -f "$w/$n" ] && [ ! -L "$w/$n" ] || continue
    read -r a r <"$w/$n" 2>/dev/null || continue
    [ "$a" = "$att" ] || continue
    pp=$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$p/status" 2>/dev/null)
    found="$found$p ${pp:-0} $r
"
    continue
  fi
  printf '%s\n' "$v" | grep -qxF "CLUSTERCTL_ATTEMPT=$att" || continue
  printf '%s\n' "$v" | grep -qxF "CLUSTERCTL_NODE=$node" || continue
  grep -qF "/$6/py/zygote.py" "/proc/$p/cmdline" 2>/dev/null && continue
  r=$(printf '%s\n' "$v" | sed -n 's/^RANK=//p' | head -n 1)
  [ -n "$r" ] || continue
  pp=$(sed -n 's/^PPid:[[:space:]]*//p' "/proc/$p/status" 2>/dev/null)
  found="$found$p ${pp:-0} $r
"
done
pids=" $(printf '%s' "$found" | while read -r p _; do printf '%s ' "$p"; done)"
printf '%s' "$found" | while read -r p pp r; do
  case $pids in *" $pp "*) continue;; esac
  echo "@@clusterctl-rank $p $r"
  $T "$spy" dump --full-filenames --pid "$p" 2>&1
  echo "@@clusterctl-end $?"
done
echo "@@clusterctl-done"
'''


@dataclass(frozen=True)
class Frame:
    function: str
    file: str
    line: int | None

    def to_dict(self) -> dict:
        return {"function": self.function, "file": self.file, "line": self.line}


@dataclass(frozen=True)
class Thread:
    ident: str
    name: str
    status: str                       # idle | active | active+gil ...
    frames: tuple[Frame, ...]         # innermost first (as py-spy prints them)


@dataclass(frozen=True)
class RankStack:
    node: str
    rank: int
    pid: int
    frames: tuple[Frame, ...]         # the rank's main thread, innermost first
    error: str | None = None          # py-spy failed on this process
    threads: tuple[Thread, ...] = field(default=(), compare=False)

    def to_dict(self) -> dict:
        return {"node": self.node, "rank": self.rank, "pid": self.pid, "frames": [f.to_dict() for f in self.frames]}


# ------------------------------------------------------------------------------------------------ parsing (pure)
_THREAD = re.compile(r'^Thread (\S+) \(([^)]*)\)(?:: "(.*)")?\s*$')
MAX_LINE = 4096     # a longer line of py-spy output is no frame (and is not parsed)


def _frame(line: str) -> "Frame | None":
    """``    function (file:line)`` -> a Frame; ``None`` for anything else. Linear (issue 24: the regex
    ``^\\s+(.+?) \\((.+?)(?::(\\d+))?\\)\\s*$`` was quadratic in a line of `` (``: 10 s for 16 KB)."""
    if len(line) > MAX_LINE or not line[:1].isspace():
        return None
    body = line.strip()
    i = body.find(" (", 1)
    if i < 0 or not body.endswith(")") or len(body) < i + 4:
        return None
    function, inner = body[:i], body[i + 2:-1]
    file, sep, num = inner.rpartition(":")
    if sep and file and num.isascii() and num.isdigit():
        return Frame(function, file, int(num))
    return Frame(function, inner, None)


def parse_dump(text: str) -> list[Thread]:
    """py-spy ``dump`` text -> its threads, frames innermost first. Lines that are neither (the Process/Python
    header, ``--locals`` values) are skipped."""
    threads: list[Thread] = []
    cur: dict | None = None
    cur_frames: list[Frame] = []
    for line in text.splitlines():
        m = _THREAD.match(line)
        if m:
            if cur:
                threads.append(Thread(**cur, frames=tuple(cur_frames)))
            cur, cur_frames = {"ident": m.group(1), "status": m.group(2), "name": m.group(3) or ""}, []
            continue
        if cur is None:
            continue
        f = _frame(line) if line.startswith("    ") and not line.startswith("        ") else None
        if f:
            cur_frames.append(f)
    if cur:
        threads.append(Thread(**cur, frames=tuple(cur_frames)))
    return threads


LAUNCHER = "/clusterctl/rankview.py"     # every rank runs through it (its lib dir differs per node and attempt)


def own_frames(frames: Sequence[Frame]) -> tuple[Frame, ...]:
    """A rank's frames (innermost first) without the launcher's outermost ones: from the first frame of
    clusterctl.rankview outwards (with the runpy frames that ran it) they are the same for every rank, but for
    their path, so ranks in the same place would not group together."""
    for i, f in enumerate(frames):
        if f.file.endswith(LAUNCHER):
            return tuple(frames[:i])
    return tuple(frames)


def main_thread(threads: Sequence[Thread]) -> Thread | None:
    """The thread named MainThread, else the first one py-spy lists."""
    return next((t for t in threads if t.name == "MainThread"), threads[0] if threads else None)


def parse_node(node: str, output: str) -> list[RankStack]:
    """One node's ``NODE_SCRIPT`` output -> a ``RankStack`` per rank, in rank order."""
    out: list[RankStack] = []
    pid = rank = None
    body: list[str] = []
    for line in output.splitlines():
        if line.startswith(MARK + "rank "):
            _, p, r = line.split()
            pid, rank, body = int(p), int(r), []
        elif line.startswith(MARK + "end ") and pid is not None:
            rc = int(line.split()[1])
            text = "\n".join(body)
            threads = parse_dump(text)
            main = main_thread(threads)
            error = None
            if rc != 0 or main is None:
                error = _error_text(text) or f"py-spy exited with code {rc}"
            out.append(RankStack(node, rank, pid, own_frames(main.frames) if main else (), error, tuple(threads)))
            pid = rank = None
        elif pid is not None:
            body.append(line)
    return sorted(out, key=lambda s: s.rank)


def _error_text(text: str) -> str:
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    errs = [ln for ln in lines if ln.startswith("Error:")]
    return (errs[0] if errs else (lines[0] if lines else ""))[:300]


# ------------------------------------------------------------------------------------------------ grouping (pure)
_LIB = re.compile(r"/(site|dist)-packages/|/lib/python\d(\.\d+)?/|^<")


def is_library(file: str) -> bool:
    """A frame of the standard library or an installed package (py-spy ``--full-filenames`` paths)."""
    return bool(_LIB.search(file))


def where(frames: Sequence[Frame]) -> str:
    """``innermost_function <- first_frame_of_user_code file:line`` (only the latter when they are the same)."""
    if not frames:
        return "no Python frames"
    inner = frames[0]
    user = next((f for f in frames if not is_library(f.file)), None)
    if user is None:
        return f"{inner.function} {_loc(inner)}"
    if user is inner:
        return f"{user.function} {_loc(user)}"
    return f"{inner.function} {ARROW} {user.function} {_loc(user)}"


def _loc(f: Frame) -> str:
    return f"{os.path.basename(f.file)}" + (f":{f.line}" if f.line is not None else "")


def ranks_text(ranks: Sequence[int]) -> str:
    """[0, 1, 2, 5] -> "ranks 0-2,5"; [7] -> "rank 7"."""
    rs = sorted(set(ranks))
    parts, i = [], 0
    while i < len(rs):
        j = i
        while j + 1 < len(rs) and rs[j + 1] == rs[j] + 1:
            j += 1
        parts.append(str(rs[i]) if i == j else f"{rs[i]}-{rs[j]}")
        i = j + 1
    return ("rank " if len(rs) == 1 else "ranks ") + ",".join(parts)


def group(stacks: Sequence[RankStack]) -> list[tuple[list[RankStack], tuple[Frame, ...]]]:
    """Ranks with identical main-thread stacks (function, file, line of every frame) together; largest group
    first, then by lowest rank. Ranks py-spy could not read form groups by their error."""
    groups: dict[tuple, list[RankStack]] = {}
    for s in stacks:
        key = ("error", s.error) if s.error else tuple(s.frames)
        groups.setdefault(key, []).append(s)
    ordered = sorted(groups.values(), key=lambda g: (-len(g), min(s.rank for s in g)))
    return [(g, g[0].frames) for g in ordered]


def summary(stacks: Sequence[RankStack]) -> list[str]:
    """One line per group: "ranks 0-6: all_reduce <- train_step train.py:88"."""
    lines = []
    for members, frames in group(stacks):
        err = members[0].error
        lines.append(f"{ranks_text([s.rank for s in members])}: "
                     + (f"py-spy failed: {err}" if err else where(frames)))
    return lines


def render(stacks: Sequence[RankStack], errors: dict[str, str] | None = None) -> str:
    """Grouped summary, then each group's full stack (innermost first) with its nodes and pids."""
    out = summary(stacks)
    for members, frames in group(stacks):
        if members[0].error:
            continue
        out += ["", f"{ranks_text([s.rank for s in members])} "
                    f"({', '.join(f'{s.node}:{s.pid}' for s in members)}):"]
        out += [f"    {f.function} ({f.file}" + (f":{f.line})" if f.line is not None else ")") for f in frames]
    for node, msg in (errors or {}).items():
        out.append(f"{node}: {msg}")
    return "\n".join(out)


def to_json(stacks: Sequence[RankStack]) -> list[dict]:
    return [s.to_dict() for s in sorted(stacks, key=lambda s: s.rank)]


# ------------------------------------------------------------------------------------------------ I/O (thin)
def spy_binary() -> Path:
    """This machine's py-spy (the PyPI wheel's static binary, next to this Python's scripts)."""
    for cand in (Path(sysconfig.get_path("scripts")) / "py-spy", shutil.which("py-spy")):
        if cand and Path(cand).is_file() and os.access(cand, os.X_OK):
            return Path(cand)
    raise UserError("py-spy not found next to this Python or on PATH: pip install py-spy")


def node_argv(job_id: str, attempt: int, node: str, spy: str = "py-spy") -> list[str]:
    return ["sh", "-c", NODE_SCRIPT, "clusterctl-stacks", job_id, str(attempt), spy, str(DUMP_TIMEOUT_S), node,
            warm_key(job_id, node)]


def collect_node(run: Callable[..., object], node: str, job_id: str, attempt: int,
                 binary: Callable[[], bytes]) -> list[RankStack]:
    """``run(argv, timeout=, stdin=)`` on one node (a ``Transport.run``). Ships py-spy when the node lacks it."""
    r = run(node_argv(job_id, attempt, node), timeout=120)
    if r.exit_code == 3 and MARK + "no-py-spy" in r.stdout:
        r = run(node_argv(job_id, attempt, node, "-"), timeout=180, stdin=binary())
    if MARK + "done" not in r.stdout:
        raise RuntimeError(f"stack collection failed (exit {r.exit_code}): "
                           f"{(r.stderr.strip() or r.stdout.strip())[-300:]}")
    return parse_node(node, r.stdout)


def collect(nodes: Sequence[str], run_on: Callable[[str], Callable[..., object]], job_id: str, attempt: int,
            *, fan_out=None, host_timeout: float = 200) -> tuple[list[RankStack], dict[str, str]]:
    """Every rank's stack on ``nodes`` (in parallel). ``run_on(node)`` gives that node's ``run``.
    Returns (stacks in rank order, {node: error})."""
    from clusterctl.transport import fan_out as default_fan_out

    cache: dict[str, bytes] = {}

    def binary() -> bytes:
        if "b" not in cache:
            cache["b"] = spy_binary().read_bytes()
        return cache["b"]

    results = (fan_out or default_fan_out)(list(nodes), lambda n: collect_node(run_on(n), n, job_id, attempt, binary),
                                           host_timeout=host_timeout)
    stacks: list[RankStack] = []
    errors: dict[str, str] = {}
    for r in results:
        if r.ok:
            stacks += r.value
            if not r.value:
                errors[r.host] = "no rank process of this attempt found"
        else:
            errors[r.host] = str(r.error)
    return sorted(stacks, key=lambda s: s.rank), errors


def hang_record(stacks: Sequence[RankStack], errors: dict[str, str]) -> str:
    """The message of the ``stacks`` event the supervisor stores on a hang: one line per group."""
    lines = summary(stacks) + [f"{n}: {e}" for n, e in errors.items()]
    return "\n".join(lines) if lines else "no rank process found"


def dump_json(stacks: Sequence[RankStack], errors: dict[str, str]) -> str:
    return json.dumps({"stacks": to_json(stacks), "errors": errors}, indent=1)
