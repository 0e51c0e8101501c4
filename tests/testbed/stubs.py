"""Per-host hardware profiles and the stub GPU tools generated from them.

A profile is a plain dict. ``profile(**overrides)`` fills in every key:

==================  =========================  ================================================
key                 default                    meaning
==================  =========================  ================================================
gpus                8                          GPU count; 0 = CPU host: no nvidia-smi at all
model               "NVIDIA H100 80GB HBM3"    ``name`` column / ``nvidia-smi -L``
memory_mib          81559                      ``memory.total`` in MiB
driver              "550.54.15"                driver_version (also NVRM version)
cuda                "12.4"                     CUDA version in the ``nvidia-smi`` banner
ecc_uncorrectable   [0] * gpus                 ``ecc.errors.uncorrected.volatile.total`` per GPU
retired_pending     None                       ``retired_pages.pending`` per GPU (Yes/No): a pre-Ampere GPU;
                                               None: [N/A], as A100/H100/H200 print it (row remapping)
remapped_pending    [False] * gpus             ``--query-remapped-rows`` remapped_rows.pending per GPU (1/0)
remapped_failure    [False] * gpus             remapped_rows.failure per GPU (1/0)
mismatch            False                      every nvidia-smi call fails with NVML mismatch, exit 18
toolkit             True (False if gpus == 0)  nvidia-ctk + nvidia-container-cli present
toolkit_version     "1.14.6"                   ``nvidia-ctk --version``
cdi                 True (False if gpus == 0)  ``nvidia-ctk cdi list`` lists the GPUs
image               True                       ``localhost/pytorch-cuda:v2.7-ssh`` in the host's store
hook                toolkit                    ``nvidia-container-runtime-hook`` in the stub bin (a docker
                                               testbed's dockerd has the stub bin on its PATH, so ``--gpus``
                                               works: see ``_HOOK``)
docker              False                      a ``docker`` shim (``exec podman "$@"``) in the stub bin
                                               (without it, ``docker`` is whatever /usr/local/bin or /usr/bin
                                               hold: on the dev image a real docker CLI with no daemon)
==================  =========================  ================================================

Formats the stubs print (the vendors' documented formats: nvidia-smi(1), https://docs.nvidia.com/deploy/nvidia-smi/;
the NVIDIA Container Toolkit docs; NVIDIA's Xid catalog, https://docs.nvidia.com/deploy/xid-errors/; the CUDA
Driver API's CUresult values; parsers are written against these):

``nvidia-smi --query-gpu=index,name,driver_version,memory.total,ecc.errors.uncorrected.volatile.total,retired_pages.pending,uuid --format=csv,noheader``::

    0, NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB, 0, [N/A], GPU-3b0a5b0e-7d1c-4f4e-8a55-000000000000

  with ``nounits``: ``81559`` instead of ``81559 MiB``. Without ``noheader`` a header line comes first:
  ``index, name, driver_version, memory.total [MiB], ecc.errors.uncorrected.volatile.total,
  retired_pages.pending, uuid`` (units in brackets dropped with ``nounits``). Other fields: memory.used,
  memory.free, pci.bus_id, temperature.gpu, utilization.gpu [%], count, compute_cap,
  ecc.errors.uncorrected.aggregate.total. An unknown field prints
  ``Field "x" is not a valid field to query.`` and exits 2. ``-i N`` selects one GPU.

``nvidia-smi -L``::

    GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-3b0a5b0e-7d1c-4f4e-8a55-000000000000)

``nvidia-smi`` (no args): the usual banner table containing
``| NVIDIA-SMI 550.54.15   Driver Version: 550.54.15   CUDA Version: 12.4 |``.

``nvidia-smi --version``::

    NVIDIA-SMI version  : 550.54.15
    NVML version        : 550.54
    DRIVER version      : 550.54.15
    CUDA Version        : 12.4

With ``mismatch`` any call prints ``Failed to initialize NVML: Driver/library version mismatch`` (stdout)
and exits 18.

``nvidia-ctk --version``::

    NVIDIA Container Toolkit CLI version 1.14.6
    commit: 5605d191332dcfeea802c4497360d60a65c7887e

``nvidia-ctk cdi list``: ``INFO[0000] Found 9 CDI devices`` on **stderr** (logrus), then on stdout one
device per line: ``nvidia.com/gpu=0`` ... ``nvidia.com/gpu=7``, ``nvidia.com/gpu=all``. Without ``cdi``:
``INFO[0000] Found 0 CDI devices`` and nothing on stdout.

``nvidia-container-cli --version``: ``cli-version: 1.14.6`` / ``lib-version: 1.14.6``;
``nvidia-container-cli info``: ``NVRM version:   550.54.15``, ``CUDA version:   12.4``, then per GPU
``Device Index:   0`` / ``Model:          NVIDIA H100 80GB HBM3`` / ``GPU UUID:       GPU-...`` / ...
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_MODEL = "NVIDIA H100 80GB HBM3"
HOOK = "nvidia-container-runtime-hook"


def profile(**overrides) -> dict:
    """A complete profile: defaults, then ``overrides``; per-GPU lists sized to ``gpus``."""
    unknown = set(overrides) - set(_DEFAULTS) - {"ecc_uncorrectable", "retired_pending", "toolkit", "cdi", "hook",
                                                  "remapped_pending", "remapped_failure"}
    if unknown:
        raise ValueError(f"unknown profile keys: {sorted(unknown)}")
    p = dict(_DEFAULTS)
    p.update({k: v for k, v in overrides.items() if v is not None})
    n = int(p["gpus"])
    p.setdefault("toolkit", n > 0)
    p.setdefault("cdi", n > 0)
    p.setdefault("hook", bool(p["toolkit"]))
    p["ecc_uncorrectable"] = list(p.get("ecc_uncorrectable") or [0] * n)
    # page retirement (pre-Ampere) reports Yes/No; A100/H100/H200 remap rows instead and print [N/A] here
    p["retired_pending"] = [bool(x) for x in p["retired_pending"]] if p.get("retired_pending") else None
    p["remapped_pending"] = [bool(x) for x in (p.get("remapped_pending") or [False] * n)]
    p["remapped_failure"] = [bool(x) for x in (p.get("remapped_failure") or [False] * n)]
    if any(len(p[k] or [0] * n) != n for k in ("ecc_uncorrectable", "retired_pending", "remapped_pending",
                                                "remapped_failure")):
        raise ValueError("ecc_uncorrectable / retired_pending / remapped_* need one entry per GPU")
    return p


_DEFAULTS = {
    "gpus": 8,
    "model": DEFAULT_MODEL,
    "memory_mib": 81559,
    "driver": "550.54.15",
    "cuda": "12.4",
    "mismatch": False,
    "toolkit_version": "1.14.6",
    "image": True,
    "sshd_max_startups": "200:30:300",   # sshd MaxStartups (a low one makes a bastion that drops handshakes)
    "docker": False,
    "mig": "Disabled",             # mig.mode.current (H100: Disabled/Enabled; no MIG: [N/A])
    "persistence": "Enabled",      # persistence_mode
    "compute_mode": "Default",     # compute_mode: Default | Exclusive_Process | Prohibited
    "fabric": "Completed",         # fabric.state (HGX: NVSwitch fabric via Fabric Manager; PCIe cards: [N/A])
    "cuinit": 0,                   # what the stub libcuda.so.1's cuInit returns (802: Fabric Manager down)
    "xid": (),                     # kernel log lines after "NVRM: " (the stub dmesg), e.g. an Xid 79 line
}


def gpu_uuid(host_index: int, gpu: int) -> str:
    return f"GPU-3b0a5b0e-7d1c-4f4e-8a55-{host_index:06d}{gpu:06d}"


def write_stubs(bin_dir: Path, prof: dict, host_index: int) -> None:
    """(Re)write the stub tools for one host into ``bin_dir``."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    for name in ("nvidia-smi", "nvidia-ctk", "nvidia-container-cli", "docker", HOOK, "dmesg"):
        (bin_dir / name).unlink(missing_ok=True)
    data = dict(prof, uuids=[gpu_uuid(host_index, i) for i in range(prof["gpus"])])
    (bin_dir / "profile.json").write_text(json.dumps(data, indent=1))
    header = f"#!{os.path.realpath(sys.executable)} -IS\nPROFILE = {str(bin_dir / 'profile.json')!r}\n"
    if prof["gpus"] > 0:
        _script(bin_dir / "nvidia-smi", header + _NVIDIA_SMI)
        _script(bin_dir / "dmesg", dmesg_script(prof))
    if prof["toolkit"]:
        _script(bin_dir / "nvidia-ctk", header + _NVIDIA_CTK)
        _script(bin_dir / "nvidia-container-cli", header + _NVIDIA_CONTAINER_CLI)
    if prof["hook"]:
        mounts = sorted({str(Path(sys.base_prefix).resolve()), str(bin_dir.resolve())} - {"/usr", "/"})
        _script(bin_dir / HOOK, header + f"PYTHON = {os.path.realpath(sys.executable)!r}\nMOUNTS = {mounts!r}\n"
                + _HOOK)
    if prof["docker"]:
        _script(bin_dir / "docker", '#!/bin/sh\nexec podman "$@"\n')
    lib = lib_dir(bin_dir)
    (lib / "libcuda.so.1").unlink(missing_ok=True)
    if prof["gpus"] > 0:
        lib.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(libcuda(int(prof["cuinit"]), prof["gpus"], _cuda_version(prof["cuda"])), lib / "libcuda.so.1")


