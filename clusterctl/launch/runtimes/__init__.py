"""Runtimes: pure argv builders and status parsers for docker, podman and bare (no I/O here).

Every argv here is a list run on the node through ``Transport.run`` (which quotes it with ``shlex.join``); user
values are always separate argv elements or ``--flag=value``, never spliced into shell text. The few node-side
shell snippets are constants that take every value as a positional parameter.

Environment (plain *and* secret) never appears on a command line. The launcher passes ``NodePlan.env_script(secrets)``
as the **stdin** of ``runtime_argv``: a POSIX-shell text of ``export NAME='value'`` lines (``shlex.quote``d, so quotes,
``$()`` and newlines survive). Containers: the start wrapper writes it to a 0600 file that only the container's
first shell reads (and deletes) before it ``exec``s torchrun, so it is neither on a command line nor in the
container's config (see ``CONTAINER_START``). Bare: the wrapper keeps it in one variable, ``CLUSTERCTL_ENV_SCRIPT``,
which the runner's shell ``eval``s and unsets. Either way the job's ``PATH``/``LD_LIBRARY_PATH`` never change how
docker/podman themselves run.
Transport.run must close stdin after writing it (EOF), as ``subprocess.run(input=...)`` does.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Mapping, Protocol

from clusterctl.config.inventory import RUNTIMES

LABEL_JOB = "clusterctl.job"
LABEL_JOB_ID = "clusterctl.job_id"
LABEL_ATTEMPT = "clusterctl.attempt"
LABEL_NODE = "clusterctl.node"
ENV_SCRIPT_VAR = "CLUSTERCTL_ENV_SCRIPT"
LIB_DIR_VAR = "CLUSTERCTL_LIB_DIR"       # where plan.checkpoint_installer writes (bare: NODE_DIR/lib)
# Per node: home directories are often shared (NFS) between the nodes of a cluster, and the bare runtime keeps
# pid/exit/log files per attempt, so every node needs its own tree. ``{node}`` is the inventory name.
DEFAULT_JOBS_ROOT = "~/.clusterctl/nodes/{node}/jobs"

# Inner shell of the bare runner: apply the environment (CLUSTERCTL_ENV_SCRIPT), then exec torchrun.
APPLY_ENV_AND_EXEC = f'eval "${ENV_SCRIPT_VAR}" || exit 126; unset {ENV_SCRIPT_VAR}; exec "$@"'

# Containers: the env script must not end up in the container's config (``inspect`` would show secrets), so the
# start wrapper on the node writes stdin to a 0600 file in a fresh 0700 directory, mounts that directory into the
# container, and the container's first shell reads the file, deletes it, applies it and execs torchrun. The
# wrapper waits (bounded) for the file to be gone, then removes the directory; a signalled wrapper (session lost,
# timeout) removes it too: the runtime runs in the background so that the traps run at once. $1 $2: the runtime
# and "run".
ENV_MOUNT = "/run/clusterctl-env"
CONTAINER_START = f'''umask 077
d=$(mktemp -d) || exit 125
c=
trap '[ -z "$c" ] || kill "$c" 2>/dev/null; rm -rf -- "$d"; exit 129' HUP
trap '[ -z "$c" ] || kill "$c" 2>/dev/null; rm -rf -- "$d"; exit 130' INT
trap '[ -z "$c" ] || kill "$c" 2>/dev/null; rm -rf -- "$d"; exit 143' TERM
cat >"$d/env" || {{ rm -rf -- "$d"; exit 125; }}
p=$1 r=$2; shift 2
"$p" "$r" "--volume=$d:{ENV_MOUNT}" "$@" </dev/null & c=$!
wait "$c"; rc=$?; c=
i=0
while [ "$rc" -eq 0 ] && [ -e "$d/env" ] && [ "$i" -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
rm -rf -- "$d"
exit "$rc"
'''
# Its own variables are CLUSTERCTL_* names, which no job env var may have (spec.py reserves them): any job name
# (S, f, ...) arrives.
CONTAINER_APPLY = (f'{ENV_SCRIPT_VAR}=$(cat {ENV_MOUNT}/env) && rm -f {ENV_MOUNT}/env || exit 126; '
                   f'eval "${ENV_SCRIPT_VAR}" || exit 126; unset {ENV_SCRIPT_VAR}; exec "$@"')


def container_name(job_id: str, node: str) -> str:
    """Unique to one job and node: job ids (``<name>-<stamp>-<hex>``) never hold ``_``, so the first ``_`` ends
    the id (``clusterctl-a-..._b-c`` and ``clusterctl-a-b-..._c`` cannot be the same). Never trusted alone: the
    control commands select containers by the ``clusterctl.job_id`` label, then by this exact name."""
    return f"clusterctl-{job_id}_{node}"


# Shell prefix of the container control commands: $0 the runtime, $1 the job id, $2 the container name. Sets
# $cid to the id of the container that carries the label clusterctl.job_id=$1 and is named exactly $2, or exits
# 1 (a container of another job, or of nobody, with that name is never touched).
SELECT_CONTAINER = (f'cid=$("$0" ps -a --no-trunc --filter "label={LABEL_JOB_ID}=$1" --format "{{{{.ID}}}} '
                    '{{.Names}}" | while read -r i n; do [ "$n" = "$2" ] && { echo "$i"; break; }; done); '
                    '[ -n "$cid" ] || { echo "clusterctl: no container $2 of job $1" >&2; exit 1; }')


# Warm recovery (docs/design.md): a zygote container per job and node, beside the attempt's container, labelled
# LABEL_WARM (not LABEL_JOB_ID: a relaunch's cleanup by job id leaves it alone; stop(None) removes it). Its
# directory holds zygote.py, its socket and the job's module dir per attempt; mounted at the same path into the
# zygote's and every warm attempt's container. /tmp: a unix socket path must stay under 108 bytes.
LABEL_WARM = "clusterctl.warm"
WARM_ROOT = "/tmp/clusterctl-warm"


def warm_dir(job_id: str, node: str) -> str:
    return f"{WARM_ROOT}/{job_id}_{node}"


def zygote_client(wdir: str, kind: str) -> list[str]:
    """The torch-free client that has the zygote in ``wdir`` fork a ``kind`` (torchrun | rank | ping)."""
    return ["python3", "-S", f"{wdir}/zygote.py", "client", f"{wdir}/z.sock", kind]


def jobs_root_for(jobs_root: str, node: str) -> str:
    """``jobs_root`` of one node: its ``{node}`` placeholder (if any) replaced by the inventory name."""
    return jobs_root.replace("{node}", node)


def node_dir(jobs_root: str, job_id: str, attempt: int) -> str:
    """Per-attempt directory on a node. A leading ``~/`` is expanded by the node-side snippets (``$HOME``)."""
    return f"{jobs_root.rstrip('/')}/{job_id}/{attempt}"


def node_dir_of(node: str, job_id: str, attempt: int) -> str:
    """``node_dir`` under the default jobs root of ``node`` (where the plan put it)."""
    return node_dir(jobs_root_for(DEFAULT_JOBS_ROOT, node), job_id, attempt)


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
    gpu_flags: str | None = None           # "gpus" (--gpus=all) | "cdi" (CDI device), from preflight; None: the
                                           # runtime's default (docker: gpus, podman: cdi)
    infiniband: bool = False               # containers: --device=/dev/infiniband --cap-add=IPC_LOCK (the plan adds
                                           # memlock=-1 to the ulimits)
    ipc: str = "host"
    shm_size: str | None = None
    ulimits: tuple[tuple[str, str], ...] = (("memlock", "-1"), ("stack", "67108864"))
    pids_limit: int = -1                   # containers: --pids-limit (-1: unlimited; podman's default 2048 counts
                                           # threads: 8 GPU ranks exhaust it, podman#25703)
    extra_args: tuple[str, ...] = ()

    @property
    def labels(self) -> dict[str, str]:
        return {LABEL_JOB: self.job, LABEL_JOB_ID: self.job_id, LABEL_ATTEMPT: str(self.attempt),
                LABEL_NODE: self.node}


class NodeRef(Protocol):
    """What stop/logs builders need about a started node (``plan.NodePlan`` has these)."""

    job_id: str
    container_name: str
    node_dir: str
    log_path: str | None


@dataclass(frozen=True)
class Ref:
    """A ``NodeRef`` as a value: what the stop/logs/pid/inspect builders need about a node of an attempt."""

    container_name: str
    node_dir: str
    log_path: str | None
    job_id: str = ""      # its containers are selected by this id's label (SELECT_CONTAINER)


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
    """Everything that differs between docker, podman and bare is asked of the host's runtime (``get``): what
    runs a node, how it is listed, stopped, entered, logged and judged. Nothing outside this package compares a
    runtime's name."""
    name: str
    containerized: bool          # False: runs on the host (bare): no image, no container, the host's filesystem
    info_argv: tuple[str, ...] | None    # preflight's `info` of the engine (checks.runtime parses it); None: none

    def exec_argv(self, node: NodeRef, argv: list[str], *, interactive: bool = False, tty: bool = False,
                  workdir: str | None = None) -> list[str]:
        """``argv`` where the job runs on the node: in its container, or (bare) on the host in ``workdir``."""

    def log_path(self, node_dir: str) -> str | None:
        """The node's own log file (bare: NODE_DIR/node.log); None: the runtime keeps it (``logs_argv``)."""

    def oom_argv(self, node: NodeRef) -> list[str]:
        """A command whose output ``oom_killed`` judges: did the kernel's OOM killer end the node's ranks?"""

    def oom_killed(self, stdout: str, pid: int | None) -> bool:
        """Pure: ``oom_argv``'s output -> OOM-killed (``pid``: the rank's pid, for a host-wide kernel log)."""

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

    def pid_argv(self, node: NodeRef) -> list[str]:
        """Print the host pid of the node's main process (container init / bare runner); nothing when none."""

    def init_gone_argv(self, node: NodeRef, confirm_s: float) -> list[str] | None:
        """A command that exits 3 when the node is listed as running but its main process is gone (and still
        listed so ``confirm_s`` later); exit 0 otherwise. None: the runtime's listing needs no second look."""


