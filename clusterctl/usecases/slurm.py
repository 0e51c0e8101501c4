"""The Slurm commands (``cli.slurm``): ``sbatch`` (the batch script), and ``sbatch-run``'s runs: the first
launches, a requeued one resumes; the Slurm guard's plan of what to remove when the allocation ends."""
from __future__ import annotations

import socket
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence, Union

from clusterctl.errors import UserError
from clusterctl.model.events import EventKind
from clusterctl.store.ledger import Ledger
from clusterctl.store.state import JobState
from clusterctl.transport import ConnectOptions
from clusterctl.usecases.base import Workspace, open_workspace, state_root
from clusterctl.usecases.context import load_context
from clusterctl.usecases.lifecycle import (
    LaunchRequest,
    Launched,
    PreflightFailed,
    Resumed,
    ResumeRequest,
    launch,
    resume,
)


@dataclass(frozen=True)
class Sbatch:
    script: str                          # the batch script's text
    path: Path                           # where it is (or, not written, would be) written
    argv: list[str]                      # the sbatch command line that submits it
    gpus_per_node: Any = None
    slurm_job_id: str | None = None      # submitted: Slurm's job id


def sbatch(state_dir: str | None, job_path: str, *, overlay: str | None, sbatch_args: Sequence[str],
           signal_s: int, script_path: str | None = None, write: bool = True, submit: bool = False,
           python: str = sys.executable) -> Sbatch:
    """``sbatch``: the batch script that supervises the job inside a Slurm allocation (``slurm.sbatch``), written
    (mode 755; default ``<state>/slurm/<job name>.sbatch``) unless not ``write`` (``--dry-run``), and with
    ``submit`` submitted (``UserError`` when sbatch refuses)."""
    from clusterctl.config.spec import load_job
    from clusterctl.slurm import allocation
    from clusterctl.slurm import sbatch as sbatch_mod

    spec = load_job(job_path)
    root = state_root(state_dir)
    script = sbatch_mod.build(job_path, spec, str(root), overlay, python, sbatch_args, signal_s)
    path = Path(script_path or Path(root) / "slurm" / f"{spec.name}.sbatch").resolve()
    out = Sbatch(script.render(), path, script.sbatch_argv(str(path)), script.gpus_per_node)
    if not write:
        return out
    path.parent.mkdir(parents=True, exist_ok=True)
    (Path(root) / "slurm").mkdir(parents=True, exist_ok=True)
    path.write_text(out.script)
    path.chmod(0o755)
    if not submit:
        return out
    r = allocation.run_cmd(out.argv, 60.0)
    if r.returncode != 0:
        raise UserError(f"sbatch failed: {r.stderr.strip() or r.stdout.strip()}")
    return Sbatch(out.script, path, out.argv, out.gpus_per_node, r.stdout.strip().split(";")[0])


@dataclass(frozen=True)
class SbatchRun:
    ws: Workspace
    run: SlurmRun
    resumed: Resumed | None = None                              # action resume
    launched: Union[Launched, PreflightFailed, None] = None     # action launch


def sbatch_run(state_dir: str | None, job_path: str, inventory: str | None, environ: Mapping[str, str],
               options: ConnectOptions) -> SbatchRun:
    """``sbatch-run``, inside the batch script: launch the job (the first run of this Slurm job) or resume it (a
    requeued run) on this allocation's hosts; nothing when it already SUCCEEDED."""
    from clusterctl.slurm import sbatch as sbatch_mod

    sjid = environ.get("SLURM_JOB_ID", "")
    if not sjid.isdigit():
        raise UserError("sbatch-run runs inside the script `clusterctl sbatch` writes (SLURM_JOB_ID not set)")
    restart = sbatch_mod.restart_count(environ)
    where = f"Slurm job {sjid}, SLURM_RESTART_COUNT={restart}, batch host {socket.gethostname()}"
    ws = open_workspace(state_dir)
    run = slurm_run(ws, job_path, inventory, sjid, where, restart=restart)
    if run.action == "succeeded":
        return SbatchRun(ws, run)
    if run.action == "resume":      # the hosts that left: srun cannot reach them; their guards' word is recorded
        return SbatchRun(ws, run, resumed=resume(ws, ResumeRequest(run.job_id, options, run.leaving,
                                                                   cleaned=run.leaving)))
    launched = launch(ws, LaunchRequest(job_path, inventory, options, environ=environ))
    if not isinstance(launched, PreflightFailed):
        slurm_launched(ws, sjid, launched, where)
    return SbatchRun(ws, run, launched=launched)


@dataclass(frozen=True)
class SlurmRun:
    action: str                          # launch (the first run of this Slurm job) | resume | succeeded
    job_id: str | None = None
    name: str | None = None
    leaving: tuple[str, ...] = ()        # the last allocation's hosts this one lacks (resume --exclude)


