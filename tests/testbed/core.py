"""A multi-host testbed on one machine: N network namespaces on a bridge, a real OpenSSH sshd per host,
per-host stub GPU tools, per-host podman storage, with ``docker=True`` a real dockerd per host (dockerd.py),
shared storage, and fault injection.

    with Testbed(3, "/tmp/tb") as tb:
        tb.hosts[0].name, tb.hosts[0].address, tb.hosts[0].ns   # node1, 10.77.0.11, tb1
        tb.inventory("/tmp/tb/inventory.yaml")
        tb.partition("node2"); tb.heal("node2")

Names derive from ``prefix`` (netns ``<prefix>I``, bridge ``<prefix>br0``, veth ``<prefix>Iv``, login user
``cc<prefix>``), addresses from ``subnet_octet`` (10.S.0.1 bridge, 10.S.0.(10+I) hosts), so testbeds with
different prefixes and subnets coexist. A prefix names one testbed: ``up()`` first removes leftovers of a
previous testbed with the same prefix. State is saved as ``<base_dir>/testbed.json`` (``Testbed.load``) and
``/run/clusterctl-testbed/<prefix>.json`` (for ``cleanup_stale``).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal as signals
import socket
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from . import containers, dockerd, stubs, system
from . import slurm as slurmd

REGISTRY = Path("/run/clusterctl-testbed")
SSHD = "/usr/sbin/sshd"
SYSTEM_PATH = "/usr/local/bin:/usr/bin:/bin"  # after the host's stub bin dir on every host's PATH


@dataclass
class Host:
    name: str  # node1
    address: str  # 10.77.0.11
    ns: str  # tb1
    index: int  # 1
    veth: str  # tb1v (bridge side)
    dir: Path  # per-host files (sshd config, keys, stub bin, podman store)
    profile: dict = field(repr=False)
    env: dict = field(repr=False)  # what the host's sshd sets for sessions (PATH, CONTAINERS_*, DOCKER_HOST)
    daemon: "dockerd.Daemon | None" = field(default=None, repr=False)   # its dockerd (docker testbeds)

    @property
    def bin_dir(self) -> Path:
        return self.dir / "bin"


class PortHandle:
    """A listener occupying a port inside a host's netns; ``release()`` (or leave the ``with``) frees it."""

    def __init__(self, proc: subprocess.Popen):
        self.proc = proc

    def release(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.release()


class Testbed:
    def __init__(self, n_hosts: int, base_dir, profiles=None, prefix: str = "tb", subnet_octet: int = 77,
                 docker: bool = False, slurm: bool = False):
        if not 1 <= n_hosts <= 200:
            raise ValueError("n_hosts must be 1..200")
        if not (len(prefix) <= 9 and prefix.isalnum() and prefix.isascii() and prefix[-1].isalpha()):
            # names are <prefix><digits>: a prefix ending in a digit would alias another prefix's hosts
            raise ValueError("prefix must be alphanumeric, end with a letter and have at most 9 characters")
        profiles = list(profiles or [])
        if len(profiles) > n_hosts:
            raise ValueError("more profiles than hosts")
        self.prefix = prefix
        self.subnet_octet = subnet_octet
        self.docker = docker
        self.base_dir = Path(base_dir).resolve()
        self.slurm: slurmd.Cluster | None = None   # with slurm=True: a real Slurm (slurm.py)
        self.bridge = f"{prefix}br0"
        self.gateway = f"10.{subnet_octet}.0.1"
        self.user = f"cc{prefix}"
        self.plain_user = f"cc{prefix}u"     # a non-root login, made by add_plain_user()
        self.home = self.base_dir / "home"
        self.shared = self.base_dir / "shared"
        self.key = self.base_dir / "client" / "id_ed25519"
        # under /run, readable by every testbed login (a non-root one cannot reach into pytest's 0700 tmp dirs)
        self.authorized_keys = Path("/run") / f"clusterctl-testbed-{prefix}" / "authorized_keys"
        self.known_hosts = self.base_dir / "known_hosts"
        self.runroot = Path("/run") / f"clusterctl-testbed-{prefix}"
        if slurm:
            self.slurm = slurmd.cluster(self.base_dir, self.runroot, prefix)
        self.hosts: list[Host] = []
        for i in range(1, n_hosts + 1):
            prof = stubs.profile(**(profiles[i - 1] if i <= len(profiles) else {}))
            hdir = self.base_dir / "hosts" / f"node{i}"
            self.hosts.append(Host(
                name=f"node{i}", address=f"10.{subnet_octet}.0.{10 + i}", ns=f"{prefix}{i}", index=i,
                veth=f"{prefix}{i}v", dir=hdir, profile=prof, env=self._host_env(hdir, f"node{i}"),
                daemon=dockerd.daemon(hdir, self.runroot / "docker" / f"node{i}") if docker else None))
        self._up = False

    # --- lifecycle ---------------------------------------------------------------------------------------

    def __enter__(self) -> "Testbed":
        self.up()
        return self

    def __exit__(self, *exc) -> None:
        self.down()

    def up(self) -> "Testbed":
        if self._up:
            return self
        if os.geteuid() != 0:
            raise RuntimeError("the testbed needs root (network namespaces, sshd, podman)")
        missing = [t for t in ("ip", "nsenter", "unshare", "ssh-keygen", "podman", "runc") if not shutil.which(t)]
        if missing or not os.path.exists(SSHD):
            raise RuntimeError(f"missing tools {missing + ([] if os.path.exists(SSHD) else [SSHD])}: "
                               "apt-get install openssh-server podman runc iproute2 util-linux")
        if self.slurm is not None and not slurmd.available():
            raise RuntimeError(f"a slurm testbed needs munged, slurmctld, slurmd and srun: {slurmd.INSTALL_HINT}")
        if self.docker and not (os.path.exists(dockerd.DOCKERD) and shutil.which("docker")):
            raise RuntimeError(f"a docker testbed needs {dockerd.DOCKERD} and the docker CLI: {dockerd.INSTALL_HINT}")
        if (real := [t for t in ("nvidia-smi", "nvidia-ctk", "nvidia-container-cli")
                     if shutil.which(t, path=SYSTEM_PATH)]):
            raise RuntimeError(f"{real} found on {SYSTEM_PATH}: hosts profiled without them would still see them")
        cleanup_stale(self.prefix)
        if (holder := system.address_in_use(self.gateway)):
            raise RuntimeError(f"{self.gateway} already on {holder}: pick another subnet_octet")
        self._save_state()
        try:
            self._create_files()
            self._create_network()
            system.ensure_user(self.user, self.home)
            for h in self.hosts:              # the daemons start while the rest is built (they take seconds)
                if h.daemon is not None:
                    dockerd.spawn(h.daemon, h.ns, h.name, path=str(h.bin_dir))
            self._start_slurm()
            self._setup_images()
            for h in self.hosts:
                self._spawn_sshd(h)
            self._wait_ssh(self.hosts, timeout=30)
            self._setup_docker_images()
            if self.slurm is not None:
                slurmd.wait_ready(self.slurm, [h.name for h in self.hosts], timeout=60)
        except BaseException:
            self.down()
            raise
        self._up = True
        return self

    def down(self) -> None:
        """Remove everything this testbed created (safe to call at any point, more than once). Every clusterctl
        supervisor whose job targets this testbed's addresses is stopped first."""
        system.kill_pids(system.supervisors_using(f"10.{self.subnet_octet}.0."))
        daemons = [h.daemon for h in self.hosts if h.daemon is not None]
        if daemons:         # containers removed and daemons stopped, in parallel; kill_netns gets the rest
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(dockerd.stop, daemons))
        if self.slurm is not None:      # munged lives outside the namespaces: kill_netns would not stop it
            slurmd.stop(self.slurm, [h.name for h in self.hosts])
        for h in self.hosts:
            if (h.dir / "storage" / "libpod").exists() and (Path("/run/netns") / h.ns).exists():
                # podman state first, while its processes still run, so no container mounts are left
                self.exec(h, ["podman", "rm", "-a", "-f", "-t", "0"], timeout=60, check=False)
        system.kill_netns([h.ns for h in self.hosts])
        system.ip_batch([f"link del {h.veth}" for h in self.hosts if system.link_exists(h.veth)]
                        + [f"netns del {h.ns}" for h in self.hosts if (Path("/run/netns") / h.ns).exists()]
                        + ([f"link del {self.bridge}"] if system.link_exists(self.bridge) else []))
        system.unmount_under(self.base_dir)
        system.unmount_under(self.runroot)
        system.remove_user(self.user)
        system.remove_user(self.plain_user)
        subprocess.run(["rm", "-rf", str(self.runroot), str(self.base_dir / "hosts"),
                        str(self.base_dir / "template")], check=False)
        (REGISTRY / f"{self.prefix}.json").unlink(missing_ok=True)
        self._up = False

    # --- building ----------------------------------------------------------------------------------------

    def _create_files(self) -> None:
        for d in (self.home, self.shared, self.key.parent):
            d.mkdir(parents=True, exist_ok=True)
        Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)
        if not self.key.exists():
            system.sh(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", f"{self.user}@testbed",
                       "-f", str(self.key)])
        self.authorized_keys.parent.mkdir(mode=0o755, parents=True, exist_ok=True)
        self.authorized_keys.write_text(self.key.with_suffix(".pub").read_text())
        self.authorized_keys.chmod(0o644)
        keygens = []
        for h in self.hosts:
            h.dir.mkdir(parents=True, exist_ok=True)
            hk = h.dir / "ssh_host_ed25519_key"
            if not hk.exists():
                keygens.append(subprocess.Popen(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", h.name,
                                                 "-f", str(hk)], stdout=subprocess.DEVNULL))
            stubs.write_stubs(h.bin_dir, h.profile, h.index)
            containers.write_configs(h.dir, self.runroot / h.name, self.shared)
            (h.dir / "sshd_config").write_text(self._sshd_config(h))
        for p in keygens:
            if p.wait(timeout=30) != 0:
                raise RuntimeError("ssh-keygen failed")
        self.known_hosts.write_text("".join(
            f"{h.address} {(h.dir / 'ssh_host_ed25519_key.pub').read_text().split()[0]} "
            f"{(h.dir / 'ssh_host_ed25519_key.pub').read_text().split()[1]}\n" for h in self.hosts))

    def _sshd_config(self, h: Host) -> str:
        env = " ".join(f"{k}={v}" for k, v in h.env.items())
        return "\n".join([
            "Port 22", f"ListenAddress {h.address}", f"HostKey {h.dir / 'ssh_host_ed25519_key'}",
            f"PidFile {h.dir / 'sshd.pid'}", f"AuthorizedKeysFile {self.authorized_keys}",
            "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password", "UsePAM no", "StrictModes no", "UseDNS no",
            f"MaxStartups {h.profile.get('sshd_max_startups', '200:30:300')}", "MaxSessions 64", "LogLevel ERROR", "PrintMotd no",
            "Subsystem sftp internal-sftp", f"SetEnv {env}", ""])

    def _create_network(self) -> None:
        lines = [f"link add {self.bridge} type bridge", f"addr add {self.gateway}/24 dev {self.bridge}",
                 f"link set {self.bridge} up"]
        for h in self.hosts:
            lines += [f"netns add {h.ns}", f"link add {h.veth} type veth peer name eth0 netns {h.ns}",
                      f"link set {h.veth} master {self.bridge} up"]
        system.ip_batch(lines)
        for h in self.hosts:
            system.ip_batch([f"addr add {h.address}/24 dev eth0", "link set eth0 up", "link set lo up"], h.ns)

    def _host_env(self, hdir: Path, name: str) -> dict[str, str]:
        env = {"PATH": f"{hdir / 'bin'}:{SYSTEM_PATH}", "LD_LIBRARY_PATH": str(stubs.lib_dir(hdir / "bin")),
               "CONTAINERS_CONF": str(hdir / "containers.conf"),
               "CONTAINERS_STORAGE_CONF": str(hdir / "storage.conf")}
        if self.docker:
            env.update(dockerd.daemon(hdir, self.runroot / "docker" / name).env)
        if self.slurm is not None:
            env.update(self.slurm.env)
        return env

    def _start_slurm(self) -> None:
        """munged, slurmctld in the first host's namespace, a slurmd per host in its own (slurm.py)."""
        if self.slurm is None:
            return
        slurmd.write(self.slurm, self.hosts, int(self.hosts[0].profile["gpus"]))
        slurmd.start_munged(self.slurm)
        slurmd.start_ctld(self.slurm, self.hosts[0].ns, self.hosts[0].name)
        for h in self.hosts:
            slurmd.start_slurmd(self.slurm, h.ns, h.name)

    def start_slurmd(self, host) -> None:
        """Start the host's slurmd again (after ``kill``) and return the node to service."""
        h = self.host(host)
        if self.slurm is not None and slurmd.slurmd_pid(self.slurm, h.name) is None:
            slurmd.start_slurmd(self.slurm, h.ns, h.name)
            slurmd.resume(self.slurm, h.name)

    def scontrol(self, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
        if self.slurm is None:
            raise RuntimeError(f"testbed {self.prefix} has no Slurm (Testbed(..., slurm=True))")
        return slurmd.scontrol(self.slurm, *args, timeout=timeout)

    def _setup_docker_images(self) -> None:
        daemons = {h.name: h.daemon for h in self.hosts if h.daemon is not None}
        if not daemons:
            return
        dockerd.wait_ready(daemons, timeout=60)
        tar = self.base_dir / "template" / "rootfs.tar"
        tar.parent.mkdir(parents=True, exist_ok=True)
        tar.write_bytes(containers.rootfs_tar())
        wanted = [h.daemon for h in self.hosts if h.daemon is not None and h.profile["image"]]
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda d: dockerd.import_image(d, tar), wanted))

    def job_mounts(self, runtime: str) -> list[str]:
        """The ``mounts`` a job needs on this testbed: docker has no containers.conf ``volumes``, so a docker
        job mounts the host's /usr, Python, venv, repo and shared storage itself; podman and bare need none."""
        return dockerd.job_mounts(self.shared) if runtime == "docker" else []

    def add_plain_user(self) -> str:
        """A non-root login (same key as ``user``; not in the ``docker`` group), for the permission cases of
        preflight. Its home is under the runroot. Returns the user name (``inventory(extra_vars={"ansible_user":
        ...})``); ``down`` removes it."""
        uid = system.free_uid()
        home = self.runroot / "plain-home"
        home.mkdir(parents=True, exist_ok=True)
        os.chown(home, uid, uid)
        system.ensure_user(self.plain_user, home, uid=uid)
        return self.plain_user

    def stop_dockerd(self, host) -> None:
        """Stop the host's dockerd (its containers go with it): `docker` then fails to connect."""
        h = self.host(host)
        if h.daemon is not None:
            dockerd.stop(h.daemon)

    def start_dockerd(self, host) -> None:
        h = self.host(host)
        if h.daemon is not None and dockerd.pid(h.daemon) is None:
            dockerd.spawn(h.daemon, h.ns, h.name, path=str(h.bin_dir))
            dockerd.wait_ready({h.name: h.daemon}, timeout=60)

    def docker_cli(self, host, *args: str, timeout: float = 60, check: bool = False) -> subprocess.CompletedProcess:
        """The docker CLI against the host's own daemon."""
        h = self.host(host)
        if h.daemon is None:
            raise RuntimeError(f"testbed {self.prefix} has no dockerd (Testbed(..., docker=True))")
        return dockerd.docker(h.daemon, *args, timeout=timeout, check=check)

    def container_names(self, host, runtime: str = "podman", *filters: str) -> list[str]:
        """Names of the containers (all states) on the host, of ``runtime``'s engine; ``filters``: ``--filter``
        values (``label=clusterctl.job_id``)."""
        argv = [runtime, "ps", "-a", "--format", "{{.Names}}", *(f"--filter={f}" for f in filters)]
        r = self.exec(host, argv, timeout=60)
        if r.returncode != 0:
            raise RuntimeError(f"{' '.join(argv)} on {self.host(host).name}: {r.stderr.strip()}")
        return r.stdout.split()

    def remove_containers(self, host) -> None:
        """Force-remove every container on the host (podman, and docker on a docker testbed)."""
        self.exec(host, ["podman", "rm", "-a", "-f", "-t", "0"], timeout=60)
        if self.host(host).daemon is not None:
            self.exec(host, ["sh", "-c", 'ids=$(docker ps -aq) && [ -z "$ids" ] || docker rm -f $ids'], timeout=60)

    def reset_jobs(self) -> None:
        """Leave no job behind between tests: stop the supervisors targeting this testbed, remove every container
        and kill every process in the hosts' netns but sshd and the engine daemons (a test that fails midway must
        not hand its running job, and its rendezvous port, to the next one)."""
        system.kill_pids(system.supervisors_using(f"10.{self.subnet_octet}.0."))
        for h in self.hosts:
            if self.partitioned(h):
                self.heal(h)
            self.remove_containers(h)
            sshd = self.sshd_pid(h)
            system.kill_pids([pid for pid, cmd in self.processes(h)
                              if pid != sshd and not self.is_daemon(cmd) and not re.match(r"^sshd|/sshd ", cmd)])

    @staticmethod
    def is_daemon(cmdline: str) -> bool:
        """A container engine's own daemon (dockerd, its containerd): part of the host, not of any job."""
        return cmdline.startswith((dockerd.DOCKERD + " ", "containerd --config")) or slurmd.is_daemon(cmdline)

    def _setup_images(self) -> None:
        wanted = [h for h in self.hosts if h.profile["image"]]
        if not wanted:
            return
        tdir = self.base_dir / "template"
        tdir.mkdir(parents=True, exist_ok=True)
        store = containers.build_template(tdir, self.runroot / "template", self.shared)
        with ThreadPoolExecutor(4) as pool:
            list(pool.map(lambda h: containers.copy_store(store, h.dir / "storage"), wanted))

    def _spawn_sshd(self, h: Host) -> None:
        script = f"hostname {h.name} && exec {SSHD} -f {shlex.quote(str(h.dir / 'sshd_config'))} " \
                 f"-E {shlex.quote(str(h.dir / 'sshd.log'))}"
        # nsenter --net (not `ip netns exec`, which remounts /sys and breaks podman's cgroup detection)
        p = subprocess.run(["nsenter", f"--net=/run/netns/{h.ns}", "unshare", "--uts", "sh", "-c", script],
                           capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
        if p.returncode != 0:
            raise RuntimeError(f"sshd on {h.name} failed: {p.stderr.strip()} {self._log_tail(h)}")

    def _log_tail(self, h: Host) -> str:
        try:
            return (h.dir / "sshd.log").read_text()[-2000:]
        except OSError:
            return ""

    def _wait_ssh(self, hosts: list[Host], timeout: float) -> None:
        """Poll each host's port 22 until sshd sends its banner."""
        pending = list(hosts)
        end = time.monotonic() + timeout
        while pending:
            still = []
            for h in pending:
                try:
                    with socket.create_connection((h.address, 22), timeout=1) as s:
                        s.settimeout(2)
                        if not s.recv(4).startswith(b"SSH-"):
                            still.append(h)
                except OSError:
                    still.append(h)
            pending = still
            if pending and time.monotonic() > end:
                raise RuntimeError(f"sshd not ready on {[h.name for h in pending]}: {self._log_tail(pending[0])}")
            if pending:
                time.sleep(0.02)

    # --- state ------------------------------------------------------------------------------------------

    def _state(self) -> dict:
        return {"n_hosts": len(self.hosts), "base_dir": str(self.base_dir), "prefix": self.prefix,
                "subnet_octet": self.subnet_octet, "profiles": [h.profile for h in self.hosts],
                "docker": self.docker, "slurm": self.slurm is not None}

    def _save_state(self) -> None:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        REGISTRY.mkdir(parents=True, exist_ok=True)
        text = json.dumps(self._state(), indent=1)
        (self.base_dir / "testbed.json").write_text(text)
        (REGISTRY / f"{self.prefix}.json").write_text(text)

    @classmethod
    def from_state(cls, state: dict) -> "Testbed":
        tb = cls(state["n_hosts"], state["base_dir"], state["profiles"], state["prefix"], state["subnet_octet"],
                 docker=bool(state.get("docker")), slurm=bool(state.get("slurm")))
        tb._up = all((Path("/run/netns") / h.ns).exists() for h in tb.hosts)
        return tb

    @classmethod
    def load(cls, base_dir) -> "Testbed":
        return cls.from_state(json.loads((Path(base_dir) / "testbed.json").read_text()))

    # --- lookup, inventory -------------------------------------------------------------------------------

    def host(self, host) -> Host:
        if isinstance(host, Host):
            return host
        for h in self.hosts:
            if host in (h.name, h.address, h.ns):
                return h
        raise KeyError(f"no host {host!r} in testbed {self.prefix}")

    def inventory(self, path, runtime: str = "podman", hosts=None, extra_vars=None) -> Path:
        """Write an Ansible-style inventory YAML for clusterctl; return its path."""
        import yaml

        chosen = [self.host(h) for h in hosts] if hosts else self.hosts
        hv = {h.name: {"ansible_host": h.address, "ansible_port": 22, "clusterctl_gpus": h.profile["gpus"]}
              for h in chosen}
        group = {"ansible_user": self.user, "ansible_ssh_private_key_file": str(self.key),
                 "clusterctl_known_hosts": str(self.known_hosts), "clusterctl_runtime": runtime,
                 "clusterctl_interface": "eth0"}
        if len({h.profile["gpus"] for h in chosen}) == 1:
            group["clusterctl_gpus"] = chosen[0].profile["gpus"]
        group.update(extra_vars or {})
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(yaml.safe_dump({"all": {"hosts": hv, "vars": group}}, sort_keys=False))
        return path

    # --- inside a host -----------------------------------------------------------------------------------

    def exec(self, host, argv: list[str], timeout: float = 30, check: bool = False, **kw) -> subprocess.CompletedProcess:
        """Run ``argv`` inside the host (its netns, hostname and session env), capturing text output."""
        h = self.host(host)
        env = dict(os.environ, **h.env)
        return subprocess.run(
            ["nsenter", f"--net=/run/netns/{h.ns}", "unshare", "--uts", "sh", "-c",
             f'hostname {h.name} && exec "$@"', "sh", *argv],
            env=env, capture_output=True, text=True, timeout=timeout, check=check,
            stdin=kw.pop("stdin", subprocess.DEVNULL), **kw)

    def processes(self, host) -> list[tuple[int, str]]:
        """(pid, cmdline) of every process living in the host's netns."""
        return [(pid, system.cmdline(pid)) for pid in system.netns_pids(self.host(host).ns)]

    # --- faults ------------------------------------------------------------------------------------------

    def partition(self, host) -> None:
        """Cut the host off the bridge: peers see silence (hangs), not resets."""
        system.sh(["ip", "link", "set", self.host(host).veth, "down"])

    def partitioned(self, host) -> bool:
        flags = int(Path(f"/sys/class/net/{self.host(host).veth}/flags").read_text(), 16)
        return not flags & 1  # IFF_UP

    def heal(self, host) -> None:
        system.sh(["ip", "link", "set", self.host(host).veth, "up"])

    def kill(self, host, pattern: str | None = None, signal: int = signals.SIGKILL) -> list[int]:
        """Signal processes in the host's netns (all of them = the host crashed), or those whose cmdline
        matches the regex ``pattern``. Returns the pids signalled."""
        procs = self.processes(host)
        pids = [pid for pid, cmd in procs if pattern is None or re.search(pattern, cmd)]
        return system.kill_pids(pids, signal)

    def sshd_pid(self, host) -> int | None:
        h = self.host(host)
        try:
            pid = int((h.dir / "sshd.pid").read_text())
        except (OSError, ValueError):
            return None
        return pid if SSHD in system.cmdline(pid) else None

    def stop_sshd(self, host) -> None:
        """Stop the listening sshd (open sessions stay, new connections are refused)."""
        if (pid := self.sshd_pid(host)) is not None:
            os.kill(pid, signals.SIGTERM)
            end = time.monotonic() + 10
            while self.sshd_pid(host) == pid and time.monotonic() < end:
                time.sleep(0.02)

    def start_sshd(self, host) -> None:
        h = self.host(host)
        if self.sshd_pid(h) is None:
            self._spawn_sshd(h)
        self._wait_ssh([h], timeout=30)

    def occupy_port(self, host, port: int) -> PortHandle:
        """Listen on ``port`` (all addresses) inside the host until the handle is released."""
        h = self.host(host)
        code = ("import socket,sys,time\ns=socket.socket();s.setsockopt(socket.SOL_SOCKET,socket.SO_REUSEADDR,1)\n"
                f"s.bind(('0.0.0.0',{int(port)}));s.listen(64);print('ready',flush=True)\ntime.sleep(1e9)")
        p = subprocess.Popen(["nsenter", f"--net=/run/netns/{h.ns}", sys.executable, "-I", "-S", "-c", code],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, stdin=subprocess.DEVNULL)
        if p.stdout.readline().strip() != "ready":
            p.wait(timeout=10)
            raise RuntimeError(f"cannot occupy port {port} on {h.name}: {p.stderr.read().strip()}")
        return PortHandle(p)


def cleanup_stale(prefix: str) -> None:
    """Remove leftovers of a previous (crashed) testbed with this prefix."""
    reg = REGISTRY / f"{prefix}.json"
    if reg.exists():
        try:
            Testbed.from_state(json.loads(reg.read_text())).down()
        except (ValueError, KeyError, OSError):
            reg.unlink(missing_ok=True)
    # anything the registry did not know about, by name
    system.kill_netns(system.list_netns(prefix))
    lines = [f"netns del {ns}" for ns in system.list_netns(prefix)]
    lines += [f"link del {link}" for link in os.listdir("/sys/class/net")
              if link == f"{prefix}br0" or (link.startswith(prefix) and link.endswith("v")
                                           and link[len(prefix):-1].isdigit())]
    system.ip_batch(lines)
    system.remove_user(f"cc{prefix}")
    system.remove_user(f"cc{prefix}u")

