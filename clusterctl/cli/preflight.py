"""``preflight``: every host checked before a launch."""
from __future__ import annotations

import sys

import click

from clusterctl.cli.base import (
    accept_option,
    app,
    complete_hosts,
    connect_options,
    err,
    inventory_option,
    nonempty,
    out,
    output_option,
    progress_bar,
)


@app.command("preflight")
@inventory_option
@click.argument("job", required=False, type=click.Path())
@click.option("--limit", default=None, callback=nonempty, shell_complete=complete_hosts,
              help="Hosts, groups, comma lists, the inventory's ranges (gpu[01:04]) and globs (node*); Ansible's "
                   "':&part' (also in part) and ':!part' (not in part).")
@output_option
@click.option("--strict", is_flag=True, help="Warnings fail too.")
@click.option("--pull", is_flag=True, help="Pull the image where it is missing instead of failing.")
@accept_option
@click.pass_context
def preflight_cmd(ctx, inventory, job, limit, output, strict, pull, accept_new) -> int:
    """Check every host before a launch; every failure says how to fix it."""
    from clusterctl.checks.report import render_table
    from clusterctl.checks.results import exit_code
    from clusterctl.usecases import preflight as upreflight

    request = upreflight.PreflightRequest(job, inventory, limit, pull, connect_options(ctx, accept_new))
    with progress_bar(output != "json") as progress:
        report = upreflight.preflight(request, progress=progress,
                                      notes=lambda note: err.print(f"note: {note}", markup=False))
    if output == "json":
        sys.stdout.write(report.to_json() + "\n")
    else:
        render_table(report, out)
    return exit_code(report, strict)
