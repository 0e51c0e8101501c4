"""The Slurm commands: ``clusterctl sbatch`` and the script's own ``sbatch-run`` (hidden)."""
from __future__ import annotations

import os

import click

from clusterctl.cli.base import app, connect_options, err, inventory_option, out, output_option, print_json
from clusterctl.cli.lifecycle import _attach


@app.command("sbatch", context_settings={"ignore_unknown_options": True})
@click.argument("job")
@click.option("--overlay", default=None, help="Vars overlay YAML for -i slurm (docs/slurm.md).")
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
    from clusterctl.usecases import slurm as uslurm

    got = uslurm.sbatch(ctx.obj.state_dir, job, overlay=overlay, sbatch_args=sbatch_args, signal_s=signal_s,
                        script_path=script_path, write=not dry_run, submit=submit)
    if dry_run:
        if output == "json":
            print_json({"script": got.script, "path": str(got.path), "sbatch": got.argv,
                        "gpus_per_node": got.gpus_per_node})
        else:
            out.print(got.script, markup=False, end="")
            err.print("would submit: " + " ".join(got.argv), markup=False)
        return 0
    if output == "json":
        print_json({"path": str(got.path), "sbatch": got.argv, "slurm_job_id": got.slurm_job_id})
    else:
        err.print(f"wrote {got.path}", markup=False)
        if submit:
            out.print(f"submitted Slurm job {got.slurm_job_id}", markup=False)
        else:
            err.print("submit it: " + " ".join(got.argv), markup=False)
    return 0


@app.command("sbatch-run", hidden=True)
@click.argument("job")
@inventory_option
@click.pass_context
def sbatch_run_cmd(ctx, job, inventory) -> int:
    """Inside the batch script: launch JOB (first run of this Slurm job) or resume it (a requeued run)."""
    from clusterctl.checks.report import render_table
    from clusterctl.usecases import lifecycle
    from clusterctl.usecases import slurm as uslurm

    got = uslurm.sbatch_run(ctx.obj.state_dir, job, inventory, os.environ, connect_options(ctx, False))
    ws, run = got.ws, got.run
    if run.action == "succeeded":
        err.print(f"job {run.name} already SUCCEEDED", markup=False)
        return 0
    if got.resumed is not None:
        outcome = got.resumed
        err.print(f"job {outcome.job_id}: {outcome.message}", markup=False)
        if outcome.pid is None or outcome.action == "already_supervised":
            return 0
        return _attach(ws, outcome.job_id, outcome.name, "text", from_start=False)
    launched = got.launched
    if isinstance(launched, lifecycle.PreflightFailed):
        render_table(launched.report, err)
        err.print("launch stopped: preflight failed", markup=False)
        return 1
    err.print(f"job {launched.job_id} launched on {', '.join(launched.nodes)}", markup=False)
    return _attach(ws, launched.job_id, launched.name, "text")
