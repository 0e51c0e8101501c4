"""`clusterctl doctor`: this machine, as clusterctl needs it (ssh-agent, ssh config, key files, the state dir,
the torchrun a local job would start).

Each check returns a ``Finding`` (a value); nothing here prints or exits."""
from __future__ import annotations

import os
import socket
import stat
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Mapping


@dataclass(frozen=True)
class Finding:
    check: str
    status: str             # pass | warn | fail
    detail: str
    hint: str | None = None

    def to_dict(self) -> dict:
        return asdict(self)


def ssh_agent(environ: Mapping[str, str]) -> Finding:
    sock = environ.get("SSH_AUTH_SOCK")
    if not sock:
        return Finding("ssh_agent", "warn", "no ssh-agent (SSH_AUTH_SOCK unset): only key files can be used",
                       "`eval $(ssh-agent) && ssh-add`, or set ansible_ssh_private_key_file in the inventory")
    try:
        with socket.socket(socket.AF_UNIX) as s:
            s.settimeout(2)
            s.connect(sock)
    except OSError as e:
        return Finding("ssh_agent", "fail", f"SSH_AUTH_SOCK={sock} does not answer: {e.strerror or e}",
                       "start a new agent (`eval $(ssh-agent)`) or unset SSH_AUTH_SOCK")
    return Finding("ssh_agent", "pass", f"agent at {sock}")


def ssh_config(home: Path) -> Finding:
    path = home / ".ssh" / "config"
    if not path.exists():
        return Finding("ssh_config", "pass", f"{path}: none (defaults apply)")
    try:
        import paramiko

        cfg = paramiko.SSHConfig.from_path(str(path))
        return Finding("ssh_config", "pass", f"{path}: {len(cfg.get_hostnames())} host pattern(s)")
    except Exception as e:  # noqa: BLE001 - any parse error is the finding
        return Finding("ssh_config", "fail", f"{path}: cannot be read: {e}", f"fix the syntax of {path}")


def key_files(home: Path) -> list[Finding]:
    out = []
    for key in sorted((home / ".ssh").glob("id_*")):
        if key.suffix == ".pub" or not key.is_file():
            continue
        mode = stat.S_IMODE(key.stat().st_mode)
        if mode & 0o077:
            out.append(Finding("key_permissions", "fail", f"{key} is mode {mode:o}: OpenSSH refuses keys others "
                                                           "can read", f"chmod 600 {key}"))
        else:
            out.append(Finding("key_permissions", "pass", f"{key} is mode {mode:o}"))
    return out or [Finding("key_permissions", "warn", f"no private key in {home / '.ssh'}",
                           "ssh-keygen -t ed25519, or name the key with ansible_ssh_private_key_file")]


def state_dir(root: Path) -> Finding:
    from clusterctl.store import paths

    try:
        paths.ensure_state_dir(root)
    except Exception as e:  # noqa: BLE001 - the error text is the finding (owner, mode, not writable)
        return Finding("state_dir", "fail", f"{root}: {e}", "--state-dir DIR (or $CLUSTERCTL_STATE_DIR)")
    free = os.statvfs(root)
    mb = free.f_bavail * free.f_frsize / 2**20
    if mb < 256:
        return Finding("state_dir", "warn", f"{root}: private, {mb:.0f} MiB free",
                       "the log copy takes up to 128 MiB per job: free some space or use --state-dir")
    return Finding("state_dir", "pass", f"{root}: private (0700), {mb:.0f} MiB free")


def torchrun(environ: Mapping[str, str]) -> Finding:
    """The torchrun a job on this machine (the embedded default, a ``local`` host, bare runtime) would start:
    what launch's preflight finds (PATH, then beside clusterctl's interpreter)."""
    from clusterctl.transport.local import which_local

    found = which_local("torchrun", environ)
    if found:
        return Finding("torchrun", "pass", f"{found} (for jobs on this machine)")
    return Finding("torchrun", "warn", "no torchrun on PATH nor beside clusterctl's interpreter: jobs on this "
                                       "machine (the embedded default) cannot start",
                   "install torch beside clusterctl (`make install` does), or set the job's `torchrun:` to its "
                   "full path; not needed to launch on remote hosts")


def diagnose(root: Path, environ: Mapping[str, str], home: Path) -> list[Finding]:
    return [ssh_agent(environ), ssh_config(home), *key_files(home), state_dir(root), torchrun(environ)]
