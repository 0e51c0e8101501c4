"""`make demo` and `make demo-recovery`: the quickstart job on this machine, in a checkpoint dir of its own.

    python examples/quickstart/demo.py train      # train from scratch (every time: a fresh checkpoint dir)
    python examples/quickstart/demo.py recovery   # the same job, a rank SIGKILLed mid-epoch: detection, relaunch,
                                                  # exact resume; its final parameters vs. an uninterrupted run's

It runs the real CLI (`clusterctl launch`, attached) on examples/quickstart/job.yaml with the embedded default
inventory (this machine, bare runtime). Only the checkpoint dir (a new /tmp/clusterctl-demo.XXXXXX per run, removed
at the end unless --keep) and, for the recovery, the job name and `--kill-rank-at` differ from job.yaml.
"""
from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml

HERE = Path(__file__).resolve().parent
JOB = HERE / "job.yaml"
KILL_AT = 90                     # 2 ranks x 32 samples: 48 steps per epoch, so step 90 is mid-epoch 1
FINGERPRINT = re.compile(r"final parameters sha256 ([0-9a-f]{64})")


def job_file(workdir: Path, name: str, extra_args: list[str]) -> Path:
    spec = yaml.safe_load(JOB.read_text())
    spec["name"] = name
    spec["script"] = str(HERE / "train.py")
    spec["checkpoint"] = {**spec.get("checkpoint", {}), "dir": str(workdir / "checkpoints")}
    spec["args"] = [*spec.get("args", []), *extra_args]
    path = workdir / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def launch(job: Path, echo: bool = True) -> tuple[int, str]:
    """`clusterctl launch JOB` attached; its output streamed (echo) and returned."""
    argv = [sys.executable, "-m", "clusterctl.cli", "launch", str(job)]
    print(f"$ clusterctl launch {job}", flush=True)
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
    out = []
    for line in proc.stdout:
        out.append(line)
        if echo:
            sys.stdout.write(line)
            sys.stdout.flush()
    return proc.wait(), "".join(out)


def fingerprint(output: str) -> str | None:
    found = FINGERPRINT.findall(output)
    return found[-1] if found else None


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("what", choices=["train", "recovery"])
    p.add_argument("--keep", action="store_true", help="keep the checkpoint dir")
    args = p.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="clusterctl-demo."))
    try:
        if args.what == "train":
            rc, _ = launch(job_file(workdir, "quickstart", []))
            return rc
        print(f"== 1/2: the quickstart uninterrupted (output summarized), checkpoints in {workdir}/reference",
              flush=True)
        (workdir / "reference").mkdir()
        rc, out = launch(job_file(workdir / "reference", "quickstart-reference", []), echo=False)
        want = fingerprint(out)
        if rc != 0 or want is None:
            sys.stdout.write(out)
            print("the uninterrupted run failed", file=sys.stderr)
            return rc or 1
        print(f"   done; final parameters sha256 {want}\n", flush=True)
        print(f"== 2/2: the same job; the last rank SIGKILLs itself at step {KILL_AT} (mid-epoch), clusterctl "
              "detects it, relaunches, and the run resumes from the newest checkpoint", flush=True)
        (workdir / "recovery").mkdir()
        rc, out = launch(job_file(workdir / "recovery", "quickstart-recovery", ["--kill-rank-at", str(KILL_AT)]))
        got = fingerprint(out)
        print()
        if rc != 0 or got is None:
            print(f"the run with the killed rank did not finish (exit {rc})", file=sys.stderr)
            return rc or 1
        if got != want:
            print(f"final parameters differ: {got} vs {want} (uninterrupted)", file=sys.stderr)
            return 1
        print(f"exact resume: the final parameters are bit-identical to the uninterrupted run's (sha256 {got})")
        print("see what the supervisor decided: clusterctl events quickstart-recovery")
        return 0
    finally:
        if args.keep:
            print(f"checkpoints kept in {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
