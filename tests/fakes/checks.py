"""Fakes for the preflight unit tests (no tests here): a Transport that answers the probe script from canned sections."""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from clusterctl.checks.probe import NONCE_PREFIX
from clusterctl.transport.base import CommandResult

H100 = "NVIDIA H100 80GB HBM3"


def smi_rows(n=8, driver="550.54.15", model=H100, ecc=None, retired=None) -> str:
    ecc = ecc or [0] * n
    retired = retired or [False] * n
    return "\n".join(f"{i}, {model}, {driver}, 81559, {ecc[i]}, {'Yes' if retired[i] else 'No'}, GPU-{i:032d}"
                     for i in range(n))


PODMAN_INFO = ('{"host": {"ociRuntime": {"name": "runc"}, "security": {"rootless": false}}, '
               '"store": {"graphRoot": "/var/lib/containers/storage"}, "version": {"Version": "4.3.1"}}')
DOCKER_INFO = ('{"ServerVersion": "24.0.7", "DockerRootDir": "/var/lib/docker", '
               '"Runtimes": {"nvidia": {"path": "nvidia-container-runtime"}, "runc": {"path": "runc"}}}')
DF = ("Filesystem         1-blocks        Used   Available Capacity Mounted on\n"
      "/dev/vda       1000000000000 500000000000 500000000000      50% {mount}")


def sections_for(address: str, hostname: str, runtime: str = "podman", gpus: int = 8, **over: Any) -> dict:
    """name -> (output, rc) of a healthy host."""
    s = {
        "hostname": (hostname, 0),
        "nvidia_smi": (smi_rows(gpus), 0),
        "smi_modes": ("\n".join(f"{i}, [N/A], Enabled, Default" for i in range(gpus)), 0),
        "smi_remap": ("\n".join(f"GPU-{i:032d}, 0, 0" for i in range(gpus)), 0),
        "smi_fabric": ("\n".join(f"{i}, Completed, Success" for i in range(gpus)), 0),
        "cuda_init": (f"cuInit 0 CUDA_SUCCESS devices {gpus} driver 12040\nno error", 0),
        "xid": ("", 0),
        "rdma": ("uverbs /dev/infiniband/uverbs0\nport /sys/class/infiniband/mlx5_0/ports/1 InfiniBand 4: ACTIVE\n"
                 "module nvidia_peermem\nmodule ib_uverbs", 0),
        "memlock": ("unlimited", 0),
        "runtime_info": (PODMAN_INFO if runtime == "podman" else DOCKER_INFO, 0),
        "nvidia_ctk": ("NVIDIA Container Toolkit CLI version 1.14.6\ncommit: 5605d19", 0),
        "cdi_list": ("INFO[0000] Found 9 CDI devices\n" + "".join(f"nvidia.com/gpu={i}\n" for i in range(gpus))
                     + "nvidia.com/gpu=all", 0),
        "image": ('sha256:' + "ab" * 32 + ' ["localhost/pytorch-cuda@sha256:' + "cd" * 32 + '"]', 0),
        "image_pull": ("sha256:" + "ab" * 32, 0),
        "ss": ("LISTEN 0      128    0.0.0.0:22 0.0.0.0:*", 0),
        "df_checkpoint": (DF.format(mount="/shared"), 0),
        "df_runtime": (DF.format(mount="/"), 0),
        "timedatectl": ("yes", 0),
        "ip_addr": (f"1: lo    inet 127.0.0.1/8 scope host lo\\       valid_lft forever preferred_lft forever\n"
                    f"2: eth0    inet {address}/24 brd 10.77.0.255 scope global eth0\\       valid_lft forever", 0),
        "ip_link": ("1: lo: <LOOPBACK,UP,LOWER_UP> mtu 65536 qdisc noqueue state UNKNOWN mode DEFAULT\\    link/loopback\n"
                    "2: eth0@if5: <BROADCAST,MULTICAST,UP,LOWER_UP> mtu 1500 qdisc noqueue state UP mode DEFAULT\\"
                    "    link/ether 46:e4:ff:38:65:aa", 0),
        "ssh_conn": (f"10.77.0.1 50000 {address} 22", 0),
        "getent": ("", 2),
        "nonce_write": ("", 0),
    }
    s.update(over)
    return s


