"""What preflight needs to know about a job, and the knobs of a preflight run (plain frozen dataclasses).

``PreflightJob.from_spec`` reads a job spec by attribute (duck typing), so this package does not import
``clusterctl.config.spec``.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, FrozenSet

DEFAULT_IMAGE = "pytorch-cuda:v2.7-ssh"
DEFAULT_RDZV_PORT = 29400
GIB = 1024 ** 3


def _get(obj: Any, *path: str) -> Any:
    for name in path:
        if obj is None:
            return None
        obj = obj.get(name) if isinstance(obj, dict) else getattr(obj, name, None)
    return obj


@dataclass(frozen=True)
class PreflightJob:
    image: str = DEFAULT_IMAGE
    nproc_per_node: int | str = "gpu"          # an int, or "gpu" (one process per GPU)
    rdzv_port: int = DEFAULT_RDZV_PORT
    checkpoint_dir: str | None = None
    ports: tuple[int, ...] = ()                # extra ports that must be free (the rendezvous port is added)
    torchrun: tuple[str, ...] = ("torchrun",)  # the job's torchrun command
    script: str | None = None                  # the job's script (None: a module)
    workdir: str | None = None                 # bare: where the script runs (the job file's dir by default)
    container_workdir: str | None = None       # containers: the job's `workdir:` (None: the image's)
    mounts: tuple[str, ...] = ()               # containers: HOST:CONTAINER[:OPTS]

    def __post_init__(self) -> None:
        if not isinstance(self.rdzv_port, int) or not 0 < self.rdzv_port < 65536:
            raise ValueError(f"rendezvous port must be 1-65535, got {self.rdzv_port!r}")
        for p in self.ports:
            if not isinstance(p, int) or not 0 < p < 65536:
                raise ValueError(f"port must be 1-65535, got {p!r}")

    @property
    def all_ports(self) -> tuple[int, ...]:
        return tuple(dict.fromkeys((self.rdzv_port, *self.ports)))

    @classmethod
    def from_spec(cls, spec: Any) -> "PreflightJob":
        """Build from any object (or dict) shaped like a JobSpec: ``image``, ``nproc_per_node``,
        ``rendezvous.port``, ``checkpoint.dir``. Missing attributes take the defaults."""
        image = _get(spec, "image") or DEFAULT_IMAGE
        nproc = _get(spec, "nproc_per_node")
        port = _get(spec, "rendezvous", "port") or _get(spec, "rdzv_port") or DEFAULT_RDZV_PORT
        ckpt = _get(spec, "checkpoint", "dir")
        if ckpt is None:
            ckpt = _get(spec, "checkpoint_dir")
        ports = tuple(int(p) for p in (_get(spec, "ports") or ()))
        workdir = _get(spec, "workdir")
        return cls(image=str(image), nproc_per_node=nproc if nproc is not None else "gpu", rdzv_port=int(port),
                   checkpoint_dir=str(ckpt) if ckpt else None, ports=ports,
                   torchrun=tuple(str(a) for a in (_get(spec, "torchrun") or ("torchrun",))),
                   script=_get(spec, "script"), workdir=workdir or _get(spec, "source_dir"),
                   container_workdir=workdir, mounts=tuple(str(m) for m in (_get(spec, "mounts") or ())))


@dataclass(frozen=True)
class PreflightOptions:
    command_timeout_s: float = 60.0      # the whole probe script on one host
    probe_timeout_s: float = 15.0        # each tool inside the script (when `timeout` exists on the host)
    pull: bool = False                   # --pull: pull the image instead of only looking for it
    pull_timeout_s: float = 900.0
    rendezvous_timeout_s: float = 5.0    # the temporary listener / connectors
    max_workers: int = 64
    deadline_s: float | None = None      # whole-run deadline per phase (fan-out)
    disk_warn_pct: float = 10.0          # warn: free < 10% AND free < 50 GiB
    disk_warn_bytes: int = 50 * GIB
    disk_fail_pct: float = 2.0           # fail: free < 2% OR free < 5 GiB
    disk_fail_bytes: int = 5 * GIB
    clock_warn_s: float = 0.5
    clock_fail_s: float = 5.0
    slow_command_s: float = 1.0          # ssh warns when a command's overhead (shell startup + RTT) exceeds this
    only: FrozenSet[str] | None = None   # run only these check ids (None: all)

    def wants(self, check_id: str) -> bool:
        return self.only is None or check_id in self.only
