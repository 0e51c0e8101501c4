"""Pure: why a node's attempt ended, read from what the node left behind.

Inputs are texts fetched from the node (the tail of its own log, torchrun's error file, the kernel log); outputs
are values the supervisor, ``status`` and ``resume`` record. No I/O here, so every rule is tested on recorded output.
"""
from __future__ import annotations

import json
import re
import signal as _signal
from dataclasses import dataclass

RANK_PREFIX = re.compile(r"^\[(\d+)\]:")

# torchrun's failure summary: "Root Cause (first observed failure):" then rank / exitcode (pid) lines. Read in
# linear time (issue 24: one regex with two lazy ``.*?`` over the whole tail was cubic, 70 s on a 256 KB tail
# holding the GIL): each marker's block is the text up to the next marker, at most ROOT_CAUSE_BLOCK characters,
# and only the last MAX_TEXT characters of any text from a node are read.
ROOT_CAUSE_MARK = "Root Cause (first observed failure):"
ROOT_CAUSE_BLOCK = 4096
_EXITCODE = re.compile(r"exitcode\s{0,64}:\s{0,64}(-?\d{1,9})(?:\s{0,64}\(pid:\s{0,64}(\d{1,12})\))?")
MAX_TEXT = 256 << 10      # the most of a node's text any parser here reads (its end: where the errors are)


def capped(text: str, limit: int = MAX_TEXT) -> str:
    """The last ``limit`` characters of ``text`` (what the parsers of node output read)."""
    return text[-limit:] if len(text) > limit else text


SHELL_SIGNALS = {128 + s.value: s.name for s in (_signal.SIGHUP, _signal.SIGINT, _signal.SIGQUIT, _signal.SIGABRT,
                                                 _signal.SIGKILL, _signal.SIGSEGV, _signal.SIGPIPE,
                                                 _signal.SIGTERM, _signal.SIGBUS)}


@dataclass(frozen=True)
class RootCause:
    rank: int
    exit_code: int          # torchrun's: -N when the rank was killed by signal N
    pid: int | None = None

    @property
    def signal(self) -> str | None:
        return signal_name(-self.exit_code) if self.exit_code < 0 else None


def root_cause_of(text: str) -> RootCause | None:
    """The first failure summary in ``text`` (its last ``MAX_TEXT`` characters) that names a rank and an exit code.
    Linear: each marker's block is bounded by the next marker and ``ROOT_CAUSE_BLOCK``.

    torchrun's root cause is its first *observed* failure, ordered by time: a rank's error file is stamped when the
    rank raised, a rank killed by a signal when the agent saw it. A local peer of a SIGKILLed rank can raise first
    ("Connection reset by peer", then SIGTERMed by the agent) and be named. Where the root cause failed because a
    peer went away (``PEER_GONE``) and the summary's ``Failures:`` list has a rank that did not (nor was SIGTERMed:
    the agent's own stop of the others), that rank is it."""
    text = capped(text)
    pos = text.find(ROOT_CAUSE_MARK)
    while pos >= 0:
        start = pos + len(ROOT_CAUSE_MARK)
        nxt = text.find(ROOT_CAUSE_MARK, start, start + ROOT_CAUSE_BLOCK)
        block = text[start:nxt if nxt >= 0 else start + ROOT_CAUSE_BLOCK]
        end = block.find(SUMMARY_END)
        block = block[:end] if end >= 0 else block
        found = _failures(block)[:1]
        if found:
            cause, victim = found[0]
            if victim:
                listed = text.rfind(FAILURES_MARK, max(0, pos - ROOT_CAUSE_BLOCK), pos)
                others = _failures(text[listed + len(FAILURES_MARK):pos]) if listed >= 0 else []
                cause = next((c for c, v in others if not v and c.signal != "SIGTERM"), cause)
            return cause
        pos = nxt if nxt >= 0 else text.find(ROOT_CAUSE_MARK, start + ROOT_CAUSE_BLOCK)
    return None


FAILURES_MARK = "Failures:"
SUMMARY_END = "=" * 40           # the summary's closing rule (torchrun prints 60)
_RANK_LINE = re.compile(r"(?<![\w])rank\s{0,64}:\s{0,64}(\d{1,9})")       # not local_rank's


