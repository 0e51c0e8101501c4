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

import hashlib
import importlib
import os
from dataclasses import dataclass, field
from typing import Mapping, Protocol

from clusterctl.config.inventory import RUNTIMES

LABEL_JOB = "clusterctl.job"
LABEL_JOB_ID = "clusterctl.job_id"
LABEL_ATTEMPT = "clusterctl.attempt"
LABEL_NODE = "clusterctl.node"
ENV_SCRIPT_VAR = "CLUSTERCTL_ENV_SCRIPT"
# The rank view (clusterctl/rankview.py): each rank writes ``rank-<RANK>`` into this directory, one per attempt and
# node, made by the start wrapper (mode 0700) at the same path on the host and in the job's containers (a bind mount
# at its own path; the variable is set there). Cold: ``<node dir>/view``. A warm container attempt's ranks run in the
# zygote's container, which mounts the warm dir's ``s`` at its host path too: there it is ``<warm dir>/s/view-<N>``,
# and ``<node dir>/view`` is a symlink to it. The node's watch reads ``<node dir>/view`` either way.
VIEW_DIR_VAR = "CLUSTERCTL_VIEW_DIR"
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
# and "run"; $3 the rank view's dir ("": none; see VIEW_DIR_VAR), $4 a path made a symlink to it ("": none).
ENV_MOUNT = "/run/clusterctl-env"
CONTAINER_START = f'''umask 077
d=$(mktemp -d) || exit 125
c=
trap '[ -z "$c" ] || kill "$c" 2>/dev/null; rm -rf -- "$d"; exit 129' HUP
trap '[ -z "$c" ] || kill "$c" 2>/dev/null; rm -rf -- "$d"; exit 130' INT
trap '[ -z "$c" ] || kill "$c" 2>/dev/null; rm -rf -- "$d"; exit 143' TERM
cat >"$d/env" || {{ rm -rf -- "$d"; exit 125; }}
p=$1 r=$2 v=$3 l=$4; shift 4
if [ -n "$v" ]; then
  case $v in "~/"*) v=$HOME/${{v#"~/"}};; esac
  case $l in "~/"*) l=$HOME/${{l#"~/"}};; esac
  {{ [ ! -L "$v" ] || rm -f -- "$v"; }} && mkdir -p -- "$v" &&
    {{ [ -z "$l" ] || {{ mkdir -p -- "${{l%/*}}" && rm -rf -- "$l" && ln -s -- "$v" "$l"; }}; }} || {{ rm -rf -- "$d"; exit 125; }}
  set -- "--volume=$v:$v" "--env={VIEW_DIR_VAR}=$v" "$@"
fi
"$p" "$r" "--volume=$d:{ENV_MOUNT}" "$@" </dev/null & c=$!
wait "$c"; rc=$?; c=
i=0
while [ "$rc" -eq 0 ] && [ -e "$d/env" ] && [ "$i" -lt 300 ]; do sleep 0.1; i=$((i + 1)); done
rm -rf -- "$d"
exit "$rc"
'''
# Its own variables are CLUSTERCTL_* names, which no job env var may have (spec.py reserves them): any job name
# (S, f, ...) arrives.
# Core dumps off in containers (a GPU rank's core is tens of GB on the node's disk): the container's first shell
# lowers its soft limit before it applies the env (no privilege needed; ``--ulimit=core=0`` would make podman add
# its own ``nofile`` limit, which a host without CAP_SYS_RESOURCE refuses). Not when the job names ``core`` in
# ``container.ulimits``; a script may raise it again up to the hard limit.
NO_CORE_DUMPS = "ulimit -S -c 0 2>/dev/null; "
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


