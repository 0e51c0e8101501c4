"""A real Docker Engine per testbed host (``Testbed(..., docker=True)``).

Each host runs its own ``dockerd`` inside its network namespace (started like its sshd: ``nsenter --net`` +
``unshare --uts``), with its own data root (under the host's directory), exec root, pidfile and socket (under the
testbed's runroot), no iptables, no bridge, vfs storage and cgroupfs. dockerd starts its own containerd. The
host's ``docker`` CLI reaches it through ``DOCKER_HOST`` (sshd ``SetEnv``, as for PATH). The test image is the
podman one's rootfs tar, ``docker import``ed into every daemon (and tagged with the jobs' default short name). dockerd has no containers.conf ``volumes``: jobs
on docker hosts mount the host's /usr, Python, venv, repo and shared storage themselves (``job_mounts``).
"""

from __future__ import annotations

import os
import signal as signals
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from . import containers

DOCKERD = "/usr/sbin/dockerd"
INSTALL_HINT = "apt-get install docker.io (or `make test`, which installs it without starting a system daemon)"


@dataclass(frozen=True)
class Daemon:
    """Where one host's dockerd keeps its things."""

    data_root: Path      # images, containers (vfs): on disk, under the host's directory
    exec_root: Path      # runtime state, containerd's sockets: under /run (short paths: unix sockets <= 107)
    log: Path

    @property
    def pidfile(self) -> Path:
        return self.exec_root / "dockerd.pid"

    @property
    def socket(self) -> Path:
        return self.exec_root / "docker.sock"

    @property
    def env(self) -> dict[str, str]:
        return {"DOCKER_HOST": f"unix://{self.socket}"}


def daemon(host_dir: Path, runroot: Path) -> Daemon:
    return Daemon(data_root=host_dir / "docker", exec_root=runroot, log=host_dir / "dockerd.log")


def argv(d: Daemon) -> list[str]:
    return [DOCKERD, f"--data-root={d.data_root}", f"--exec-root={d.exec_root}", f"--pidfile={d.pidfile}",
            f"--host=unix://{d.socket}", "--iptables=false", "--ip6tables=false", "--bridge=none",
            "--storage-driver=vfs", "--exec-opt=native.cgroupdriver=cgroupfs", "--shutdown-timeout=1",
            "--log-level=warn"]


def spawn(d: Daemon, ns: str, hostname: str, path: str | None = None) -> None:
    """Start the daemon in the host's netns, detached (``setsid -f``: its own session, not our child, so no zombie
    is left in this process when it stops), output to ``d.log``. ``path``: put first on its PATH (the host's stub
    bin: dockerd offers ``--gpus`` when nvidia-container-runtime-hook is on its PATH at start)."""
    env = dict(os.environ, PATH=f"{path}:{os.environ.get('PATH', '')}") if path else None
    d.data_root.mkdir(parents=True, exist_ok=True)
    d.exec_root.mkdir(parents=True, exist_ok=True)
    script = 'hostname "$1" && shift && exec "$@"'
    with open(d.log, "ab") as log:
        subprocess.run(["setsid", "-f", "nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "sh", "-c", script,
                        "sh", hostname, *argv(d)], stdin=subprocess.DEVNULL, stdout=log, stderr=log, close_fds=True,
                       check=True, timeout=30, env=env)


def pid(d: Daemon) -> int | None:
    try:
        p = int(d.pidfile.read_text())
    except (OSError, ValueError):
        return None
    try:
        return p if b"dockerd" in Path(f"/proc/{p}/cmdline").read_bytes() and _alive(p) else None
    except OSError:
        return None


def docker(d: Daemon, *args: str, timeout: float = 60, check: bool = False, **kw) -> subprocess.CompletedProcess:
    """The docker CLI against this daemon (from the machine's own namespace: the socket is a file)."""
    return subprocess.run(["docker", *args], env=dict(os.environ, **d.env), capture_output=True, text=True,
                          timeout=timeout, check=check, stdin=kw.pop("stdin", subprocess.DEVNULL), **kw)


def wait_ready(daemons: dict[str, Daemon], timeout: float) -> None:
    """Until every daemon answers ``docker version`` (its server part)."""
    pending = dict(daemons)
    end = time.monotonic() + timeout
    while pending:
        for name, d in list(pending.items()):
            if d.socket.exists() and docker(d, "version", "--format", "{{.Server.Version}}", timeout=10).returncode == 0:
                del pending[name]
        if pending and time.monotonic() > end:
            name, d = next(iter(pending.items()))
            tail = d.log.read_text(errors="replace")[-2000:] if d.log.exists() else ""
            raise RuntimeError(f"dockerd not ready on {sorted(pending)} after {timeout:g}s: {tail}")
        if pending:
            time.sleep(0.1)


def import_image(d: Daemon, tar: Path) -> None:
    venv_bin = Path(sys.prefix).resolve() / "bin"
    r = docker(d, "import", "--change", f"ENV PATH={venv_bin}:/usr/bin:/bin", "--change", 'CMD ["sleep","infinity"]',
               str(tar), containers.IMAGE, timeout=120)
    if r.returncode != 0:
        raise RuntimeError(f"docker import failed: {r.stderr.strip()}")
    # the short name too: podman resolves `pytorch-cuda:v2.7-ssh` (the jobs' default image) to localhost/, docker
    # to docker.io/library/, where no registry answers
    r = docker(d, "tag", containers.IMAGE, containers.IMAGE.removeprefix("localhost/"), timeout=60)
    if r.returncode != 0:
        raise RuntimeError(f"docker tag failed: {r.stderr.strip()}")


def stop(d: Daemon, timeout: float = 15) -> None:
    """Remove every container, then stop the daemon (its containerd goes with it). Whatever is left in the netns
    is killed by ``Testbed.down`` afterwards."""
    if (p := pid(d)) is None:
        return
    if d.socket.exists():
        ids = docker(d, "ps", "-aq", timeout=30).stdout.split()
        if ids:
            docker(d, "rm", "-f", *ids, timeout=60)
    try:
        os.kill(p, signals.SIGTERM)
    except ProcessLookupError:
        return
    end = time.monotonic() + timeout
    while _alive(p) and time.monotonic() < end:
        time.sleep(0.05)


def _alive(p: int) -> bool:
    try:   # a zombie is gone (the daemon may be a child of this process)
        return Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def job_mounts(shared: Path) -> list[str]:
    """What containers.conf ``volumes`` gives every podman container, as a job's ``mounts`` for docker hosts."""
    return containers.mounts(shared)