def slurm_run(ws: Workspace, job_path: str, inventory: str | None, slurm_job_id: str, where: str,
              restart: int = 0) -> SlurmRun:
    """One run of the sbatch script: the first run of a Slurm job marks it ``launching`` and launches; a requeued
    one (its marker names the clusterctl job, or the job of that name recorded since it was marked) resumes that
    job on this allocation's hosts, or does nothing when it already SUCCEEDED. The hosts of the last run that this
    allocation lacks leave with it (``leaving``: ``resume --exclude``; ``srun`` cannot reach them now, so resume
    does not try to clean them): their Slurm guards (``slurm.guard``) removed the job from them when that run
    ended (a ``cleanup`` event each), or ``cleanup_pending`` says why not."""
    from clusterctl.config.spec import load_job
    from clusterctl.slurm import guard, sbatch

    path = sbatch.marker(ws.root, slurm_job_id)
    m = sbatch.read_marker(path)
    if m is None:          # the first run: marked before anything is launched (a requeue from here on finds it)
        sbatch.write_marker(path, sbatch.launching(load_job(job_path).name, ws.store.now()))
        return SlurmRun("launch")
    if m.job_id is None:   # a run was launching: the job of that name it recorded since, if it got that far
        since = sorted((j for j in ws.store.list_jobs(name=m.name) if j.created_at >= m.since),
                       key=lambda j: j.created_at)
        if not since:
            return SlurmRun("launch")
        sbatch.write_marker(path, since[0].job_id)
    ledger = Ledger(ws.store)
    j = ws.store.get_job(m.job_id or since[0].job_id)
    if j.state == JobState.SUCCEEDED:
        ledger.event(j.job_id, EventKind.SLURM_RUN, f"{where}: the job already SUCCEEDED; nothing to do")
        return SlurmRun("succeeded", j.job_id, j.name)
    hosts = load_context(job_path, inventory).hosts        # the hosts of this (new) allocation
    rec = ledger.record(j)
    names = {h.name for h in hosts}
    gone = tuple(h.name for h in rec.hosts if h.name not in names)
    # the old hosts stay in the record for one step (the last attempt's nodes are observed by name); resume
    # drops them (--exclude) and relaunches on this allocation's hosts
    ledger.record_changed(j.job_id, rec.replace(hosts=tuple(hosts) + tuple(h for h in rec.hosts if h.name in gone)))
    ledger.event(j.job_id, EventKind.SLURM_RUN, f"{where}: requeued run, resuming on "
                                                f"{', '.join(h.name for h in hosts)}"
                                                + (f" (leaving {', '.join(gone)})" if gone else ""))
    for node in gone:
        report = guard.read_report(ws.root, slurm_job_id, node)
        if report is not None and (report.get("restart") != restart - 1 or report.get("job_id") != j.job_id):
            report = None                        # another run's, or from before the job was launched
        if report is not None and report.get("ok"):
            ledger.event(j.job_id, EventKind.CLEANUP, f"{node} left the allocation: its Slurm guard removed the "
                                                      f"job's processes there when the last run ended", node=node)
        else:
            why = (f"its Slurm guard could not remove them: {report.get('detail')}" if report is not None else
                   "its Slurm guard did not report (the node went down with the allocation?)")
            ledger.event(j.job_id, EventKind.CLEANUP_PENDING, f"could not clean up {node}: it left the allocation "
                                                              f"and {why}", node=node)
    slurm_guard_plan(ws, slurm_job_id, j.job_id)
    return SlurmRun("resume", j.job_id, j.name, gone)


def slurm_guard_plan(ws: Workspace, slurm_job_id: str, job_id: str) -> None:
    """What each node's Slurm guard runs when this allocation ends (``slurm.guard``): the job's removal commands,
    as ``stop`` runs them (its containers or bare runners, and its zygotes)."""
    from clusterctl.launch import runtimes
    from clusterctl.slurm import guard

    commands = {}
    for h in Ledger(ws.store).record(ws.store.get_job(job_id)).hosts:
        rt = runtimes.get(h.runtime)
        commands[h.name] = [rt.remove_job_argv(job_id, jobs_root=runtimes.jobs_root_for(runtimes.DEFAULT_JOBS_ROOT,
                                                                                       h.name)),
                            rt.zygote_remove_argv(job_id)]
    guard.write_plan(ws.root, slurm_job_id, job_id, commands)


def slurm_launched(ws: Workspace, slurm_job_id: str, launched: Launched, where: str) -> None:
    """The first run launched ``launched``: the marker a requeued run finds, and the ``slurm_run`` event."""
    from clusterctl.slurm import sbatch

    sbatch.write_marker(sbatch.marker(ws.root, slurm_job_id), launched.job_id)
    slurm_guard_plan(ws, slurm_job_id, launched.job_id)
    Ledger(ws.store).event(launched.job_id, EventKind.SLURM_RUN, f"{where}: launched on {', '.join(launched.nodes)}")