# Warm recovery (docs/design.md, docs/security.md): a zygote per job and node (a container labelled LABEL_WARM
# beside the attempt's container; bare: a host process). Its files live in the node's warm dir, ``<root>/<key>``:
# * the root is this user's private warm root, ``${TMPDIR:-/tmp}/clusterctl-warm-<uid>``: created mode 0700 and,
#   before every use, checked to be a directory (not a symlink) of this uid with mode 0700, in a parent that root or
#   this uid owns and nobody else can rename entries of (not group/other-writable, or sticky like /tmp). Anything else
#   (a root another user created first, a long TMPDIR) disables warm with the reason (``WARM_ROOT_SH``): the node
#   starts cold. Nothing in it is another principal's, so nothing the node runs from it is.
# * ``<key>`` (``warm_key``) is short by construction (hashes of the job id and the node name), so every socket path
#   stays far under the 107 bytes of a unix socket path, whatever the names.
# * ``<key>/py/zygote.py``: the only file executed from the warm dir (by the zygote, and by the torch-free client
#   with ``python3 -I -S``: no directory of the script on sys.path, no PYTHON* variables). Mounted read-only into
#   containers.
# * ``<key>/s``: the socket ``z.sock``, the rank markers (``ranks/``) and the job's modules per attempt
#   (``lib-N``): the only part mounted read-write into the zygote's and the warm attempt's containers. The host runs
#   nothing from it.
# In containers the warm dir is at ``WARM_IN_CONTAINER/<key>`` (``warm_path``); the host's path, known only on the
# node (its uid, its TMPDIR), replaces ``WARM_PLACEHOLDER`` in an argv at the start (``WARM_EXEC``).
LABEL_WARM = "clusterctl.warm"
WARM_ROOT_PREFIX = "clusterctl-warm-"          # + uid, in ${TMPDIR:-/tmp}
WARM_IN_CONTAINER = "/run/clusterctl-warm"
WARM_PLACEHOLDER = "@clusterctl-warm@"
MAX_WARM_ROOT = 78     # + "/<key:19>/s/z.sock" (29 bytes) <= 107 bytes (sun_path)

# Shell function ``warm_root [create]``: sets $r to this user's private warm root (creating it with ``create``), or
# prints why warm is disabled and returns 1 (2: there is none yet). Fixed text; builtins, id and ls only.
WARM_ROOT_SH = f'''warm_root() {{
  u=$(id -u) || return 1
  b=${{TMPDIR:-/tmp}}; case $b in /*) b=${{b%/}} ;; *) b=/tmp ;; esac
  r=$b/{WARM_ROOT_PREFIX}$u
  set -- "${{1:-}}" $(LC_ALL=C ls -ldn -- "$b/" 2>/dev/null)
  case ${{4:-}} in 0|"$u") ;; *) echo "clusterctl: warm disabled: $b/ belongs to uid ${{4:-?}} (not root, not uid $u)" >&2; return 1 ;; esac
  case ${{2:-}} in d????-??-?*|d????????[tT]*) ;; *) echo "clusterctl: warm disabled: others may rename entries of $b/ (${{2:-?}})" >&2; return 1 ;; esac
  [ "${{#r}}" -le {MAX_WARM_ROOT} ] || {{ echo "clusterctl: warm disabled: $r is ${{#r}} bytes long: its socket paths would pass 107 bytes" >&2; return 1; }}
  if [ "$1" = create ] && [ ! -e "$r" ] && [ ! -L "$r" ]; then mkdir -m 700 -- "$r" 2>/dev/null; fi
  set -- $(LC_ALL=C ls -ldn -- "$r" 2>/dev/null)
  [ -n "${{1:-}}" ] || {{ echo "clusterctl: no warm root $r" >&2; return 2; }}
  if [ "$3" != "$u" ] || {{ [ "$1" != drwx------ ] && [ "$1" != drwx------. ]; }}; then
    echo "clusterctl: warm disabled: $r is not a private directory of uid $u (owner uid $3, mode $1)" >&2; return 1
  fi
}}'''

# $1 the warm key, then an argv: check the warm root, replace every WARM_PLACEHOLDER in every element by the node's warm dir
# (<root>/<key>), exec the argv (stdin passes through). Exit 3 (the reason on stderr) when warm is disabled.
SUBSTITUTE = (f'for a; do shift; b=; while :; do case $a in *{WARM_PLACEHOLDER}*) ;; *) break;; esac; '
              f'b=$b${{a%%{WARM_PLACEHOLDER}*}}$w; a=${{a#*{WARM_PLACEHOLDER}}}; done; set -- "$@" "$b$a"; done')
WARM_EXEC = f'{WARM_ROOT_SH}\nwarm_root || exit 3\nw=$r/$1; shift\n{SUBSTITUTE}\nexec "$@"\n'

# $1 the warm key: ping the node's zygote with the host's python3, isolated (-I -S). Exit 3: warm disabled (the
# reason on stderr); 4: no zygote there; else the client's (0: it answered).
WARM_PING = f'''{WARM_ROOT_SH}
warm_root; rc=$?
[ "$rc" -eq 2 ] && exit 4
[ "$rc" -eq 0 ] || exit 3
w=$r/$1
[ -f "$w/py/zygote.py" ] && [ -S "$w/s/z.sock" ] && [ ! -L "$w/s/z.sock" ] || {{ echo "clusterctl: no zygote in $w" >&2; exit 4; }}
exec python3 -I -S "$w/py/zygote.py" client "$w/s/z.sock" ping
'''


