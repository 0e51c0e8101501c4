"""Runtimes: pure argv builders and status parsers for docker, podman and bare (no I/O here).

Every argv here is a list run on the node through ``Transport.run`` (which quotes it with ``shlex.join``); user
values are always separate argv elements or ``--flag=value``, never spliced into shell text. The few node-side
shell snippets are constants that take every value as a positional parameter.

Environment (plain *and* secret) never appears on a command line. The launcher passes ``NodePlan.env_script(secrets)``
as the **stdin** of ``runtime_argv``: a POSIX-shell text of ``export NAME='value'`` lines (``shlex.quote``d, so quotes,
``$()`` and newlines survive). The start wrapper reads it into one variable, ``CLUSTERCTL_ENV_SCRIPT``; the shell that
finally ``exec``s torchrun (inside the container, or the bare runner) ``eval``s it and unsets it. So the job's
``PATH``/``LD_LIBRARY_PATH`` never change how docker/podman themselves run, and nothing is written to the node's disk.
Transport.run must close stdin after writing it (EOF), as ``subprocess.run(input=...)`` does.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Mapping, Protocol

LABEL_JOB = "clusterctl.job"
LABEL_JOB_ID = "clusterctl.job_id"
LABEL_ATTEMPT = "clusterctl.attempt"
LABEL_NODE = "clusterctl.node"
ENV_SCRIPT_VAR = "CLUSTERCTL_ENV_SCRIPT"
# Per node: home directories are often shared (NFS) between the nodes of a cluster, and the bare runtime keeps
# pid/exit/log files per attempt, so every node needs its own tree. ``{node}`` is the inventory name.
DEFAULT_JOBS_ROOT = "~/.clusterctl/nodes/{node}/jobs"

# Outer wrapper (container runtimes): stdin -> CLUSTERCTL_ENV_SCRIPT, then exec the docker/podman argv.
READ_ENV_AND_EXEC = f'{ENV_SCRIPT_VAR}=$(cat) || exit 125; export {ENV_SCRIPT_VAR}; exec "$@"'
# Inner shell (inside the container, or the bare runner): apply the environment, then exec torchrun.
APPLY_ENV_AND_EXEC = f'eval "${ENV_SCRIPT_VAR}" || exit 126; unset {ENV_SCRIPT_VAR}; exec "$@"'


def container_name(job: str, node: str) -> str:
    return f"clusterctl-{job}-{node}"


def jobs_root_for(jobs_root: str, node: str) -> str:
    """``jobs_root`` of one node: its ``{node}`` placeholder (if any) replaced by the inventory name."""
    return jobs_root.replace("{node}", node)


def node_dir(jobs_root: str, job_id: str, attempt: int) -> str:
    """Per-attempt directory on a node. A leading ``~/`` is expanded by the node-side snippets (``$HOME``)."""
    return f"{jobs_root.rstrip('/')}/{job_id}/{attempt}"


@dataclass(frozen=True)
class RunRequest:
    """Everything a runtime needs to start one node of one attempt."""

    job: str
    job_id: str
    attempt: int
    node: str                              # inventory name
    name: str                              # container name (bare: recorded in NODE_DIR/name)
    image: str
    workdir: str | None                    # None: the image's WORKDIR (containers); bare always has one
    node_dir: str                          # per-attempt directory on the node (bare: log, pid, exit files)
    command: tuple[str, ...]               # the torchrun argv
    mounts: tuple[str, ...] = ()
    gpus: int | None = None                # 0: no GPU flags; None (unknown) or >0: all GPUs
    infiniband: bool = False
    ipc: str = "host"
    shm_size: str | None = None
    ulimits: tuple[tuple[str, str], ...] = (("memlock", "-1"), ("stack", "67108864"))
    extra_args: tuple[str, ...] = ()

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL_JOB: self.job, LABEL_JOB_ID: self.job_id, LABEL_ATTEMPT: str(self.attempt),
                LABEL_NODE: self.node}


class NodeRef(Protocol):
    """What stop/logs builders need about a started node (``plan.NodePlan`` has these)."""

    container_name: str
    node_dir: str
    log_path: str | None


@dataclass(frozen=True)
class Instance:
    """One container (or bare attempt) as reported by a status listing."""

    name: str
    state: str                  # running | exited | created | paused | restarting | removing | dead | unknown
    exit_code: int | None       # set when state == "exited" (bare: 128+N when killed by signal N)
    labels: Mapping[str, str] = field(default_factory=dict)

    @property
    def attempt(self) -> int | None:
        v = self.labels.get(LABEL_ATTEMPT)
        return int(v) if v is not None and v.isdigit() else None


class Runtime(Protocol):
    name: str

    def run_argv(self, req: RunRequest) -> list[str]:
        """Start the node detached; stdin must carry ``NodePlan.env_script``. Exit 0 once started."""

    def stop_argv(self, node: NodeRef, signal: str = "TERM") -> list[str]:
        """Send ``signal`` to the node's torchrun agent (KILL: the whole process tree)."""

    def remove_argv(self, names: list[str]) -> list[str]:
        """Force-remove these containers (bare: kill what is left; files are kept)."""

    def list_argv(self, job_id: str, *, jobs_root: str = DEFAULT_JOBS_ROOT) -> list[str]:
        """List every container/attempt of ``job_id`` on the node, for ``parse_list``."""

    def parse_list(self, stdout: str) -> list[Instance]:
        """Pure parse of ``list_argv``'s output."""

    def remove_job_argv(self, job_id: str, *, jobs_root: str = DEFAULT_JOBS_ROOT) -> list[str]:
        """Remove everything of ``job_id`` on the node in one command (rollback / cleanup)."""

    def logs_argv(self, node: NodeRef, *, tail: int | None = None, follow: bool = False) -> list[str]:
        """Print (or follow) the node's output."""


_MODULES = {"docker": "clusterctl.runtimes.docker", "podman": "clusterctl.runtimes.podman",
            "bare": "clusterctl.runtimes.bare"}


def get(name: str) -> Runtime:
    """The runtime called ``name`` (docker, podman, bare); modules are imported lazily."""
    try:
        module = _MODULES[name]
    except KeyError:
        raise ValueError(f"unknown runtime {name!r} (one of {', '.join(_MODULES)})") from None
    return importlib.import_module(module).RUNTIME


def names() -> tuple[str, ...]:
    return tuple(_MODULES)
