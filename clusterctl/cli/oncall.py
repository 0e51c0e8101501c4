"""On a job's nodes: ``exec``, ``shell``, ``stacks``."""
from __future__ import annotations

import sys

import click

from clusterctl.cli.base import (
    Finite,
    accept_option,
    app,
    complete_hosts,
    complete_jobs,
    complete_nodes,
    connect_options,
    err,
    inventory_option,
    nonempty,
    out,
    output_option,
    print_json,
)


@app.command("exec")
@inventory_option
@click.option("--limit", default=None, callback=nonempty, shell_complete=complete_hosts,
              help="Hosts, groups, comma lists, ranges (gpu[01:04]), globs (node*); Ansible's ':&part' and "
                   "':!part' (as preflight --limit).")
@click.option("--job", default=None, callback=nonempty, help="Run on the nodes of this job's current attempt.")
@click.option("--node", default=None, callback=nonempty, shell_complete=complete_nodes,
              help="With --job: only this node.")
@click.option("--in-container", is_flag=True, help="With --job: inside the job's container (bare: in its directory).")
@click.option("--timeout", default=60.0, show_default=True, type=Finite(0.1, 86400),
              help="Seconds the command may run on each host.")
@output_option
@accept_option
@click.argument("command", nargs=-1, required=True, type=click.UNPROCESSED)
@click.pass_context
def exec_cmd(ctx, inventory, limit, job, node, in_container, timeout, output, accept_new, command) -> int:
    """Run COMMAND (after --) on every host, or on a job's nodes; identical results are grouped.

    The argv is quoted: no shell unless you write `sh -c '...'`. Exit 0 when every host exited 0, else 1."""
    from clusterctl.oncall import remote_exec
    from clusterctl.usecases import oncall as uoncall

    request = uoncall.ExecRequest(tuple(command), inventory, limit, job, node, in_container, timeout,
                                  connect_options(ctx, accept_new))
    results = uoncall.exec_on(ctx.obj.state_dir, request, notes=lambda note: err.print(f"note: {note}", markup=False))
    if output == "json":
        print_json([r.to_dict() for r in results])
    else:
        out.print(remote_exec.render(results), markup=False)
    return remote_exec.exit_code(results)


@app.command("shell")
@click.argument("job", shell_complete=complete_jobs)
@click.option("--node", default=None, callback=nonempty, shell_complete=complete_nodes,
              help="This node (default: the current attempt's rendezvous host).")
@accept_option
@click.pass_context
def shell_cmd(ctx, job, node, accept_new) -> int:
    """An interactive shell in JOB's container on a node (bare: on the host, in the job's directory).

    Exits with the shell's exit code; stdin may be a pipe (`echo 'nvidia-smi' | clusterctl shell JOB`)."""
    from clusterctl.usecases import oncall as uoncall

    tty = sys.stdin.isatty() and sys.stdout.isatty()
    return uoncall.shell(ctx.obj.state_dir, job, node, connect_options(ctx, accept_new), tty=tty)


@app.command("stacks")
@click.argument("job", shell_complete=complete_jobs)
@click.option("--node", default=None, callback=nonempty, shell_complete=complete_nodes,
              help="Only the ranks on this node.")
@output_option
@accept_option
@click.pass_context
def stacks_cmd(ctx, job, node, output, accept_new) -> int:
    """The Python stack of every rank of JOB's current attempt (py-spy), identical stacks grouped."""
    from clusterctl.launch import stacks
    from clusterctl.usecases import oncall as uoncall

    got = uoncall.stacks(ctx.obj.state_dir, job, node, connect_options(ctx, accept_new))
    if output == "json":
        print_json(stacks.to_json(got.found))
        for n, msg in got.errors.items():
            err.print(f"{n}: {msg}", markup=False)
    else:
        out.print(stacks.render(got.found, got.errors), markup=False)
    return 1 if got.errors or not got.found else 0
