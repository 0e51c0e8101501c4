"""``clusterctl sbatch JOB.yaml [-- SBATCH ARGS]``: the batch script that runs the supervisor inside the allocation.

The script (``render``: pure, what ``--dry-run`` prints is what is submitted) asks for the job's node count,
``--requeue`` (and not ``--no-kill``: with it, Slurm 22.05 removes even the batch host from the job when that node
fails and kills the batch step, leaving an allocation with nothing running in it until its time limit; without it,
any node failure requeues the whole Slurm job, and the next run resumes), and ``--signal=B:USR1@<s>`` so the batch
shell hears of the time limit before it hits: the trap requeues the Slurm job, and the next run resumes. Every run of the script executes ``clusterctl sbatch-run`` (``run``
here): the first run of a Slurm job writes ``<state>/slurm/<SLURM_JOB_ID>`` (the marker) *before* it launches:
``launching NAME SINCE`` (atomically: a temporary file renamed), then the clusterctl job id once launched. A later
run of the same Slurm job (requeued after its supervisor's node died, a node failure, or the time-limit trap)
finds the marker and resumes the same job record (``resume`` semantics: newest valid checkpoint) on the hosts of
the new allocation; a marker still ``launching`` names the job of that name recorded since (a requeue between the
launch and the marker's job id resumes it, never launches a second job), or none (launched again). Each run
records an event with ``SLURM_JOB_ID`` and ``SLURM_RESTART_COUNT``. The state dir must be on storage every node sees (it is given to the
script as an absolute path).
"""
from __future__ import annotations

import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from clusterctl.config.yamlfile import line_of, load_yaml_with_lines
from clusterctl.errors import InputError
from clusterctl.slurm.guard import MODULE as GUARD_MODULE
from clusterctl.slurm.guard import write_atomically
from clusterctl.transport.srun import EXPORT

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
    gpus_per_node: int | None = None      # ``--gpus-per-node`` (``gpus_per_node``: the job's GPUs, when known)

    def render(self) -> str:
        q = shlex.quote
        run = [self.python, "-m", "clusterctl.cli", "--state-dir", self.state_dir, "sbatch-run", self.job_path,
               "-i", self.inventory]
        srun = ["srun", "--overlap", "--ntasks-per-node=1", "--kill-on-bad-exit=0", "--quiet",
                "--export=" + ",".join(EXPORT)]
        guard = [self.python, "-m", GUARD_MODULE, self.state_dir]
        return "\n".join([
            "#!/bin/bash",
            f"#SBATCH --job-name={q(self.job_name)}",
            f"#SBATCH --nodes={self.nodes}",
            "#SBATCH --ntasks-per-node=1",
            *([f"#SBATCH --gpus-per-node={int(self.gpus_per_node)}"] if self.gpus_per_node else []),
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
            "# one guard per node: when this allocation ends (the job ends, is requeued or cancelled), it removes",
            "# what the job left on its node (containers and detached processes outside Slurm's steps)",
            f'{shlex.join(srun)} --nodes="${{SLURM_JOB_NUM_NODES}}" {shlex.join(guard)} "${{SLURM_JOB_ID}}" &',
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
                       sbatch_args=tuple(sbatch_args),
                       gpus_per_node=gpus_per_node(job_path, spec, overlay, sbatch_args))


def asks_for_gpus(sbatch_args: Sequence[str]) -> bool:
    """Do the user's own sbatch arguments request GPUs (``--gpus*``, ``-G``, ``--gres=gpu...``)?"""
    return any(a.startswith(("--gpus", "-G")) or (a.startswith("--gres") and "gpu" in a) for a in sbatch_args)


def overlay_gpus(overlay: str | None) -> tuple[Any, int]:
    """The overlay's ``all: vars: clusterctl_gpus`` (the GPUs of every allocated node) and its line; (None, 0)."""
    if not overlay:
        return None, 0
    data = load_yaml_with_lines(overlay)
    top = data.get("all") if isinstance(data, dict) else None
    gvars = top.get("vars") if isinstance(top, dict) else None
    if not isinstance(gvars, dict) or "clusterctl_gpus" not in gvars:
        return None, 0
    return gvars["clusterctl_gpus"], line_of(gvars, "clusterctl_gpus")


def gpus_per_node(job_path: str, spec, overlay: str | None, sbatch_args: Sequence[str] = ()) -> int | None:
    """The ``--gpus-per-node`` the script asks for: the overlay's ``clusterctl_gpus`` (the inventory's GPU count:
    under ``-i slurm`` the overlay's vars are the inventory's); None when it is 0 or unset, or when the sbatch
    arguments ask for GPUs themselves. ``nproc_per_node: gpu`` without a count is an error (exit 2): Slurm would
    give the job no GPU, and the ranks would count the node's."""
    if asks_for_gpus(sbatch_args):
        return None
    count, line = overlay_gpus(overlay)
    if count is not None and (isinstance(count, bool) or not isinstance(count, int) or count < 0):
        raise InputError(str(overlay), line, f"expected a GPU count (an integer >= 0), got {count!r}",
                         key="all.vars.clusterctl_gpus")
    if spec.nproc_per_node == "gpu" and not count:
        raise InputError(job_path, line_of(load_yaml_with_lines(job_path), "nproc_per_node") or 1,
                         "nproc_per_node: gpu under sbatch needs the nodes' GPU count to ask Slurm for: set "
                         "clusterctl_gpus in the overlay's all: vars (--overlay), or pass it to sbatch "
                         "(-- --gpus-per-node=N)", key="nproc_per_node")
    return count or None


def marker(root: Path, slurm_job_id: str) -> Path:
    """``<state>/slurm/<SLURM_JOB_ID>``: the clusterctl job id this Slurm job runs (``launching NAME SINCE`` while
    its first run launches)."""
    return root / "slurm" / slurm_job_id


@dataclass(frozen=True)
class Marker:
    job_id: str | None          # the clusterctl job; None: a run was launching ``name`` since ``since``
    name: str | None = None
    since: float = 0.0


LAUNCHING = "launching"


def read_marker(path: Path) -> Marker | None:
    """None: no run of this Slurm job got as far as launching."""
    try:
        words = path.read_text().split()
    except FileNotFoundError:
        return None
    if len(words) == 3 and words[0] == LAUNCHING:
        try:
            return Marker(None, words[1], float(words[2]))
        except ValueError:
            pass
    if len(words) != 1:
        raise InputError(str(path), 1, "not a clusterctl sbatch marker (a job id, or `launching NAME SINCE`): "
                                       "move it aside")
    return Marker(words[0])


def write_marker(path: Path, text: str) -> None:
    """Replace the marker atomically (a reader sees the old text or the new, never a part): a temporary file in
    the same directory, flushed to the disk, renamed over it."""
    write_atomically(path, text + "\n")


def launching(name: str, since: float) -> str:
    return f"{LAUNCHING} {name} {since!r}"


def restart_count(env: Mapping[str, str]) -> int:
    v = env.get("SLURM_RESTART_COUNT", "0")
    return int(v) if v.isdigit() else 0
