"""GPU checks: nvidia-smi CSV parser (pure), the image -> minimum driver table, gpu_driver/gpu_count/gpu_health."""
from __future__ import annotations

import re
import shlex
from dataclasses import replace
from typing import Any

from clusterctl.checks.model import (
    Check,
    HostProbe,
    Probe,
    Section,
    first_line,
    has_gpus,
    section,
    tool_cmd,
    tool_error,
)
from clusterctl.checks.results import CheckResult, failed, passed, skipped, warned
from clusterctl.model import causes

NVIDIA_SMI_QUERY = ("index,name,driver_version,memory.total,ecc.errors.uncorrected.volatile.total,"
                    "retired_pages.pending,uuid")
NVIDIA_SMI_ARGV = ("nvidia-smi", f"--query-gpu={NVIDIA_SMI_QUERY}", "--format=csv,noheader,nounits")

# CUDA major(.minor) of the image -> minimum Linux driver (minor-version compatibility).
MIN_DRIVER: dict[tuple[int, ...], str] = {
    (13,): "580.65.06",
    (12,): "525.60.13",
    (11, 8): "450.80.02",
    (11,): "450.80.02",
}
DEFAULT_CUDA = (12,)   # pytorch-cuda:v2.7-ssh, and any image whose CUDA version cannot be read from its name

_CUDA_RE = re.compile(r"cuda[-_:.]?v?(\d{2})(?:\.(\d))?|cu(\d{2})(\d)", re.I)
_NA = ("[n/a]", "n/a", "[not supported]", "not supported", "[unknown error]", "")
_FIELDS = 7
_MISMATCH = "Driver/library version mismatch"


def cuda_of_image(image: str) -> tuple[int, ...]:
    """``pytorch/pytorch:2.1.0-cuda11.8-cudnn8`` -> (11, 8); ``...-cu121`` -> (12, 1); unknown -> (12,)."""
    m = _CUDA_RE.search(image)
    if not m:
        return DEFAULT_CUDA
    if m.group(1):
        return (int(m.group(1)), int(m.group(2))) if m.group(2) else (int(m.group(1)),)
    return int(m.group(3)), int(m.group(4))


def min_driver_for(image: str) -> tuple[tuple[int, ...], str]:
    cuda = cuda_of_image(image)
    for key in (cuda[:2], cuda[:1]):
        if key in MIN_DRIVER:
            return cuda, MIN_DRIVER[key]
    return cuda, MIN_DRIVER[DEFAULT_CUDA]


def version_tuple(v: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.findall(r"\d+", v))


def _na(s: str) -> bool:
    return s.strip().lower() in _NA


def _int(s: str) -> int | None:
    s = s.strip()
    if _na(s):
        return None
    m = re.match(r"-?\d+", s)
    return int(m.group(0)) if m else None


def parse_nvidia_smi(output: str, rc: int = 0) -> dict[str, Any]:
    """``nvidia-smi --query-gpu=index,name,driver_version,memory.total,ecc.errors.uncorrected.volatile.total,
    retired_pages.pending,uuid --format=csv[,noheader][,nounits]`` -> {"error", "gpus": [...]}."""
    gpus: list[dict[str, Any]] = []
    error = None
    for line in output.splitlines():
        line = line.strip()
        if not line or line.startswith("index,") or line.startswith("index "):
            continue
        fields = [f.strip() for f in line.split(",")]
        if len(fields) > _FIELDS:      # a comma inside the GPU name
            fields = [fields[0], ", ".join(fields[1:len(fields) - 5]), *fields[-5:]]
        if len(fields) != _FIELDS or _int(fields[0]) is None:
            error = error or line[:300]
            continue
        retired = fields[5].strip().lower()
        gpus.append({
            "index": _int(fields[0]), "name": fields[1], "driver_version": fields[2],
            "memory_mib": _int(fields[3]), "ecc_uncorrected": _int(fields[4]),
            "retired_pending": None if _na(retired) else retired == "yes", "uuid": fields[6],
        })
    if rc != 0:
        error = first_line(output) or f"exit {rc}"
        gpus = []
    return {"error": error if (rc != 0 or not gpus) else None, "gpus": gpus}


_LIST_RE = re.compile(r"^GPU (\d+): (.+?) \(UUID: ([^)]+)\)\s*$")


