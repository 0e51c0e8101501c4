"""podman: like docker, but GPUs through CDI, ``rm -t 0`` and ``ps --format json``."""
from __future__ import annotations

from clusterctl.launch.runtimes.docker import CDI_ALL_GPUS, ContainerRuntime


class PodmanRuntime(ContainerRuntime):
    name = "podman"
    program = "podman"
    info_argv = ("podman", "info", "--format", "json")

    def gpu_args(self, flags: str | None = None) -> list[str]:
        return [CDI_ALL_GPUS]   # CDI whatever preflight found: podman 4 has no --gpus

    def init_args(self) -> list[str]:
        return ["--init"]      # catatonit, from the host (not mounted into the image's /sbin): reaps, forwards

    def rm_flags(self) -> list[str]:
        return ["-f", "--time=0"]                   # no 10 s SIGTERM grace: we signal first when we mean to

    def ps_format(self) -> str:
        return "json"


RUNTIME = PodmanRuntime()
