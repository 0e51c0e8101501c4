"""On a job's nodes: ``exec``, ``shell``, ``stacks``."""
from __future__ import annotations

import sys

import click

from clusterctl.cli.base import (
    Finite,
    accept_option,
    app,
    check_key_files,
    complete_hosts,
    complete_jobs,
    complete_nodes,
    connect_options,
    err,
    inventory_option,
    load_hosts,
    nonempty,
    out,
    output_option,
    print_json,
)


def _job_nodes(ctx, job):
    from clusterctl import jobs

    return jobs.job_nodes(jobs.open_workspace(ctx.obj.state_dir), job)


@app.command("exec")
@inventory_option
@click.option("--limit", default=None, callback=nonempty, shell_complete=complete_hosts,
              help="Hosts, groups, comma lists, globs (as preflight --limit).")
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
    from clusterctl.errors import UserError
    from clusterctl.oncall import remote_exec
    from clusterctl.transport import connect

    wrap = None
    if job:   # (imports per branch: the job's record needs pydantic, a plain exec does not)
        from clusterctl.oncall import jobnodes

        if limit or inventory:
            raise UserError("--job takes its hosts from the job: use --node instead of --limit/-i")
        jn = _job_nodes(ctx, job)
        hosts = [jn.host(n) for n in jn.pick(node)]
        if in_container:
            wrap = lambda h, argv: jobnodes.in_job_argv(jn, h.name, argv)  # noqa: E731
    else:
        from clusterctl.config import hostpattern

        if node or in_container:
            raise UserError("--node and --in-container need --job")
        hosts = hostpattern.select(load_hosts(inventory), limit)
    check_key_files(hosts)
    results = remote_exec.run(hosts, list(command), connect=connect, options=connect_options(ctx, accept_new),
                              timeout=timeout, wrap=wrap)
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
    from clusterctl.oncall import shell
    from clusterctl.transport import connect

    jn = _job_nodes(ctx, job)
    target = jn.pick(node or jn.rdzv_host)[0]
    host = jn.host(target)
    check_key_files([host])
    tty = sys.stdin.isatty() and sys.stdout.isatty()
    t = connect(host, connect_options(ctx, accept_new))
    try:
        return shell.run(t, shell.argv(jn, target, tty=tty), tty=tty)
    finally:
        t.close()


@app.command("stacks")
@click.argument("job", shell_complete=complete_jobs)
@click.option("--node", default=None, callback=nonempty, shell_complete=complete_nodes,
              help="Only the ranks on this node.")
@output_option
@accept_option
@click.pass_context
def stacks_cmd(ctx, job, node, output, accept_new) -> int:
    """The Python stack of every rank of JOB's current attempt (py-spy), identical stacks grouped."""
    from clusterctl.oncall import stacks
    from clusterctl.transport import connect

    jn = _job_nodes(ctx, job)
    nodes = jn.pick(node)
    check_key_files([jn.host(n) for n in nodes])
    options = connect_options(ctx, accept_new)
    transports: dict = {}

    def run_on(n):
        transports[n] = connect(jn.host(n), options)
        return transports[n].run

    try:
        found, errors = stacks.collect(nodes, run_on, jn.job.job_id, jn.attempt)
    finally:
        for t in transports.values():
            t.close()
    if output == "json":
        print_json(stacks.to_json(found))
        for n, msg in errors.items():
            err.print(f"{n}: {msg}", markup=False)
    else:
        out.print(stacks.render(found, errors), markup=False)
    return 1 if errors or not found else 0
