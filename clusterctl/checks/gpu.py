"""GPU checks: nvidia-smi CSV parser (pure), the image -> minimum driver table, gpu_driver/gpu_count/gpu_health."""
from __future__ import annotations

import re
import shlex
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
    return passed("gpu_driver", f"driver {version} (CUDA {cuda_s} needs >= {minimum})", **data)


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


def check_gpu_health(p: HostProbe) -> CheckResult:
    gpus, skip = _gpu_list(p, "gpu_health")
    if skip:
        return skip
    ecc = {g["index"]: g["ecc_uncorrected"] for g in gpus if g["ecc_uncorrected"]}
    pending = [g["index"] for g in gpus if g["retired_pending"]]
    data = {"ecc_uncorrected": {str(k): v for k, v in ecc.items()}, "retired_pending": pending}
    if ecc:
        which = ", ".join(f"GPU {i}: {n}" for i, n in ecc.items())
        first = next(iter(ecc))
        return failed("gpu_health", f"uncorrectable ECC errors ({which})",
                      f"drain the host; reset the GPU (`nvidia-smi -r -i {shlex.quote(str(first))}`) or reboot, and replace it if "
                      "errors return", **data)
    if pending:
        return warned("gpu_health", f"retired pages pending on GPU {', '.join(map(str, pending))}",
                      "reboot the host (or reset the GPU) so the pending pages are retired", **data)
    no_ecc = all(g["ecc_uncorrected"] is None for g in gpus)
    return passed("gpu_health", "no uncorrectable ECC errors" + (" (ECC not reported)" if no_ecc else ""), **data)


NVIDIA_SMI = Probe("nvidia_smi", lambda host, job, o: section(
    "nvidia_smi", tool_cmd(o.probe_timeout_s, NVIDIA_SMI_ARGV)), applies=has_gpus)
DRIVER = Check("gpu_driver", "host", check_gpu_driver, ("nvidia_smi",), label="driver")
COUNT = Check("gpu_count", "host", check_gpu_count, ("nvidia_smi",), label="gpus")
HEALTH = Check("gpu_health", "host", check_gpu_health, ("nvidia_smi",), label="health")