def _failures(block: str) -> list[tuple[RootCause, bool]]:
    """The failures one block of torchrun's summary lists, in order: (the failure, whether it says a peer went
    away)."""
    found = list(_RANK_LINE.finditer(block))
    out = []
    for m, nxt in zip(found, found[1:] + [None]):
        entry = block[m.start():nxt.start() if nxt else len(block)]
        e = _EXITCODE.search(entry)
        if e:
            out.append((RootCause(int(m.group(1)), int(e.group(1)), int(e.group(2)) if e.group(2) else None),
                        peer_failure(entry)))
    return out


def root_cause(text: str) -> tuple[int, int] | None:
    """(rank, exit code) from torchrun's failure summary."""
    rc = root_cause_of(text)
    return (rc.rank, rc.exit_code) if rc else None


def signal_name(number: int) -> str:
    try:
        return _signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


def signal_of(exit_code: int | None) -> str | None:
    """The signal behind a shell-style exit status (128+N), e.g. 137 -> SIGKILL."""
    return SHELL_SIGNALS.get(exit_code) if exit_code is not None else None


def node_lines(text: str, node: str) -> list[str]:
    """A node's raw log lines as ``[node/rank] text`` (``-`` for the agent's own lines), empty lines dropped."""
    out = []
    for line in capped(text).splitlines():
        m = RANK_PREFIX.match(line)
        body = (line[m.end():] if m else line).rstrip()
        if body.strip():
            out.append(f"[{node}/{m.group(1) if m else '-'}] {body}")
    return out


def error_tail(lines: list[str], node: str, rank: int | None, n: int = 20) -> str:
    """The last ``n`` non-empty lines of ``rank`` (all of the node's lines when the rank printed none)."""
    mine = [ln for ln in lines if rank is not None and ln.startswith(f"[{node}/{rank}] ")]
    return "\n".join((mine or lines)[-n:])


# ------------------------------------------------------------------------------ a rank that failed because a peer did
# What a rank prints when the other end of a collective or of the store went away: gloo's "Connection closed by
# peer [ADDR]" / "Connection reset by peer", NCCL's remote error, c10d's network errors. Such a failure is a
# consequence; the cause is on another node, often still being torn down by its torchrun. With NCCL the peers of a
# rank that failed (exit 1) wait in their collective until ProcessGroupNCCL's watchdog times it out and aborts the
# process (SIGABRT): "Watchdog caught collective operation timeout", "NCCL communicator was aborted on rank N",
# c10::DistBackendError (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp): victims too, whatever their signal.
PEER_GONE = re.compile(r"Connection (?:closed|reset) by peer|ncclRemoteError|remote process exited|"
                       r"DistNetworkError|RendezvousConnectionError|Watchdog caught collective operation timeout|"
                       r"NCCL communicator was aborted|DistBackendError")


def peer_failure(text: str) -> bool:
    """Whether ``text`` (a failed rank's error tail) says the rank failed because a peer went away."""
    return PEER_GONE.search(capped(text)) is not None


# ------------------------------------------------------------------------------ a GPU that failed
# What a rank prints when its GPU (not the job's code) failed. The CUDA runtime's error strings, as torch raises them
# ("RuntimeError: CUDA error: <cudaGetErrorString>", c10/cuda/CUDAException.h) and NCCL reports them ("Cuda failure
# '<string>'"); NVIDIA CUDA Runtime API reference, 6.38 Data types, enum cudaError: cudaErrorECCUncorrectable (214)
# "uncorrectable ECC error encountered", cudaErrorLaunchFailure (719) "unspecified launch failure",
# cudaErrorUnknown (999) "unknown error", cudaErrorSystemNotReady (802) "system not yet initialized" (Fabric Manager
# down on an NVSwitch system). NVML's NVML_ERROR_GPU_IS_LOST: "GPU is lost" (NVML API reference, nvmlReturn_t).
# NCCL's ncclUnhandledCudaError: "unhandled cuda error" (NCCL docs, ncclResult_t / ncclGetErrorString). "unknown
# error" alone is too common: only in torch's "CUDA error: unknown error" form.
GPU_ERROR = re.compile(r"uncorrectable ECC error encountered|unspecified launch failure|CUDA error: unknown error|"
                       r"GPU is lost|unhandled cuda error|system not yet initialized|cudaErrorSystemNotReady|"
                       r"CUDA_ERROR_SYSTEM_NOT_READY|\b(?:CUDA|cuda|cuInit)\b[^\n]{0,120}\b802\b", re.IGNORECASE)
