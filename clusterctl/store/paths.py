"""Where clusterctl keeps its state: ``--state-dir`` > ``$CLUSTERCTL_STATE_DIR`` > the platform's state dir.

Layout (the directory is private, mode 0700)::

    <state_dir>/state.db                      SQLite store (mode 0600), see ``clusterctl.store.state``
    <state_dir>/jobs/<job_id>/supervisor.log  detached supervisor's log
    <state_dir>/jobs/<job_id>/supervisor.pid  detached supervisor's pid

Whoever can write the state dir can replace ``state.db``, and ``resume``/``stop`` then run their argv on their
hosts with your keys and secrets: a state dir or ``jobs/`` (or a job dir) owned by another user, or writable by
group/others, is refused (``UserError``, exit 2, with the fix), and so is a ``state.db`` that is a symlink or not
ours. Files are opened with ``O_NOFOLLOW`` (``open_private``).
"""
from __future__ import annotations

import os
import re
import stat
from pathlib import Path
from typing import Mapping

import platformdirs

from clusterctl.config.ids import JOB_ID_RE
from clusterctl.errors import UserError

ENV_VAR = "CLUSTERCTL_STATE_DIR"
APP_NAME = "clusterctl"
DIR_MODE = 0o700

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
    A directory owned by someone else, or writable by group/others, is refused (``UserError``)."""
    return _ensure_private_dir(Path(path))


def db_path(root: str | os.PathLike[str]) -> Path:
    """``<root>/state.db``; ``UserError`` if it (or its -wal/-shm) exists as a symlink or another user's file."""
    path = Path(root) / "state.db"
    for p in (path, Path(f"{path}-wal"), Path(f"{path}-shm")):
        try:
            info = p.lstat()
        except FileNotFoundError:
            continue
        except OSError as exc:
            raise UserError(f"{p}: cannot read: {exc.strerror or exc}") from None
        if stat.S_ISLNK(info.st_mode) or not stat.S_ISREG(info.st_mode):
            raise UserError(f"{p}: not a regular file (a symlink?): refusing to use it. Remove it (rm {_q(p)}) "
                            f"or use another --state-dir")
        if _owner_mismatch(info):
            raise UserError(f"{p}: owned by uid {info.st_uid}, not by you (uid {os.getuid()}): refusing to use it. "
                            f"Use your own --state-dir")
    return path


def open_private(path: str | os.PathLike[str], *, append: bool = True) -> int:
    """``os.open`` for our files in the state dir: created 0600, never through a symlink (``O_NOFOLLOW``), and
    refused if the file exists but is another user's. ``append``: else truncate. Returns the fd."""
    flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    flags |= os.O_APPEND if append else os.O_TRUNC
    try:
        fd = os.open(path, flags, 0o600)
    except OSError as exc:
        raise UserError(f"{path}: cannot open (a symlink?): {exc.strerror or exc}") from None
    if _owner_mismatch(os.fstat(fd)):
        os.close(fd)
        raise UserError(f"{path}: owned by another user: refusing to write it")
    return fd


# File systems where SQLite's WAL does not work: its index is shared memory (``-shm``, mmap'ed), which no two hosts
# share (https://sqlite.org/wal.html: "WAL does not work over a network filesystem"). The state database there uses
# a rollback journal (``state.journal_mode``), whose locks are the file system's POSIX locks.
NETWORK_FS = frozenset({"nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs",
                        "fuse.glusterfs", "fuse.sshfs", "fuse.cephfs", "9p", "afs", "ocfs2", "gfs2", "panfs",
                        "fuse.juicefs", "wekafs", "virtiofs"})


def filesystem_type(path: str | os.PathLike[str], mounts: str | None = None) -> str | None:
    """The type of the file system holding ``path`` (``nfs4``, ``ext4``, ...) from ``/proc/self/mounts`` (the
    mount point that is the longest prefix of its real path); None where that cannot be read (not Linux)."""
    if mounts is None:
        try:
            mounts = Path("/proc/self/mounts").read_text()
        except OSError:
            return None
    real = os.path.realpath(path)
    best, kind = -1, None
    for line in mounts.splitlines():
        fields = line.split()
        if len(fields) < 3:
            continue
        point = re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), fields[1])
        inside = real == point or real.startswith(point.rstrip("/") + "/")
        if inside and len(point) >= best:
            best, kind = len(point), fields[2]
    return kind


def on_network_fs(path: str | os.PathLike[str], mounts: str | None = None) -> str | None:
    """The network file system type holding ``path`` (``nfs4``, ``lustre``, ...), or None when it is local."""
    kind = filesystem_type(path, mounts)
    return kind if kind in NETWORK_FS else None


def write_private(path: str | os.PathLike[str], text: str) -> None:
    """Replace ``path`` with ``text``, 0600: written to a fresh temp file beside it (``O_EXCL | O_NOFOLLOW``, so
    never through a symlink planted there), then renamed over ``path`` (a symlink at ``path`` is replaced, never
    followed). For reports the supervisor writes into the job's directory (``stacks-<N>.json``)."""
    import secrets

    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{secrets.token_hex(6)}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0)
                 | getattr(os, "O_CLOEXEC", 0), 0o600)
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


def output_log(root: str | os.PathLike[str], job_id: str) -> Path:
    """The controller's copy of every rank's output (``logs``; rotated to ``output.log.1``)."""
    return job_dir(root, job_id) / "output.log"


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
    if _owner_mismatch(info):
        raise UserError(f"{path}: state directory owned by uid {info.st_uid}, not by you (uid {os.getuid()}): its "
                        f"owner could replace the job records and make clusterctl run their commands with your "
                        f"keys. Use a directory of your own (--state-dir or ${ENV_VAR}), or, if it is yours: "
                        f"chown {os.getuid()} {_q(path)} && chmod 700 {_q(path)}")
    if info.st_mode & 0o022:
        raise UserError(f"{path}: state directory is writable by group/others (mode "
                        f"{stat.S_IMODE(info.st_mode):o}): anyone with write access could replace the job records. "
                        f"Check its contents, then: chmod 700 {_q(path)}")
    # mkdir's mode is filtered by the umask and ignored for an existing directory: make it private.
    if stat.S_IMODE(info.st_mode) != DIR_MODE:
        try:
            path.chmod(DIR_MODE)
        except OSError as exc:
            raise UserError(f"{path}: cannot make state directory private: {exc.strerror or exc}") from None
    return path


def _owner_mismatch(info: os.stat_result) -> bool:
    return hasattr(os, "getuid") and info.st_uid != os.getuid()


def _q(path: str | os.PathLike[str]) -> str:
    import shlex

    return shlex.quote(os.fspath(path))