def lib_dir(bin_dir: Path) -> Path:
    """Where a host's stub libcuda.so.1 lies (on its LD_LIBRARY_PATH, as the driver's lies in the loader's path)."""
    return bin_dir.parent / "lib"


def _cuda_version(cuda: str) -> int:
    major, _, minor = cuda.partition(".")
    return int(major) * 1000 + int(minor or 0) * 10


# A stub of the CUDA driver library: the five entry points the cuda probe calls (checks.gpu.CUDA_PROGRAM), with the
# CUresult values and strings of the CUDA Driver API reference (https://docs.nvidia.com/cuda/cuda-driver-api/
# group__CUDA__TYPES.html, enum cudaError_enum: 0 CUDA_SUCCESS "no error", 3 CUDA_ERROR_NOT_INITIALIZED
# "initialization error", 100 CUDA_ERROR_NO_DEVICE "no CUDA-capable device is detected", 802
# CUDA_ERROR_SYSTEM_NOT_READY "system not yet initialized"). No libc: built with ``-nostdlib``.
_LIBCUDA_C = r"""
typedef int CUresult;
static const char *name_of(CUresult e) {
    switch (e) { case 0: return "CUDA_SUCCESS"; case 3: return "CUDA_ERROR_NOT_INITIALIZED";
                 case 100: return "CUDA_ERROR_NO_DEVICE"; case 802: return "CUDA_ERROR_SYSTEM_NOT_READY"; }
    return 0;
}
static const char *string_of(CUresult e) {
    switch (e) { case 0: return "no error"; case 3: return "initialization error";
                 case 100: return "no CUDA-capable device is detected"; case 802: return "system not yet initialized"; }
    return 0;
}
static int initialized;
CUresult cuInit(unsigned int flags) { initialized = (INIT_RESULT == 0); return INIT_RESULT; }
CUresult cuDeviceGetCount(int *count) { if (!initialized) return 3; *count = DEVICES; return 0; }
CUresult cuDriverGetVersion(int *v) { *v = DRIVER_VERSION; return 0; }
CUresult cuGetErrorName(CUresult e, const char **s) { *s = name_of(e); return *s ? 0 : 1; }
CUresult cuGetErrorString(CUresult e, const char **s) { *s = string_of(e); return *s ? 0 : 1; }
"""


