"""podman: like docker, but GPUs through CDI, ``rm -t 0`` and ``ps --format json``."""
from __future__ import annotations

from clusterctl.runtimes.docker import ContainerRuntime


class PodmanRuntime(ContainerRuntime):
    name = "podman"
    program = "podman"

    def gpu_args(self) -> list[str]:
        return ["--device=nvidia.com/gpu=all"]   # CDI; podman has no --gpus

    def rm_flags(self) -> list[str]:
        return ["-f", "--time=0"]                   # no 10 s SIGTERM grace: we signal first when we mean to

    def ps_format(self) -> str:
        return "json"


RUNTIME = PodmanRuntime()