def parse_nvidia_smi_list(output: str, rc: int = 0) -> dict[str, Any]:
    """``nvidia-smi -L`` (``GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-...)``; MIG devices, indented ``MIG ...``
    lines, are not GPUs) -> {"gpus": [{"index", "name", "uuid"}], "error"}."""
    gpus = [{"index": int(m.group(1)), "name": m.group(2), "uuid": m.group(3)}
            for m in map(_LIST_RE.match, output.splitlines()) if m]
    error = None if rc == 0 and gpus else (first_line(output) or (f"exit {rc}" if rc else "no GPU listed"))
    return {"gpus": gpus if rc == 0 else [], "error": error}


def _smi(p: HostProbe) -> tuple[dict[str, Any] | None, CheckResult | None]:
    """(parsed, None) or (None, a fail/skip for gpu_driver)."""
    sec: Section | None = p.sections.get("nvidia_smi")
    if sec is not None and sec.rc == 127 and p.host.gpus is None:
        return None, skipped("gpu_driver", "nvidia-smi not found and clusterctl_gpus not set: treated as a CPU host")
    parsed = parse_nvidia_smi(sec.output, sec.rc) if sec else None
    if parsed is None or parsed["error"] or not parsed["gpus"]:
        msg = tool_error("nvidia-smi", sec, p.options.probe_timeout_s) if (sec is None or sec.rc) else None
        msg = msg or (f"nvidia-smi: {parsed['error']}" if parsed and parsed["error"] else "nvidia-smi found no GPUs")
        return None, failed("gpu_driver", msg, _driver_hint(sec, msg), exit_code=sec.rc if sec else None)
    return parsed, None


def _driver_hint(sec: Section | None, msg: str) -> str:
    if _MISMATCH in msg or (sec is not None and sec.rc == 18):
        return "the loaded kernel module and the installed NVIDIA libraries differ: reboot the host (or reload the nvidia modules)"
    if sec is not None and sec.rc == 127:
        return "install the NVIDIA driver (nvidia-smi is not on PATH), or set clusterctl_gpus: 0 for a CPU host"
    if sec is not None and sec.rc == 9:
        return "the NVIDIA kernel driver is not loaded: `sudo modprobe nvidia` or reinstall the driver"
    if sec is not None and sec.rc == 124:
        return "nvidia-smi hangs: a GPU or the driver is wedged; check `dmesg` for Xid errors and reset or reboot"
    return "run `nvidia-smi` on the host and fix the driver error it prints"


def check_gpu_driver(p: HostProbe) -> CheckResult:
    if p.host.gpus == 0:
        return skipped("gpu_driver", "CPU host (clusterctl_gpus: 0)")
    parsed, bad = _smi(p)
    if bad:
        return bad
    assert parsed is not None
    version = parsed["gpus"][0]["driver_version"]
    image = p.image
    cuda, minimum = min_driver_for(image)
    cuda_s = ".".join(map(str, cuda)) + (".x" if len(cuda) == 1 else "")
    data = {"version": version, "minimum": minimum, "cuda": cuda_s}
    if version_tuple(version) < version_tuple(minimum):
        return failed("gpu_driver", f"driver {version} is older than {minimum}, the minimum for CUDA {cuda_s} "
                      f"({image})", f"upgrade the NVIDIA driver to >= {minimum}, or use an image built for an "
                      "older CUDA", **data)
    cuda = check_cuda(p)          # the driver's own answer: nvidia-smi (NVML) can look fine while cuInit fails
    data.update(cuda.data)
    if cuda.status in ("fail", "warn"):
        return replace(cuda, id="gpu_driver", data=data)
    return passed("gpu_driver", f"driver {version} (CUDA {cuda_s} needs >= {minimum})"
                  + (f"; {cuda.detail}" if p.sections.get("cuda_init") is not None else ""), **data)


def _gpu_list(p: HostProbe, cid: str) -> tuple[list[dict[str, Any]], CheckResult | None]:
    """(the GPUs nvidia-smi listed, None), or ([], the skip of ``cid``: a CPU host, or no list; see gpu_driver)."""
    if p.host.gpus == 0:
        return [], skipped(cid, "CPU host (clusterctl_gpus: 0)")
    parsed, bad = _smi(p)
    if bad or parsed is None:
        return [], skipped(cid, "no GPU list (see gpu_driver)")
    return parsed["gpus"], None


