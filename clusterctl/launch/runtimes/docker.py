"""docker: argv builders and ``docker ps --format '{{json .}}'`` parsing (pure)."""
from __future__ import annotations

import json
import re
from dataclasses import replace
from typing import Any

from clusterctl.launch.runtimes import (
    CONTAINER_APPLY,
    CONTAINER_START,
    NO_CORE_DUMPS,
    DEFAULT_JOBS_ROOT,
    LABEL_JOB_ID,
    LABEL_NODE,
    LABEL_WARM,
    PID_ALIVE,
    SELECT_CONTAINER,
    SUBSTITUTE,
    WARM_PLACEHOLDER,
    WARM_ROOT_SH,
    Instance,
    NodeRef,
    RunRequest,
    warm_exec,
    warm_job_key,
    warm_path,
    zygote_ping_argv,
)
from clusterctl.model.causes import MAX_TEXT, OOM_KILL

CDI_ALL_GPUS = "--device=nvidia.com/gpu=all"
_EXITED_RE = re.compile(r"^Exited \((-?[0-9]+)\)")
_STATES = {"running", "exited", "created", "paused", "restarting", "removing", "dead"}
_STATE_ALIASES = {"stopped": "exited", "configured": "created", "initialized": "created", "up": "running"}

# $0 the runtime  $1 the job id  $2 the container name  $3 seconds to wait before asking the status again.
# Exit 3: the container is listed as running, its init process is gone, and it is still "running" $3 s later
# (conmon, which records the exit, was killed with it). Exit 0 otherwise, also when it cannot tell (no such
# container of this job, inspect failed, no pid): the listing is then believed.
# $0 the runtime  $1 the job id  $2 the node ("": every one of the job)  $3 the warm key ("": every one of the job)
# $4 the job's part of the warm keys: remove the job's zygote container(s) (selected by label), then the warm dir(s)
# when the warm root is this user's (otherwise none of them is there). Ids are hex printed by -q.
ZYGOTE_REMOVE = (WARM_ROOT_SH + '\ni=0; while :; do ids=$("$0" ps -aq --filter="label=' + LABEL_WARM + '=$1" ${2:+--filter="label='
                 + LABEL_NODE + '=$2"}) || exit 1; [ -z "$ids" ] && break; "$0" rm RMFLAGS $ids >/dev/null 2>&1 && break; '
                 'i=$((i + 1)); [ "$i" -ge 20 ] && { "$0" rm RMFLAGS $ids >/dev/null; exit 1; }; [ "$i" -gt 1 ] && sleep 0.5; done; '
                 'warm_root 2>/dev/null || exit 0; '
                 'if [ -n "$3" ]; then rm -rf -- "$r/$3"; else rm -rf -- "$r/$4"-*; fi')
# $1 the warm key, then the runtime's run argv (its WARM_PLACEHOLDERs: the warm dir): a fresh warm dir in this user's
# checked warm root (``WARM_ROOT_SH``), env.json (stdin's first line) and zygote.py (the rest) in its read-only part,
# then start the zygote, and write its container's host pid into ``zpid`` (outside the part the container writes):
# the node's watch reads the warm ranks' /proc state through it (``runtimes.RANK_OS``).
ZYGOTE_START = (WARM_ROOT_SH + '\nwarm_root create || exit 125\nw=$r/$1; shift\n'
                'rm -rf -- "$w" && mkdir -m 700 -- "$w" "$w/py" "$w/s" && (umask 077 && IFS= read -r e && '
                'printf "%s\\n" "$e" >"$w/py/env.json" && cat >"$w/py/zygote.py") || exit 125\n'
                + SUBSTITUTE + '\nc=$("$@") || exit $?\nprintf "%s\\n" "$c"\n'
                '"$1" inspect --format="{{.State.Pid}}" "$c" >"$w/zpid" 2>/dev/null || rm -f -- "$w/zpid"\nexit 0')

INIT_GONE = (PID_ALIVE + '; ' + SELECT_CONTAINER.replace("exit 1", "exit 0") + '; '
             'p=$("$0" inspect --format "{{.State.Pid}}" "$cid" 2>/dev/null) || exit 0; '
             '[ "${p:-0}" -gt 0 ] 2>/dev/null || exit 0; alive "$p" && exit 0; sleep "$3"; '
             's=$("$0" inspect --format "{{.State.Status}}" "$cid" 2>/dev/null) || exit 0; '
             '[ "$s" = running ] && exit 3; exit 0')