def _h(text: str, n: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:n]


def warm_job_key(job_id: str) -> str:
    """The part of every warm key of ``job_id`` (its warm dirs are ``<root>/<this>-*``)."""
    return _h(job_id, 10)


def warm_key(job_id: str, node: str) -> str:
    """The node's warm dir under the warm root: 19 characters whatever the job's and the node's names."""
    return f"{warm_job_key(job_id)}-{_h(node, 8)}"


def warm_root(uid: int | None = None, tmpdir: str | None = None) -> str:
    """The warm root of ``uid`` (default: this process's) under ``tmpdir`` (default: $TMPDIR or /tmp), as
    ``WARM_ROOT_SH`` makes it on a node."""
    base = tmpdir or os.environ.get("TMPDIR") or "/tmp"
    base = base.rstrip("/") if base.startswith("/") else "/tmp"
    return f"{base}/{WARM_ROOT_PREFIX}{os.getuid() if uid is None else uid}"


def warm_path(key: str, containerized: bool) -> str:
    """The warm dir as the job's processes see it: in a container, ``WARM_IN_CONTAINER/<key>``; on the host,
    ``WARM_PLACEHOLDER`` (``WARM_EXEC`` puts the node's real path there at the start)."""
    return f"{WARM_IN_CONTAINER}/{key}" if containerized else WARM_PLACEHOLDER


def warm_exec(key: str, argv: list[str]) -> list[str]:
    """``argv`` with ``WARM_PLACEHOLDER`` replaced by the node's checked warm dir of ``key`` (``WARM_EXEC``)."""
    return ["sh", "-c", WARM_EXEC, "clusterctl-warm", key, *argv]


def zygote_client(wdir: str, kind: str) -> list[str]:
    """The torch-free client that has the zygote in ``wdir`` (as the caller sees it) fork a ``kind`` (torchrun |
    rank | ping); isolated (-I: nothing beside the script, no PYTHON* variable, no user site is imported)."""
    return ["python3", "-I", "-S", f"{wdir}/py/zygote.py", "client", f"{wdir}/s/z.sock", kind]


def zygote_ping_argv(key: str) -> list[str]:
    """Exit 0 when the node's zygote of ``key`` answers (the host's python3; see ``WARM_PING``)."""
    return ["sh", "-c", WARM_PING, "clusterctl-warm-ping", key]


def jobs_root_for(jobs_root: str, node: str) -> str:
    """``jobs_root`` of one node: its ``{node}`` placeholder (if any) replaced by the inventory name."""
    return jobs_root.replace("{node}", node)


def node_dir(jobs_root: str, job_id: str, attempt: int) -> str:
    """Per-attempt directory on a node. A leading ``~/`` is expanded by the node-side snippets (``$HOME``)."""
    return f"{jobs_root.rstrip('/')}/{job_id}/{attempt}"


def view_dir(node_dir: str) -> str:
    """Where the node's watch reads the rank view of the attempt of ``node_dir`` (see ``VIEW_DIR_VAR``)."""
    return f"{node_dir.rstrip('/')}/view"


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
    view_dir: str = ""                     # containers: the rank view's dir (VIEW_DIR_VAR; "": none); bare: always
                                           # NODE_DIR/view
    view_link: str = ""                    # containers: a path made a symlink to view_dir (a warm attempt's)

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

    def gpu_args(self, flags: str | None = None) -> list[str]:
        """The run flags that hand a container the node's GPUs (``flags``: preflight's choice, "gpus" | "cdi");
        [] where nothing is needed (bare: the ranks are on the host)."""

    # the warm path (``recovery: warm``, the default: ``plan.build_plan`` asks these of every node's runtime)
    def zygote_start_argv(self, req: RunRequest, key: str) -> list[str]:
        """Start the node's zygote in the warm dir of ``key`` (stdin: the job's environment line, then
        zygote.py's source); remove an old one first (``zygote_remove_argv``)."""

    def warm_run_argv(self, req: RunRequest, key: str) -> list[str]:
        """``run_argv`` of a warm attempt (``req.command``: the zygote's clients at ``warm_path``)."""

    def warm_lib_dir(self, key: str, attempt: int) -> str | None:
        """Where a warm attempt's modules go (``LIB_DIR_VAR``); None: where a cold attempt's go."""

    def zygote_remove_argv(self, job_id: str, node: str | None = None, key: str = "") -> list[str]:
        """Remove the job's zygote on this node (``node``/``key``; None/"": every one of the job) and its warm
        dir (``stop``, the Slurm guard)."""

    def zygote_exec_argv(self, job_id: str, node: str, argv: list[str], *, interactive: bool = False,
                         tty: bool = False) -> list[str] | None:
        """``argv`` where a warm attempt's ranks run (its zygote's container); None: where ``exec_argv`` runs."""

    def zygote_ping_argv(self, key: str) -> list[str]:
        """Exit 0 when the node's zygote of ``key`` answers."""