def check_gpu_count(p: HostProbe) -> CheckResult:
    gpus, skip = _gpu_list(p, "gpu_count")
    if skip:
        return skip
    n = len(gpus)
    models = sorted({g["name"] for g in gpus})
    data = {"count": n, "expected": p.host.gpus, "models": models}
    if p.host.gpus is not None and n != p.host.gpus:
        return failed("gpu_count", f"{n} GPUs visible, inventory says {p.host.gpus}",
                      "check `nvidia-smi -L` and `dmesg` for a GPU that fell off the bus; or set clusterctl_gpus "
                      f"to {n}", **data)
    nproc = p.job.nproc_per_node if p.job else None
    if isinstance(nproc, int) and nproc > n:
        return failed("gpu_count", f"nproc_per_node={nproc} but only {n} GPUs", f"set nproc_per_node to {n} "
                      "(or \"gpu\") in the job", **data)
    note = "" if p.host.gpus is not None else " (clusterctl_gpus not set)"
    return passed("gpu_count", f"{n} x {', '.join(models)}{note}", **data)


# ------------------------------------------------------------------------------------------------ health (issue 35)
# Queried apart from NVIDIA_SMI_QUERY, each on its own: an unknown field fails a whole query on an older driver
# (``Field "x" is not a valid field to query.``, exit 2), so the base list must not depend on them.
# nvidia-smi(1), https://docs.nvidia.com/deploy/nvidia-smi/index.html: --query-gpu fields mig.mode.current,
# persistence_mode, compute_mode; --query-remapped-rows (Ampere and later: row remapping replaced page retirement,
# so retired_pages.* is [N/A] on A100/H100/H200: https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/).
MODES_ARGV = ("nvidia-smi", "--query-gpu=index,mig.mode.current,persistence_mode,compute_mode",
              "--format=csv,noheader")
REMAP_ARGV = ("nvidia-smi", "--query-remapped-rows=gpu_uuid,remapped_rows.pending,remapped_rows.failure",
              "--format=csv,noheader")
# fabric.state / fabric.status (NVML nvmlDeviceGetGpuFabricInfo): NVSwitch systems register every GPU with the
# fabric through Fabric Manager ("Not Started" -> "In Progress" -> "Completed"); elsewhere "N/A" / not supported.
FABRIC_ARGV = ("nvidia-smi", "--query-gpu=index,fabric.state,fabric.status", "--format=csv,noheader")


def _rows(output: str, rc: int, width: int) -> tuple[list[list[str]], str | None]:
    """CSV rows of ``width`` fields (a header line skipped), or ([], the error) where the query failed."""
    if rc != 0:
        return [], first_line(output) or f"exit {rc}"
    rows = []
    for line in output.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) == width and not line.lower().startswith(("index", "gpu_uuid")):
            rows.append(fields)
    return rows, (None if rows else first_line(output) or "no rows")


def _flag(s: str) -> bool | None:
    v = s.strip().lower()
    return None if _na(v) else v in ("1", "yes", "enabled", "true")


def parse_gpu_modes(output: str, rc: int = 0) -> dict[str, Any]:
    """``nvidia-smi --query-gpu=index,mig.mode.current,persistence_mode,compute_mode --format=csv,noheader`` ->
    {"gpus": [{"index", "mig", "persistence", "compute_mode"}], "error"}; mig/persistence: True/False/None
    ([N/A]: no MIG on the GPU)."""
    rows, error = _rows(output, rc, 4)
    gpus = [{"index": _int(r[0]), "mig": _flag(r[1]), "persistence": _flag(r[2]),
             "compute_mode": None if _na(r[3]) else r[3]} for r in rows if _int(r[0]) is not None]
    return {"gpus": gpus, "error": error}


def parse_remapped_rows(output: str, rc: int = 0) -> dict[str, Any]:
    """``nvidia-smi --query-remapped-rows=gpu_uuid,remapped_rows.pending,remapped_rows.failure
    --format=csv,noheader`` -> {"gpus": [{"uuid", "pending", "failure"}], "error"} (NVML: bPending, a reset
    remaps the row; bFailureOccurred, a remapping failed: the GPU needs replacing)."""
    rows, error = _rows(output, rc, 3)
    return {"gpus": [{"uuid": r[0], "pending": _flag(r[1]), "failure": _flag(r[2])} for r in rows],
            "error": error}