# Did the OOM killer end a process of the container? Its OOMKilled flag, and the kernel's own line: podman (4.3,
# runc, cgroup v1 here) sets the flag only when the container's main process was the one killed, never for a rank
# under torchrun. The kernel's summary line (mm/oom_kill.c, dump_oom_summary: "oom-kill:constraint=...,oom_memcg=
# ...,task_memcg=/libpod_parent/libpod-<id>,task=python,pid=N,uid=0") names the victim's cgroup, whose path holds the
# container's full id (cgroupfs and systemd managers alike); reading it needs the right to read the kernel log
# (dmesg), else the flag alone answers. $cid: SELECT_CONTAINER's full id.
OOM_SH = ('"$0" inspect --format="oomkilled={{.State.OOMKilled}}" "$cid"; '
          f'dmesg 2>/dev/null | tail -n 2000 | grep -F "{OOM_KILL}" | grep -F "$cid" | tail -c {MAX_TEXT}; exit 0')


class ContainerRuntime:
    """Shared by docker and podman; subclasses set the program, the GPU flags and the remove flags."""

    name = "docker"
    program = "docker"
    containerized = True
    info_argv: tuple[str, ...] | None = ("docker", "info", "--format", "{{json .}}")

    def log_path(self, node_dir: str) -> None:
        return None      # the runtime keeps the container's log (``logs_argv``)

    def oom_argv(self, node: NodeRef) -> list[str]:
        return self._by_label(node, OOM_SH)       # the flag, and the kernel's oom-kill lines naming the container

    def oom_killed(self, stdout: str, pid: int | None) -> bool:
        return "oomkilled=true" in stdout or any(OOM_KILL in line for line in stdout.splitlines())

    def gpu_args(self, flags: str | None = None) -> list[str]:
        """``flags`` (preflight's choice, see ``checks.runtime.choose_gpu_flags``): "cdi" on a docker >= 25 with
        CDI enabled and no ``nvidia`` runtime; otherwise the nvidia runtime/hook's ``--gpus``."""
        return [CDI_ALL_GPUS] if flags == "cdi" else ["--gpus=all"]

    def rm_flags(self) -> list[str]:
        return ["-f"]                      # docker rm has no -t; -f kills with SIGKILL at once

    def init_args(self) -> list[str]:
        """docker: no ``--init``. Docker's init is bind-mounted at ``/sbin/docker-init``; an image whose ``/sbin``
        is a symlink into a read-only mount (``/sbin -> usr/sbin`` with the host's /usr mounted read-only, as on
        the testbed) cannot start ("read-only file system", tests/fixtures/runtimes/docker_init_readonly.txt).
        The container's first process is then torchrun itself (``CONTAINER_APPLY`` execs it): it handles TERM
        (``stop``), and KILL ends the whole container."""
        return []

    def ps_format(self) -> str:
        return "{{json .}}"

    # ------------------------------------------------------------------ start
    def run_argv(self, req: RunRequest) -> list[str]:
        argv = ["sh", "-c", CONTAINER_START, "clusterctl-start",
                self.program, "run", req.view_dir, req.view_link, "-d", f"--name={req.name}"]
        argv += [f"--label={k}={v}" for k, v in req.labels.items()]
        argv += self._run_options(req)
        argv.append(req.image)
        apply = CONTAINER_APPLY if any(k == "core" for k, _ in req.ulimits) else NO_CORE_DUMPS + CONTAINER_APPLY
        argv += ["sh", "-c", apply, "clusterctl-env", *req.command]
        return argv

    def _run_options(self, req: RunRequest) -> list[str]:
        argv = ["--network=host", f"--ipc={req.ipc}", *self.init_args(), "--restart=no",
                f"--pids-limit={req.pids_limit}"]
        argv += [f"--ulimit={k}={v}" for k, v in req.ulimits]
        if req.shm_size is not None and req.ipc != "host":
            argv.append(f"--shm-size={req.shm_size}")
        if req.gpus != 0:
            argv += self.gpu_args(req.gpu_flags)
        if req.infiniband:     # RDMA: the verbs devices, and pinning memory (the plan adds memlock=-1)
            argv += ["--device=/dev/infiniband", "--cap-add=IPC_LOCK"]
        argv += [f"--volume={m}" for m in req.mounts]
        if req.workdir:
            argv.append(f"--workdir={req.workdir}")
        argv += list(req.extra_args)
        return argv

    # ------------------------------------------------------------------ warm recovery
    def zygote_name(self, job_id: str, node: str) -> str:
        return f"clusterctl-zygote-{job_id}_{node}"

    def _warm_mounts(self, key: str) -> list[str]:
        """The warm dir's two parts, at ``warm_path`` in the container: the socket dir read-write, zygote.py's
        read-only (nothing a container writes is ever executed on the host)."""
        inside = warm_path(key, True)
        return [f"{WARM_PLACEHOLDER}/s:{inside}/s", f"{WARM_PLACEHOLDER}/py:{inside}/py:ro"]

    def zygote_start_argv(self, req: RunRequest, key: str) -> list[str]:
        """Start the node's zygote container (stdin: one line, the JSON of the job's environment for the zygote (``zygote.with_job_env``), then zygote.py's source): the job's image, mounts, GPUs and
        workdir, as the attempt's container has them, plus the warm dir of ``key``; its process imports torch and
        serves ``<warm dir>/s/z.sock`` (clusterctl/launch/zygote.py). Remove an old one first
        (``zygote_remove_argv``)."""
        inside = warm_path(key, True)
        argv = ["sh", "-c", ZYGOTE_START, "clusterctl-zygote", key, self.program, "run", "-d",
                f"--name={self.zygote_name(req.job_id, req.node)}", f"--label={LABEL_WARM}={req.job_id}",
                f"--label={LABEL_NODE}={req.node}"]
        argv += self._run_options(req)
        serve = ["python3", f"{inside}/py/zygote.py", "serve", f"{inside}/s/z.sock"]
        if not any(k == "core" for k, _ in req.ulimits):        # warm ranks inherit the zygote's limit: as cold
            serve = ["sh", "-c", NO_CORE_DUMPS + 'exec "$@"', "clusterctl-zygote", *serve]
        # the socket dir at its host path too: the warm ranks' view dirs (runtimes.VIEW_DIR_VAR) are in there
        view = f"--volume={WARM_PLACEHOLDER}/s:{WARM_PLACEHOLDER}/s"
        argv += [*(f"--volume={m}" for m in self._warm_mounts(key)), view, req.image, *serve]
        return argv

    def warm_run_argv(self, req: RunRequest, key: str) -> list[str]:
        """``run_argv`` of a warm attempt (``req.command``: the zygote's clients at ``warm_path``): the warm dir
        mounted as in the zygote's container, the node's checked path put in at the start (``warm_exec``)."""
        return warm_exec(key, self.run_argv(replace(req, mounts=(*req.mounts, *self._warm_mounts(key)))))

    def warm_lib_dir(self, key: str, attempt: int) -> str | None:
        """Where a warm attempt's modules go (``LIB_DIR_VAR``): the zygote's children must see them."""
        return f"{warm_path(key, True)}/s/lib-{attempt}"

    def zygote_remove_argv(self, job_id: str, node: str | None = None, key: str = "") -> list[str]:
        """Remove the job's zygote container on this node (``node``; None: all of the job's) and its warm dir."""
        return ["sh", "-c", ZYGOTE_REMOVE.replace("RMFLAGS", " ".join(self.rm_flags())), self.program, job_id,
                node or "", key, warm_job_key(job_id)]

    def zygote_exec_argv(self, job_id: str, node: str, argv: list[str], *, interactive: bool = False,
                         tty: bool = False) -> list[str]:
        """``exec [-i] [-t]`` in the job's zygote container of ``node``: where the ranks of a warm attempt run
        (its attempt container holds only their clients). Selected as ``exec_argv`` selects, by the job's warm
        label and the exact name."""
        flags = (" -i" if interactive else "") + (" -t" if tty else "")
        select = SELECT_CONTAINER.replace(f"label={LABEL_JOB_ID}=", f"label={LABEL_WARM}=")
        return ["sh", "-c", f'{select}; shift 2; exec "$0" exec{flags} "$cid" "$@"', self.program, job_id,
                self.zygote_name(job_id, node), *argv]

    def zygote_ping_argv(self, key: str) -> list[str]:
        """Exit 0 when the zygote of ``key`` answers (host's python3, torch-free client; ``WARM_PING``)."""
        return zygote_ping_argv(key)

    # ------------------------------------------------------------------ control
    def _by_label(self, node: NodeRef, command: str, *args: str) -> list[str]:
        """``command`` (shell text using $cid; $3... are ``args``) on this job's container of ``node``, selected
        by its job-id label and exact name (SELECT_CONTAINER): never another job's container of the same name."""
        return ["sh", "-c", f"{SELECT_CONTAINER}; {command}", self.program, node.job_id, node.container_name,
                *args]

    def stop_argv(self, node: NodeRef, signal: str = "TERM") -> list[str]:
        return self._by_label(node, 'exec "$0" kill --signal="$3" "$cid"', signal)

    def remove_argv(self, names: list[str]) -> list[str]:
        return [self.program, "rm", *self.rm_flags(), *names]

    def list_argv(self, job_id: str, *, jobs_root: str = DEFAULT_JOBS_ROOT) -> list[str]:
        return [self.program, "ps", "-a", "--no-trunc", f"--filter=label={LABEL_JOB_ID}={job_id}",
                f"--format={self.ps_format()}"]

    def remove_job_argv(self, job_id: str, *, jobs_root: str = DEFAULT_JOBS_ROOT) -> list[str]:
        # ids are hex container ids printed by -q; nothing user-controlled is expanded. Retried for up to 10 s: a
        # container whose conmon was killed can fail `rm -f` once ("container state improper") until podman syncs
        # its state, and dockerd refuses a second removal while one is in progress (the supervisor's and `stop`'s
        # at once: "removal of container ... is already in progress"): the listing tells when it is gone. The first
        # retry comes at once: podman's refused rm has synced the state (a killed node's container: measured, the
        # second rm succeeds 0.1 s after the first; the 0.5 s sleep was most of a killed node's gang stop)
        script = ('i=0; while ids=$("$0" ps -aq --filter="label=$1=$2"); do [ -z "$ids" ] && exit 0; '
                  '"$0" rm ' + " ".join(self.rm_flags()) + ' $ids 2>/dev/null && exit 0; i=$((i + 1)); '
                  '[ "$i" -ge 20 ] && { "$0" rm ' + " ".join(self.rm_flags()) + ' $ids; exit 1; }; '
                  '[ "$i" -gt 1 ] && sleep 0.5; done; exit 1')
        return ["sh", "-c", script, self.program, LABEL_JOB_ID, job_id]

    def logs_argv(self, node: NodeRef, *, tail: int | None = None, follow: bool = False) -> list[str]:
        opts = []
        if tail is not None:
            opts.append(f"--tail={int(tail)}")
        if follow:
            opts.append("--follow")
        return self._by_label(node, 'shift 2; exec "$0" logs "$@" "$cid"', *opts)

    def exec_argv(self, node: NodeRef, argv: list[str], *, interactive: bool = False, tty: bool = False,
                  workdir: str | None = None) -> list[str]:
        """``exec [-i] [-t] CONTAINER argv`` in this job's container of ``node``, selected by its job-id label and
        exact name as ``stop`` does (issue 24: by name alone, ``exec --in-container``/``shell`` could enter another
        job's container that took the name)."""
        flags = (" -i" if interactive else "") + (" -t" if tty else "")
        return self._by_label(node, f'shift 2; exec "$0" exec{flags} "$cid" "$@"', *argv)

    def pid_argv(self, node: NodeRef) -> list[str]:
        return self._by_label(node, 'exec "$0" inspect --format="{{.State.Pid}}" "$cid"')

    def inspect_argv(self, node: NodeRef, template: str) -> list[str]:
        """``inspect --format=TEMPLATE`` of this job's container of ``node`` (see ``_by_label``)."""
        return self._by_label(node, 'exec "$0" inspect --format="$3" "$cid"', template)

    def init_gone_argv(self, node: NodeRef, confirm_s: float) -> list[str]:
        """Exits 3 when this job's container of ``node`` is listed as running although its init process is gone
        (podman keeps saying "Up" when conmon and the container's init were SIGKILLed); see ``INIT_GONE``."""
        return ["sh", "-c", INIT_GONE, self.program, node.job_id, node.container_name, str(confirm_s)]

    # ------------------------------------------------------------------ status
    def parse_list(self, stdout: str) -> list[Instance]:
        return parse_ps(stdout)