# The kernel log line of an Xid (NVIDIA, "Xid Errors", docs.nvidia.com/deploy/xid-errors: "NVRM: Xid (PCI:0000:3b:00):
# 79, pid=..., GPU has fallen off the bus."), after dmesg's "[seconds since boot]". The Xids that mean the GPU (not
# the job) failed: 48 double-bit ECC error, 74 NVLink error, 79 fallen off the bus, 94 contained / 95 uncontained
# ECC error, 119 / 120 GSP RPC timeout / GSP error.
XID_LINE = re.compile(r"^\s*(?:\[\s*(\d+(?:\.\d+)?)\]\s*)?.*?NVRM: Xid \((PCI:[0-9A-Fa-f:.]+)\): (\d{1,4})\b")
GPU_XIDS = frozenset({48, 74, 79, 94, 95, 119, 120})


def gpu_error(lines: list[str]) -> str | None:
    """The first of a node's lines (``node_lines``) that says a GPU failed (``GPU_ERROR``), or None."""
    return next((ln.strip()[:400] for ln in lines if GPU_ERROR.search(ln)), None)


@dataclass(frozen=True)
class Xid:
    pci: str
    code: int
    line: str
    uptime_s: float | None      # dmesg's [seconds since boot], when the line has it


def parse_xid(kernel_log: str) -> list[Xid]:
    """Every ``NVRM: Xid`` line of a kernel log (``dmesg``), in order. Linear: one anchored match per line."""
    out = []
    for line in capped(kernel_log).splitlines():
        if "NVRM: Xid" not in line:
            continue
        m = XID_LINE.match(line)
        if m:
            out.append(Xid(m.group(2), int(m.group(3)), line.strip()[:400],
                           float(m.group(1)) if m.group(1) is not None else None))
    return out


# the node-side command of ``recent_xid``: the node's uptime, then its kernel log's Xid lines (bounded: tail)
XID_PROBE = ("cat /proc/uptime; dmesg 2>/dev/null | grep -F 'NVRM: Xid' | tail -n 200; "
             "journalctl -k -q --no-pager -o short-monotonic -n 20000 2>/dev/null | grep -F 'NVRM: Xid' | tail -n 200; "
             "true")
XID_SLACK_S = 60.0


def recent_xid(probe_output: str, within_s: float) -> Xid | None:
    """The last GPU-failure Xid (``GPU_XIDS``) of ``XID_PROBE``'s output logged within the last ``within_s``
    seconds (plus ``XID_SLACK_S``) by the kernel's clock; an Xid of an earlier day says nothing of this attempt."""
    first = probe_output.split("\n", 1)[0].split()
    try:
        uptime = float(first[0])
    except (IndexError, ValueError):
        return None
    found = [x for x in parse_xid(probe_output) if x.code in GPU_XIDS and x.uptime_s is not None
             and uptime - x.uptime_s <= within_s + XID_SLACK_S]
    return found[-1] if found else None


# ------------------------------------------------------------------------------ NCCL on sockets where IB is expected
# With NCCL_DEBUG=INFO (NCCL_DEBUG_SUBSYS INIT or NET) each rank says which network transport NCCL chose: "NCCL INFO
# Using network IB" / "NCCL INFO NET/IB : Using [0]mlx5_0:1/IB ..." or, when the verbs devices are unusable,
# "NCCL INFO NET/Socket : Using [0]eth0:10.0.0.1<0>" and "NCCL INFO Using network Socket" (NCCL's environment
# variables documentation, NCCL_DEBUG; src/transport/net_socket.cc, src/net.cc).
NCCL_NET_LINE = re.compile(r"NCCL INFO (?:Using network (\w+)|NET/(\w+) : Using)")


def nccl_network(lines: list[str]) -> tuple[str, str] | None:
    """(transport, line): the network NCCL says it uses in ``lines`` ("Using network X" first, else the first
    "NET/X : Using"), or None when it said nothing (NCCL_DEBUG below INFO, or no NCCL)."""
    found = [(m, line) for line in lines for m in [NCCL_NET_LINE.search(line)] if m]
    m, line = next(((m, ln) for m, ln in found if m.group(1)), found[0] if found else (None, ""))
    return ((m.group(1) or m.group(2)), line.strip()[:300]) if m else None


# ------------------------------------------------------------------------------ failures a retry cannot fix
CANT_OPEN = re.compile(r"can't open file '([^']+)': \[Errno 2\]")
NO_MODULE = re.compile(r"ModuleNotFoundError: No module named '([\w.]+)'")


@dataclass(frozen=True)
class ConfigError:
    message: str
    fix: str