def libcuda(init_result: int, devices: int, driver_version: int) -> Path:
    """The stub libcuda.so.1 for these answers, compiled once (``cc``) into a cache shared by testbeds."""
    return _compiled("libcuda", f"libcuda-{init_result}-{devices}-{driver_version}.so.1", _LIBCUDA_C,
                     [f"-DINIT_RESULT={init_result}", f"-DDEVICES={devices}", f"-DDRIVER_VERSION={driver_version}"])


def _compiled(kind: str, name: str, source: str, defines: list[str]) -> Path:
    """``source`` built as a shared library (no libc) into ``$TMPDIR/clusterctl-stubs-<uid>/<name>``, once: an
    existing one is reused (parallel testbeds may build the same one: the rename is atomic). The cache is this
    user's alone (0700, owned by us, else refused): a library another user could plant there is loaded as code."""
    cache = Path(os.environ.get("TMPDIR", "/tmp")) / f"clusterctl-stubs-{os.getuid()}"
    cache.mkdir(mode=0o700, exist_ok=True)
    st = cache.lstat()
    if not cache.is_dir() or cache.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise RuntimeError(f"{cache}: not a private directory of this user: refusing to build or load {kind} there")
    out = cache / name
    if out.exists():
        return out
    cc = shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        raise RuntimeError(f"the stub {kind} needs a C compiler (`cc`): apt-get install gcc")
    src = cache / f"{name}-{os.getpid()}.c"
    src.write_text(source)
    tmp = out.with_name(out.name + f".{os.getpid()}")
    try:
        subprocess.run([cc, "-shared", "-fPIC", "-nostdlib", "-O1", *defines, "-o", str(tmp), str(src)],
                       check=True, capture_output=True, timeout=60)
        os.replace(tmp, out)
    finally:
        src.unlink(missing_ok=True)
        tmp.unlink(missing_ok=True)
    return out