def parse_ps(stdout: str) -> list[Instance]:
    """Parse docker's ``{{json .}}`` lines or podman's ``--format json`` array (either CLI behind either name)."""
    text = stdout.strip()
    if not text:
        return []
    try:
        if text.startswith("["):
            items = json.loads(text)
        else:
            items = [json.loads(line) for line in text.splitlines() if line.strip()]
    except json.JSONDecodeError as e:
        raise ValueError(f"cannot parse container list: {e}") from None
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise ValueError("cannot parse container list: expected JSON objects")
    return [_instance(i) for i in items]


def _instance(item: dict[str, Any]) -> Instance:
    names = item.get("Names")
    if isinstance(names, list):
        names = names[0] if names else ""
    name = str(names or item.get("Name") or "").lstrip("/")
    labels = item.get("Labels") or {}
    if isinstance(labels, str):
        labels = dict(p.split("=", 1) if "=" in p else (p, "") for p in labels.split(",") if p)
    status = str(item.get("Status") or "")
    state = str(item.get("State") or "").lower()
    if not state:
        low = status.lower()
        state = ("running" if low.startswith("up") else "exited" if low.startswith("exited")
                 else "created" if low.startswith("created") else "unknown")
    state = _STATE_ALIASES.get(state, state)
    if state not in _STATES:
        state = "unknown"
    exit_code: int | None = None
    if state == "exited":
        code = item.get("ExitCode")
        if isinstance(code, int) and not isinstance(code, bool):
            exit_code = code
        else:
            m = _EXITED_RE.match(status)
            exit_code = int(m.group(1)) if m else None
    return Instance(name=name, state=state, exit_code=exit_code, labels={str(k): str(v) for k, v in labels.items()})


RUNTIME = ContainerRuntime()