def parse_gpu_fabric(output: str, rc: int = 0) -> dict[str, Any]:
    """``nvidia-smi --query-gpu=index,fabric.state,fabric.status --format=csv,noheader`` -> {"gpus": [{"index",
    "state", "status"}], "error"}; state None where the GPU has no fabric ([N/A]: no NVSwitch)."""
    rows, error = _rows(output, rc, 3)
    gpus = [{"index": _int(r[0]), "state": None if _na(r[1]) else r[1], "status": None if _na(r[2]) else r[2]}
            for r in rows if _int(r[0]) is not None]
    return {"gpus": gpus, "error": error}


def _section(p: HostProbe, name: str, parser) -> dict[str, Any] | None:
    sec = p.sections.get(name)
    return parser(sec.output, sec.rc) if sec is not None else None


def check_gpu_health(p: HostProbe) -> CheckResult:
    gpus, skip = _gpu_list(p, "gpu_health")
    if skip:
        return skip
    index_of = {g["uuid"]: g["index"] for g in gpus}
    remap = _section(p, "smi_remap", parse_remapped_rows) or {"gpus": [], "error": "not run"}
    modes = _section(p, "smi_modes", parse_gpu_modes) or {"gpus": [], "error": "not run"}
    ecc = {g["index"]: g["ecc_uncorrected"] for g in gpus if g["ecc_uncorrected"]}
    pending = [g["index"] for g in gpus if g["retired_pending"]]
    remap_pending = [index_of.get(r["uuid"], r["uuid"]) for r in remap["gpus"] if r["pending"]]
    remap_failed = [index_of.get(r["uuid"], r["uuid"]) for r in remap["gpus"] if r["failure"]]
    mig = [m["index"] for m in modes["gpus"] if m["mig"]]
    prohibited = [m["index"] for m in modes["gpus"] if (m["compute_mode"] or "").lower() == "prohibited"]
    exclusive = [m["index"] for m in modes["gpus"] if "exclusive" in (m["compute_mode"] or "").lower()]
    no_persistence = [m["index"] for m in modes["gpus"] if m["persistence"] is False]
    data = {"ecc_uncorrected": {str(k): v for k, v in ecc.items()}, "retired_pending": pending,
            "remapped_rows_pending": remap_pending, "remapped_rows_failure": remap_failed, "mig_enabled": mig,
            "compute_mode": {str(m["index"]): m["compute_mode"] for m in modes["gpus"]},
            "persistence_off": no_persistence,
            "unknown": sorted(n for n, d in (("remapped_rows", remap), ("modes", modes)) if d["error"])}

    def gpus_s(ids: list) -> str:
        return ", ".join(map(str, ids))

    if ecc:
        which = ", ".join(f"GPU {i}: {n}" for i, n in ecc.items())
        first = next(iter(ecc))
        return failed("gpu_health", f"uncorrectable ECC errors ({which})",
                      f"drain the host; reset the GPU (`nvidia-smi -r -i {shlex.quote(str(first))}`) or reboot, and replace it if "
                      "errors return", **data)
    xid = check_gpu_xid(p)        # the kernel log's GPU faults (NVRM Xid)
    data.update(xid.data)
    if xid.status == "fail":
        return replace(xid, id="gpu_health", data=data)
    if remap_failed:
        return failed("gpu_health", f"row remapping failed on GPU {gpus_s(remap_failed)} (no spare rows left)",
                      "drain the host and replace the GPU (RMA): a failed row remapping does not heal", **data)
    if prohibited:
        return failed("gpu_health", f"compute mode Prohibited on GPU {gpus_s(prohibited)}: no CUDA context allowed",
                      f"`sudo nvidia-smi -i {prohibited[0]} -c DEFAULT`", **data)
    if remap_pending:
        return warned("gpu_health", f"row remapping pending on GPU {gpus_s(remap_pending)}",
                      f"reset the GPU (`nvidia-smi -r -i {remap_pending[0]}`, no process on it) or reboot the host "
                      "so the pending rows are remapped", **data)
    if xid.status == "warn":
        return replace(xid, id="gpu_health", data=data)
    if pending:
        return warned("gpu_health", f"retired pages pending on GPU {', '.join(map(str, pending))}",
                      "reboot the host (or reset the GPU) so the pending pages are retired", **data)
    if mig:
        return warned("gpu_health", f"MIG mode enabled on GPU {gpus_s(mig)}: CUDA sees MIG instances, not the GPU",
                      f"`sudo nvidia-smi -i {mig[0]} -mig 0` (then reset the GPU), or run on other hosts", **data)
    if exclusive:
        return warned("gpu_health", f"compute mode Exclusive_Process on GPU {gpus_s(exclusive)}: one CUDA "
                      "process per GPU", f"`sudo nvidia-smi -i {exclusive[0]} -c DEFAULT` if more than one process "
                      "(a rank plus a profiler or a checkpoint helper) touches a GPU", **data)
    no_ecc = all(g["ecc_uncorrected"] is None for g in gpus)
    notes = [n for n, on in (("ECC not reported", no_ecc), (f"persistence mode off on GPU {gpus_s(no_persistence)}",
                                                             bool(no_persistence)),
                             ("remapped rows not reported", "remapped_rows" in data["unknown"]),
                             (xid.detail, xid.status == "skip" and p.sections.get("xid") is not None)) if on]
    return passed("gpu_health", "no uncorrectable ECC errors, no row remapping pending"
                  + (f" ({'; '.join(notes)})" if notes else ""), **data)


