"""Where clusterctl keeps its state: ``--state-dir`` > ``$CLUSTERCTL_STATE_DIR`` > the platform's state dir.

Layout (the directory is private, mode 0700)::

    <state_dir>/state.db                      SQLite store (mode 0600), see ``clusterctl.state``
    <state_dir>/jobs/<job_id>/supervisor.log  detached supervisor's log
    <state_dir>/jobs/<job_id>/supervisor.pid  detached supervisor's pid
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Mapping

import platformdirs

from clusterctl.errors import UserError

ENV_VAR = "CLUSTERCTL_STATE_DIR"
APP_NAME = "clusterctl"
DIR_MODE = 0o700

# A job id becomes a directory name: no separators, no leading dot, no "..".
JOB_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,199}$")


def state_dir(explicit: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None) -> Path:
    """The state directory: ``explicit`` (the ``--state-dir`` flag), else ``$CLUSTERCTL_STATE_DIR``,
    else ``platformdirs.user_state_dir("clusterctl")``. Empty values count as unset. Creates nothing."""
    env = os.environ if environ is None else environ
    chosen = os.fspath(explicit) if explicit not in (None, "") else env.get(ENV_VAR) or None
    if chosen is None:
        chosen = platformdirs.user_state_dir(APP_NAME)
    return Path(chosen).expanduser().absolute()


def ensure_state_dir(path: str | os.PathLike[str]) -> Path:
    """Create ``path`` (and parents) with mode 0700; an existing directory we own is chmod'ed to 0700.
    A directory owned by someone else is left as it is."""
    return _ensure_private_dir(Path(path))


def db_path(root: str | os.PathLike[str]) -> Path:
    return Path(root) / "state.db"


def job_dir(root: str | os.PathLike[str], job_id: str) -> Path:
    """``<root>/jobs/<job_id>``; ``UserError`` if ``job_id`` could escape that directory."""
    if not JOB_ID_RE.match(job_id) or ".." in job_id:
        raise UserError(f"invalid job id {job_id!r}")
    return Path(root) / "jobs" / job_id


def ensure_job_dir(root: str | os.PathLike[str], job_id: str) -> Path:
    """Create ``<root>/jobs/<job_id>`` (each level mode 0700) and return it."""
    directory = job_dir(root, job_id)
    _ensure_private_dir(directory.parent)
    return _ensure_private_dir(directory)


def supervisor_log_path(root: str | os.PathLike[str], job_id: str) -> Path:
    return job_dir(root, job_id) / "supervisor.log"


def supervisor_pid_path(root: str | os.PathLike[str], job_id: str) -> Path:
    return job_dir(root, job_id) / "supervisor.pid"


def _ensure_private_dir(path: Path) -> Path:
    try:
        path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)
        info = path.stat()
    except FileExistsError:
        raise UserError(f"{path}: state directory path exists and is not a directory") from None
    except OSError as exc:
        raise UserError(f"{path}: cannot create state directory: {exc.strerror or exc}") from None
    if not stat.S_ISDIR(info.st_mode):
        raise UserError(f"{path}: state directory path exists and is not a directory")
    # mkdir's mode is filtered by the umask and ignored for an existing directory: fix it if it is ours.
    ours = not hasattr(os, "getuid") or info.st_uid == os.getuid()
    if ours and stat.S_IMODE(info.st_mode) != DIR_MODE:
        try:
            path.chmod(DIR_MODE)
        except OSError as exc:
            raise UserError(f"{path}: cannot make state directory private: {exc.strerror or exc}") from None
    return path