# Shell function: is process $1 alive? A zombie is not: a container init whose conmon was killed with it stays a
# zombie until its new parent reaps it, and /proc/PID exists until then. (builtins only: the watch runs it every 0.5 s)
PID_ALIVE = ('alive() { [ "${1:-0}" -gt 0 ] 2>/dev/null && [ -r "/proc/$1/status" ] || return 1; '
             'while read -r k v _; do [ "$k" = State: ] && { [ "$v" != Z ] && [ "$v" != X ]; return; }; '
             'done <"/proc/$1/status"; return 1; }')

# Shell function: the newest step N of a complete-looking checkpoint ``$1/step-N`` (a MANIFEST.json or DCP's
# .metadata in it; the supervisor then verifies it). Builtins only: a glob, no process per call.
NEWEST_STEP = ('newest() { n=; [ -n "$1" ] || return; for m in "$1"/step-*/MANIFEST.json "$1"/step-*/.metadata; do '
               '[ -e "$m" ] || continue; x=${m%/*}; x=${x##*/step-}; case $x in ""|*[!0-9]*) continue;; esac; '
               'x=${x#"${x%%[!0]*}"}; x=${x:-0}; if [ -z "$n" ] || [ "$x" -gt "$n" ]; then n=$x; fi; done; }')

# $1 checkpoint root ("" for none)  $2... a pid_argv: looks every 0.5 s whether that pid lives and for the newest
# checkpoint step under the root; prints "1 [STEP]" (alive) or "0 [STEP]" (gone, or never was) at once when that
# changed, else at every second look: a line a second is the heartbeat. (Each line is an SSH packet that the
# supervisor decrypts in Python: one a second per steady node, not two.)
WATCH = (PID_ALIVE + '; ' + NEWEST_STEP + '; c=$1; shift; p=$("$@" 2>/dev/null); l=; i=0; while :; do '
         'newest "$c"; if alive "$p"; then s="1 $n"; else s="0 $n"; fi; i=$((i + 1)); '
         'if [ "$s" != "$l" ] || [ "$i" -ge 2 ]; then echo "$s"; l=$s; i=0; fi; sleep 0.5; done')