# ------------------------------------------------------------------------------------------------ cuInit (issue 35)
# The driver itself, not NVML: with Fabric Manager down on an NVSwitch system nvidia-smi lists every GPU while
# cuInit returns 802, CUDA_ERROR_SYSTEM_NOT_READY, "system not yet initialized" (CUDA Driver API, "Error
# Handling": https://docs.nvidia.com/cuda/cuda-driver-api/group__CUDA__TYPES.html). A short python3 program in a
# child process of the probe shell (never in a zygote: a process that initialised CUDA must not fork ranks),
# bounded by the probe timeout. Fixed text: no user value enters it.
CUDA_PROGRAM = (
    "import ctypes,sys\n"
    "try:\n"
    "    c=ctypes.CDLL('libcuda.so.1')\n"
    "except OSError as e:\n"
    "    print('libcuda: %s' % e); sys.exit(3)\n"
    "r=c.cuInit(0); n=ctypes.c_int(0); v=ctypes.c_int(0)\n"
    "if r==0: c.cuDeviceGetCount(ctypes.byref(n))\n"
    "c.cuDriverGetVersion(ctypes.byref(v))\n"
    "s=ctypes.c_char_p(); m=ctypes.c_char_p()\n"
    "c.cuGetErrorName(r,ctypes.byref(s)); c.cuGetErrorString(r,ctypes.byref(m))\n"
    "print('cuInit %d %s devices %d driver %d' % (r,(s.value or b'?').decode(),n.value,v.value))\n"
    "print((m.value or b'').decode())\n")
CUDA_ARGV = ("python3", "-c", CUDA_PROGRAM)
_CUINIT_RE = re.compile(r"^cuInit (-?\d+) (\S+) devices (\d+) driver (\d+)$")
SYSTEM_NOT_READY = 802
FABRIC_MANAGER_START = "sudo systemctl enable --now nvidia-fabricmanager"


def parse_cuda_init(output: str, rc: int = 0) -> dict[str, Any]:
    """The cuInit probe (``CUDA_PROGRAM``) -> {"code": cuInit's CUresult | None, "name", "message", "devices",
    "driver": cuDriverGetVersion (12040 = 12.4), "error": why there is no code (libcuda missing, no python3, ...)}."""
    lines = [ln.strip() for ln in output.splitlines() if ln.strip()]
    for i, line in enumerate(lines):
        m = _CUINIT_RE.match(line)
        if m:
            return {"code": int(m.group(1)), "name": m.group(2), "message": lines[i + 1] if i + 1 < len(lines) else "",
                    "devices": int(m.group(3)), "driver": int(m.group(4)), "error": None}
    error = "timed out" if rc == 124 else ("python3 not found" if rc == 127 else (first_line(output) or f"exit {rc}"))
    return {"code": None, "name": None, "message": None, "devices": 0, "driver": None, "error": error}


