"""A real Slurm on the testbed (``Testbed(..., slurm=True)``): Debian's munged, slurmctld and slurmd.

One munged for the whole testbed (a unix socket under the runroot: every namespace shares the filesystem, so
every daemon and client reaches it), ``slurmctld`` inside the first host's namespace, one ``slurmd -N nodeI`` per
host inside that host's namespace (started like its sshd: ``nsenter --net`` + ``unshare --uts``), each with its own
spool dir, pid and log file. ``proctrack/linuxproc``, ``task/none``, no cgroups, ``select/cons_tres``. Steps that
slurmd starts for a host inherit its namespace, so they see that host's network as an SSH session does.

Clients (``srun``, ``scontrol``, ``sbatch``) find this Slurm through ``SLURM_CONF`` (``Cluster.env``); the daemons
are started with ``-f`` and the same env. The nodes offer no GPUs as gres (``Gres=gpu:N`` with
no: see ``gres_conf``).
"""

from __future__ import annotations

import os
import shutil
import signal as signals
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

MUNGED = "/usr/sbin/munged"
SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
INSTALL_HINT = "apt-get install slurmctld slurmd slurm-client munge (or `make test`)"


@dataclass(frozen=True)
class Cluster:
    """Where one testbed's Slurm keeps its things."""

    dir: Path            # slurm.conf, state, spool dirs, logs (under the testbed's base dir)
    run: Path            # munge socket, pid files (under /run: unix sockets <= 107 characters)
    name: str            # ClusterName

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def munge_socket(self) -> Path:
        return self.run / "munge.socket"

    @property
    def env(self) -> dict[str, str]:
        return {"SLURM_CONF": str(self.conf)}

    def slurmd_pidfile(self, node: str) -> Path:
        return self.run / f"slurmd-{node}.pid"

    @property
    def ctld_pidfile(self) -> Path:
        return self.run / "slurmctld.pid"

    @property
    def munged_pidfile(self) -> Path:
        return self.run / "munged.pid"


def available() -> bool:
    return all(os.path.exists(p) for p in (MUNGED, SLURMCTLD, SLURMD)) and bool(shutil.which("srun"))


def cluster(base_dir: Path, runroot: Path, prefix: str) -> Cluster:
    return Cluster(dir=base_dir / "slurm", run=runroot / "slurm", name=f"cc{prefix}")


def config(c: Cluster, hosts, gpus: int, slurmd_timeout: int = 6) -> str:
    """slurm.conf for ``hosts`` (objects with ``name`` and ``address``; the first runs slurmctld)."""
    first = hosts[0]
    lines = [
        f"ClusterName={c.name}", f"SlurmctldHost={first.name}({first.address})",
        "SlurmUser=root", "SlurmdUser=root", "AuthType=auth/munge", "CredType=cred/munge",
        # cred_expire (120 s by default) is also how long Slurm holds a requeued job (Reason=BeginTime) before it
        # runs it again (slurm.conf(5), AuthInfo): 30 s keeps the requeue test short, still ample for a step launch
        f"AuthInfo=socket={c.munge_socket},cred_expire=30",
        f"StateSaveLocation={c.dir / 'state'}", f"SlurmdSpoolDir={c.dir / 'spool' / '%n'}",
        f"SlurmctldPidFile={c.ctld_pidfile}", f"SlurmdPidFile={c.run / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={c.dir / 'slurmctld.log'}", f"SlurmdLogFile={c.dir / 'slurmd-%n.log'}",
        "SlurmctldDebug=info", "SlurmdDebug=info",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core", "SchedulerType=sched/backfill",
        "MpiDefault=none", "ReturnToService=2", "JobRequeue=1", f"TaskProlog={c.dir / 'task_prolog.sh'}",
        # a dead node is noticed within seconds (the tests kill hosts); the ping runs every timeout/3
        f"SlurmdTimeout={slurmd_timeout}", "SlurmctldTimeout=10", "MessageTimeout=5", "InactiveLimit=0",
        # KillWait: the seconds between SIGTERM and SIGKILL: the guard (clusterctl.slurm.guard) cleans in them
        "KillWait=10", "MinJobAge=300", "Waittime=0", "TreeWidth=64",
        "SchedulerParameters=sched_interval=1,bf_interval=1",
    ]
    gres = ""   # see gres_conf
    for h in hosts:
        lines.append(f"NodeName={h.name} NodeAddr={h.address} NodeHostname={h.name} CPUs=2 RealMemory=1000"
                     f"{gres} State=UNKNOWN")
    lines.append(f"PartitionName=main Nodes={','.join(h.name for h in hosts)} Default=YES MaxTime=INFINITE "
                 "State=UP OverSubscribe=NO")
    return "\n".join(x for x in lines if x) + "\n"


def gres_conf(gpus: int) -> str:
    # Slurm 22.05's slurmd reported 0 GPUs for `Name=gpu Count=N` without File= (the testbed has no devices), and
    # the node went INVAL: the testbed's nodes offer no gres; -i slurm then takes GPUs from the overlay/inventory vars
    return ""


def task_prolog(hosts) -> str:
    """Slurm's TaskProlog prints ``export K=V`` lines that set a task's environment: each host's steps get what its
    sshd sets for SSH sessions (``Host.env``: its own stub bin dir on PATH, its podman/docker config)."""
    import shlex

    lines = ["#!/bin/sh", 'case "$SLURMD_NODENAME" in']
    for h in hosts:
        exports = " ".join(shlex.quote(f"export {k}={v}") for k, v in h.env.items())
        lines.append(f"  {h.name}) printf '%s\\n' {exports} ;;")
    lines += ["esac", ""]
    return "\n".join(lines)


