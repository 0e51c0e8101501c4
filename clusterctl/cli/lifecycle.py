"""A job's life: ``launch`` (and attaching to it), ``stop``, ``resume``, ``forget``, and the supervisor's command
line of the release before (``_supervise``, accepted for a release)."""
from __future__ import annotations

import dataclasses

import click

from clusterctl.cli.base import (
    Finite,
    accept_option,
    app,
    complete_jobs,
    complete_nodes,
    connect_options,
    err,
    inventory_option,
    nonempty,
    out,
    output_option,
    print_json,
    progress_bar,
    with_unset_secrets,
)


def launch_overrides(name: str | None, nodes: str | None, env: tuple, script_args: tuple = ()) -> dict:
    """`launch --name/--nodes/--env K=V [-- ARGS]` as job-file keys (validated with the job file; ARGS follow
    the file's ``args``)."""
    out: dict = {"args": list(script_args)} if script_args else {}
    if name is not None:
        out["name"] = name
    if nodes is not None:
        out["nodes"] = int(nodes) if nodes.isdigit() else nodes
    pairs = {}
    for item in env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{item!r}: expected K=V", param_hint="--env")
        pairs[key] = value
    if pairs:
        out["env"] = pairs
    return out


@app.command("launch")
@click.argument("job", type=click.Path())
@inventory_option
@click.option("--dry-run", is_flag=True, help="Print the per-node plan (secrets as ***) and a warning per problem "
                                               "launch would refuse (unset secret variables, key files); exit 0.")
@click.option("--strict", is_flag=True, help="With --dry-run: exit 2 when there is any such problem.")
@click.option("--detach", "-d", is_flag=True, help="Return once the job is started; the supervisor runs on.")
@click.option("--skip-preflight", is_flag=True, help="Skip the quick preflight of the chosen hosts.")
@click.option("--name", "name_override", default=None, help="Override the job file's name.")
@click.option("--nodes", "nodes_override", default=None, help="Override the job file's nodes (4, or MIN:MAX).")
@click.option("--env", "env_override", multiple=True, metavar="K=V",
              help="Add or override an env entry (repeatable; not for secrets: use secret_env).")
@output_option
@accept_option
@click.argument("script_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- SCRIPT_ARGS...]")
@click.pass_context
def launch_cmd(ctx, job, inventory, dry_run, strict, detach, skip_preflight, name_override, nodes_override,
               env_override, output, accept_new, script_args) -> int:
    """Start JOB (a job YAML) on the inventory's hosts and supervise it. Arguments after `--` go to the script,
    after the job file's `args` (`clusterctl launch job.yaml -- --lr 0.1`)."""
    import os

    from clusterctl.checks.report import render_table
    from clusterctl.usecases import lifecycle
    from clusterctl.usecases.base import open_workspace

    ws = open_workspace(ctx.obj.state_dir)
    request = lifecycle.LaunchRequest(job, inventory, connect_options(ctx, accept_new), skip_preflight=skip_preflight,
                                 environ=os.environ, overrides=launch_overrides(name_override, nodes_override,
                                                                                env_override, script_args))
    if dry_run:   # needs no secret values: they show as ***
        with with_unset_secrets(job, os.environ):
            dry = lifecycle.dry_run(ws, request)
        if output == "json":
            print_json({**dry.plan.to_dict(), "warnings": [str(p) for p in dry.problems]})
        else:
            out.print(dry.plan.render(), markup=False)
        for p in dry.problems:
            err.print(f"warning: {p}", markup=False)
        return 2 if strict and dry.problems else 0
    with progress_bar(not skip_preflight and output != "json") as progress:
        launched = lifecycle.launch(ws, request, on_progress=progress)
    if isinstance(launched, lifecycle.PreflightFailed):
        render_table(launched.report, err)
        err.print("launch stopped: preflight failed (fix the above, or --skip-preflight)", markup=False)
        return 1
    for detail, hint in launched.warnings:
        err.print(f"warning: {detail}" + (f"\n  {hint}" if hint else ""), markup=False)
    if output == "json" and detach:
        print_json({"job_id": launched.job_id, "name": launched.name, "supervisor_pid": launched.supervisor_pid})
        return 0
    err.print(f"job {launched.job_id} launched on {', '.join(launched.nodes)} (supervisor pid "
              f"{launched.supervisor_pid})" + (f"; spares {', '.join(launched.spares)}" if launched.spares else ""),
              markup=False)
    for host, why in launched.excluded:
        err.print(f"excluded {host}: cordoned: {why}", markup=False)
    if detach:
        err.print(f"follow it: clusterctl logs -f {launched.name}   stop it: clusterctl stop {launched.name}",
                  markup=False)
        return 0
    return _attach(ws, launched.job_id, launched.name, output)


def _attach(ws, job_id, name, output, extra=None, from_start=True) -> int:
    from clusterctl.store.state import JobState
    from clusterctl.usecases import lifecycle
    from clusterctl.views.logs import for_terminal

    stream = err if output == "json" else out    # -o json: stdout is the final view alone; the logs on stderr
    try:
        ended = lifecycle.attach(ws, job_id, lambda line: stream.print(for_terminal(line), markup=False),
                            from_start=from_start)
    except KeyboardInterrupt:
        err.print(f"\ndetached; job {name} keeps running. Re-attach: clusterctl logs -f {name}   "
                  f"stop: clusterctl stop {name}", markup=False)
        return 0
    view = ended.view
    if output == "json":
        print_json({**(extra or {}), **view})
    else:
        err.print(f"job {name}: {ended.state.value}" + (f" ({view['reason']})" if view["reason"] else ""),
                  markup=False)
    return 0 if ended.state == JobState.SUCCEEDED else 1


