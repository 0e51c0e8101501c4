"""The command line: parse, call, print, exit. The only module that prints or exits.

Exit codes: 0 success; 1 the operation found failures (a check failed, a job failed); 2 usage or input error.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import sys
import traceback
from dataclasses import dataclass
from typing import List, Optional

import click
from rich.console import Console

from clusterctl import __version__
from clusterctl.errors import ClusterctlError

out = Console(highlight=False, soft_wrap=True)
err = Console(stderr=True, highlight=False, soft_wrap=True)
OUTPUT = click.Choice(["table", "json"])


@dataclass
class Globals:
    state_dir: Optional[str] = None
    debug: bool = False
    accept_new_host_keys: bool = False


def _load_hosts(path):
    """``-i``: an inventory file, ``slurm[:OVERLAY]`` or the embedded default."""
    from clusterctl.slurm.allocation import load_hosts

    return load_hosts(path)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--state-dir", envvar="CLUSTERCTL_STATE_DIR", default=None,
              help="State directory (jobs DB, logs). Default: $CLUSTERCTL_STATE_DIR, else platformdirs' user "
                   "state dir (e.g. ~/.local/state/clusterctl).")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("--accept-new-host-keys", is_flag=True, help="Record unknown SSH host keys (never changed ones).")
@click.version_option(__version__, "--version", prog_name="clusterctl", message="%(prog)s %(version)s")
@click.pass_context
def app(ctx: click.Context, state_dir, debug, accept_new_host_keys) -> None:
    """Launch and supervise multi-node PyTorch training over SSH."""
    ctx.obj = Globals(state_dir, debug, accept_new_host_keys)


def inventory_option(f):
    return click.option("-i", "--inventory", default=None,
                        help="Inventory YAML (default: $CLUSTERCTL_INVENTORY, ./inventory.yaml, else this machine).")(f)


def output_option(f):
    return click.option("--output", "-o", type=OUTPUT, default="table", show_default=True,
                        help="table, or json on stdout for scripts.")(f)


def complete_jobs(ctx, param, incomplete: str) -> list:
    """Shell completion of JOB: the names and ids in the state dir (``--state-dir`` or its default)."""
    try:
        from clusterctl.store.paths import db_path, state_dir
        from clusterctl.store.state import Store

        root = state_dir((ctx.find_root().params or {}).get("state_dir"))
        if not db_path(root).exists():
            return []
        with Store(db_path(root)) as store:
            jobs = store.list_jobs()
        names = dict.fromkeys([j.name for j in jobs] + [j.job_id for j in jobs])
        return [n for n in names if n.startswith(incomplete)]
    except Exception:  # noqa: BLE001 - completion never prints a traceback into the user's shell
        return []


def complete_hosts(ctx, param, incomplete: str) -> list:
    """Shell completion of HOST: the default inventory's host names ($CLUSTERCTL_INVENTORY, ./inventory.yaml)."""
    try:

        return [h.name for h in _load_hosts(ctx.params.get("inventory")).hosts if h.name.startswith(incomplete)]
    except Exception:  # noqa: BLE001
        return []


def accept_option(f):
    return click.option("--accept-new-host-keys", "accept_new", is_flag=True,
                        help="Record unknown SSH host keys (never changed ones).")(f)


def print_json(value) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")
    sys.stdout.flush()


def connect_options(ctx: click.Context, accept_new: bool = False, **kw):
    from clusterctl.transport import ConnectOptions

    return ConnectOptions(accept_new_host_keys=accept_new or ctx.obj.accept_new_host_keys, **kw)