# A stub of NVML (libnvidia-ml.so.1): the calls clusterctl.rankview.Nvml makes, with the nvmlReturn_t values and the
# nvmlUtilization_t layout of the NVML API reference (https://docs.nvidia.com/deploy/nvml-api/: 0 NVML_SUCCESS,
# 6 NVML_ERROR_NOT_FOUND; nvmlDeviceGetHandleByPciBusId_v2 takes "domain:bus:device.function" as nvidia-smi prints
# it; nvmlUtilization_t = {unsigned int gpu; unsigned int memory;}). One device, at BUS_ID, UTIL % busy.
_LIBNVML_C = r"""
typedef int nvmlReturn_t;
typedef struct { unsigned int gpu; unsigned int memory; } nvmlUtilization_t;
static int device = 42, initialized;
static int same(const char *a, const char *b) { while (*a && *a == *b) { a++; b++; } return *a == *b; }
nvmlReturn_t nvmlInit_v2(void) { initialized = 1; return 0; }
nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *bus, void **handle) {
    if (!initialized) return 1;
    if (!same(bus, BUS_ID)) return 6;
    *handle = &device; return 0;
}
nvmlReturn_t nvmlDeviceGetUtilizationRates(void *handle, nvmlUtilization_t *u) {
    if (handle != &device) return 2;
    u->gpu = UTIL; u->memory = UTIL / 2; return 0;
}
"""


def libnvml(bus_id: str, util: int) -> Path:
    """The stub libnvidia-ml.so.1 with one GPU at ``bus_id``, ``util`` % busy, compiled (``cc``) into a cache."""
    return _compiled("libnvml", f"libnvml-{bus_id.replace(':', '_')}-{util}.so.1", _LIBNVML_C,
                     [f'-DBUS_ID="{bus_id}"', f"-DUTIL={util}"])


def _script(path: Path, text: str) -> None:
    path.write_text(text)
    os.chmod(path, 0o755)


