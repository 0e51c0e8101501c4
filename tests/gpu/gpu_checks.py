#!/usr/bin/env python3
"""The device run (issue 35): what clusterctl does on one real GPU machine, bare (no docker), in <= 8 minutes.

    tests/gpu/run_gpu_checks.sh [--out DIR] [--wheels DIR] [--stages a,b,...] [--steps N] [--budget-s S] [--keep]

Not collected by pytest; its CPU-checkable parts (argument parsing, the inventory and the job it writes, the
fixture documents, the rank probe program run cold on CPU) are unit tests (tests/unit/checks/test_device_run.py).

Stages (each prints PASS/FAIL lines; the summary and every figure go to OUT/results.json):

``deps``       with ``--wheels DIR``: clusterctl's dependencies installed offline from DIR (cp312 wheels fetched
               by tests/gpu/fetch_wheels.sh) with ``pip --target`` into a folder first on PYTHONPATH (the machine's
               own python3 and torch); clusterctl itself runs from this tree (PYTHONPATH).
``fixtures``   every nvidia-smi query, the cuInit program and the kernel-log probe preflight runs, through their
               parsers; the outputs become golden fixtures under OUT/fixtures/<parser>/<case>_real.json.
``preflight``  ``clusterctl preflight`` against the real driver (local connection, bare): gpu_driver (with cuInit),
               gpu_count, gpu_health pass, nvidia-smi's driver version in the detail.
``zygote``     clusterctl's zygote (launch/zygote.py) on this CUDA build: after its preload no NVML is mapped and
               no /dev/nvidia* is open (the driver is not initialised; ``import torch`` itself maps libcuda, which
               module did is recorded); a rank forked from it initialises CUDA and NCCL and is not in torch's
               "bad fork" state.
``startup``    warm (forked from the zygote) vs cold (a fresh interpreter) rank start-up per phase: torch import,
               CUDA context, first matmul, NCCL init (world size 1).
``release``    a forked rank holding GPU memory is SIGKILLed: seconds until nvidia-smi shows the memory released,
               and the zygote's ping latency meanwhile (it must keep answering).
``nvml``       the rank view's GPU utilisation (clusterctl.rankview.Nvml: NVML through ctypes, the device by its PCI
               bus id) against nvidia-smi's ``utilization.gpu`` while matmuls keep the GPU busy, and idle.
``job``        a clusterctl job with NCCL (the quickstart, every GPU, recovery: warm, flight recorder on): its last
               rank SIGKILLs itself (--kill-rank-at), the supervisor relaunches warm, the job resumes from its
               checkpoint and finishes; the ranks' views (issue 37) show collectives read from NCCL's flight
               recorder and their GPU memory, and ``top --once`` the rank training with its GPU memory and
               utilisation; on-demand flight-recorder dumps are taken from the warm rank through torch's
               debug-info pipe (TORCH_NCCL_DEBUG_INFO_PIPE_FILE) and through the rank view's ``dump`` trigger,
               and torch's analyzer reads both. (No NCCL hang here: NCCL refuses
               two ranks of one communicator on one GPU, and the device machine has one.)

Exit 0 only when every stage run passed. Record the figures in docs/benchmarks.md ``## gpu``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))           # clusterctl from this tree (its dependencies: the deps stage)
from clusterctl.launch.zygote import PRELOAD  # noqa: E402 - stdlib only at import

QUICKSTART = ROOT / "examples" / "quickstart"
ZYGOTE = ROOT / "clusterctl" / "launch" / "zygote.py"
STAGES = ("deps", "fixtures", "preflight", "zygote", "startup", "release", "nvml", "job")
BUDGET_S = 480.0
RDZV_PORT = 29512


# ------------------------------------------------------------------------------------------------ pure parts
def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(prog="run_gpu_checks.sh", description="clusterctl's device run (issue 35)")
    ap.add_argument("--out", default=os.environ.get("OUT") or None,
                    help="where results.json, the logs and the captured fixtures go (default: $OUT, else a temp dir)")
    ap.add_argument("--wheels", default=None, help="install clusterctl's dependencies offline from this wheel dir")
    ap.add_argument("--stages", default=",".join(STAGES), help=f"comma list of {', '.join(STAGES)} (default: all)")
    ap.add_argument("--steps", type=int, default=60, help="training steps of the job stage (default 60)")
    ap.add_argument("--budget-s", type=float, default=BUDGET_S, help="wall-clock budget of the whole run (default 480)")
    ap.add_argument("--keep", action="store_true", help="keep the work dir (inventory, job, state)")
    args = ap.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    unknown = [s for s in stages if s not in STAGES]
    if unknown or not stages:
        ap.error(f"unknown stage(s) {', '.join(unknown) or '(none given)'}; known: {', '.join(STAGES)}")
    if args.steps < 20:
        ap.error("--steps must be at least 20 (the kill comes at step 10, after the first checkpoint)")
    if not 60 <= args.budget_s <= 3600:
        ap.error("--budget-s must be between 60 and 3600")
    args.stages = [s for s in STAGES if s in stages]          # run order is fixed
    return args


def build_inventory(n_gpus: int) -> dict[str, Any]:
    """This machine as a one-host inventory: local connection, bare runtime, its GPU count."""
    return {"all": {"hosts": {"gpu-local": {"ansible_host": "127.0.0.1", "clusterctl_connection": "local",
                                            "clusterctl_runtime": "bare", "clusterctl_gpus": n_gpus}}}}


def build_job(work: Path, n_gpus: int, steps: int, *, port: int = RDZV_PORT) -> dict[str, Any]:
    """The quickstart on every GPU with NCCL, warm recovery, a checkpoint every 5 steps, the last rank killing
    itself at step 10 (once: not after a resume), torch's debug-info pipe on. The flight recorder is clusterctl's
    own (launch/plan.py FLIGHT_RECORDER: TORCH_FR_BUFFER_SIZE, and TORCH_FR_DUMP_TEMP_FILE under the checkpoint
    dir, where a pipe-triggered dump goes too: the deprecated TORCH_NCCL_DEBUG_INFO_TEMP_FILE loses to it)."""
    fr = work / "fr"
    return {
        "name": "gpu-devrun", "nodes": 1, "nproc_per_node": n_gpus, "script": "train.py",
        "workdir": str(QUICKSTART), "recovery": "warm",
        "args": ["--steps", str(steps), "--checkpoint-every", "5", "--kill-rank-at", "10", "--step-time", "0.2",
                 "--log-every", "5", "--phases", str(work / "phases.jsonl")],
        "env": {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT", "PYTHONPATH": str(ROOT),
                "TORCH_NCCL_DEBUG_INFO_PIPE_FILE": f"{fr}/pipe_"},
        "checkpoint": {"dir": str(work / "checkpoints"), "keep": 2},
        "rendezvous": {"port": port, "join_timeout": 120, "last_call_timeout": 1},
        "restarts": {"max_restarts": 0, "max_failures": 2},      # the kill goes to the supervisor: a relaunch
        "supervisor": {"probe_interval_s": 1},
    }


def fixture_doc(command: str, output: str, rc: int, expected: Any, source: str) -> dict[str, Any]:
    """A golden fixture as tests/fixtures/checks/<parser>/<case>.json holds it."""
    return {"command": command, "source": source, "output": output, "rc": rc, "expected": expected}


# The rank the zygote forks (or a fresh interpreter runs cold): times each phase of a rank's start, in a JSON line.
# argv: OUT_JSON [hold_mib]. Without CUDA it runs the CPU phases only (gloo), which is what CI runs.
RANK_PROBE = r'''
import json, os, sys, time
t0 = time.perf_counter()
out, hold = sys.argv[1], int(sys.argv[2]) if len(sys.argv) > 2 else 0
phases = {}
import torch, torch.distributed as dist
phases["torch"] = time.perf_counter() - t0
cuda = torch.cuda.is_available()
res = {"pid": os.getpid(), "cuda": cuda, "bad_fork": bool(torch.cuda._is_in_bad_fork()), "phases": phases}
if cuda:
    t = time.perf_counter(); torch.cuda.init(); torch.zeros(1, device="cuda"); torch.cuda.synchronize()
    phases["cuda_context"] = time.perf_counter() - t
dev = "cuda" if cuda else "cpu"
t = time.perf_counter(); a = torch.randn(1024, 1024, device=dev); (a @ a).sum().item()
phases["first_matmul"] = time.perf_counter() - t
store = dist.FileStore(out + ".store", 1)
t = time.perf_counter()
dist.init_process_group("nccl" if cuda else "gloo", store=store, rank=0, world_size=1)
x = torch.ones(1, device=dev); dist.all_reduce(x)
if cuda: torch.cuda.synchronize()
phases["nccl_init" if cuda else "gloo_init"] = time.perf_counter() - t
res["allreduce"] = x.item()
dist.destroy_process_group()
res["total"] = time.perf_counter() - t0
if hold and cuda:
    buf = torch.empty(hold * 2**20, dtype=torch.uint8, device="cuda"); torch.cuda.synchronize()
    res["holding_mib"] = hold
open(out, "w").write(json.dumps(res))
if hold:
    time.sleep(600)
'''


# which of the zygote's preload modules maps libcuda (dlopen, not cuInit: cuInit opens /dev/nvidiactl): argv modules
MAPS_PROBE = r'''
import importlib, sys
def cuda():
    return any("libcuda.so" in ln for ln in open("/proc/self/maps"))
for m in sys.argv[1:]:
    importlib.import_module(m)
    if cuda():
        print(m); break
else:
    print("none")
'''


# argv: SECONDS. Idle, then busy (bf16 matmuls on a side thread): rankview.Nvml's utilisation and nvidia-smi's.
NVML_PROBE = r'''
import json, subprocess, sys, threading, time
import torch
from clusterctl.rankview import Nvml, pci_bus_id
bus = pci_bus_id(torch.cuda.get_device_properties(0)); nvml = Nvml()
def smi():
    out = subprocess.run(["nvidia-smi", "-i", "0", "--query-gpu=utilization.gpu,pci.bus_id",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout
    u, b = [x.strip() for x in out.split(",")]
    return float(u), b
time.sleep(1.5)
idle = (nvml.utilization(bus), smi())
stop = time.monotonic() + float(sys.argv[1])
def work():
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    while time.monotonic() < stop:
        for _ in range(20): a @ a
        torch.cuda.synchronize()
threading.Thread(target=work, daemon=True).start()
time.sleep(float(sys.argv[1]) / 2)
busy = (nvml.utilization(bus), smi())
print(json.dumps({"bus_id": bus, "smi_bus_id": busy[1][1], "idle": [idle[0], idle[1][0]],
                  "busy": [busy[0], busy[1][0]]}))
'''


def stage_nvml(r: Run) -> None:
    p = r.sh([r.python, "-c", NVML_PROBE, "4"], 90)
    try:
        d = json.loads(p.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        r.step("nvml: the probe ran", False, (p.stdout + p.stderr)[-500:])
        return
    r.figures["nvml"] = d
    r.step("nvml: the bus id names the device nvidia-smi names", d["bus_id"] == d["smi_bus_id"], json.dumps(d))
    r.step("nvml: busy GPU read busy by both (>= 50 %)", (d["busy"][0] or 0) >= 50 and d["busy"][1] >= 50,
           json.dumps(d))


def nccl_view(views: list[dict]) -> tuple[bool, str]:
    """Issue 37's NCCL path: do the rank views (``rank-<RANK>`` files, clusterctl/rankview.py) of a GPU job show
    collectives completed, read from NCCL's flight recorder (``_dump_nccl_trace_json``: the CPU one that gloo
    writes has none of a NCCL job's), and the rank's GPU memory? (ok, what they said)"""
    seen = [f"rank {v.get('rank')}: colls {v.get('colls')}, gpu_mem {v.get('gpu_mem')}" for v in views]
    ok = bool(views) and all((v.get("colls") or 0) > 0 and (v.get("gpu_mem") or 0) > 0 for v in views)
    return ok, "; ".join(seen) or "no rank view"


def read_views(home: Path, node: str = "gpu-local") -> list[dict]:
    """The newest attempt's rank views of the device job on this host (bare: under the node's jobs root)."""
    dirs = sorted(home.glob(f".clusterctl/nodes/{node}/jobs/*/*/view"), key=lambda d: d.stat().st_mtime)
    out = []
    for f in sorted(dirs[-1].glob("rank-*")) if dirs else []:
        try:
            out.append(json.loads(f.read_text()))
        except (OSError, ValueError):
            continue
    return out


# ------------------------------------------------------------------------------------------------ the run
class Run:
    def __init__(self, out: Path, work: Path, budget_s: float):
        self.out, self.work, self.t0, self.budget_s = out, work, time.monotonic(), budget_s
        self.results: list[dict[str, Any]] = []
        self.figures: dict[str, Any] = {}
        self.env = dict(os.environ, CLUSTERCTL_STATE_DIR=str(work / "state"),
                        PYTHONPATH=f"{ROOT}:{os.environ.get('PYTHONPATH', '')}".rstrip(":"),
                        PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
        self.env.pop("CLUSTERCTL_INVENTORY", None)
        self.python = sys.executable

    def left(self) -> float:
        return self.budget_s - (time.monotonic() - self.t0)

    def step(self, name: str, ok: bool, detail: str = "") -> bool:
        self.results.append({"name": name, "ok": bool(ok), "detail": detail[:1000]})
        print(f"[{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""), flush=True)
        return bool(ok)

    def sh(self, argv: list[str], timeout: float, **kw) -> subprocess.CompletedProcess:
        timeout = max(1.0, min(timeout, self.left()))
        print(f"$ {' '.join(map(str, argv))}", flush=True)
        try:
            return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL,
                                  env=kw.pop("env", self.env), **kw)
        except subprocess.TimeoutExpired as e:
            return subprocess.CompletedProcess(argv, 124, (e.stdout or b"").decode(errors="replace")
                                               if isinstance(e.stdout, bytes) else (e.stdout or ""), "timed out")

    def clusterctl(self, *args: str, timeout: float = 180) -> subprocess.CompletedProcess:
        return self.sh([self.python, "-c", "from clusterctl.cli import main; main()", *args], timeout)

    def save(self) -> None:
        doc = {"results": self.results, "figures": self.figures, "wall_s": round(time.monotonic() - self.t0, 1)}
        (self.out / "results.json").write_text(json.dumps(doc, indent=1))


def stage_deps(r: Run, wheels: str | None) -> None:
    """Install the wheels with ``pip --target`` into a folder put first on PYTHONPATH: the machine's python3 is
    itself a venv (/opt/torch/.venv), and a venv made from a venv's python sees the base interpreter's site
    packages, not its torch."""
    if not wheels:
        r.step("deps: none to install (no --wheels)", True)
        return
    site = r.work / "site"
    whls = sorted(str(w) for w in Path(wheels).glob("*.whl"))
    p = r.sh([sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
              "--no-cache-dir", "--target", str(site), *whls], 180)
    if r.step("deps: installed offline from the wheels", p.returncode == 0 and bool(whls),
              f"{len(whls)} wheels; " + (p.stdout + p.stderr)[-500:]):
        r.env["PYTHONPATH"] = f"{site}:{r.env['PYTHONPATH']}"
        r.env["PATH"] = f"{site / 'bin'}:{r.env['PATH']}"
        sys.path.insert(0, str(site))


def gpu_count(r: Run) -> int:
    from clusterctl.checks.gpu import parse_nvidia_smi_list

    p = r.sh(["nvidia-smi", "-L"], 60)
    return len(parse_nvidia_smi_list(p.stdout, p.returncode)["gpus"])


def stage_fixtures(r: Run, n: int) -> None:
    from clusterctl.checks import gpu

    p = r.sh(list(gpu.NVIDIA_SMI_ARGV), 60)
    base = gpu.parse_nvidia_smi(p.stdout, p.returncode)
    model = base["gpus"][0]["name"] if base["gpus"] else "unknown GPU"
    driver = base["gpus"][0]["driver_version"] if base["gpus"] else "?"
    source = f"recorded by tests/gpu/gpu_checks.py on {n} x {model}, driver {driver}"
    cases = [("nvidia_smi", gpu.NVIDIA_SMI_ARGV, gpu.parse_nvidia_smi),
             ("nvidia_smi_list", ("nvidia-smi", "-L"), gpu.parse_nvidia_smi_list),
             ("gpu_modes", gpu.MODES_ARGV, gpu.parse_gpu_modes),
             ("remapped_rows", gpu.REMAP_ARGV, gpu.parse_remapped_rows),
             ("gpu_fabric", gpu.FABRIC_ARGV, gpu.parse_gpu_fabric),
             ("cuda_init", ("python3", "-c", gpu.CUDA_PROGRAM), gpu.parse_cuda_init),
             ("xid", ("sh", "-c", gpu.XID_SCRIPT), lambda o, rc: gpu.parse_xid(o))]
    slug = "".join(c if c.isalnum() else "_" for c in model.lower()).strip("_")
    for kind, argv, parser in cases:
        p = r.sh(list(argv), 60)
        parsed = parser(p.stdout, p.returncode)
        d = r.out / "fixtures" / kind
        d.mkdir(parents=True, exist_ok=True)
        command = " ".join(argv) if kind not in ("cuda_init", "xid") else f"{argv[0]} -c <{kind} program>"
        (d / f"{slug}_x{n}_real.json").write_text(json.dumps(fixture_doc(command, p.stdout, p.returncode, parsed,
                                                                         source), indent=1) + "\n")
        rows = parsed.get("gpus") if isinstance(parsed, dict) else parsed
        if kind == "xid":
            ok, detail = p.returncode == 0, f"{len(parsed)} Xid lines"
        elif kind == "cuda_init":
            ok, detail = parsed["code"] == 0 and parsed["devices"] == n, json.dumps(parsed)
        elif kind == "gpu_fabric":      # unknown to an older driver: a failed query is an answer too
            ok, detail = bool(rows) or bool(parsed["error"]), json.dumps(parsed)[:300]
        else:
            ok, detail = len(rows or []) == n and not parsed.get("error"), json.dumps(parsed)[:300]
        r.step(f"fixtures: {kind} parsed ({' '.join(argv[:2])[:60]})", ok, detail)


def stage_preflight(r: Run, inv: Path, job: Path, n: int) -> None:
    p = r.clusterctl("preflight", "-i", str(inv), str(job), "--output", "json")
    (r.out / "preflight.json").write_text(p.stdout)
    try:
        data = json.loads(p.stdout)
    except ValueError:
        r.step("preflight: JSON on stdout", False, f"exit {p.returncode}: {p.stderr[-500:]}")
        return
    checks = {c["id"]: c for c in data["hosts"][0]["checks"]}
    for c in checks.values():
        print(f"    {c['status']:4}  {c['id']:17} {c['detail']}")
    r.step("preflight: exit 0", p.returncode == 0, json.dumps(data["summary"]))
    for cid in ("gpu_driver", "gpu_count", "gpu_health"):
        c = checks.get(cid, {})
        r.step(f"preflight: {cid} pass", c.get("status") == "pass", c.get("detail", "missing"))
    drv = checks.get("gpu_driver", {})
    r.step("preflight: cuInit ok on every GPU", f"cuInit ok, {n} devices" in drv.get("detail", ""),
           drv.get("detail", ""))
    r.figures["preflight_s"] = data.get("duration_s")


def start_zygote(r: Run, sock: Path) -> subprocess.Popen | None:
    log = open(r.out / "zygote.log", "w")
    z = subprocess.Popen([r.python, str(ZYGOTE), "serve", str(sock)], stdout=log, stderr=subprocess.STDOUT,
                         stdin=subprocess.DEVNULL, env=r.env, start_new_session=True)
    end = time.monotonic() + min(120.0, r.left())
    while time.monotonic() < end and z.poll() is None:
        if ping(r, sock)[0] == 0:
            return z
        time.sleep(0.2)
    r.step("zygote: up and answering pings", False, (r.out / "zygote.log").read_text()[-500:])
    z.kill()
    return None


def ping(r: Run, sock: Path) -> tuple[int, float]:
    t = time.perf_counter()
    p = subprocess.run([r.python, "-S", str(ZYGOTE), "client", str(sock), "ping"], capture_output=True,
                       timeout=10, stdin=subprocess.DEVNULL, env=r.env)
    return p.returncode, time.perf_counter() - t


def fork_rank(r: Run, sock: Path, probe: Path, out: Path, *extra: str) -> subprocess.Popen:
    return subprocess.Popen([r.python, "-S", str(ZYGOTE), "client", str(sock), "rank", str(probe), str(out), *extra],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=r.env,
                            text=True)


def wait_file(path: Path, timeout: float) -> dict | None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if path.exists() and path.stat().st_size:
            return json.loads(path.read_text())
        time.sleep(0.1)
    return None


def stage_zygote_startup_release(r: Run, stages: list[str]) -> None:
    probe = r.work / "rank_probe.py"
    probe.write_text(RANK_PROBE)
    sock = r.work / "zygote.sock"
    z = start_zygote(r, sock)
    if z is None:
        return
    try:
        if "zygote" in stages:
            maps = Path(f"/proc/{z.pid}/maps").read_text()
            fds = [os.readlink(f) for f in Path(f"/proc/{z.pid}/fd").iterdir() if f.is_symlink()]
            mapped = sorted({ln.split()[-1] for ln in maps.splitlines() if "libcuda" in ln or "libnvidia-ml" in ln})
            r.figures["zygote_mapped"] = mapped
            r.step("zygote: no NVML mapped after the preload", not any("libnvidia-ml" in m for m in mapped),
                   ", ".join(mapped))
            p = r.sh([r.python, "-c", MAPS_PROBE, *PRELOAD], 120)
            r.figures["zygote_maps_libcuda_at"] = p.stdout.strip()
            print(f"    libcuda mapped by: {p.stdout.strip()}")
            dev = [f for f in fds if f.startswith("/dev/nvidia")]
            r.step("zygote: CUDA driver not initialised (no /dev/nvidia* open)", not dev, ", ".join(dev))
        warm = None
        if "zygote" in stages or "startup" in stages:
            c = fork_rank(r, sock, probe, r.work / "warm.json")
            c.wait(timeout=max(1.0, min(180.0, r.left())))
            warm = wait_file(r.work / "warm.json", 5)
            ok = bool(warm) and warm["cuda"] and not warm["bad_fork"] and warm.get("allreduce") == 1.0
            r.step("zygote: a forked rank initialises CUDA and NCCL, not in bad fork", ok,
                   json.dumps(warm) if warm else (c.stdout.read() if c.stdout else "")[-500:])
        if "startup" in stages:
            p = r.sh([r.python, str(probe), str(r.work / "cold.json")], 180)
            cold = wait_file(r.work / "cold.json", 1)
            ok = bool(cold and warm)
            r.step("startup: cold rank ran", bool(cold), p.stdout[-300:] + p.stderr[-300:])
            if ok:
                r.figures["startup"] = {"warm": warm["phases"] | {"total": warm["total"]},
                                        "cold": cold["phases"] | {"total": cold["total"]}}
                print(json.dumps(r.figures["startup"], indent=1))
        if "release" in stages:
            release(r, sock, probe)
    finally:
        os.killpg(z.pid, signal.SIGKILL)
        z.wait(timeout=10)


def used_mib(r: Run) -> int | None:
    p = r.sh(["nvidia-smi", "-i", "0", "--query-gpu=memory.used", "--format=csv,noheader,nounits"], 30)
    return int(p.stdout.split()[0]) if p.returncode == 0 and p.stdout.split() else None


def release(r: Run, sock: Path, probe: Path) -> None:
    base = used_mib(r)
    holder = fork_rank(r, sock, probe, r.work / "hold.json", "4096")
    info = wait_file(r.work / "hold.json", min(120.0, r.left()))
    if not r.step("release: a forked rank holds 4 GiB on GPU 0", bool(info and info.get("holding_mib"))):
        holder.kill()
        return
    os.kill(info["pid"], signal.SIGKILL)
    t_kill, pings, released = time.monotonic(), [], None
    while time.monotonic() - t_kill < 60:
        rc, lat = ping(r, sock)
        pings.append(lat if rc == 0 else None)
        used = used_mib(r)
        if used is not None and base is not None and used <= base + 256:
            released = time.monotonic() - t_kill
            break
        time.sleep(0.05)
    holder.wait(timeout=30)
    answered = [p for p in pings if p is not None]
    r.figures["release"] = {"released_s": released, "pings": len(pings), "ping_max_s": max(answered, default=None),
                            "ping_failed": sum(p is None for p in pings)}
    r.step("release: GPU memory released after SIGKILL", released is not None, json.dumps(r.figures["release"]))
    r.step("release: the zygote answered every ping meanwhile", bool(answered) and len(answered) == len(pings)
           and max(answered) < 5.0, json.dumps(r.figures["release"]))


def analyzer(r: Run, folder: Path, prefix: str) -> subprocess.CompletedProcess:
    """torch's flight-recorder analyzer on the dumps ``folder/<prefix><rank>``."""
    return r.sh([r.python, "-m", "torch.distributed.flight_recorder.fr_trace", str(folder), "-p", prefix], 120)