def check_cuda(p: HostProbe) -> CheckResult:
    if p.host.gpus == 0:
        return skipped("cuda", "CPU host (clusterctl_gpus: 0)")
    sec = p.sections.get("cuda_init")
    if sec is None:
        return skipped("cuda", "cuInit not probed")
    init = parse_cuda_init(sec.output, sec.rc)
    fabric = _section(p, "smi_fabric", parse_gpu_fabric) or {"gpus": [], "error": "not run"}
    unready = [g for g in fabric["gpus"] if g["state"] is not None and
               (g["state"].lower() != "completed" or (g["status"] or "success").lower() != "success")]
    data = {"cuinit": init["code"], "name": init["name"], "devices": init["devices"], "driver": init["driver"],
            "fabric": {str(g["index"]): g["state"] for g in fabric["gpus"] if g["state"] is not None}}
    fm = (f"{FABRIC_MANAGER_START} (NVSwitch systems need Fabric Manager running, its version equal to the "
          "driver's; `systemctl status nvidia-fabricmanager` and its log say why it stopped)")
    if init["code"] is None:
        if sec.rc == 127:
            return skipped("cuda", "python3 not on the host: cuInit not probed", **data)
        if sec.rc == 124:
            return failed("cuda", f"cuInit did not return within {p.options.probe_timeout_s:g} s",
                          "a GPU or the driver is wedged: check the kernel log for Xid errors, reset or reboot", **data)
        return failed("cuda", f"CUDA driver library not usable: {init['error']}",
                      "install the NVIDIA driver's CUDA library (libcuda.so.1, e.g. libnvidia-compute) matching the "
                      "kernel module", **data)
    if init["code"] != 0:
        what = f"cuInit returned {init['code']} {init['name']} \"{init['message']}\""
        if init["code"] == SYSTEM_NOT_READY or unready:
            states = ", ".join(f"GPU {g['index']}: {g['state']}" for g in unready)
            return failed("cuda", what + (f"; fabric {states}" if states else "") + " (nvidia-smi looks fine)",
                          fm, **data)
        return failed("cuda", what, "run a CUDA sample on the host and fix what it reports (driver install, "
                      "`dmesg` for NVRM errors)", **data)
    if unready:
        states = ", ".join(f"GPU {g['index']}: {g['state']}/{g['status']}" for g in unready)
        return warned("cuda", f"fabric registration not complete ({states})", fm, **data)
    fabric_s = f", fabric Completed on {len(data['fabric'])} GPUs" if data["fabric"] else ""
    return passed("cuda", f"cuInit ok, {init['devices']} devices, CUDA driver {init['driver'] // 1000}."
                  f"{init['driver'] % 1000 // 10}{fabric_s}", **data)


# ------------------------------------------------------------------------------------------------ Xid (issue 35)
# The NVIDIA driver logs GPU faults to the kernel log as ``NVRM: Xid (PCI:<domain:bus:device>): <xid>, pid=...,
# name=..., <text>`` (NVIDIA "Xid Errors", https://docs.nvidia.com/deploy/xid-errors/index.html). The line format
# and the set of Xids that mean the GPU (not the program) failed are the model's (``model.causes``: the supervisor
# reads a failed node's kernel log with them); the catalog's meaning of each:
XID_MEANING: dict[int, str] = {
    48: "double bit ECC error (DBE)",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
    119: "GSP RPC timeout",
    120: "GSP error",
}
assert set(XID_MEANING) == causes.GPU_XIDS
# 94: the error was contained: only the application that touched the memory is affected; the GPU keeps working.
XID_CONTAINED = frozenset({94})
_XID_DETAIL_RE = re.compile(r"NVRM: Xid \([^)]*\): \d+,\s*(.*)$")
# the kernel log, bounded: dmesg (root, or kernel.dmesg_restrict=0), else journalctl -k for this boot (the
# systemd-journal group); only the Xid lines, the last 50. Exit 3: neither could be read.
XID_SCRIPT = ("if out=$(dmesg 2>&1); then :; elif out=$(journalctl -k -b -q --no-pager 2>&1); then :; "
              "else printf '%s\\n' \"$out\" | head -n 1; exit 3; fi; "
              "printf '%s\\n' \"$out\" | grep -F 'NVRM: Xid' | tail -n 50; exit 0")


def parse_xid(text: str) -> list[dict[str, Any]]:
    """Every ``NVRM: Xid`` line in ``text`` (dmesg, ``journalctl -k``, a rank's log: the prefix does not matter;
    lines as ``model.causes.parse_xid`` reads them) -> [{"xid", "pci", "detail", "meaning" (the catalog's, None
    for an Xid outside XID_MEANING), "fatal" (a GPU fault: in XID_MEANING and not contained), "seconds" (dmesg's
    timestamp, else None), "line"}], in order. Pure."""
    out = []
    for x in causes.parse_xid(text):
        m = _XID_DETAIL_RE.search(x.line)
        out.append({"xid": x.code, "pci": x.pci.removeprefix("PCI:"), "detail": m.group(1).strip()[:300] if m else "",
                    "meaning": XID_MEANING.get(x.code), "fatal": x.code in XID_MEANING and x.code not in XID_CONTAINED,
                    "seconds": x.uptime_s, "line": x.line})
    return out


