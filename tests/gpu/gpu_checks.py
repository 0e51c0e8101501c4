#!/usr/bin/env python3
"""Manual GPU-machine check (not collected by pytest, not part of `make test`). Run on a machine with NVIDIA GPUs,
the driver, and this repo's venv (torch with CUDA):

    tests/gpu/run_gpu_checks.sh [--steps 100] [--keep]

1. counts the GPUs with the real ``nvidia-smi -L`` (N);
2. writes an inventory for this machine (local connection, bare runtime, ``clusterctl_gpus: N``) and a job
   (the quickstart ``train.py``, ``nproc_per_node: N``, ``NCCL_DEBUG=INFO``);
3. ``clusterctl preflight -i INV JOB --output json`` against the real nvidia-smi: exit 0, and gpu_driver,
   gpu_count (N GPUs), gpu_health pass, the driver version equals nvidia-smi's;
4. checks that this Python's torch sees the N GPUs;
5. ``clusterctl launch JOB -i INV`` (attached): exit 0, every rank 0..N-1 started with WORLD_SIZE=N, the log
   shows NCCL initialising (``NCCL INFO``) and training finishing (``done: step``).

Needs a CUDA build of torch in the venv (`make venv` installs the default PyPI wheel, which is CUDA-enabled on
x86_64 Linux; a `+cpu` build makes step 4 fail and skips step 5).

Prints PASS/FAIL per step and a summary; exits 0 only when every step passed. Works in a temp dir (removed
unless --keep); the job uses rendezvous port 29512.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
QUICKSTART = ROOT / "examples" / "quickstart"
RESULTS: list[tuple[str, bool, str]] = []


def step(name: str, ok: bool, detail: str = "") -> bool:
    RESULTS.append((name, ok, detail))
    print(f"[{'PASS' if ok else 'FAIL'}] {name}" + (f": {detail}" if detail else ""), flush=True)
    return ok


def clusterctl_cmd() -> list[str]:
    exe = Path(sys.executable).parent / "clusterctl"
    return [str(exe)] if exe.exists() else [sys.executable, "-c", "from clusterctl.cli import main; main()"]


def run(argv: list[str], env: dict, timeout: float) -> subprocess.CompletedProcess:
    print(f"$ {' '.join(argv)}", flush=True)
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env)


def gpu_count() -> tuple[int, str]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return 0, "nvidia-smi not found on PATH"
    r = subprocess.run([smi, "-L"], capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    if r.returncode != 0:
        return 0, f"nvidia-smi -L failed (exit {r.returncode}): {(r.stdout + r.stderr).strip()[:300]}"
    n = sum(1 for line in r.stdout.splitlines() if line.startswith("GPU "))
    return n, r.stdout.strip()


def driver_version() -> str:
    r = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True,
                       text=True, timeout=60, stdin=subprocess.DEVNULL)
    return r.stdout.splitlines()[0].strip() if r.returncode == 0 and r.stdout.strip() else ""


def write_files(tmp: Path, n: int, steps: int) -> tuple[Path, Path]:
    import yaml

    inv = tmp / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"all": {"hosts": {"gpu-local": {
        "ansible_host": "127.0.0.1", "clusterctl_connection": "local", "clusterctl_runtime": "bare",
        "clusterctl_gpus": n}}}}, sort_keys=False))
    job = tmp / "job.yaml"
    job.write_text(yaml.safe_dump({
        "name": "gpu-quickstart", "nodes": 1, "nproc_per_node": n, "script": "train.py",
        "workdir": str(QUICKSTART),
        "args": ["--steps", str(steps), "--checkpoint-every", str(max(1, steps // 2)),
                 "--dump-env", str(tmp / "env" / "rank")],
        "env": {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT"},
        "checkpoint": {"dir": str(tmp / "checkpoints"), "keep": 2},
        "rendezvous": {"port": 29512, "join_timeout": 120, "last_call_timeout": 1},
        "restarts": {"max_restarts": 0, "max_failures": 1},
        "supervisor": {"probe_interval_s": 1},
    }, sort_keys=False))
    return inv, job


def check_preflight(inv: Path, job: Path, env: dict, n: int) -> bool:
    r = run(clusterctl_cmd() + ["preflight", "-i", str(inv), str(job), "--output", "json"], env, 180)
    try:
        data = json.loads(r.stdout)
    except ValueError:
        return step("preflight JSON on stdout", False, f"exit {r.returncode}; stdout {r.stdout[:300]!r}; "
                                                       f"stderr {r.stderr[-500:]!r}")
    host = data["hosts"][0]
    print("  host checks:")
    for c in host["checks"]:
        print(f"    {c['status']:4}  {c['id']:17} {c['detail']}" + (f"\n          hint: {c['hint']}" if c["hint"] else ""))
    print("  cluster checks:")
    for c in data["cluster"]:
        print(f"    {c['status']:4}  {c['id']:20} {c['detail']}")
    checks = {c["id"]: c for c in host["checks"]}
    ok = step("preflight exit code 0", r.returncode == 0, f"exit {r.returncode}, summary {data['summary']}")
    for cid in ("ssh", "gpu_driver", "gpu_count", "gpu_health"):
        c = checks.get(cid)
        ok &= step(f"preflight {cid} pass", bool(c) and c["status"] == "pass",
                   f"{c['status']}: {c['detail']}" if c else "missing")
    want = driver_version()
    got = (checks.get("gpu_driver") or {}).get("detail", "")
    ok &= step("preflight reports nvidia-smi's driver version", bool(want) and want in got,
               f"nvidia-smi says {want!r}; check says {got!r}")
    count = checks.get("gpu_count", {})
    ok &= step(f"preflight sees {n} GPUs", count.get("detail", "").startswith(f"{n} x "),
               count.get("detail", "missing"))
    table = run(clusterctl_cmd() + ["preflight", "-i", str(inv), str(job)], dict(env, COLUMNS="100"), 180)
    print(table.stdout)
    return ok


def check_torch(env: dict, n: int) -> bool:
    r = run([sys.executable, "-c", "import torch; print(torch.__version__, torch.version.cuda, "
                                   "torch.cuda.is_available(), torch.cuda.device_count(), "
                                   "torch.distributed.is_nccl_available())"], env, 300)
    parts = r.stdout.split()
    ok = r.returncode == 0 and len(parts) == 5 and parts[2] == "True" and parts[3] == str(n) and parts[4] == "True"
    return step(f"torch sees {n} CUDA GPUs and NCCL", ok,
                r.stdout.strip() or r.stderr.strip()[-300:])


def check_launch(inv: Path, job: Path, env: dict, tmp: Path, n: int, steps: int) -> bool:
    t0 = time.monotonic()
    r = run(clusterctl_cmd() + ["launch", str(job), "-i", str(inv)], env, 900)
    log = r.stdout + r.stderr
    (tmp / "launch.log").write_text(log)
    print("\n".join(log.splitlines()[-25:]))
    ok = step("launch exit code 0 (job succeeded)", r.returncode == 0,
              f"exit {r.returncode} after {time.monotonic() - t0:.0f}s; full log: {tmp / 'launch.log'}")
    envs = {}
    for p in sorted((tmp / "env").glob("rank-rank*.json")):
        d = json.loads(p.read_text())["env"]
        envs[int(d.get("RANK", -1))] = d
    ok &= step(f"{n} ranks started with WORLD_SIZE={n}",
               sorted(envs) == list(range(n)) and all(d.get("WORLD_SIZE") == str(n) for d in envs.values()),
               f"ranks {sorted(envs)}, world sizes {sorted({d.get('WORLD_SIZE') for d in envs.values()})}")
    ok &= step("NCCL initialised (NCCL INFO in the log)", "NCCL INFO" in log,
               next((ln.strip() for ln in log.splitlines() if "NCCL INFO" in ln and "version" in ln.lower()), ""))
    ok &= step(f"training finished ({steps} steps)", f"done: step {steps}" in log,
               next((ln.strip() for ln in log.splitlines() if "done: step" in ln), "no 'done: step' line"))
    return ok


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=100)
    ap.add_argument("--keep", action="store_true", help="keep the temp dir (inventory, job, logs)")
    args = ap.parse_args()

    n, listing = gpu_count()
    print(listing)
    if not step("nvidia-smi -L lists GPUs", n > 0, f"{n} GPUs"):
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="clusterctl-gpu-check-"))
    env = dict(os.environ, CLUSTERCTL_STATE_DIR=str(tmp / "state"),
               PATH=f"{Path(sys.executable).parent}:{os.environ.get('PATH', '/usr/bin:/bin')}")
    env.pop("CLUSTERCTL_INVENTORY", None)
    try:
        inv, job = write_files(tmp, n, args.steps)
        print(f"inventory {inv}:\n{inv.read_text()}job {job}:\n{job.read_text()}")
        check_preflight(inv, job, env, n)
        if check_torch(env, n):
            check_launch(inv, job, env, tmp, n, args.steps)
        else:
            step("launch the quickstart with NCCL", False, "skipped: torch cannot use the GPUs")
    finally:
        if args.keep:
            print(f"kept {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)
    passed = sum(ok for _, ok, _ in RESULTS)
    print(f"\n==== GPU checks: {passed}/{len(RESULTS)} passed ====")
    for name, ok, _ in RESULTS:
        print(f"  {'PASS' if ok else 'FAIL'}  {name}")
    return 0 if passed == len(RESULTS) else 1


if __name__ == "__main__":
    sys.exit(main())