def on_demand(r: Run, fr: Path, job_dir: Path | None) -> dict[str, Any]:
    """While attempt 2 (the warm one) trains: ``top --once``; a dump through torch's debug-info pipe (its C++
    heartbeat thread: no GIL needed); a dump through the rank view's trigger (``view/dump``: fr-<RANK>, stacks)."""
    got: dict[str, Any] = {"top": []}
    end = time.monotonic() + 20
    while time.monotonic() < end:   # until every rank trains (its CUDA memory is in the view from its first step)
        t = r.clusterctl("top", "gpu-devrun", "--once", "--output", "json", timeout=60)
        (r.out / "top.json").write_text(t.stdout + t.stderr)
        try:
            got["top"] = json.loads(t.stdout)["ranks"]
        except (ValueError, KeyError, TypeError):
            got["top"] = []
        if got["top"] and all(x.get("state") == "training" for x in got["top"]):
            break
        time.sleep(1)
    pipe = fr / "pipe_0.pipe"
    if pipe.exists():           # torch makes the FIFO when the process group starts; its reader is the warm rank
        fd = os.open(pipe, os.O_WRONLY | os.O_NONBLOCK)
        os.write(fd, b"1\n")
        os.close(fd)
        got["pipe"] = time.monotonic()
    if job_dir is not None:
        views = sorted(job_dir.glob("*/view"), key=lambda d: d.stat().st_mtime)
        if views:
            dest = r.work / "dump"
            (views[-1] / "dump").write_text(str(dest))
            got["trigger"] = dest
    return got


