"""The command line: parse, call, print, exit. The only package that prints or exits.

One module per command group (setup, preflight, lifecycle, views, oncall, nodes, slurm, report), each: flags -> a
request -> one use case (``clusterctl.usecases.<group>``, the same group) -> text or JSON and an exit code; ``base``
holds what they share. Importing this package registers every command on ``app``.

Exit codes: 0 success; 1 the operation found failures (a check failed, a job failed); 2 usage or input error.
"""
from __future__ import annotations

import logging
import os
import sys
import traceback
from typing import List, Optional

import click

from clusterctl.cli import lifecycle, nodes, oncall, preflight, report, setup, slurm, views  # noqa: F401 - commands
from clusterctl.cli.base import app, err
from clusterctl.errors import ClusterctlError

__all__ = ["app", "main"]


GLOBAL_FLAGS = ("--debug", "--version")


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
        if isinstance(e, click.NoSuchOption) and e.ctx is not None and e.ctx.command.name == "launch":
            e.message += " (arguments for the script go after `--`: clusterctl launch job.yaml -- --lr 0.1)"
        e.show()
        code = 2
    except click.ClickException as e:
        e.show()
        code = e.exit_code
    except BrokenPipeError:    # the reader of stdout went away (`| head -1`): as `cat | head`, not an error
        reader_gone()
        code = 0
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
    try:
        sys.stdout.flush()
    except BrokenPipeError:
        reader_gone()
        code = 0
    sys.exit(code)


def reader_gone() -> None:
    """stdout's reader went away: what is still buffered goes to /dev/null, not into an "Exception ignored" line
    at exit."""
    try:
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    except (OSError, ValueError):
        pass


if __name__ == "__main__":
    main()