# ---------------------------------------------------------------------------------------------- inventory
@app.command("inventory")
@inventory_option
@output_option
def inventory_cmd(inventory: Optional[str], output: str) -> int:
    """Print the resolved hosts and their variables."""

    inv = _load_hosts(inventory)
    if output == "json":
        print_json({"source": inv.source, "hosts": [h.to_dict() for h in inv.hosts],
                    "groups": {g: list(h) for g, h in inv.groups.items()}})
        return 0
    from clusterctl.views.columns import Column, fit

    # plain columns that fit 80: headers never break, names and addresses never cut; groups shrink first
    cols = [Column("host"), Column("address"), Column("port"), Column("user", min=4), Column("connection"),
            Column("runtime"), Column("gpus"), Column("interface", min=9), Column("groups", min=6)]
    rows = [[h.name, h.address, str(h.port or "-"), h.user or "-", h.connection, h.runtime,
             "-" if h.gpus is None else str(h.gpus), h.interface or "-", ",".join(h.groups)] for h in inv.hosts]
    out.print(f"inventory: {inv.source}", markup=False)
    for line in fit(cols, rows, out.width, shrink_order=[(8, 12)]):
        out.print(line, markup=False)
    return 0


# ---------------------------------------------------------------------------------------------- preflight
def check_key_files(hosts) -> None:
    """Unusable ansible_ssh_private_key_file -> exit 2 at its inventory line, before anything connects."""
    from clusterctl.jobs import check_key_files as check

    check(hosts)


def progress_bar(show: bool):
    """The preflight progress bar on stderr (a ``progress(done, total, label)`` callback), or None."""
    from contextlib import nullcontext

    from clusterctl.checks.report import progress_display

    return progress_display(err) if show else nullcontext(None)


@app.command("preflight")
@inventory_option
@click.argument("job", required=False)
@click.option("--limit", default=None, help="Hosts, groups, comma lists, the inventory's ranges (gpu[01:04]) and "
                                             "globs (node*).")
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
        spec, inv = None, _load_hosts(inventory)
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


# ---------------------------------------------------------------------------------------------- on-call: exec, shell, stacks
def _job_nodes(ctx, job):
    from clusterctl.oncall import jobnodes
    from clusterctl.supervise import controller

    _, store = controller.open_store(ctx.obj.state_dir)
    return jobnodes.load(store, job)


