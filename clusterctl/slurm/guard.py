"""The Slurm guard: what removes a job's leftovers from a node when its allocation ends (issue 34 item 6).

Slurm ends a job's steps when the Slurm job ends, is requeued or cancelled: SIGTERM to their processes, SIGKILL
``KillWait`` seconds later. What a step started but does not hold is missed: docker containers (dockerd's
children), and bare runners and zygotes that detached from the short ``srun`` step that started them
(``proctrack/linuxproc`` follows parent pids). They ran on in nodes Slurm hands to other jobs, and a node that left
the allocation could no longer be reached (``srun`` runs steps only on the allocation's nodes) to clean it.

So the batch script (``sbatch.BatchScript``) starts, before the supervisor, one guard task per node as a background
step (``python -m clusterctl.slurm.guard STATE_DIR SLURM_JOB_ID``). A guard waits. On SIGTERM (or SIGINT, SIGHUP:
the allocation ends) it runs the commands the supervisor's side wrote for its node (``plan_path``: the job's
removal commands per node, as argv lists: ``write_plan``), within ``BUDGET_S`` (under Slurm's default
``KillWait`` of 30 s), and writes what happened to ``report_path`` (``{"node", "ok", "detail", "restart",
"job_id", "at"}``). The next run of a requeued Slurm job reads the reports of the nodes that left
(``read_report``): cleaned, or ``cleanup_pending`` with the reason. Only the standard library: it runs on every
node of the allocation.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable, Mapping, Sequence

BUDGET_S = 25.0        # for every command of a node together; Slurm's KillWait defaults to 30 s
MODULE = "clusterctl.slurm.guard"


def plan_path(root: Path, slurm_job_id: str) -> Path:
    return Path(root) / "slurm" / f"{slurm_job_id}.guard.json"


def report_path(root: Path, slurm_job_id: str, node: str) -> Path:
    return Path(root) / "slurm" / f"{slurm_job_id}.left" / f"{node}.json"


def write_atomically(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def write_plan(root: Path, slurm_job_id: str, job_id: str, commands: Mapping[str, Sequence[Sequence[str]]]) -> None:
    """What each node's guard runs when the allocation ends: ``{node: [argv, ...]}`` for clusterctl job ``job_id``."""
    write_atomically(plan_path(root, slurm_job_id), json.dumps(
        {"job_id": job_id, "nodes": {n: [list(map(str, a)) for a in argvs] for n, argvs in commands.items()}}))


def read_report(root: Path, slurm_job_id: str, node: str) -> dict | None:
    try:
        return json.loads(report_path(root, slurm_job_id, node).read_text())
    except (OSError, ValueError):
        return None


def clean(root: Path, slurm_job_id: str, node: str, restart: int, *, budget_s: float = BUDGET_S,
          run: Callable[..., subprocess.CompletedProcess] = subprocess.run) -> dict:
    """Run ``node``'s commands of the plan (none yet: nothing was launched) and write the report."""
    try:
        plan = json.loads(plan_path(root, slurm_job_id).read_text())
    except FileNotFoundError:
        plan = {"job_id": None, "nodes": {}}
    except (OSError, ValueError) as e:
        plan, problem = None, f"cannot read {plan_path(root, slurm_job_id)}: {e}"
    if plan is not None:
        problem = None
        deadline = time.monotonic() + budget_s
        for argv in plan.get("nodes", {}).get(node, []):
            left = deadline - time.monotonic()
            try:
                r = run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=max(0.1, left))
            except subprocess.TimeoutExpired:
                problem = f"{argv[0]}: no answer within {budget_s:g}s"
                break
            except OSError as e:
                problem = f"{argv[0]}: {e.strerror}"
                continue
            if r.returncode != 0:
                problem = (r.stderr.strip() or r.stdout.strip())[-300:] or f"{argv[0]}: exit code {r.returncode}"
    report = {"node": node, "ok": problem is None, "detail": problem or "removed the job's processes",
              "restart": restart, "job_id": (plan or {}).get("job_id"), "at": time.time()}
    write_atomically(report_path(root, slurm_job_id, node), json.dumps(report))
    return report


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if len(args) != 2 or not args[1].isdigit():
        print("usage: python -m clusterctl.slurm.guard STATE_DIR SLURM_JOB_ID", file=sys.stderr)
        return 2
    root, sjid = Path(args[0]), args[1]
    node = os.environ.get("SLURMD_NODENAME") or socket.gethostname()
    restart = int(os.environ.get("SLURM_RESTART_COUNT", "0") or 0)
    signals = {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}
    signal.pthread_sigmask(signal.SIG_BLOCK, signals)       # held until sigwait takes one: no signal is missed
    signal.sigwait(signals)
    for s in signals:         # Slurm may signal again: the work is done once (a command past its time is KILLed)
        signal.signal(s, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)
    clean(root, sjid, node, restart)
    return 0


if __name__ == "__main__":
    sys.exit(main())