def stage_job(r: Run, inv: Path, job: Path, steps: int) -> None:
    fr = r.work / "fr"
    fr.mkdir(exist_ok=True)
    p = r.clusterctl("launch", str(job), "-i", str(inv), "--detach", timeout=180)
    if not r.step("job: launched (detached)", p.returncode == 0, (p.stdout + p.stderr)[-500:]):
        return
    end = time.monotonic() + max(10.0, r.left() - 40)
    state, got = None, None
    nccl_ok, nccl_said = False, "never looked"
    while time.monotonic() < end:
        s = r.clusterctl("status", "gpu-devrun", "--output", "json", timeout=60)
        try:
            doc = json.loads(s.stdout)
        except ValueError:
            doc = {}
        state = doc.get("state")
        if state == "RUNNING" and not nccl_ok:
            nccl_ok, nccl_said = nccl_view(read_views(Path.home()))
        if state == "RUNNING" and doc.get("attempt", 0) >= 2 and got is None and read_views(Path.home()):
            jobs = sorted(Path.home().glob(".clusterctl/nodes/gpu-local/jobs/gpu-devrun-*"))
            got = on_demand(r, fr, jobs[-1] if jobs else None)
        if state in ("SUCCEEDED", "FAILED", "CANCELLED"):
            break
        time.sleep(1)
    got = got or {}
    logs = r.clusterctl("logs", "gpu-devrun", "--tail", "400", timeout=60)
    events = r.clusterctl("events", "gpu-devrun", "--output", "json", timeout=60)
    (r.out / "job.log").write_text(logs.stdout + logs.stderr)
    (r.out / "job-events.json").write_text(events.stdout)
    text = logs.stdout + logs.stderr
    r.step("job: SUCCEEDED", state == "SUCCEEDED", f"state {state}")
    r.step("job: the last rank was SIGKILLed", "SIGKILL to myself at step 10" in text)
    try:
        evs = json.loads(events.stdout)
    except ValueError:
        evs = []
    warm = [e for e in evs if e.get("kind") == "relaunch" and e.get("class") == "warm"]
    r.step("job: relaunched warm", bool(warm), warm[0]["message"] if warm else events.stdout[-500:])
    r.step("job: resumed from the checkpoint", "resumed from" in text)
    r.step(f"job: finished ({steps} steps) with NCCL", f"done: step {steps}" in text and "NCCL INFO" in text)
    r.step("job: the rank view reads NCCL's flight recorder (collectives, GPU memory)", nccl_ok, nccl_said)
    tops = got.get("top") or []
    r.figures["top"] = tops
    r.step("job: top shows the rank's GPU memory and utilisation",
           bool(tops) and all((t.get("gpu_mem_bytes") or 0) > 0 and t.get("gpu_util_pct") is not None for t in tops),
           json.dumps(tops)[:600])
    # the pipe's dump goes where clusterctl's TORCH_FR_DUMP_TEMP_FILE says: <checkpoints>/flight_recorder/<job>-<n>/
    traces = sorted((r.work / "checkpoints" / "flight_recorder").glob("*-2/rank_*"))
    r.step("job: on-demand flight-recorder dump from the warm rank through TORCH_NCCL_DEBUG_INFO_PIPE_FILE",
           "pipe" in got and bool(traces), ", ".join(str(t.relative_to(r.work)) for t in traces))
    if traces:
        a = analyzer(r, traces[0].parent, "rank_")
        (r.out / "fr-analyzer-pipe.txt").write_text(a.stdout + a.stderr)
        r.step("job: torch's analyzer reads the pipe's dump", a.returncode == 0, (a.stdout + a.stderr)[-400:])
    dump = got.get("trigger")
    frs = sorted(dump.glob("fr-*")) if dump else []
    r.step("job: the rank view's dump trigger wrote fr-<RANK> and stacks (NCCL)",
           bool(frs) and any(dump.glob("stack-*.txt")), ", ".join(f.name for f in dump.iterdir()) if dump and
           dump.exists() else "no dump dir")
    if frs:
        a = analyzer(r, dump, "fr-")
        (r.out / "fr-analyzer-view.txt").write_text(a.stdout + a.stderr)
        r.step("job: torch's analyzer reads the rank view's NCCL dump", a.returncode == 0, (a.stdout + a.stderr)[-400:])
    phases = r.work / "phases.jsonl"
    if phases.exists():
        r.figures["job_phases"] = [json.loads(ln) for ln in phases.read_text().splitlines() if ln.strip()]


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    out = Path(args.out or tempfile.mkdtemp(prefix="clusterctl-devrun-out-"))
    out.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="clusterctl-devrun-"))
    r = Run(out, work, args.budget_s)
    try:
        if "deps" in args.stages:
            stage_deps(r, args.wheels)
        n = gpu_count(r)
        if not r.step("nvidia-smi -L lists GPUs", n > 0, f"{n} GPUs"):
            return 1
        import yaml

        inv, job = work / "inventory.yaml", work / "job.yaml"
        inv.write_text(yaml.safe_dump(build_inventory(n), sort_keys=False))
        job.write_text(yaml.safe_dump(build_job(work, n, args.steps), sort_keys=False))
        for name, stage in (("fixtures", lambda: stage_fixtures(r, n)),
                            ("preflight", lambda: stage_preflight(r, inv, job, n)),
                            ("zygote|startup|release", lambda: stage_zygote_startup_release(r, args.stages)),
                            ("nvml", lambda: stage_nvml(r)),
                            ("job", lambda: stage_job(r, inv, job, args.steps))):
            if not any(s in args.stages for s in name.split("|")):
                continue
            if r.left() < 20:
                r.step(f"{name}: skipped, out of budget", False, f"{r.left():.0f} s left")
                continue
            try:
                stage()
            except Exception as e:  # noqa: BLE001 - a stage's crash is its FAIL, the others still run
                r.step(f"{name}: crashed", False, f"{type(e).__name__}: {e}")
            r.save()
    finally:
        r.save()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)
    passed = sum(x["ok"] for x in r.results)
    print(f"\n==== device run: {passed}/{len(r.results)} passed in {time.monotonic() - r.t0:.0f} s; {out} ====")
    return 0 if passed == len(r.results) else 1


if __name__ == "__main__":
    sys.exit(main())