@app.command("exec")
@inventory_option
@click.option("--limit", default=None, help="Hosts, groups, comma lists, globs (as preflight --limit).")
@click.option("--job", default=None, help="Run on the nodes of this job's current attempt.")
@click.option("--node", default=None, help="With --job: only this node.")
@click.option("--in-container", is_flag=True, help="With --job: inside the job's container (bare: in its directory).")
@click.option("--timeout", default=60.0, show_default=True, type=click.FloatRange(min=0.1),
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
        hosts = hostpattern.select(_load_hosts(inventory), limit)
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
@click.option("--node", default=None, help="This node (default: the current attempt's rendezvous host).")
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
@click.option("--node", default=None, help="Only the ranks on this node.")
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


# ---------------------------------------------------------------------------------------------- jobs
def launch_overrides(name: str | None, nodes: str | None, env: tuple) -> dict:
    """`launch --name/--nodes/--env K=V` as job-file keys (validated with the job file)."""
    out: dict = {}
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
@click.argument("job")
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
@click.pass_context
def launch_cmd(ctx, job, inventory, dry_run, strict, detach, skip_preflight, name_override, nodes_override,
               env_override, output, accept_new) -> int:
    """Start JOB (a job YAML) on the inventory's hosts and supervise it."""
    import os

    from clusterctl import jobs
    from clusterctl.checks.report import render_table

    ws = jobs.open_workspace(ctx.obj.state_dir)
    request = jobs.LaunchRequest(job, inventory, connect_options(ctx, accept_new), skip_preflight=skip_preflight,
                                 environ=os.environ, overrides=launch_overrides(name_override, nodes_override,
                                                                                env_override))
    if dry_run:   # needs no secret values: they show as ***
        dry = jobs.dry_run(ws, request)
        if output == "json":
            print_json({**dry.plan.to_dict(), "warnings": [str(p) for p in dry.problems]})
        else:
            out.print(dry.plan.render(), markup=False)
        for p in dry.problems:
            err.print(f"warning: {p}", markup=False)
        return 2 if strict and dry.problems else 0
    with progress_bar(not skip_preflight and output != "json") as progress:
        launched = jobs.launch(ws, request, on_progress=progress)
    if isinstance(launched, jobs.PreflightFailed):
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
    from clusterctl import jobs
    from clusterctl.store.state import JobState
    from clusterctl.views.logs import for_terminal

    try:
        ended = jobs.attach(ws, job_id, lambda line: out.print(for_terminal(line), markup=False),
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
    from pathlib import Path

    from clusterctl.store.state import JobState
    from clusterctl.supervise import controller

    state = controller.supervise(Path(ctx.obj.state_dir), job_id, connect_options(ctx), adopt=adopt,
                                 echo=lambda m: print(m, flush=True))
    return 0 if state == JobState.SUCCEEDED else 1


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

    from clusterctl.supervise import controller
    from clusterctl.views import history, status

    root, store = controller.open_store(ctx.obj.state_dir)
    if watch and not job:
        raise click.UsageError("--watch needs a JOB")
    if job:
        from clusterctl import jobs

        ws = jobs.Workspace(root, store)
        job_id = store.get_job(job).job_id
        options = connect_options(ctx, accept_new)

        def view():
            return jobs.status(ws, job_id, options)

        if watch:
            return _watch(view, output)
        v = view()
        if output == "json":
            print_json(v)
        else:
            for line in status.text(v):
                out.print(line, markup=False)
        return 0
    now = time.time()
    chosen = history.select(store, store.list_jobs(), states=history.parse_states(states),
                            since=history.parse_since(since, now) if since else None, show_all=show_all)
    views = [status.job_view(store, j, now, supervision=controller.supervision(root, j)) for j in chosen]
    rows = [history.row(store, j, now) for j in chosen]
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

    unsupervised = [status.unsupervised(v) for v in views]
    for v, lost in zip(views, unsupervised):
        if lost:
            err.print(status.unsupervised_line(v, now), markup=False)
    cols = [Column("job"), Column("name", optional=True), Column("state"), Column("attempt", right=True, short="att"),
            Column("nodes", min=5, max=40), Column("started", short="start"), Column("ended"),
            Column("elapsed", right=True, short="took"),
            Column("reason", min=16, max=60)]     # the full job id (holds the name: left out when narrow)
    table = [[r["job_id"], r["name"], r["state"], str(r["attempt"]),
              ",".join(r["nodes"]) or "-", history.clock(r["started_at"], now), history.clock(r["ended_at"], now),
              history.duration(r["elapsed_s"]),
              (f"UNSUPERVISED: no supervisor; `clusterctl resume {r['name']}`" + (f" ({r['short_reason']})"
                                                                                   if r["short_reason"] else ""))
              if lost else r["short_reason"]]
             for r, lost in zip(rows, unsupervised)]
    for line in fit(cols, table, out.width, shrink_order=[(8, 24), (4, 12), (1, 8)], spill=8):
        out.print(line, markup=False)
    return 0


def _watch(view, output: str, interval_s: float = 2.0) -> int:
    """`status JOB --watch`: rich Live on a terminal, else one line (json: one object) per change, until the job
    ends; exit 0 when it succeeded, 1 when it failed or was stopped. ``view()``: the job's current status view."""
    import datetime
    import time

    from rich.live import Live
    from rich.text import Text

    from clusterctl.views import status as status_mod

    def ended(v) -> bool:
        return v["state"] in status_mod.ENDED

    if output == "table" and out.is_terminal:
        with Live(Text(""), console=out, auto_refresh=False) as live:
            while True:
                v = view()
                stamp = datetime.datetime.now().strftime("%H:%M:%S")
                live.update(Text("\n".join([*status_mod.text(v), f"(every {interval_s:g}s, {stamp}; Ctrl-C to "
                                                                 "stop watching)"])), refresh=True)
                if ended(v):
                    break
                time.sleep(interval_s)
    else:
        last = None
        while True:
            v = view()
            ck = v["checkpoint"] or {}
            key = (v["state"], v["attempt"], v["reason"], tuple((n["node"], n["state"]) for n in v["nodes"]),
                   ck.get("step"))
            if key != last:
                last = key
                if output == "json":
                    sys.stdout.write(json.dumps(v, default=str) + "\n")
                    sys.stdout.flush()
                else:
                    stamp = datetime.datetime.now().strftime("%H:%M:%S")
                    nodes = ",".join(f"{n['node']}={n['state'] or '?'}" for n in v["nodes"]) or "-"
                    out.print(f"{stamp} {v['state']} attempt {v['attempt']} nodes {nodes} checkpoint "
                              f"{ck.get('step', '-')}" + (f" — {v['reason']}" if v["reason"] else ""), markup=False)
            if ended(v):
                break
            time.sleep(interval_s)
    return 0 if v["state"] == "SUCCEEDED" else 1


@app.command("events")
@click.argument("job", shell_complete=complete_jobs)
@click.option("-f", "--follow", is_flag=True, help="Keep printing new events until the job ends.")
@output_option
@click.pass_context
def events_cmd(ctx, job, follow, output) -> int:
    """The job's timeline: every decision the supervisor took."""
    import datetime
    import time

    from clusterctl.supervise import controller
    from clusterctl.views import status

    root, store = controller.open_store(ctx.obj.state_dir)
    j = store.get_job(job)
    if output == "json" and not follow:
        print_json(status.events_view(store, j))
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

    last = 0
    while True:
        for e in store.events(j.job_id, after_id=last):
            show(e)
            last = e.id
        if not follow:
            return 0
        current = store.get_job(j.job_id)
        if current.terminal and not controller.live_supervisor(root, current):
            for e in store.events(j.job_id, after_id=last):   # what the supervisor wrote while it ended
                show(e)
            return 0
        time.sleep(0.5)


@app.command("logs")
@click.argument("job", shell_complete=complete_jobs)
@click.option("--node", default=None, help="Only this node.")
@click.option("--rank", default=None, type=int, help="Only this global rank.")
@click.option("--attempt", default=None, type=click.IntRange(min=1), help="Only this attempt.")
@click.option("--tail", default=None, type=click.IntRange(min=0), help="Only the last N lines (0: none).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines and events until the job ends.")
@accept_option
@click.pass_context
def logs_cmd(ctx, job, node, rank, attempt, tail, follow, accept_new) -> int:
    """Every rank's output, prefixed [node/rank] (the controller's copy, completed from the nodes' own logs for
    any stretch no supervisor followed)."""
    from clusterctl.supervise import controller
    from clusterctl.views import logs

    root, store = controller.open_store(ctx.obj.state_dir)
    j = store.get_job(job)
    sel = logs.Selection.check(store, j, node=node, rank=rank, attempt=attempt)
    if not controller.live_supervisor(root, j) and store.attempts(j.job_id):
        for n, msg in controller.fill_logs(root, store, j.job_id, connect_options(ctx, accept_new),
                                           attempt=attempt).items():
            err.print(f"{n}: could not read its own log ({msg}); lines it printed since the last copy may be "
                      "missing", markup=False)
    path = logs.path(root, j.job_id)
    lines = logs.read(path, sel, tail)
    for line in lines:
        out.print(logs.for_terminal(line), markup=False)     # a node's escape sequences are shown, not run
    if follow:
        try:
            controller.follow(root, store, j.job_id,
                              lambda ln: (sel.keeps(ln) or ln.startswith("clusterctl: ")) and out.print(
                                  logs.for_terminal(ln), markup=False),
                              from_start=False)
        except KeyboardInterrupt:
            pass
    return 0


@app.command("stop")
@click.argument("job", shell_complete=complete_jobs)
@click.option("--grace", default=10.0, show_default=True, type=click.FloatRange(0, 3600),
              help="Seconds between SIGTERM and kill (0-3600).")
@output_option
@accept_option
@click.pass_context
def stop_cmd(ctx, job, grace, output, accept_new) -> int:
    """SIGTERM torchrun on every node, kill after --grace, remove exactly this job's containers."""
    from clusterctl import jobs

    stopped = jobs.stop(jobs.open_workspace(ctx.obj.state_dir), job, connect_options(ctx, accept_new), grace_s=grace)
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
@click.option("--exclude", multiple=True, help="Do not use this host (repeatable).")
@click.option("--checkpoint", default=None, help="Resume from this checkpoint instead of the latest valid one.")
@click.option("--detach", "-d", is_flag=True,
              help="Return once the job is relaunched (or re-attached); the supervisor runs on.")
@output_option
@accept_option
@click.pass_context
def resume_cmd(ctx, job, exclude, checkpoint, detach, output, accept_new) -> int:
    """Bring a job back: re-attach if it still runs, else relaunch from its newest valid checkpoint. A job that
    finished well while unsupervised becomes SUCCEEDED; nothing is relaunched."""
    from clusterctl import jobs

    ws = jobs.open_workspace(ctx.obj.state_dir)
    outcome = jobs.resume(ws, jobs.ResumeRequest(job, connect_options(ctx, accept_new), tuple(exclude), checkpoint))
    for host, why in outcome.excluded:
        err.print(f"excluded {host}: cordoned: {why}", markup=False)
    err.print(f"job {outcome.job_id}: {outcome.message}", markup=False)
    extra = {"job_id": outcome.job_id, "outcome": outcome.action, "message": outcome.message,
             "supervisor_pid": outcome.pid}
    if detach or outcome.pid is None or outcome.action == "already_supervised":
        if output == "json":
            print_json({**extra, "state": ws.store.get_job(outcome.job_id).state.value})
        return 0
    return _attach(ws, outcome.job_id, outcome.name, output, extra=extra, from_start=False)


@app.command("forget")
@click.argument("jobs", nargs=-1, required=True)
@output_option
@click.pass_context
def forget_cmd(ctx, jobs, output) -> int:
    """Delete finished jobs' records and controller-side logs (never checkpoints, never an active job)."""
    from clusterctl import jobs as jobs_mod

    done = jobs_mod.forget(jobs_mod.open_workspace(ctx.obj.state_dir), jobs)
    if output == "json":
        print_json({"forgotten": [dataclasses.asdict(f) for f in done]})
    else:
        for f in done:
            err.print(f"forgot {f.job_id}: its records and controller-side logs"
                      + (f" (checkpoints in {f.checkpoint_dir_kept} are kept)" if f.checkpoint_dir_kept else ""),
                      markup=False)
    return 0


@app.command("nodes")
@inventory_option
@output_option
@click.pass_context
def nodes_cmd(ctx, inventory, output) -> int:
    """Per host: ok or cordoned (reason, since), jobs run, failures by class in the last 7 days, the last one."""
    import time

    from clusterctl.supervise import controller
    from clusterctl.views import history
    from clusterctl.views import nodes as nodehealth

    inv = _load_hosts(inventory)
    _, store = controller.open_store(ctx.obj.state_dir)
    now = time.time()
    rows = nodehealth.node_rows([h.name for h in inv.hosts], store.cordons(), store.all_attempts(),
                                store.node_events(), now)
    if output == "json":
        print_json(rows)
        return 0
    from clusterctl.views.columns import Column, fit

    cols = [Column("host"), Column("state"), Column("jobs", right=True), Column("failures 7d", min=11),
            Column("last failure", min=12), Column("cordon", min=40)]
    table = []
    for r in rows:
        lf = r["last_failure"]
        table.append([r["host"] + ("" if r["in_inventory"] else " (not in inventory)"), r["state"], str(r["jobs"]),
                      ", ".join(f"{k} {v}" for k, v in sorted(r["failures_7d"].items())) or "-",
                      f"{history.clock(lf['time'], now)} {lf['class']} {lf['job_id']}" if lf else "-",
                      f"{r['reason']} (since {history.clock(r['since'], now)}, {r['by']})" if r["reason"] else ""])
    for line in fit(cols, table, out.width, shrink_order=[(5, 30), (4, 30)], spill=5):
        out.print(line, markup=False)
    return 0


def _host_names(hosts) -> list:
    from clusterctl.config.inventory import HOSTNAME_RE
    from clusterctl.errors import UserError

    for h in hosts:
        if not HOSTNAME_RE.match(h):
            raise UserError(f"invalid host name {h!r} (the inventory name, e.g. gpu01)")
    return list(dict.fromkeys(hosts))


@app.command("cordon")
@click.argument("hosts", nargs=-1, required=True, shell_complete=complete_hosts)
@click.option("--reason", required=True, help="Why (shown by `nodes`, in plans and in launch errors).")
@click.option("--slurm-drain", is_flag=True, help="Also drain them in Slurm (scontrol update ... State=DRAIN).")
@inventory_option
@output_option
@click.pass_context
def cordon_cmd(ctx, hosts, reason, inventory, output, slurm_drain) -> int:
    """Keep HOSTs out of every launch, resume and relaunch (running attempts are not touched)."""
    from clusterctl import jobs as jobs_mod
    from clusterctl.errors import UserError

    if not reason.strip() or "\n" in reason:
        raise UserError("--reason must be one non-empty line")
    names = _host_names(hosts)
    out = jobs_mod.cordon(jobs_mod.open_workspace(ctx.obj.state_dir), names, reason.strip(), _load_hosts(inventory),
                          slurm_drain=slurm_drain)
    done = out.cordons
    if output != "json":
        for h in out.unknown:
            err.print(f"warning: {h} is in no inventory clusterctl knows (nor any job's nodes): cordoned "
                      "anyway; check the name", markup=False)
        for h, why in out.replaced.items():
            err.print(f"{h} was already cordoned ({why}): the new reason replaces it", markup=False)
    if out.drain_refused:
        host, message = out.drain_refused
        raise UserError(f"{host} cordoned, but Slurm refused to drain it: {message}")
    if output == "json":
        print_json([{"host": c.host, "state": "cordoned", "reason": c.reason, "since": c.since, "by": c.by}
                    for c in done])
    else:
        for c in done:
            err.print(f"{c.host} cordoned: {c.reason} (launch, resume and relaunches skip it; "
                      f"`clusterctl uncordon {c.host}` to undo)", markup=False)
    return 0


@app.command("uncordon")
@click.argument("hosts", nargs=-1, required=True, shell_complete=complete_hosts)
@output_option
@click.pass_context
def uncordon_cmd(ctx, hosts, output) -> int:
    """Let HOSTs be used again; their earlier failures no longer count toward an automatic cordon."""
    from clusterctl import jobs as jobs_mod

    result = jobs_mod.uncordon(jobs_mod.open_workspace(ctx.obj.state_dir), _host_names(hosts))
    if output == "json":
        print_json([{"host": h, "state": "ok", "was_cordoned": was} for h, was in result.items()])
    else:
        for h, was in result.items():
            err.print(f"{h} uncordoned" if was else f"{h} was not cordoned", markup=False)
    return 0


@app.command("init")
@click.argument("file", default="job.yaml", required=False)
def init_cmd(file) -> int:
    """Write the commented job file template to FILE (default job.yaml; - for stdout); never overwrites."""
    import os
    from importlib import resources

    from clusterctl.errors import UserError

    text = resources.files("clusterctl.templates").joinpath("job.yaml").read_text(encoding="utf-8")
    if file == "-":
        sys.stdout.write(text)
        return 0
    try:
        fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    except FileExistsError:
        raise UserError(f"{file} already exists; not overwritten (pick another name, or remove it first)") from None
    except OSError as e:
        raise UserError(f"{file}: cannot write: {e.strerror or e}") from None
    with os.fdopen(fd, "w", encoding="utf-8") as f:
        f.write(text)
    err.print(f"wrote {file}: set name and script, then `clusterctl launch {file} --dry-run` to see the plan",
              markup=False)
    return 0


# ---------------------------------------------------------------------------------------------- entry point
GLOBAL_FLAGS = ("--debug",)
GLOBAL_OPTIONS = ("--state-dir",)


def hoist_globals(args: List[str]) -> List[str]:
    """``clusterctl status --debug`` and ``clusterctl logs JOB --state-dir D`` as well as ``clusterctl --debug
    status``: the group's own options are accepted after the subcommand too (moved in front of it; nothing after a
    ``--`` is touched: that is a remote command's argv)."""
    front, rest, i = [], [], 0
    while i < len(args):
        a = args[i]
        if a == "--":
            rest.extend(args[i:])
            break
        if a in GLOBAL_FLAGS:
            front.append(a)
        elif a in GLOBAL_OPTIONS and i + 1 < len(args):
            front += [a, args[i + 1]]
            i += 1
        elif a.split("=", 1)[0] in GLOBAL_OPTIONS and "=" in a:
            front.append(a)
        else:
            rest.append(a)
        i += 1
    return front + rest


# ---------------------------------------------------------------------------------------------- first hour
@app.command("doctor")
@output_option
@click.pass_context
def doctor_cmd(ctx, output) -> int:
    """This machine as clusterctl needs it: ssh-agent, ~/.ssh/config, key permissions, the state dir."""
    import os
    from pathlib import Path

    from clusterctl.store import paths
    from clusterctl.views import doctor

    found = doctor.diagnose(paths.state_dir(ctx.obj.state_dir), os.environ, Path.home())
    if output == "json":
        print_json([f.to_dict() for f in found])
    else:
        marks = {"pass": "✓", "warn": "!", "fail": "✗"}
        for f in found:
            out.print(f"{marks[f.status]} {f.check}: {f.detail}" + (f"\n    → {f.hint}" if f.hint else ""),
                      markup=False)
    return 1 if any(f.status == "fail" for f in found) else 0


@app.command("validate")
@click.argument("job")
@inventory_option
@click.option("--strict", is_flag=True, help="Warnings (unset secret variables, key files) fail too (exit 2).")
@output_option
@click.pass_context
def validate_cmd(ctx, job, inventory, strict, output) -> int:
    """Check JOB and the inventory as launch does before contacting any host (schema, hosts, cordons, secret
    variables, key files); exit 0 valid, 2 invalid."""
    import os

    from clusterctl import jobs

    ws = jobs.open_workspace(ctx.obj.state_dir)
    dry = jobs.dry_run(ws, jobs.LaunchRequest(job, inventory, environ=os.environ))
    problems = [str(p) for p in dry.problems]
    if output == "json":
        print_json({"valid": not (strict and problems), "job": dry.plan.job_id.removesuffix("-DRYRUN"), "nodes": [n.host for n in dry.plan.nodes],
                    "warnings": problems})
    else:
        for p in problems:
            err.print(f"warning: {p}", markup=False)
        err.print(f"{job}: valid ({len(dry.plan.nodes)} node(s): {', '.join(n.host for n in dry.plan.nodes)})"
                  + (f", {len(problems)} warning(s)" if problems else ""), markup=False)
    return 2 if strict and problems else 0


@app.command("schema")
def schema_cmd() -> int:
    """The job file's JSON Schema (for editors: yaml-language-server, VS Code); also shipped as
    templates/job.schema.json in the repo, clusterctl.templates in the wheel)."""
    from clusterctl.config.spec import json_schema

    print_json(json_schema())
    return 0


def main(argv: Optional[List[str]] = None) -> None:
    args = hoist_globals(sys.argv[1:] if argv is None else list(argv))
    debug = "--debug" in args
    # paramiko logs a failed handshake with its traceback; the failure reaches the user as a value (per host)
    logging.getLogger("paramiko").setLevel(logging.DEBUG if debug else logging.CRITICAL + 1)
    if debug:
        logging.basicConfig(level=logging.WARNING)
    try:
        rv = app.main(args=args, prog_name="clusterctl", standalone_mode=False)
        code = rv if isinstance(rv, int) else 0
    except click.exceptions.Exit as e:
        code = e.exit_code
    except click.UsageError as e:
        e.show()
        code = 2
    except click.ClickException as e:
        e.show()
        code = e.exit_code
    except (click.Abort, KeyboardInterrupt):
        err.print("interrupted", markup=False)
        code = 130
    except ClusterctlError as e:
        if debug:
            traceback.print_exc()
        err.print(f"error: {e}", markup=False)
        code = e.exit_code
    except Exception as e:  # noqa: BLE001 - the last line of defence: no traceback without --debug
        if debug:
            traceback.print_exc()
        err.print(f"internal error: {e.__class__.__name__}: {e} (rerun with --debug for the traceback)",
                  markup=False)
        code = 1
    sys.exit(code)


# registers `sbatch` (and the script's `sbatch-run`) on this module's app
from clusterctl.cli import slurm as cli_slurm  # noqa: E402

cli_slurm.register(sys.modules[__name__])


if __name__ == "__main__":
    main()
