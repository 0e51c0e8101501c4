"""The Slurm commands: ``clusterctl sbatch`` and the script's own ``sbatch-run`` (hidden)."""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import click

from clusterctl.cli.base import app, connect_options, err, inventory_option, out, output_option, print_json
from clusterctl.cli.lifecycle import _attach


@app.command("sbatch", context_settings={"ignore_unknown_options": True})
@click.argument("job")
@click.option("--overlay", default=None, help="Vars overlay YAML for -i slurm (see README, Slurm).")
@click.option("--submit", is_flag=True, help="Submit the script with sbatch (prints the Slurm job id).")
@click.option("--dry-run", is_flag=True, help="Print the batch script and the sbatch command; write nothing.")
@click.option("--signal-s", default=120, show_default=True, type=click.IntRange(1, 86400),
              help="Seconds before the time limit at which the script requeues the Slurm job.")
@click.option("--script", "script_path", default=None,
              help="Where to write the script (default <state>/slurm/<job name>.sbatch).")
@output_option
@click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
@click.pass_context
def sbatch_cmd(ctx, job, overlay, submit, dry_run, signal_s, script_path, output, sbatch_args) -> int:
    """Write (--submit: and submit) a batch script that supervises JOB inside a Slurm allocation, with
    --requeue; a requeued run resumes the job from its newest valid checkpoint. Arguments after `--` go to
    sbatch (e.g. -- --time=2:00:00 --partition=gpu)."""
    from clusterctl import jobs
    from clusterctl.config.spec import load_job
    from clusterctl.errors import UserError
    from clusterctl.slurm import allocation as slurm
    from clusterctl.slurm import sbatch

    spec = load_job(job)
    root = jobs.state_root(ctx.obj.state_dir)
    script = sbatch.build(job, spec, str(root), overlay, sys.executable, sbatch_args, signal_s)
    path = Path(script_path or Path(root) / "slurm" / f"{spec.name}.sbatch").resolve()
    text = script.render()
    argv = script.sbatch_argv(str(path))
    if dry_run:
        if output == "json":
            print_json({"script": text, "path": str(path), "sbatch": argv, "gpus_per_node": script.gpus_per_node})
        else:
            out.print(text, markup=False, end="")
            err.print("would submit: " + " ".join(argv), markup=False)
        return 0
    path.parent.mkdir(parents=True, exist_ok=True)
    (Path(root) / "slurm").mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    result = {"path": str(path), "sbatch": argv, "slurm_job_id": None}
    if submit:
        r = slurm.run_cmd(argv, 60.0)
        if r.returncode != 0:
            raise UserError(f"sbatch failed: {r.stderr.strip() or r.stdout.strip()}")
        result["slurm_job_id"] = r.stdout.strip().split(";")[0]
    if output == "json":
        print_json(result)
    else:
        err.print(f"wrote {path}", markup=False)
        if submit:
            out.print(f"submitted Slurm job {result['slurm_job_id']}", markup=False)
        else:
            err.print("submit it: " + " ".join(argv), markup=False)
    return 0

@app.command("sbatch-run", hidden=True)
@click.argument("job")
@inventory_option
@click.pass_context
def sbatch_run_cmd(ctx, job, inventory) -> int:
    """Inside the batch script: launch JOB (first run of this Slurm job) or resume it (a requeued run)."""
    from clusterctl import jobs
    from clusterctl.checks.report import render_table
    from clusterctl.errors import UserError
    from clusterctl.slurm import sbatch

    sjid = os.environ.get("SLURM_JOB_ID", "")
    if not sjid.isdigit():
        raise UserError("sbatch-run runs inside the script `clusterctl sbatch` writes (SLURM_JOB_ID not set)")
    where = (f"Slurm job {sjid}, SLURM_RESTART_COUNT={sbatch.restart_count(os.environ)}, batch host "
             f"{socket.gethostname()}")
    ws = jobs.open_workspace(ctx.obj.state_dir)
    run = jobs.slurm_run(ws, job, inventory, sjid, where, restart=sbatch.restart_count(os.environ))
    if run.action == "succeeded":
        err.print(f"job {run.name} already SUCCEEDED", markup=False)
        return 0
    if run.action == "resume":      # the hosts that left: srun cannot reach them; their guards' word is recorded
        outcome = jobs.resume(ws, jobs.ResumeRequest(run.job_id, connect_options(ctx, False), run.leaving,
                                                     cleaned=run.leaving))
        err.print(f"job {outcome.job_id}: {outcome.message}", markup=False)
        if outcome.pid is None or outcome.action == "already_supervised":
            return 0
        return _attach(ws, outcome.job_id, outcome.name, "text", from_start=False)
    request = jobs.LaunchRequest(job, inventory, connect_options(ctx, False), environ=os.environ)
    launched = jobs.launch(ws, request)
    if isinstance(launched, jobs.PreflightFailed):
        render_table(launched.report, err)
        err.print("launch stopped: preflight failed", markup=False)
        return 1
    jobs.slurm_launched(ws, sjid, launched, where)
    err.print(f"job {launched.job_id} launched on {', '.join(launched.nodes)}", markup=False)
    return _attach(ws, launched.job_id, launched.name, "text")
