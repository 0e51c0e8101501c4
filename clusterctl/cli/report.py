"""``clusterctl report JOB``: the job's goodput (issue 38): what fraction of its time trained, where the rest
went, each disruption; ``--output json``; ``--plot FILE`` (PNG or SVG) draws the run."""
from __future__ import annotations

import click

from clusterctl.cli.base import app, complete_jobs, err, nonempty, out, output_option, print_json


@app.command("report")
@click.argument("job", callback=nonempty, shell_complete=complete_jobs)
@click.option("--plot", "plot_file", default=None, metavar="FILE", callback=nonempty,
              help="Also draw the run into FILE: .png or .svg (needs the optional extra: pip install "
                   "'clusterctl[plot]').")
@output_option
@click.pass_context
def report_cmd(ctx, job, plot_file, output) -> int:
    """Goodput of JOB: wall time, productive time, goodput and ETTR, the time lost per bucket, one line per
    disruption (fault, detection, stop, restart, first step again, redone steps). A job that is still running is
    reported up to now; one the database forgot is read from its kept job dir."""
    import time

    from clusterctl.usecases import report as ureport
    from clusterctl.usecases.base import open_workspace
    from clusterctl.views import plot
    from clusterctl.views import report as text_report

    if plot_file:
        plot.check_path(plot_file)            # a wrong extension: exit 2 before any work
    ws = open_workspace(ctx.obj.state_dir)
    r = ureport.report(ws.root, ws.store, job, now=time.time())
    if output == "json":
        print_json(r.value)
    else:
        for line in text_report.text(r.value):
            out.print(line, markup=False)
    if plot_file:
        written = plot.plot(r.value, r.segments, r.marks, r.lanes, plot_file)
        err.print(f"wrote {written}", markup=False)
    return 0
