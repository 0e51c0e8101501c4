"""What happened and where it stands: ``status`` (``--watch``), ``top``, ``events``, ``logs``."""
from __future__ import annotations

import json
import sys

import click

from clusterctl.cli.base import (
    MAX_COUNT,
    accept_option,
    app,
    complete_jobs,
    complete_nodes,
    connect_options,
    err,
    nonempty,
    out,
    output_option,
    print_json,
)


@app.command("status")
@click.argument("job", required=False, shell_complete=complete_jobs)
@click.option("--all", "show_all", is_flag=True, help="Every finished job (default: the 20 newest).")
@click.option("--state", "states", multiple=True, metavar="STATE",
              help="Only jobs in this state (repeatable): PENDING STARTING RUNNING RECOVERING SUCCEEDED FAILED "
                   "STOPPED.")
@click.option("--since", default=None, metavar="WHEN",
              help="Only jobs alive since WHEN: a duration (30m, 2h, 3d) or a UTC date (2026-12-01[T08:00]).")
@click.option("--watch", "-w", is_flag=True, help="With JOB: refresh every 2 s until the job ends.")
@output_option
@accept_option
@click.pass_context
def status_cmd(ctx, job, show_all, states, since, watch, output, accept_new) -> int:
    """Jobs and their state (the active ones, then the 20 newest finished); with JOB, what happened and where it
    stands (and, when clusterctl's supervisor of an active job is gone, what the nodes say now)."""
    import time

    from clusterctl.usecases import views as uviews
    from clusterctl.usecases.base import open_workspace
    from clusterctl.views import history, status

    if watch and not job:
        raise click.UsageError("--watch needs a JOB")
    ws = open_workspace(ctx.obj.state_dir)
    if job:
        options = connect_options(ctx, accept_new)
        if watch:
            return _watch(lambda on_view, every: uviews.watch_status(ws, job, options, on_view, interval_s=every),
                          output)
        v = uviews.status(ws, job, options)
        if output == "json":
            print_json(v)
        else:
            for line in status.text(v):
                out.print(line, markup=False)
        return 0
    now = time.time()
    listed = uviews.job_list(ws, states=states, since=since, show_all=show_all, now=now,
                           options=connect_options(ctx, accept_new))
    views, rows = [v for v, _ in listed], [r for _, r in listed]
    if output == "json":
        print_json({"jobs": [{**v, **r} for v, r in zip(views, rows)]})
        return 0
    if not rows:
        if states or since:
            err.print("no job matches" + (f" --state {' '.join(states)}" if states else "")
                      + (f" --since {since}" if since else "") + " (`clusterctl status --all` lists every job)",
                      markup=False)
        else:
            err.print("no jobs yet. Launch one: `clusterctl launch JOB.yaml` (a commented job file to start "
                      "from: `clusterctl init job.yaml`)", markup=False)
        return 0
    from clusterctl.views.columns import Column, fit
    from clusterctl.views.history import short_reason

    unsupervised = [status.unsupervised(v) for v in views]
    for v, lost in zip(views, unsupervised):
        if lost:
            err.print(status.unsupervised_line(v, now), markup=False)
    cols = [Column("job"), Column("name", optional=True), Column("state"), Column("attempt", right=True, short="att"),
            Column("nodes", min=5, max=40, items=True), Column("started", short="start"), Column("ended"),
            Column("elapsed", right=True, short="took"),
            Column("reason", min=16)]   # the full job id (it holds the name: left out when narrow), whole host names
    table = [[r["job_id"], r["name"], r["state"], str(r["attempt"]),
              ",".join(r["nodes"]) or "-", history.clock(r["started_at"], now), history.clock(r["ended_at"], now),
              history.duration(r["elapsed_s"]),
              (f"UNSUPERVISED: no supervisor; `clusterctl resume {r['name']}`" + (f" ({reason})" if reason else ""))
              if lost else reason]
             for r, lost, reason in zip(rows, unsupervised, (short_reason(r["reason"], 300) for r in rows))]
    for line in fit(cols, table, out.width, shrink_order=[(4, 12), (8, 24)], spill=8):
        out.print(line, markup=False)
    return 0


def _watch(watch, output: str, interval_s: float = 2.0) -> int:
    """`status JOB --watch`: rich Live on a terminal, else one line (json: one object) per change, until the job
    ends; exit 0 when it succeeded, 1 when it failed or was stopped. ``watch(on_view, interval_s)``: the use case
    (``usecases.views.watch_status``), which calls ``on_view`` with every view until the job has ended."""
    import datetime

    from rich.live import Live
    from rich.text import Text

    from clusterctl.views import status as status_mod

    if output == "table" and out.is_terminal:
        with Live(Text(""), console=out, auto_refresh=False) as live:
            def show(v) -> None:
                stamp = datetime.datetime.now().strftime("%H:%M:%S")
                live.update(Text("\n".join([*status_mod.text(v), f"(every {interval_s:g}s, {stamp}; Ctrl-C to "
                                                                  "stop watching)"])), refresh=True)
            v = watch(show, interval_s)
    else:
        last = []

        def show(v) -> None:
            ck = v["checkpoint"] or {}
            key = (v["state"], v["attempt"], v["reason"], tuple((n["node"], n["state"]) for n in v["nodes"]),
                   ck.get("step"), v["supervised"])
            if last and key == last[-1]:
                return
            last.append(key)
            if status_mod.unsupervised(v) and not (len(last) > 1 and last[-2][-1] is False):   # once per loss
                (err if output == "json" else out).print(status_mod.unsupervised_line(v), markup=False)
            if output == "json":
                sys.stdout.write(json.dumps(v, default=str) + "\n")
                sys.stdout.flush()
            else:
                stamp = datetime.datetime.now().strftime("%H:%M:%S")
                nodes = ",".join(f"{n['node']}={n['state'] or '?'}" for n in v["nodes"]) or "-"
                out.print(f"{stamp} {v['state']} attempt {v['attempt']} nodes {nodes} checkpoint "
                          f"{ck.get('step', '-')}" + (f" — {v['reason']}" if v["reason"] else ""), markup=False)
        v = watch(show, interval_s)
    return 0 if v["state"] == "SUCCEEDED" else 1


