"""The first hour: ``inventory``, ``init``, ``doctor``, ``validate``, ``schema``."""
from __future__ import annotations

import sys

import click

from clusterctl.cli.base import (
    app,
    err,
    inventory_option,
    load_hosts,
    out,
    output_option,
    print_json,
    with_unset_secrets,
)


@app.command("inventory")
@inventory_option
@output_option
def inventory_cmd(inventory: str | None, output: str) -> int:
    """Print the resolved hosts and their variables."""

    inv = load_hosts(inventory)
    if output == "json":
        print_json({"source": inv.source, "hosts": [h.to_dict() for h in inv.hosts],
                    "groups": {g: list(h) for g, h in inv.groups.items()},
                    "notes": [n.to_dict() for n in inv.notes]})
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


@app.command("init")
@click.argument("file", default="job.yaml", required=False, type=click.Path())
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


@app.command("doctor")
@output_option
@click.pass_context
def doctor_cmd(ctx, output) -> int:
    """This machine as clusterctl needs it: ssh-agent, ~/.ssh/config, key permissions, the state dir, the torchrun
    a job on this machine uses."""
    import os
    from pathlib import Path

    from clusterctl.usecases import setup as usetup

    found = usetup.doctor(ctx.obj.state_dir, os.environ, Path.home())
    if output == "json":
        print_json([f.to_dict() for f in found])
    else:
        marks = {"pass": "✓", "warn": "!", "fail": "✗"}
        for f in found:
            out.print(f"{marks[f.status]} {f.check}: {f.detail}" + (f"\n    → {f.hint}" if f.hint else ""),
                      markup=False)
    return 1 if any(f.status == "fail" for f in found) else 0


@app.command("validate")
@click.argument("job", type=click.Path())
@inventory_option
@click.option("--strict", is_flag=True, help="Warnings (unset secret variables, key files) fail too (exit 2).")
@output_option
@click.pass_context
def validate_cmd(ctx, job, inventory, strict, output) -> int:
    """Check JOB and the inventory as launch does before contacting any host (schema, hosts, cordons, secret
    variables, key files); exit 0 valid, 2 invalid."""
    import os

    from clusterctl.usecases import lifecycle
    from clusterctl.usecases.base import open_workspace

    ws = open_workspace(ctx.obj.state_dir)
    with with_unset_secrets(job, os.environ):
        dry = lifecycle.dry_run(ws, lifecycle.LaunchRequest(job, inventory, environ=os.environ))
    problems = [str(p) for p in dry.problems]
    if output == "json":
        print_json({"valid": not (strict and problems), "job": dry.plan.job_id.removesuffix("-DRYRUN"),
                    "nodes": [n.host for n in dry.plan.nodes], "warnings": problems})
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