@app.command("_supervise", hidden=True)
@click.argument("job_id")
@click.option("--adopt", is_flag=True)
@click.pass_context
def supervise_cmd(ctx, job_id, adopt) -> int:
    """A job's supervisor as the release before started it (``clusterctl --state-dir DIR _supervise JOB_ID``);
    today's is ``python -m clusterctl.supervise``. Accepted for one release."""
    from clusterctl.store.state import JobState
    from clusterctl.usecases import lifecycle

    state = lifecycle.supervise(ctx.obj.state_dir, job_id, connect_options(ctx), adopt=adopt,
                           echo=lambda m: print(m, flush=True))
    return 0 if state == JobState.SUCCEEDED else 1


@app.command("stop")
@click.argument("job", shell_complete=complete_jobs)
@click.option("--grace", default=10.0, show_default=True, type=Finite(0, 3600),
              help="Seconds between SIGTERM and kill (0-3600).")
@output_option
@accept_option
@click.pass_context
def stop_cmd(ctx, job, grace, output, accept_new) -> int:
    """SIGTERM torchrun on every node, kill after --grace, remove exactly this job's containers."""
    from clusterctl.usecases import lifecycle
    from clusterctl.usecases.base import open_workspace

    stopped = lifecycle.stop(open_workspace(ctx.obj.state_dir), job, connect_options(ctx, accept_new), grace_s=grace)
    if output == "json":
        print_json({"job_id": stopped.job_id, "state": stopped.state.value,
                    "errors": {node: e.message for node, e in stopped.errors.items()}})
    else:
        for node, e in stopped.errors.items():
            err.print(f"{node}: could not clean up: {e.message}", markup=False)
        err.print(f"job {stopped.job_id}: {stopped.state.value}", markup=False)
    return 1 if stopped.errors else 0


@app.command("resume")
@click.argument("job", shell_complete=complete_jobs)
@click.option("--exclude", multiple=True, callback=nonempty, shell_complete=complete_nodes,
              help="Do not use this host (repeatable).")
@click.option("--checkpoint", default=None, callback=nonempty,
              help="Resume from this checkpoint instead of the latest valid one.")
@click.option("--detach", "-d", is_flag=True,
              help="Return once the job is relaunched (or re-attached); the supervisor runs on.")
@output_option
@accept_option
@click.pass_context
def resume_cmd(ctx, job, exclude, checkpoint, detach, output, accept_new) -> int:
    """Bring a job back: re-attach if it still runs, else relaunch from its newest valid checkpoint. A job that
    finished well while unsupervised becomes SUCCEEDED; nothing is relaunched."""
    from clusterctl.usecases import lifecycle
    from clusterctl.usecases.base import open_workspace

    ws = open_workspace(ctx.obj.state_dir)
    request = lifecycle.ResumeRequest(job, connect_options(ctx, accept_new), tuple(exclude), checkpoint)
    outcome = lifecycle.resume(ws, request)
    for host, why in outcome.excluded:
        err.print(f"excluded {host}: cordoned: {why}", markup=False)
    err.print(f"job {outcome.job_id}: {outcome.message}", markup=False)
    extra = {"job_id": outcome.job_id, "outcome": outcome.action, "message": outcome.message,
             "supervisor_pid": outcome.pid}
    if detach or outcome.pid is None or outcome.action == "already_supervised":
        if output == "json":
            print_json({**extra, "state": outcome.state.value})
        return 0
    return _attach(ws, outcome.job_id, outcome.name, output, extra=extra, from_start=False)


@app.command("forget")
@click.argument("jobs", nargs=-1, required=True)
@click.option("--nodes", "on_nodes", is_flag=True,
              help="Also remove each job's directory on the nodes it ran on (node logs, exit files).")
@output_option
@accept_option
@click.pass_context
def forget_cmd(ctx, jobs, on_nodes, output, accept_new) -> int:
    """Delete finished jobs' records and controller-side logs (never checkpoints, never an active job); with
    --nodes also their directories on the nodes."""
    from clusterctl.usecases import lifecycle
    from clusterctl.usecases.base import open_workspace

    done = lifecycle.forget(open_workspace(ctx.obj.state_dir), jobs, nodes=on_nodes,
                           options=connect_options(ctx, accept_new))
    if output == "json":
        print_json({"forgotten": [dataclasses.asdict(f) for f in done]})
    else:
        for f in done:
            err.print(f"forgot {f.job_id}: its records and controller-side logs"
                      + (f", its directory on {', '.join(f.nodes_cleaned)}" if f.nodes_cleaned else "")
                      + (f" (checkpoints in {f.checkpoint_dir_kept} are kept)" if f.checkpoint_dir_kept else ""),
                      markup=False)
            for node, why in f.node_errors.items():
                err.print(f"{node}: its directory of {f.job_id} may remain: {why}", markup=False)
    return 1 if any(f.node_errors for f in done) else 0