def members(protocol: type = Runtime) -> tuple[str, ...]:
    """What ``protocol`` declares: its attributes and its methods (``checked`` asks each of a runtime)."""
    own = [n for n, v in vars(protocol).items() if callable(v) and not n.startswith("_")]
    return (*protocol.__annotations__, *own)


def checked(name: str, runtime: object) -> Runtime:
    """``runtime`` when it has every member ``Runtime`` declares; else a ``TypeError`` naming what it lacks, so a
    runtime short of a method fails when it is first asked for (``get``), not mid-launch."""
    missing = [m for m in members() if not hasattr(runtime, m)]
    if missing:
        raise TypeError(f"runtime {name!r} ({type(runtime).__qualname__}) lacks {', '.join(missing)} "
                        "(clusterctl.launch.runtimes.Runtime)")
    return runtime  # type: ignore[return-value]


# Shell function: is process $1 alive? A zombie is not: a container init whose conmon was killed with it stays a
# zombie until its new parent reaps it, and /proc/PID exists until then. (builtins only: the watch runs it every 0.5 s)
PID_ALIVE = ('alive() { [ "${1:-0}" -gt 0 ] 2>/dev/null && [ -r "/proc/$1/status" ] || return 1; '
             'while read -r k v _; do [ "$k" = State: ] && { [ "$v" != Z ] && [ "$v" != X ]; return; }; '
             'done <"/proc/$1/status"; return 1; }')

# Shell function: sets $v to the start time of process $1 (field 22 of /proc/PID/stat, clock ticks since boot; the
# fields after the command name, which may hold ") ", start at field 3); false when there is no such process. With
# the pid it names one process: a pid reused after the process died has another start time. (builtins only)
PID_STARTED = ('started() { v=; [ "${1:-0}" -gt 0 ] 2>/dev/null || return 1; '
               '{ read -r v <"/proc/$1/stat"; } 2>/dev/null; v=${v##*) }; set -- $v; v=${20:-}; [ -n "$v" ]; }')

# Shell function: the newest step N of a complete-looking checkpoint ``$1/step-N`` (a MANIFEST.json or DCP's
# .metadata in it; the supervisor then verifies it). Builtins only: a glob, no process per call.
NEWEST_STEP = ('newest() { n=; [ -n "$1" ] || return; for m in "$1"/step-*/MANIFEST.json "$1"/step-*/.metadata; do '
               '[ -e "$m" ] || continue; x=${m%/*}; x=${x##*/step-}; case $x in ""|*[!0-9]*) continue;; esac; '
               'x=${x#"${x%%[!0]*}"}; x=${x:-0}; if [ -z "$n" ] || [ "$x" -gt "$n" ]; then n=$x; fi; done; }')

# Shell function: adds to the rank view $r (one JSON object, clusterctl/rankview.py) what the node sees of that rank
# from outside: ``"os":"STATE CPU_TICKS"`` (fields 3, 14 + 15 of its /proc/PID/stat), so that a rank whose monitor
# thread cannot write (its main thread holds the GIL in one long C call; SIGSTOPped) is still seen computing (R, CPU
# advancing: busy) or stopped (T). The view's "pid" is the rank's in its own PID namespace: its stat is read through
# the /proc of the attempt's main process ($p: a container's /proc; bare: the host's) or of the node's zygote ($z:
# /proc/ZPID/root, where ZPID is in the warm dir's ``zpid``: a warm container attempt's ranks run in the zygote's
# container), and used only when its start time (field 22, the same in every PID namespace) is the view's "start":
# never another process that has the number. Builtins only; a view it cannot place is left as it is.
RANK_OS = (r'rank_os() { case $r in *"}") ;; *) return 0;; esac; x=${r#*\"pid\":}; x=${x%%[!0-9]*}; '
           r'y=${r#*\"start\":}; y=${y%%[!0-9]*}; [ -n "$x" ] && [ -n "$y" ] || return 0; '
           r'for q in "/proc/$p/root" $z; do v=; { read -r v <"$q/proc/$x/stat"; } 2>/dev/null; v=${v##*) }; '
           r'set -- $v; [ "${20:-}" = "$y" ] || continue; '
           r'r="${r%?},\"os\":\"$1 $((${12:-0} + ${13:-0}))\"}"; return 0; done; }')