def config_error(exit_code: int | None, text: str, *, script: str | None, module: str | None,
                 torchrun: str = "torchrun") -> ConfigError | None:
    """A failure no retry can fix: the entry point or torchrun is missing (exit 127), or python cannot open the
    job's own script / import the job's own module. Anything else (a missing dependency, a crash) is not."""
    if exit_code == 127:
        return ConfigError(f"{torchrun} or the entry point was not found on the node (exit code 127)",
                           "install torch where the job runs, or set the job's `torchrun:` to the full path of "
                           "torchrun on the nodes (check with `clusterctl preflight JOB.yaml`)")
    if script:
        for path in CANT_OPEN.findall(capped(text)):
            if path == script or path.endswith("/" + script.lstrip("./")) or script.endswith("/" + path.lstrip("./")):
                return ConfigError(f"python can't open the job's script {path!r} (no such file on the node)",
                                   "fix `script:` in the job file (relative to `workdir`; the bare runtime's "
                                   "default workdir is the job file's directory), or put the script on the nodes")
    if module:
        top = module.split(".")[0]
        for name in NO_MODULE.findall(capped(text)):
            if name in (module, top) or module.startswith(name + "."):
                return ConfigError(f"python cannot import the job's module {name!r}",
                                   "fix `module:` in the job file, or install the package / set PYTHONPATH "
                                   "in the job's `env:` so the nodes can import it")
    return None


# ------------------------------------------------------------------------------ OOM killer
OOM_LINE = re.compile(r"(?:Out of memory|Memory cgroup out of memory): Killed process (\d+)")
OOM_KILL = "oom-kill:"
_OOM_PID = re.compile(r"\bpid=(\d+)")


def oom_killed(kernel_log: str, pid: int | None) -> bool:
    """Whether the kernel log says the OOM killer killed ``pid`` (any OOM kill when the pid is unknown).
    Line by line, no lazy ``.*?`` across a line (linear in the log's last ``MAX_TEXT`` characters)."""
    for line in capped(kernel_log).splitlines():
        killed = [int(m.group(1)) for m in OOM_LINE.finditer(line)]
        i = line.find(OOM_KILL)
        if i >= 0:
            m = _OOM_PID.search(line, i + len(OOM_KILL))
            if m:
                killed.append(int(m.group(1)))
        if killed and (pid is None or pid in killed):
            return True
    return False


# What the zygote's client of a warm rank says (in the rank's log) when the zygote saw its memory cgroup count an
# OOM kill while the rank ran and the rank died of SIGKILL (launch/zygote.py OOM_NOTE, the same words): a warm rank
# lives in the zygote's container, so the attempt container's OOMKilled flag and a kernel log line naming the
# client's pid say nothing of it.
WARM_OOM = "clusterctl-zygote: killed by the OOM killer (out of memory)"


def warm_oom(lines: list[str], node: str, rank: int | None) -> bool:
    """Whether ``rank``'s lines (any rank's when it is unknown) among a node's ``[node/rank] text`` lines carry
    the zygote client's OOM note."""
    prefix = f"[{node}/{rank}] " if rank is not None else f"[{node}/"
    return any(line.startswith(prefix) and WARM_OOM in line for line in lines)


# ------------------------------------------------------------------------------ torchrun's error file
# The bare runner copies torchrun's TORCHELASTIC_ERROR_FILE into the node's log as one line with this prefix.
ERROR_FILE_LINE = "clusterctl: torchelastic error file: "


def error_file_in(text: str) -> str | None:
    """The root cause message of the last error file the runner copied into a node's log, or None."""
    found = None
    for line in capped(text).splitlines():
        i = line.find(ERROR_FILE_LINE)
        if i >= 0:
            found = error_file_message(line[i + len(ERROR_FILE_LINE):])
    return found


def error_file_message(text: str) -> str | None:
    """The root cause message from a TORCHELASTIC_ERROR_FILE (``{"message": {"message": ..., "extraInfo": ...}}``
    as torch.distributed.elastic writes it), or None."""
    try:
        data = json.loads(text)
    except ValueError:
        return None
    msg = data.get("message") if isinstance(data, dict) else None
    if isinstance(msg, dict):
        inner = msg.get("message")
        extra = msg.get("extraInfo") or {}
        stack = extra.get("py_callstack") if isinstance(extra, dict) else None
        return "\n".join(x for x in (inner, stack) if isinstance(x, str) and x) or None
    return msg if isinstance(msg, str) and msg else None