@app.command("events")
@click.argument("job", shell_complete=complete_jobs)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events until the job ends.")
@output_option
@click.pass_context
def events_cmd(ctx, job, follow, output) -> int:
    """The job's timeline: every decision the supervisor took."""
    import datetime

    from clusterctl.usecases import views as uviews
    from clusterctl.usecases.base import open_workspace

    ws = open_workspace(ctx.obj.state_dir)
    if output == "json" and not follow:
        print_json(uviews.events_view(ws, job))
        return 0

    def show(e) -> None:
        if output == "json":   # -f with json: one object per line
            sys.stdout.write(json.dumps({"time": e.time, "attempt": e.attempt, "kind": e.kind, "class": e.klass,
                                         "node": e.node, "rank": e.rank, "exit_code": e.exit_code,
                                         "signal": e.signal, "checkpoint_step": e.checkpoint_step,
                                         "message": e.message}) + "\n")
            sys.stdout.flush()
            return
        t = datetime.datetime.fromtimestamp(e.time).strftime("%H:%M:%S")
        out.print(f"{t}  attempt {e.attempt or '-'}  {e.kind:<14} {e.message}", markup=False)

    uviews.follow_events(ws, job, show, follow=follow, options=connect_options(ctx),
                       say=lambda line: (err if output == "json" else out).print(line, markup=False))
    return 0


@app.command("logs")
@click.argument("job", shell_complete=complete_jobs)
@click.option("--node", default=None, callback=nonempty, shell_complete=complete_nodes, help="Only this node.")
@click.option("--rank", default=None, type=click.IntRange(0, MAX_COUNT), help="Only this global rank.")
@click.option("--attempt", default=None, type=click.IntRange(1, MAX_COUNT), help="Only this attempt.")
@click.option("--tail", default=None, type=click.IntRange(0, MAX_COUNT),
              help="Only the last N lines (0: none).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines and events until the job ends.")
@accept_option
@click.pass_context
def logs_cmd(ctx, job, node, rank, attempt, tail, follow, accept_new) -> int:
    """Every rank's output, prefixed [node/rank] (the controller's copy, completed from the nodes' own logs for
    any stretch no supervisor followed)."""
    from clusterctl.usecases import views as uviews
    from clusterctl.usecases.base import open_workspace
    from clusterctl.views.logs import for_terminal

    got = uviews.logs(open_workspace(ctx.obj.state_dir), job, connect_options(ctx, accept_new), node=node,
                    rank=rank, attempt=attempt, tail=tail)
    for n, msg in got.missing.items():
        err.print(f"{n}: could not read its own log ({msg}); lines it printed since the last copy may be "
                  "missing", markup=False)
    for line in got.lines:
        out.print(for_terminal(line), markup=False)     # a node's escape sequences are shown, not run
    if follow:
        try:
            got.follow(lambda ln: out.print(for_terminal(ln), markup=False))
        except KeyboardInterrupt:
            pass
    return 0


@app.command("top")
@click.argument("job", shell_complete=complete_jobs)
@click.option("--once", is_flag=True, help="Print the view once and exit (default: refresh every 2 s).")
@output_option
@click.pass_context
def top_cmd(ctx, job, once, output) -> int:
    """Every rank of a running job: node, rank, step, step time, state (starting, training, waiting, stuck, busy,
    gone), CPU %, RSS, GPU utilisation and memory where known, time waiting in a collective, and where it is;
    read from what the job's supervisor sees each round (no connection of its own)."""
    import time

    from clusterctl.usecases import views as uviews
    from clusterctl.usecases.base import open_workspace
    from clusterctl.views import top as top_mod

    ws = open_workspace(ctx.obj.state_dir)
    job = uviews.job_id_of(ws, job)         # an unknown job: exit 2, whatever else is asked

    def render(v) -> list[str]:
        lines = top_mod.text(v["doc"], v["job_id"], now=time.time(), width=out.width)
        if not v["doc"]["ranks"]:
            lines.append("no rank view yet (the ranks are starting, or the node side writes none)")
        elif v["stale"]:
            lines.append("the view is more than 10 s old: the supervisor is not writing it")
        return lines

    if once or output == "json":
        v = uviews.top(ws, job)
        if output == "json":
            print_json({"ranks": top_mod.rows(v["doc"])})
        else:
            for line in render(v):
                out.print(line, markup=False)
        return 0
    from rich.live import Live
    from rich.text import Text

    if not out.is_terminal:
        raise click.UsageError("top refreshes on a terminal only: use --once (or --output json) in a pipe")
    with Live(Text(""), console=out, auto_refresh=False) as live:
        uviews.watch_top(ws, job, lambda v: live.update(Text("\n".join([*render(v), "(every 2s; Ctrl-C to stop)"])),
                                                        refresh=True))
    return 0