def watch_argv(runtime: "Runtime", node: NodeRef, checkpoint_dir: str | None = None) -> list[str]:
    """A long-running command for the node's persistent connection: its heartbeat, the liveness of the
    attempt's main process and the newest checkpoint step on the shared storage, in one line a second, and at
    once (within 0.5 s) when either changes (see ``WATCH``, ``launcher.ClusterOps.observe``)."""
    return ["sh", "-c", WATCH, "clusterctl-watch", checkpoint_dir or "", *runtime.pid_argv(node)]


# a runtime is a module here named after it, with a ``RUNTIME`` object, and its name in config.inventory.RUNTIMES
_MODULES = {name: f"{__name__}.{name}" for name in RUNTIMES}


def get(name: str) -> Runtime:
    """The runtime called ``name`` (docker, podman, bare); modules are imported lazily."""
    try:
        module = _MODULES[name]
    except KeyError:
        raise ValueError(f"unknown runtime {name!r} (one of {', '.join(_MODULES)})") from None
    return importlib.import_module(module).RUNTIME


def names() -> tuple[str, ...]:
    return tuple(_MODULES)


def containerized(name: str) -> bool:
    """Does runtime ``name`` run the job in a container (docker, podman), not on the host (bare)?"""
    return get(name).containerized


# run ARGV in directory $1 on the host (``~/`` expanded): a bare job's ``exec --in-container`` and ``shell``
IN_DIR = 'd=$1; shift; case $d in "~/"*) d=$HOME/${d#"~/"};; esac; cd -- "$d" || exit 126; exec "$@"'