# $1 checkpoint root ("" for none)  $2 the rank view's dir ("" for none; a leading ~/ is the node's $HOME)  $3... a
# pid_argv: looks every 0.5 s whether that process lives and for the newest checkpoint step under the root; prints
# "1 [STEP]" (alive) or "0 [STEP]" (gone, or never was) at once when that changed, else at every second look: a line
# a second is the heartbeat. (Each line is an SSH packet that the supervisor decrypts in Python: one a second per
# steady node, not two.) The process is the pid *and* its start time when the pid was read: once it died, a process
# that got its pid again is not it (pid_max is 32768 on many hosts); a "1" for it made the supervisor trust the node
# as running and never probe it again (issue 34 item 13).
# Each line then carries the rank view: the one line of every ``rank-*`` file in the view dir (clusterctl/rankview.py),
# each after a TAB (a missing or empty file is left out, and a symlink: the job's processes can write in the view dir,
# the watch reads as the node's user): ``1 12<TAB>{...rank 0...}<TAB>{...rank 1...}``. Only
# "ALIVE [STEP]" decides whether a line is due (the ranks rewrite their files every second). printf, not echo: the
# JSON's backslashes are printed as they are.
WATCH = (PID_ALIVE + '; ' + PID_STARTED + '; ' + NEWEST_STEP + '; ' + RANK_OS + '; c=$1 w=$2; shift 2; '
         'case $w in "~/"*) w=$HOME/${w#"~/"};; esac; p=$("$@" 2>/dev/null); started "$p"; '
         't=$v; l=; i=0; while :; do '
         'newest "$c"; if alive "$p" && started "$p" && [ "$v" = "$t" ]; then s="1 $n"; else s="0 $n"; fi; '
         'i=$((i + 1)); '
         'if [ "$s" != "$l" ] || [ "$i" -ge 2 ]; then o=$s; '
         'if [ -n "$w" ]; then z=; { read -r z <"$w/../../zpid"; } 2>/dev/null; '
         'case $z in ""|*[!0-9]*) z=;; *) z=/proc/$z/root;; esac; '
         'for f in "$w"/rank-*; do r=; [ -L "$f" ] || { read -r r <"$f"; } 2>/dev/null; '
         '[ -n "$r" ] && { rank_os; o="$o	$r"; }; done; fi; '
         'printf "%s\n" "$o"; l=$s; i=0; fi; sleep 0.5; done')


def watch_argv(runtime: "Runtime", node: NodeRef, checkpoint_dir: str | None = None, view_dir: str = "") -> list[str]:
    """A long-running command for the node's persistent connection: its heartbeat, the liveness of the
    attempt's main process, the newest checkpoint step on the shared storage and the ranks' views (``view_dir``:
    ``view_dir(node_dir)``), in one line a second, and at once (within 0.5 s) when the first two change (see
    ``WATCH``, ``watch.Watches``)."""
    return ["sh", "-c", WATCH, "clusterctl-watch", checkpoint_dir or "", view_dir, *runtime.pid_argv(node)]


# a runtime is a module here named after it, with a ``RUNTIME`` object, and its name in config.inventory.RUNTIMES
_MODULES = {name: f"{__name__}.{name}" for name in RUNTIMES}


def get(name: str) -> Runtime:
    """The runtime called ``name`` (docker, podman, bare); modules are imported lazily."""
    try:
        module = _MODULES[name]
    except KeyError:
        raise ValueError(f"unknown runtime {name!r} (one of {', '.join(_MODULES)})") from None
    return checked(name, importlib.import_module(module).RUNTIME)


def names() -> tuple[str, ...]:
    return tuple(_MODULES)


def containerized(name: str) -> bool:
    """Does runtime ``name`` run the job in a container (docker, podman), not on the host (bare)?"""
    return get(name).containerized


# run ARGV in directory $1 on the host (``~/`` expanded): a bare job's ``exec --in-container`` and ``shell``
IN_DIR = 'd=$1; shift; case $d in "~/"*) d=$HOME/${d#"~/"};; esac; cd -- "$d" || exit 126; exec "$@"'
