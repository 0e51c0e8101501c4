"""``clusterctl sbatch JOB.yaml [-- SBATCH ARGS]``: the batch script that runs the supervisor inside the allocation.

The script (``render``: pure, what ``--dry-run`` prints is what is submitted) asks for the job's node count,
``--requeue`` (and not ``--no-kill``: with it, Slurm 22.05 removes even the batch host from the job when that node
fails and kills the batch step, leaving an allocation with nothing running in it until its time limit; without it,
any node failure requeues the whole Slurm job, and the next run resumes), and ``--signal=B:USR1@<s>`` so the batch
shell hears of the time limit before it hits: the trap requeues the Slurm job, and the next run resumes. Every run of the script executes ``clusterctl sbatch-run`` (``run``
here): the first run of a Slurm job launches the clusterctl job from ``-i slurm`` and writes
``<state>/slurm/<SLURM_JOB_ID>`` (the clusterctl job id); a later run of the same Slurm job (requeued after its
supervisor's node died, a node failure, or the time-limit trap) finds that file and resumes the same job record
(``resume`` semantics: newest valid checkpoint) on the hosts of the new allocation. Each run records an event with
``SLURM_JOB_ID`` and ``SLURM_RESTART_COUNT``. The state dir must be on storage every node sees (it is given to the
script as an absolute path).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

DEFAULT_SIGNAL_S = 120
EVENT = "slurm_run"


@dataclass(frozen=True)
class BatchScript:
    job_path: str            # absolute
    job_name: str
    nodes: str               # "3" or "2-4"
    state_dir: str           # absolute
    inventory: str           # "slurm" or "slurm:/abs/overlay.yaml"
    python: str              # the interpreter that runs clusterctl on the batch node
    signal_s: int = DEFAULT_SIGNAL_S
    sbatch_args: tuple[str, ...] = ()

    def render(self) -> str:
        q = shlex.quote
        run = [self.python, "-m", "clusterctl.cli", "--state-dir", self.state_dir, "sbatch-run", self.job_path,
               "-i", self.inventory]
        return "\n".join([
            "#!/bin/bash",
            f"#SBATCH --job-name={q(self.job_name)}",
            f"#SBATCH --nodes={self.nodes}",
            "#SBATCH --ntasks-per-node=1",
            "#SBATCH --requeue",
            f"#SBATCH --signal=B:USR1@{int(self.signal_s)}",
            "#SBATCH --open-mode=append",
            f"#SBATCH --output={q(str(Path(self.state_dir) / 'slurm' / '%x-%j.out'))}",
            "# Written by `clusterctl sbatch`: runs the clusterctl supervisor inside this allocation. A requeued run",
            "# (node failure, or the time-limit trap below) resumes the same clusterctl job from its newest valid",
            "# checkpoint on the hosts Slurm gives it then.",
            "set -u",
            'echo "clusterctl: Slurm job ${SLURM_JOB_ID} run ${SLURM_RESTART_COUNT:-0} on $(hostname)"',
            "trap 'echo \"clusterctl: time limit near: requeueing Slurm job ${SLURM_JOB_ID}\"; "
            "scontrol requeue \"${SLURM_JOB_ID}\"' USR1",
            f"{shlex.join(run)} &",
            "child=$!",
            # `wait` returns early when the trap runs: wait again until the run ends (or Slurm ends the job)
            'while :; do wait "$child"; rc=$?; kill -0 "$child" 2>/dev/null || exit "$rc"; done',
            "",
        ])

    def sbatch_argv(self, script_path: str) -> list[str]:
        return ["sbatch", "--parsable", *self.sbatch_args, script_path]


def build(job_path: str, spec, state_dir: str, overlay: str | None, python: str, sbatch_args: Sequence[str] = (),
          signal_s: int = DEFAULT_SIGNAL_S) -> BatchScript:
    nodes = str(spec.min_nodes) if spec.min_nodes == spec.max_nodes else f"{spec.min_nodes}-{spec.max_nodes}"
    inv = f"slurm:{Path(overlay).resolve()}" if overlay else "slurm"
    return BatchScript(job_path=str(Path(job_path).resolve()), job_name=spec.name, nodes=nodes,
                       state_dir=str(Path(state_dir).resolve()), inventory=inv, python=python, signal_s=signal_s,
                       sbatch_args=tuple(sbatch_args))


def marker(root: Path, slurm_job_id: str) -> Path:
    """``<state>/slurm/<SLURM_JOB_ID>``: the clusterctl job id this Slurm job runs."""
    return root / "slurm" / slurm_job_id


def restart_count(env: Mapping[str, str]) -> int:
    v = env.get("SLURM_RESTART_COUNT", "0")
    return int(v) if v.isdigit() else 0