@dataclass
class FakeHost:
    """Canned behaviour of one host. ``clock_skew``: seconds added to the host's `date`."""

    sections: dict
    clock_skew: float = 0.0
    connect_error: BaseException | None = None
    run_error: BaseException | None = None
    reachable: bool = True            # can reach the rendezvous port (as a peer)
    shared: bool = True               # sees the nonce file (as a peer)
    listener_output: str | None = None
    calls: list = field(default_factory=list)


class FakeTransport:
    def __init__(self, host, fake: FakeHost, world: dict, clock: Callable[[], float]):
        self.host, self.fake, self.world, self.clock = host, fake, world, clock
        self.closed = False

    def run(self, argv, *, timeout=None, stdin=None) -> CommandResult:
        self.fake.calls.append(list(argv))
        if self.fake.run_error is not None:
            raise self.fake.run_error
        script = argv[-1]
        if "bind-error" in script:            # the rendezvous listener
            out = self.fake.listener_output
            if out is None:
                out = "listening\npeers %d\n" % self.world.get("peers", 0)
                if NONCE_PREFIX in script:
                    out += "removed\n"
                    self.world["removed"] = True
            return CommandResult(tuple(argv), 0, out, "", 0.01)
        if "b nonce_read" in script or "b connect" in script:
            out = ""
            if "b nonce_read" in script:
                nonce = self.world["nonce"] if self.fake.shared else None
                out += ("@@cc<nonce_read\n%s\n@@cc>nonce_read 0\n" % nonce if nonce else
                        "@@cc<nonce_read\ncat: x: No such file or directory\n\n@@cc>nonce_read 1\n")
            if "b connect" in script:
                out += ("@@cc<connect\nconnected\n\n@@cc>connect 0\n" if self.fake.reachable else
                        "@@cc<connect\nfailed [Errno 111] Connection refused\n\n@@cc>connect 1\n")
            return CommandResult(tuple(argv), 0, out, "", 0.01)
        if argv[0] == "rm":
            self.world["removed"] = True
            return CommandResult(tuple(argv), 0, "", "", 0.0)
        return CommandResult(tuple(argv), 0, self._probe(script), "", 0.05)

    def _probe(self, script: str) -> str:
        names = re.findall(r"^b (\w+);", script, re.M)
        out = []
        for name in names:
            if name in ("clock0", "clock1"):
                output, rc = "%.9f" % (self.clock() + self.fake.clock_skew), 0
            else:
                output, rc = self.fake.sections.get(name, ("sh: 1: tool: not found", 127))
            out.append(f"@@cc<{name}\n{output}\n\n@@cc>{name} {rc}\n")
        return "".join(out)

    def close(self) -> None:
        self.closed = True

    def put(self, data, path, mode=0o600) -> None:  # pragma: no cover
        raise NotImplementedError


@dataclass(frozen=True)
class HostResult:
    host: Any
    value: Any = None
    error: BaseException | None = None
    duration_s: float = 0.0


def serial_fan_out(hosts, fn, *, max_workers=64, host_timeout=None, deadline=None, on_result=None, **_):
    """fan_out's contract (results in input order, errors as values), one host at a time."""
    out = []
    for h in hosts:
        t = time.perf_counter()
        try:
            r = HostResult(h, value=fn(h), duration_s=time.perf_counter() - t)
        except BaseException as e:  # noqa: BLE001
            r = HostResult(h, error=e, duration_s=time.perf_counter() - t)
        if on_result:
            on_result(r)
        out.append(r)
    return out