def check_gpu_xid(p: HostProbe) -> CheckResult:
    if p.host.gpus == 0:
        return skipped("gpu_xid", "CPU host (clusterctl_gpus: 0)")
    sec = p.sections.get("xid")
    if sec is None:
        return skipped("gpu_xid", "kernel log not read")
    if sec.rc != 0:
        why = tool_error("kernel log", sec, p.options.probe_timeout_s) or "not readable"
        return skipped("gpu_xid", f"{why} (dmesg and journalctl -k; GPU faults not checked)")
    xids = parse_xid(sec.output)
    bad = [x for x in xids if x["meaning"]]
    data = {"xids": [{k: x[k] for k in ("xid", "pci", "meaning", "fatal", "line")} for x in bad],
            "other": sorted({x["xid"] for x in xids if not x["meaning"]})}
    fatal = [x for x in bad if x["fatal"]]
    if fatal:
        last = fatal[-1]
        where = sorted({x["pci"] for x in fatal})
        return failed("gpu_xid", f"GPU fault in the kernel log: Xid {last['xid']} ({last['meaning']}) on PCI "
                      f"{last['pci']}" + (f"; {len(fatal)} such lines, GPUs {', '.join(where)}" if len(fatal) > 1 else ""),
                      "drain the host: reset the GPU (`nvidia-smi -r`) or reboot, and replace it if the Xid returns "
                      "(the kernel log keeps the line until reboot; NVIDIA's Xid catalog says what each needs)",
                      **data)
    if bad:
        return warned("gpu_xid", f"contained ECC error in the kernel log: Xid {bad[-1]['xid']} on PCI "
                      f"{bad[-1]['pci']} (the process that touched the memory was stopped; the GPU keeps working)",
                      "watch for a repeat; drain the host if it comes back", **data)
    return passed("gpu_xid", "no GPU fault Xid in the kernel log" + (
        f" (other Xids: {', '.join(map(str, data['other']))})" if data["other"] else ""), **data)


NVIDIA_SMI = Probe("nvidia_smi", lambda host, job, o: section(
    "nvidia_smi", tool_cmd(o.probe_timeout_s, NVIDIA_SMI_ARGV)), applies=has_gpus)
# The GPU checks are part of launch's quick preflight (issue 35 item 5): a host whose driver cannot start CUDA, or
# whose GPU faulted (ECC, Xid, failed row remapping), is refused before a job lands on it.
DRIVER = Check("gpu_driver", "host", check_gpu_driver, ("nvidia_smi", "cuda_init", "smi_fabric"), label="driver",
               launch=True)
COUNT = Check("gpu_count", "host", check_gpu_count, ("nvidia_smi",), label="gpus", launch=True)
def _with_nvidia_smi(name: str, argv: tuple[str, ...]) -> Probe:
    """A section that runs only where nvidia-smi exists (elsewhere gpu_driver skips or fails before reading it:
    a host without the driver is not made to start python3 or read its kernel log), exit 127 otherwise."""
    return Probe(name, lambda host, job, o: section(
        name, f"if command -v nvidia-smi >/dev/null 2>&1; then {tool_cmd(o.probe_timeout_s, argv)}; "
              "else echo 'nvidia-smi not found'; (exit 127); fi"), applies=has_gpus)


SMI_MODES = _with_nvidia_smi("smi_modes", MODES_ARGV)
SMI_REMAP = _with_nvidia_smi("smi_remap", REMAP_ARGV)
SMI_FABRIC = _with_nvidia_smi("smi_fabric", FABRIC_ARGV)
CUDA_INIT = _with_nvidia_smi("cuda_init", CUDA_ARGV)
XID = _with_nvidia_smi("xid", ("sh", "-c", XID_SCRIPT))
# cuInit and the fabric belong to gpu_driver, the kernel log's Xids and the row remapper to gpu_health: the table
# keeps one column each and fits 80 columns.
HEALTH = Check("gpu_health", "host", check_gpu_health, ("nvidia_smi", "smi_modes", "smi_remap", "xid"),
               label="health", launch=True)