def write(c: Cluster, hosts, gpus: int) -> None:
    for d in (c.dir / "state", c.dir / "spool", c.run):
        d.mkdir(parents=True, exist_ok=True)
    for h in hosts:
        (c.dir / "spool" / h.name).mkdir(parents=True, exist_ok=True)
    c.conf.write_text(config(c, hosts, gpus))
    (c.dir / "gres.conf").write_text(gres_conf(gpus))
    (c.dir / "task_prolog.sh").write_text(task_prolog(hosts))
    (c.dir / "task_prolog.sh").chmod(0o755)
    key = c.dir / "munge.key"
    if not key.exists():
        key.write_bytes(os.urandom(1024))
    key.chmod(0o600)


def _spawn(argv: list[str], ns: str | None, hostname: str | None, log: Path, env: dict) -> None:
    """Start a daemon detached (``setsid -f``), in ``ns`` with ``hostname`` when given."""
    pre = []
    if ns is not None:
        pre = ["nsenter", f"--net=/run/netns/{ns}", "unshare", "--uts", "sh", "-c",
               'hostname "$1" && shift && exec "$@"', "sh", hostname]
    with open(log, "ab") as out:
        subprocess.run(["setsid", "-f", *pre, *argv], stdin=subprocess.DEVNULL, stdout=out, stderr=out,
                       close_fds=True, check=True, timeout=30, env=dict(os.environ, **env))


def start_munged(c: Cluster) -> None:
    _spawn([MUNGED, "--force", f"--socket={c.munge_socket}", f"--key-file={c.dir / 'munge.key'}",
            f"--pid-file={c.munged_pidfile}", f"--log-file={c.dir / 'munged.log'}",
            f"--seed-file={c.dir / 'munged.seed'}", "--num-threads=4"], None, None, c.dir / "munged.out", {})
    _wait(lambda: c.munge_socket.exists(), 10, f"munged did not start: {_tail(c.dir / 'munged.log')}")


def start_ctld(c: Cluster, ns: str, hostname: str) -> None:
    _spawn([SLURMCTLD, "-f", str(c.conf), "-i"], ns, hostname, c.dir / "slurmctld.out", c.env)


def start_slurmd(c: Cluster, ns: str, hostname: str) -> None:
    _spawn([SLURMD, "-f", str(c.conf), "-N", hostname], ns, hostname, c.dir / f"slurmd-{hostname}.out", c.env)


def wait_ready(c: Cluster, nodes: list[str], timeout: float = 60) -> None:
    """Until slurmctld answers and every node is idle."""
    def ready() -> bool:
        r = scontrol(c, "-o", "show", "node", timeout=10)
        if r.returncode != 0:
            return False
        states = {}
        for line in r.stdout.splitlines():
            f = dict(kv.split("=", 1) for kv in line.split() if "=" in kv)
            states[f.get("NodeName")] = f.get("State", "")
        return all(states.get(n, "").startswith(("IDLE", "ALLOCATED", "MIXED")) for n in nodes)
    _wait(ready, timeout, f"slurm not ready: {scontrol(c, 'show', 'node', timeout=10).stdout[-1500:]} "
                          f"{_tail(c.dir / 'slurmctld.log')}")


def resume(c: Cluster, node: str) -> None:
    """Return a node that came back (DOWN after its slurmd was killed) to service."""
    scontrol(c, "update", f"NodeName={node}", "State=RESUME", timeout=10)


def scontrol(c: Cluster, *args: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(["scontrol", *args], capture_output=True, text=True, timeout=timeout,
                          env=dict(os.environ, **c.env), stdin=subprocess.DEVNULL)


def pid(pidfile: Path, name: str) -> int | None:
    try:
        p = int(pidfile.read_text())
        return p if name.encode() in Path(f"/proc/{p}/cmdline").read_bytes() else None
    except (OSError, ValueError):
        return None


def slurmd_pid(c: Cluster, node: str) -> int | None:
    return pid(c.slurmd_pidfile(node), "slurmd")


def stop(c: Cluster, nodes: list[str]) -> None:
    """Stop every daemon of this cluster (slurmds, slurmctld, munged) by the pids they recorded."""
    pids = [slurmd_pid(c, n) for n in nodes] + [pid(c.ctld_pidfile, "slurmctld"), pid(c.munged_pidfile, "munged")]
    pids = [p for p in pids if p]
    for p in pids:
        try:
            os.kill(p, signals.SIGTERM)
        except ProcessLookupError:
            pass
    end = time.monotonic() + 10
    while time.monotonic() < end and any(Path(f"/proc/{p}").exists() for p in pids):
        time.sleep(0.05)
    for p in pids:
        try:
            os.kill(p, signals.SIGKILL)
        except ProcessLookupError:
            pass


def is_daemon(cmdline: str) -> bool:
    return cmdline.startswith((SLURMD + " ", SLURMCTLD + " ", MUNGED + " "))


def _wait(pred, timeout: float, msg: str) -> None:
    end = time.monotonic() + timeout
    while not pred():
        if time.monotonic() > end:
            raise RuntimeError(msg)
        time.sleep(0.1)


def _tail(p: Path) -> str:
    try:
        return p.read_text()[-1500:]
    except OSError:
        return ""