# The stubs run with the interpreter that built the testbed (-S: no site import, fast start).
_NVIDIA_SMI = r'''
import json, sys
P = json.load(open(PROFILE))
if P["mismatch"]:
    print("Failed to initialize NVML: Driver/library version mismatch")
    sys.exit(18)
args = sys.argv[1:]
n = P["gpus"]
sel = list(range(n))
if "-i" in args:
    sel = [int(x) for x in args[args.index("-i") + 1].split(",")]
    if any(i >= n for i in sel):
        print("No devices were found"); sys.exit(6)
def fields(i):
    f = {
        "index": (str(i), None), "count": (str(n), None), "name": (P["model"], None),
        "driver_version": (P["driver"], None), "uuid": (P["uuids"][i], None),
        "memory.total": (str(P["memory_mib"]), "MiB"), "memory.used": ("0", "MiB"),
        "memory.free": (str(P["memory_mib"] - 0), "MiB"),
        "pci.bus_id": ("00000000:%02X:00.0" % (0x18 + 0x10 * i), None),
        "temperature.gpu": ("34", None), "utilization.gpu": ("0", "%"), "compute_cap": ("9.0", None),
        "ecc.errors.uncorrected.volatile.total": (str(P["ecc_uncorrectable"][i]), None),
        "ecc.errors.uncorrected.aggregate.total": (str(P["ecc_uncorrectable"][i]), None),
        "retired_pages.pending": ("[N/A]" if P["retired_pending"] is None else
                                  "Yes" if P["retired_pending"][i] else "No", None),
        "mig.mode.current": (P["mig"], None), "persistence_mode": (P["persistence"], None),
        "compute_mode": (P["compute_mode"], None),
    }
    if int(P["driver"].split(".")[0]) >= 530:      # not known to the R470 nvidia-smi the old-driver hosts play
        f.update({"fabric.state": (P["fabric"], None),
                  "fabric.status": ("Success" if P["fabric"] == "Completed" else "[N/A]", None)})
    return f
remap = [a for a in args if a.startswith("--query-remapped-rows=")]
if remap:
    names = remap[0].split("=", 1)[1].split(",")
    def rfields(i):
        return {"gpu_uuid": P["uuids"][i], "gpu_bus_id": "00000000:%02X:00.0" % (0x18 + 0x10 * i),
                "remapped_rows.correctable": "0", "remapped_rows.uncorrectable": str(int(P["remapped_failure"][i])),
                "remapped_rows.pending": "1" if P["remapped_pending"][i] else "0",
                "remapped_rows.failure": "1" if P["remapped_failure"][i] else "0"}
    for f in names:
        if f not in rfields(0):
            print('Field "%s" is not a valid field to query.' % f); sys.exit(2)
    if "noheader" not in next((a for a in args if a.startswith("--format=")), "--format=csv"):
        print(", ".join(names))
    for i in sel:
        print(", ".join(rfields(i)[f] for f in names))
    sys.exit(0)
query = [a for a in args if a.startswith("--query-gpu=")]
if query:
    names = query[0].split("=", 1)[1].split(",")
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), "csv").split(",")
    known = fields(0) if n else {}
    for f in names:
        if f not in known:
            print('Field "%s" is not a valid field to query.' % f); sys.exit(2)
    nounits = "nounits" in fmt
    if "noheader" not in fmt:
        print(", ".join(f + ("" if nounits or not known[f][1] else " [%s]" % known[f][1]) for f in names))
    for i in sel:
        fs = fields(i)
        print(", ".join(fs[f][0] + ("" if nounits or not fs[f][1] else " " + fs[f][1]) for f in names))
    sys.exit(0)
if args[:1] == ["-L"]:
    for i in sel:
        print("GPU %d: %s (UUID: %s)" % (i, P["model"], P["uuids"][i]))
    sys.exit(0)
if args[:1] == ["--version"]:
    print("NVIDIA-SMI version  : %s" % P["driver"])
    print("NVML version        : %s" % ".".join(P["driver"].split(".")[:2]))
    print("DRIVER version      : %s" % P["driver"])
    print("CUDA Version        : %s" % P["cuda"])
    sys.exit(0)
if args:
    print("Invalid combination of input arguments. Please run 'nvidia-smi -h' for help."); sys.exit(2)
line = "+" + "-" * 89 + "+"
print("Mon Jan  1 00:00:00 2024")
print(line)
print("| NVIDIA-SMI %-22s Driver Version: %-14s CUDA Version: %-9s|" % (P["driver"], P["driver"], P["cuda"]))
print("|" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+")
print("| GPU  Name                 Persistence-M | Bus-Id          Disp.A | Volatile Uncorr. ECC |")
print("| Fan  Temp   Perf          Pwr:Usage/Cap |           Memory-Usage | GPU-Util  Compute M. |")
print("|" + "=" * 41 + "+" + "=" * 24 + "+" + "=" * 22 + "|")
for i in sel:
    fs = fields(i)
    print("| %3d  %-28s    On | %s Off | %20s |" % (i, P["model"][:28], fs["pci.bus_id"][0], fs["ecc.errors.uncorrected.volatile.total"][0]))
    print("| N/A   34C    P0     70W / 700W |      0MiB / %5dMiB |      0%%      Default |" % P["memory_mib"])
    print("+" + "-" * 41 + "+" + "-" * 24 + "+" + "-" * 22 + "+")
'''

_NVIDIA_CTK = r'''
import json, sys
P = json.load(open(PROFILE))
args = sys.argv[1:]
if args[:1] in (["--version"], ["-v"]):
    print("NVIDIA Container Toolkit CLI version %s" % P["toolkit_version"])
    print("commit: 5605d191332dcfeea802c4497360d60a65c7887e")
    sys.exit(0)
if args[:2] == ["cdi", "list"]:
    devs = (["nvidia.com/gpu=%d" % i for i in range(P["gpus"])] + ["nvidia.com/gpu=all"]) if P["cdi"] and P["gpus"] else []
    sys.stderr.write("INFO[0000] Found %d CDI devices\n" % len(devs))
    for d in devs:
        print(d)
    sys.exit(0)
sys.stderr.write("Incorrect Usage. flag provided but not defined\n")
sys.exit(1)
'''

