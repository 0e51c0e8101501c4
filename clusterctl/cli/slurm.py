"""The Slurm commands: ``clusterctl sbatch`` and the script's own ``sbatch-run`` (hidden). Registered on the CLI's
click group by ``register(cli_module)`` (the module object, so ``python -m clusterctl.cli`` registers on its own
``__main__`` copy)."""
from __future__ import annotations

import os
import socket
import sys
from pathlib import Path

import click


def register(cli) -> None:
    app = cli.app

    @app.command("sbatch", context_settings={"ignore_unknown_options": True})
    @click.argument("job")
    @click.option("--overlay", default=None, help="Vars overlay YAML for -i slurm (see README, Slurm).")
    @click.option("--submit", is_flag=True, help="Submit the script with sbatch (prints the Slurm job id).")
    @click.option("--dry-run", is_flag=True, help="Print the batch script and the sbatch command; write nothing.")
    @click.option("--signal-s", default=120, show_default=True, type=click.IntRange(1, 86400),
                  help="Seconds before the time limit at which the script requeues the Slurm job.")
    @click.option("--script", "script_path", default=None,
                  help="Where to write the script (default <state>/slurm/<job name>.sbatch).")
    @cli.output_option
    @click.argument("sbatch_args", nargs=-1, type=click.UNPROCESSED)
    @click.pass_context
    def sbatch_cmd(ctx, job, overlay, submit, dry_run, signal_s, script_path, output, sbatch_args) -> int:
        """Write (--submit: and submit) a batch script that supervises JOB inside a Slurm allocation, with
        --requeue; a requeued run resumes the job from its newest valid checkpoint. Arguments after `--` go to
        sbatch (e.g. -- --time=2:00:00 --partition=gpu)."""
        from clusterctl.config.spec import load_job
        from clusterctl.errors import UserError
        from clusterctl.slurm import allocation as slurm
        from clusterctl.slurm import sbatch
        from clusterctl.store import paths

        spec = load_job(job)
        root = paths.state_dir(ctx.obj.state_dir)
        script = sbatch.build(job, spec, str(root), overlay, sys.executable, sbatch_args, signal_s)
        path = Path(script_path or Path(root) / "slurm" / f"{spec.name}.sbatch").resolve()
        text = script.render()
        argv = script.sbatch_argv(str(path))
        if dry_run:
            if output == "json":
                cli.print_json({"script": text, "path": str(path), "sbatch": argv})
            else:
                cli.out.print(text, markup=False, end="")
                cli.err.print("would submit: " + " ".join(argv), markup=False)
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
            cli.print_json(result)
        else:
            cli.err.print(f"wrote {path}", markup=False)
            if submit:
                cli.out.print(f"submitted Slurm job {result['slurm_job_id']}", markup=False)
            else:
                cli.err.print("submit it: " + " ".join(argv), markup=False)
        return 0

    @app.command("sbatch-run", hidden=True)
    @click.argument("job")
    @cli.inventory_option
    @click.pass_context
    def sbatch_run_cmd(ctx, job, inventory) -> int:
        """Inside the batch script: launch JOB (first run of this Slurm job) or resume it (a requeued run)."""
        from clusterctl import jobs
        from clusterctl.checks.report import render_table
        from clusterctl.errors import UserError
        from clusterctl.model.events import EventKind
        from clusterctl.slurm import sbatch
        from clusterctl.store.ledger import Ledger
        from clusterctl.store.state import JobState

        sjid = os.environ.get("SLURM_JOB_ID", "")
        if not sjid.isdigit():
            raise UserError("sbatch-run runs inside the script `clusterctl sbatch` writes (SLURM_JOB_ID not set)")
        count = sbatch.restart_count(os.environ)
        ws = jobs.open_workspace(ctx.obj.state_dir)
        marker = sbatch.marker(ws.root, sjid)
        where = f"Slurm job {sjid}, SLURM_RESTART_COUNT={count}, batch host {socket.gethostname()}"
        if marker.exists():
            job_id = marker.read_text().strip()
            j = ws.store.get_job(job_id)
            if j.state == JobState.SUCCEEDED:
                Ledger(ws.store).event(job_id, EventKind.SLURM_RUN, f"{where}: the job already SUCCEEDED; nothing "
                                                                    "to do")
                cli.err.print(f"job {j.name} already SUCCEEDED", markup=False)
                return 0
            hosts = jobs.load_context(job, inventory).hosts        # the hosts of this (new) allocation
            rec = Ledger(ws.store).record(j)
            names = {h.name for h in hosts}
            gone = tuple(h.name for h in rec.hosts if h.name not in names)
            # the old hosts stay in the record for one step: resume cleans up (or records that it could not)
            # the last attempt on them, then drops them (--exclude) and relaunches on this allocation's hosts
            Ledger(ws.store).record_changed(job_id, rec.replace(hosts=tuple(hosts) + tuple(
                h for h in rec.hosts if h.name in gone)))
            Ledger(ws.store).event(job_id, EventKind.SLURM_RUN, f"{where}: requeued run, resuming on "
                                                                f"{', '.join(h.name for h in hosts)}"
                                                                + (f" (leaving {', '.join(gone)})" if gone else ""))
            return ctx.invoke(cli.resume_cmd, job=job_id, exclude=gone, checkpoint=None, detach=False,
                              output="text", accept_new=False)
        request = jobs.LaunchRequest(job, inventory, cli.connect_options(ctx, False), environ=os.environ)
        launched = jobs.launch(ws, request)
        if isinstance(launched, jobs.PreflightFailed):
            render_table(launched.report, cli.err)
            cli.err.print("launch stopped: preflight failed", markup=False)
            return 1
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text(launched.job_id + "\n")
        Ledger(ws.store).event(launched.job_id, EventKind.SLURM_RUN, f"{where}: launched on "
                                                                     f"{', '.join(launched.nodes)}")
        cli.err.print(f"job {launched.job_id} launched on {', '.join(launched.nodes)}", markup=False)
        return cli._attach(ws, launched.job_id, launched.name, "text")
