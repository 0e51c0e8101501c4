"""What every command group shares: the click group and its globals, the common options, the consoles, JSON
output, connect options, the progress bar, and the unset secrets named beside a refused job
file."""
from __future__ import annotations

import json
import sys
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator, Optional

import click
from rich.console import Console

from clusterctl import __version__

class _Console(Console):
    def on_broken_pipe(self) -> None:
        """The reader went away (`clusterctl logs JOB | head -1`): rich would exit 1; ``main`` exits 0."""
        self.quiet = True
        raise BrokenPipeError


out = _Console(highlight=False, soft_wrap=True)
err = _Console(stderr=True, highlight=False, soft_wrap=True)
OUTPUT = click.Choice(["table", "json"])


class Finite(click.FloatRange):
    """A float option within its range and finite: click's FloatRange lets ``nan`` through (every comparison with
    it is false) and ``inf`` where there is no upper bound."""

    def convert(self, value, param, ctx):
        import math

        rv = super().convert(value, param, ctx)
        if not math.isfinite(rv):
            self.fail(f"{value!r} is not a finite number of seconds", param, ctx)
        return rv


MAX_COUNT = 10**9      # --tail, --rank, --attempt: far above any real value, small enough for SQLite and slicing


@dataclass
class Globals:
    state_dir: Optional[str] = None
    debug: bool = False
    accept_new_host_keys: bool = False


def nonempty(ctx, param, value):
    """A selection option given an empty value (``-i "$INV" --limit "$HOSTS"`` with both unset) is a usage error
    (exit 2): an empty value must never widen a command to every host or the default inventory."""
    for v in value if isinstance(value, tuple) else (value,):
        if v is not None and not str(v).strip(" ,"):
            name = max(param.opts, key=len) if param.opts else param.name
            raise click.BadParameter(f"empty value {v!r} (an unset variable?): name what to select, or leave "
                                     "the option out", param_hint=name)
    return value


def load_hosts(path):
    """``-i``: an inventory file, ``slurm[:OVERLAY]`` or the embedded default; its notes (Ansible vars accepted
    but not used) on stderr."""
    from clusterctl.slurm.allocation import load_hosts as load

    inv = load(path)
    for note in inv.notes:
        err.print(f"note: {note}", markup=False)
    return inv


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--state-dir", envvar="CLUSTERCTL_STATE_DIR", default=None, callback=nonempty,
              help="State directory (jobs DB, logs). Default: $CLUSTERCTL_STATE_DIR, else platformdirs' user "
                   "state dir (e.g. ~/.local/state/clusterctl).")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.option("--accept-new-host-keys", is_flag=True, help="Record unknown SSH host keys (never changed ones).")
@click.version_option(__version__, "--version", prog_name="clusterctl", message="%(prog)s %(version)s")
@click.pass_context
def app(ctx: click.Context, state_dir, debug, accept_new_host_keys) -> None:
    """Launch and supervise multi-node PyTorch training over SSH."""
    if state_dir and ctx.get_parameter_source("state_dir") == click.core.ParameterSource.COMMANDLINE:
        refuse_missing_state_dir(state_dir, ctx.invoked_subcommand)
    ctx.obj = Globals(state_dir, debug, accept_new_host_keys)


# a state dir's first use (validate: launch's checks, --dry-run's too); every other command reads one that exists
CREATES_STATE_DIR = ("launch", "validate", "cordon", "sbatch")   # sbatch: writes its script there
# commands that read no job state (exec/shell only with --job, where a missing dir then names no job): a fresh
# --state-dir is no typo to them, and they create nothing there
NO_STATE_READ = ("preflight", "inventory", "init", "schema", "exec", "shell")


def refuse_missing_state_dir(state_dir: str, command: str | None) -> None:
    """``--state-dir`` naming a directory that does not exist is a usage error (exit 2), not a new, empty history
    (a typo showed "no jobs yet"), except for the commands that start one."""
    import os

    if command in (*CREATES_STATE_DIR, *NO_STATE_READ) or "--help" in sys.argv or \
            os.path.isdir(os.path.expanduser(state_dir)):
        return
    raise click.BadParameter(f"{state_dir} does not exist (a typo?); `clusterctl launch` or `cordon` create a new "
                             "state dir, or `mkdir -p` it", param_hint="--state-dir")


