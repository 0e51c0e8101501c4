"""The hosts across jobs: ``nodes``, ``cordon``, ``uncordon``."""
from __future__ import annotations

import click

from clusterctl.cli.base import (
    app,
    complete_hosts,
    err,
    inventory_option,
    load_hosts,
    out,
    output_option,
    print_json,
)


@app.command("nodes")
@inventory_option
@output_option
@click.pass_context
def nodes_cmd(ctx, inventory, output) -> int:
    """Per host: ok or cordoned (reason, since), jobs run, failures by class in the last 7 days, the last one."""
    import time

    from clusterctl.usecases import nodes as unodes
    from clusterctl.usecases.base import open_workspace
    from clusterctl.views import history

    inv = load_hosts(inventory)
    now = time.time()
    rows = unodes.node_rows(open_workspace(ctx.obj.state_dir), inv, now)
    if output == "json":
        print_json(rows)
        return 0
    from clusterctl.views.columns import Column, fit

    # host names and the last failure's job id whole (other commands take them); the cordon's reason spills
    cols = [Column("host"), Column("state"), Column("jobs", right=True), Column("failures 7d", min=11),
            Column("last failure", min=12), Column("job"), Column("cordon", min=40)]
    table = []
    for r in rows:
        lf = r["last_failure"]
        table.append([r["host"] + ("" if r["in_inventory"] else " (not in inventory)"), r["state"], str(r["jobs"]),
                      ", ".join(f"{k} {v}" for k, v in sorted(r["failures_7d"].items())) or "-",
                      f"{history.clock(lf['time'], now)} {lf['class']}" if lf else "-", lf["job_id"] if lf else "-",
                      f"{r['reason']} (since {history.clock(r['since'], now)}, {r['by']})" if r["reason"] else ""])
    for line in fit(cols, table, out.width, shrink_order=[(6, 30), (3, 20)], spill=6):
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
    from clusterctl.errors import UserError
    from clusterctl.usecases import nodes as unodes
    from clusterctl.usecases.base import open_workspace

    if not reason.strip() or "\n" in reason:
        raise UserError("--reason must be one non-empty line")
    names = _host_names(hosts)
    out = unodes.cordon(open_workspace(ctx.obj.state_dir), names, reason.strip(), load_hosts(inventory),
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
    from clusterctl.usecases import nodes as unodes
    from clusterctl.usecases.base import open_workspace

    result = unodes.uncordon(open_workspace(ctx.obj.state_dir), _host_names(hosts))
    if output == "json":
        print_json([{"host": h, "state": "ok", "was_cordoned": was} for h, was in result.items()])
    else:
        for h, was in result.items():
            err.print(f"{h} uncordoned" if was else f"{h} was not cordoned", markup=False)
    return 0
