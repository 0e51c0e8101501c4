"""The command line: parse, call, print, exit. The only module that prints or exits.

Exit codes: 0 success; 1 the operation found failures (a check failed, a job failed); 2 usage or input error.
"""
from __future__ import annotations

import json
import sys
import traceback
from dataclasses import dataclass
from typing import List, Optional

import click
from rich.console import Console
from rich.table import Table

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


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--state-dir", envvar="CLUSTERCTL_STATE_DIR", default=None,
              help="State directory (jobs DB, logs). Default: platformdirs' user state dir.")
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
    from clusterctl import inventory as inv_mod

    inv = inv_mod.load(inventory)
    if output == "json":
        print_json({"source": inv.source, "hosts": [h.to_dict() for h in inv.hosts],
                    "groups": {g: list(h) for g, h in inv.groups.items()}})
        return 0
    table = Table(title=f"inventory: {inv.source}")
    for col in ("host", "address", "port", "user", "connection", "runtime", "gpus", "interface", "groups"):
        table.add_column(col)
    for h in inv.hosts:
        table.add_row(h.name, h.address, str(h.port or "-"), h.user or "-", h.connection, h.runtime,
                      "-" if h.gpus is None else str(h.gpus), h.interface or "-", ",".join(h.groups))
    out.print(table)
    return 0


# ---------------------------------------------------------------------------------------------- entry point
def main(argv: Optional[List[str]] = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    debug = "--debug" in args
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


if __name__ == "__main__":
    main()