def inventory_option(f):
    return click.option("-i", "--inventory", default=None, callback=nonempty, type=click.Path(),
                        help="Inventory YAML (default: $CLUSTERCTL_INVENTORY, ./inventory.yaml, else this machine).")(f)


def output_option(f):
    return click.option("--output", "-o", type=OUTPUT, default="table", show_default=True,
                        help="table, or json on stdout for scripts.")(f)


def complete_jobs(ctx, param, incomplete: str) -> list:
    """Shell completion of JOB: the names and ids in the state dir (``--state-dir`` or its default)."""
    try:
        from clusterctl.usecases.base import job_names

        return [n for n in job_names((ctx.find_root().params or {}).get("state_dir"))
                if n.startswith(incomplete)]
    except Exception:  # noqa: BLE001 - completion never prints a traceback into the user's shell
        return []


def complete_hosts(ctx, param, incomplete: str) -> list:
    """Shell completion of HOST: the default inventory's host names ($CLUSTERCTL_INVENTORY, ./inventory.yaml)."""
    try:
        from clusterctl.slurm.allocation import load_hosts as load     # quietly: no notes into the user's shell

        return [h.name for h in load(ctx.params.get("inventory")).hosts if h.name.startswith(incomplete)]
    except Exception:  # noqa: BLE001
        return []


def complete_nodes(ctx, param, incomplete: str) -> list:
    """Shell completion of --node/--exclude: the nodes of the command's JOB (its latest attempt; click does not
    parse JOB when the line ends in an option: then every job's), and the default inventory's hosts."""
    try:
        from clusterctl.usecases.base import job_node_names

        names = job_node_names((ctx.find_root().params or {}).get("state_dir"), ctx.params.get("job"))
        names = list(dict.fromkeys([*names, *complete_hosts(ctx, param, "")]))
        return [n for n in names if n.startswith(incomplete)]
    except Exception:  # noqa: BLE001
        return []


def accept_option(f):
    return click.option("--accept-new-host-keys", "accept_new", is_flag=True,
                        help="Record unknown SSH host keys (never changed ones).")(f)


@contextmanager
def with_unset_secrets(job_path: str, environ) -> Iterator[None]:
    """``validate``/``--dry-run``: when the job file is refused (a schema error), its unset ``secret_env`` and
    ``notify[].webhook_env`` variables are still named, read from the raw file (one fix round, not two)."""
    from clusterctl.errors import InputError

    try:
        yield
    except InputError:
        for warning in unset_secret_names(job_path, environ):
            err.print(f"warning: {warning}", markup=False)
        raise


def unset_secret_names(job_path: str, environ) -> list[str]:
    """``FILE:LINE: key: NAME is not set ...`` for each secret/webhook variable the raw job file names that
    ``environ`` lacks (nothing when the file cannot be read as YAML at all)."""
    from clusterctl.config import yamlfile
    from clusterctl.errors import ClusterctlError

    try:
        data = yamlfile.load_yaml_with_lines(job_path)
    except ClusterctlError:
        return []
    if not isinstance(data, dict):
        return []
    found = []
    names = data.get("secret_env")
    for i, name in enumerate(names if isinstance(names, list) else []):
        if isinstance(name, str) and name not in environ:
            found.append((yamlfile.line_of(names, i), f"secret_env[{i}]", name))
    targets = data.get("notify")
    for i, t in enumerate(targets if isinstance(targets, list) else []):
        name = t.get("webhook_env") if isinstance(t, dict) else None
        if isinstance(name, str) and not environ.get(name):
            found.append((yamlfile.line_of(t, "webhook_env"), f"notify[{i}].webhook_env", name))
    return [f"{job_path}:{line}: {key}: {name} is not set in clusterctl's environment (`export {name}=...`)"
            for line, key, name in found]


def print_json(value) -> None:
    sys.stdout.write(json.dumps(value, indent=2, default=str) + "\n")
    sys.stdout.flush()


def connect_options(ctx: click.Context, accept_new: bool = False, **kw):
    from clusterctl.transport import ConnectOptions

    return ConnectOptions(accept_new_host_keys=accept_new or ctx.obj.accept_new_host_keys, **kw)


def progress_bar(show: bool):
    """The preflight progress bar on stderr (a ``progress(done, total, label)`` callback), or None."""
    from contextlib import nullcontext

    from clusterctl.checks.report import progress_display

    return progress_display(err) if show else nullcontext(None)
