"""``preflight``: every host checked before a launch."""
from __future__ import annotations

import sys

import click

from clusterctl.cli.base import (
    accept_option,
    app,
    check_key_files,
    complete_hosts,
    connect_options,
    inventory_option,
    load_hosts,
    nonempty,
    out,
    output_option,
    progress_bar,
)


@app.command("preflight")
@inventory_option
@click.argument("job", required=False, type=click.Path())
@click.option("--limit", default=None, callback=nonempty, shell_complete=complete_hosts,
              help="Hosts, groups, comma lists, the inventory's ranges (gpu[01:04]) and globs (node*).")
@output_option
@click.option("--strict", is_flag=True, help="Warnings fail too.")
@click.option("--pull", is_flag=True, help="Pull the image where it is missing instead of failing.")
@accept_option
@click.pass_context
def preflight_cmd(ctx, inventory, job, limit, output, strict, pull, accept_new) -> int:
    """Check every host before a launch; every failure says how to fix it."""
    from clusterctl import jobs
    from clusterctl.checks.job import PreflightJob, PreflightOptions
    from clusterctl.checks.preflight import run_preflight
    from clusterctl.checks.report import render_table
    from clusterctl.checks.results import exit_code
    from clusterctl.transport import connect

    if job:   # checked against the job (nodes, nproc_per_node: exit 2 at the job file's line); its hosts, or all
        jc = jobs.load_context(job, inventory)
        spec, inv = jc.spec, jc.inventory
        hosts = list(jc.hosts) if spec.hosts else list(inv.hosts)
    else:
        spec, inv = None, load_hosts(inventory)
        hosts = list(inv.hosts)
    if limit:  # filters, keeping the job's (or inventory's) order: the first host stays the rendezvous host
        from clusterctl.config import hostpattern

        chosen = hostpattern.select(inv, limit)
        hosts = [h for h in hosts if h in chosen]
    check_key_files(hosts)
    options = connect_options(ctx, accept_new)
    with progress_bar(output != "json") as progress:
        report = run_preflight(hosts, connect=lambda h: connect(h, options),
                               job=PreflightJob.from_spec(spec) if spec is not None else None,
                               options=PreflightOptions(pull=pull), progress=progress)
    if output == "json":
        sys.stdout.write(report.to_json() + "\n")
    else:
        render_table(report, out)
    return exit_code(report, strict)