_NVIDIA_CONTAINER_CLI = r'''
import json, sys
P = json.load(open(PROFILE))
args = sys.argv[1:]
if args[:1] == ["--version"]:
    print("cli-version: %s\nlib-version: %s\nbuild date: 2024-02-07T18:41+00:00" % (P["toolkit_version"], P["toolkit_version"]))
    sys.exit(0)
if "info" in args:
    if P["mismatch"]:
        sys.stderr.write("nvidia-container-cli: initialization error: nvml error: driver/library version mismatch\n")
        sys.exit(1)
    print("NVRM version:   %s\nCUDA version:   %s\n" % (P["driver"], P["cuda"]))
    for i in range(P["gpus"]):
        print("Device Index:   %d\nDevice Minor:   %d\nModel:          %s\nBrand:          Nvidia\n"
              "GPU UUID:       %s\nBus Location:   00000000:%02x:00.0\nArchitecture:   9.0\n"
              % (i, i, P["model"], P["uuids"][i], 0x18 + 0x10 * i))
    sys.exit(0)
sys.stderr.write("Usage: nvidia-container-cli [OPTION...] COMMAND\n")
sys.exit(1)
'''

# nvidia-container-runtime-hook, as dockerd calls it (moby daemon/nvidia_linux.go: a prestart hook, argv
# ``nvidia-container-runtime-hook prestart``, added when the container asks for the ``gpu`` capability, e.g.
# ``--gpus=all``, which sets NVIDIA_VISIBLE_DEVICES). The OCI runtime passes the container's state on stdin
# (runtime-spec config.md "Hooks": ociVersion, id, status, pid, bundle); like the real hook (libnvidia-container's
# ``nvidia-container-cli configure``) it enters the container's mount namespace before pivot_root and mounts the
# driver's files into the rootfs: here the stub nvidia-smi at /usr/bin/nvidia-smi, with what the stub needs to run
# (the host's libraries, its Python, its profile). NVIDIA_VISIBLE_DEVICES=void/none or unset: nothing (as the real
# hook does). A failure prints the real hook's error shape and exits 1 (the container does not start).
_HOOK = r"""
import json, os, subprocess, sys
if sys.argv[1:2] != ["prestart"]:
    sys.exit(0)
state = json.load(sys.stdin)
bundle = state["bundle"]
cfg = json.load(open(os.path.join(bundle, "config.json")))
env = dict(e.split("=", 1) for e in cfg.get("process", {}).get("env", []) if "=" in e)
if env.get("NVIDIA_VISIBLE_DEVICES", "void") in ("", "void", "none"):
    sys.exit(0)
root = cfg["root"]["path"]
root = root if os.path.isabs(root) else os.path.join(bundle, root)
binds = [(d, d) for d in ("/usr/lib", "/usr/lib64", "/usr/lib32") if os.path.isdir(d)]
binds += [(m, m) for m in MOUNTS] + [(PYTHON, PYTHON), (os.path.join(os.path.dirname(PROFILE), "nvidia-smi"),
                                                       "/usr/bin/nvidia-smi")]
script = ['set -e']
for src, dst in binds:
    t = root + dst
    if os.path.isdir(src):
        script.append('mkdir -p "%s"' % t)
    else:
        script.append('mkdir -p "%s" && { [ -e "%s" ] || : > "%s"; }' % (os.path.dirname(t), t, t))
    script.append('mount --bind "%s" "%s"' % (src, t))
r = subprocess.run(["nsenter", "--mount=/proc/%d/ns/mnt" % state["pid"], "--", "sh", "-c", "\n".join(script)],
                   capture_output=True, text=True, timeout=20)
if r.returncode != 0:
    sys.stderr.write("nvidia-container-cli: mount error: %s\n" % (r.stderr.strip() or r.returncode))
    sys.exit(1)
"""

# dmesg on a GPU host: the driver's load line, then the profile's NVRM lines, in dmesg's default format
# ("[seconds.micros] text"; util-linux dmesg(1)). Xid lines follow NVIDIA's Xid catalog format
# (https://docs.nvidia.com/deploy/xid-errors/index.html): "NVRM: Xid (PCI:0000:3b:00): 79, pid=..., name=..., text".
# A shell script with the lines baked in (no interpreter to start: the probe runs it on every host).
def dmesg_script(prof: dict) -> str:
    lines = ["[    5.412331] nvidia: loading out-of-tree module taints kernel.",
             f"[    5.498120] NVRM: loading NVIDIA UNIX x86_64 Kernel Module  {prof['driver']}  (buildmeister@builder)"]
    lines += [f"[{3284 + i:5d}.436120] NVRM: {line}" for i, line in enumerate(prof["xid"])]
    return "#!/bin/sh\n" + "".join(f"printf '%s\\n' {shlex.quote(ln)}\n" for ln in lines)
