"""bare: torchrun on the host itself, detached from the SSH session (pure argv builders + status parser).

Process model, per node and attempt, in ``NODE_DIR`` (``~/.clusterctl/nodes/<node>/jobs/<job_id>/<attempt>``; a leading ``~/``
is expanded to ``$HOME`` on the node):

* the start wrapper (``sh -c START``) reads the env script from stdin, creates ``NODE_DIR`` (mode 0700), ``cd``s to
  the workdir, writes ``NODE_DIR/name``, and starts ``setsid nohup sh -c RUNNER`` in the background with stdin
  ``/dev/null`` and stdout+stderr appended to ``NODE_DIR/node.log``; it waits (up to 5 s) for the pid file and
  prints the pid. The SSH command returns at once; the runner survives the session (own session, no terminal,
  SIGHUP ignored).
* the runner writes its pid to ``NODE_DIR/pid`` (it is the session and process-group leader: pid == pgid == sid),
  applies the env script, runs torchrun as its child (its ranks write their view into ``NODE_DIR/view``:
  ``runtimes.VIEW_DIR_VAR``), forwards SIGTERM/SIGINT to it, and when torchrun ends writes
  its exit status to ``NODE_DIR/exit`` (128+N when killed by signal N; written whole: a temp file, then mv). torchrun's ``TORCHELASTIC_ERROR_FILE`` is
  ``NODE_DIR/error.json``; after a failure the runner copies it into the log as one line (``ERROR_FILE_LINE``).
* the runner is identified by more than its pid: before its pid file it writes ``NODE_DIR/ident``, the machine's
  boot id and its own start time (``/proc/PID/stat`` field 22, in clock ticks since boot). A pid counts as the
  runner only while that pid's boot id and start time are the same and it is no zombie (``ALIVE``): after a runner
  died without writing ``exit`` (clusterctl's own KILL, the OOM killer, a reboot) its pid may belong to any process,
  which is then neither reported running nor signalled; until its parent reaps it, it is a zombie: ``dead``.
* stop: nothing is signalled by pid once ``NODE_DIR/exit`` exists or the pid is not the runner's any more. TERM/INT go to the
  runner, which forwards them to the torchrun agent (the agent stops its workers). KILL
  goes to the whole process group *and* to every process of the user whose environment holds
  ``CLUSTERCTL_JOB_ID=<job_id>`` and ``CLUSTERCTL_ATTEMPT=<attempt>``: torch starts its workers in their own
  sessions, so a group kill alone would orphan them.
"""
from __future__ import annotations

from clusterctl.launch.runtimes import (
    APPLY_ENV_AND_EXEC,
    DEFAULT_JOBS_ROOT,
    ENV_SCRIPT_VAR,
    IN_DIR,
    LABEL_ATTEMPT,
    LABEL_JOB_ID,
    LIB_DIR_VAR,
    VIEW_DIR_VAR,
    WARM_ROOT_SH,
    Instance,
    NodeRef,
    RunRequest,
    warm_exec,
    warm_job_key,
    zygote_ping_argv,
)
from clusterctl.model.causes import ERROR_FILE_LINE, MAX_TEXT, oom_killed


def _expand_home(var: str) -> str:
    """Shell text: a leading ``~/`` in ``$var`` becomes ``$HOME/`` (the node's, not the controller's)."""
    return f'case ${var} in "~/"*) {var}=$HOME/${{{var}#"~/"}};; esac'


def _kill_by_env(*needles: str, indent: str = "") -> str:
    """Shell text: SIGKILL every process of the user whose environment holds every ``NAME=value`` of ``needles``
    (double-quoted shell words: ``$jid`` expands). torch starts its workers in their own sessions, so a process
    group kill alone would orphan them. ``indent``: of every line after the first."""
    has = [f'tr \'\\0\' \'\\n\' <"$e" 2>/dev/null | grep -qxF "{n}"' for n in needles]
    cond = f" &&\n{indent}     ".join(has)
    return (f'for e in /proc/[0-9]*/environ; do\n'
            f'{indent}  if {cond}; then\n'
            f'{indent}    p=${{e#/proc/}}; kill -s KILL -- "${{p%/environ}}" 2>/dev/null\n'
            f'{indent}  fi\n'
            f'{indent}done')


_EXPAND_D = _expand_home("d")

# ident PID: this boot's id and the start time of process PID (field 22 of /proc/PID/stat; the fields after the
# command name, which may hold spaces and parentheses, start at field 3): the runner's identity
_IDENT = ("ident() { printf '%s %s\\n' \"$(cat /proc/sys/kernel/random/boot_id)\" "
          "\"$(sed 's/.*) //' \"/proc/$1/stat\" 2>/dev/null | cut -d' ' -f20)\"; }")
# alive DIR: the runner of DIR still runs: no exit file, its pid is the same process (boot id + start time), and
# that process is not a zombie (killed without writing exit, not reaped yet: its /proc/PID and start time remain;
# the watch, PID_ALIVE, already called it gone)
ALIVE = _IDENT + """
alive() {
  [ ! -f "$1/exit" ] && p=$(cat -- "$1/pid" 2>/dev/null) && [ -n "$p" ] && [ -d "/proc/$p" ] || return 1
  [ "$(cat -- "$1/ident" 2>/dev/null)" = "$(ident "$p")" ] || return 1
  case $(sed 's/.*) //; s/ .*//' "/proc/$p/stat" 2>/dev/null) in Z|X|"") return 1 ;; esac
}"""

# $1 NODE_DIR  $2 NAME  $3 WORKDIR  $4 RUNNER  $5... torchrun argv
START = f"""set -u
d=$1 name=$2 wd=$3 runner=$4; shift 4
{_EXPAND_D}
{ENV_SCRIPT_VAR}=$(cat) || exit 125
export {ENV_SCRIPT_VAR}
(umask 077 && mkdir -p -- "$d" "$d/view") || exit 125
cd -- "$wd" || exit 125
rm -f -- "$d/pid" "$d/exit"
printf '%s\\n' "$name" >"$d/name" || exit 125
setsid nohup sh -c "$runner" clusterctl-runner "$d" "$@" </dev/null >>"$d/node.log" 2>&1 &
i=0
while [ ! -s "$d/pid" ] && [ "$i" -lt 50 ]; do sleep 0.1; i=$((i + 1)); done
[ -s "$d/pid" ] || {{ echo "clusterctl: the runner did not start (see $d/node.log)" >&2; exit 125; }}
cat -- "$d/pid"
"""

# $1 NODE_DIR  $2... torchrun argv   (environment: CLUSTERCTL_ENV_SCRIPT)
RUNNER = f"""d=$1; shift
{_IDENT}
ident $$ >"$d/ident.tmp" && mv -f -- "$d/ident.tmp" "$d/ident" || exit 125
echo $$ >"$d/pid.tmp" && mv -f -- "$d/pid.tmp" "$d/pid" || exit 125
c=
trap '[ -z "$c" ] || kill -s TERM "$c" 2>/dev/null' TERM
trap '[ -z "$c" ] || kill -s INT "$c" 2>/dev/null' INT
{LIB_DIR_VAR}=$d/lib {VIEW_DIR_VAR}=$d/view TORCHELASTIC_ERROR_FILE=$d/error.json sh -c '{APPLY_ENV_AND_EXEC}' clusterctl-env "$@" &
c=$!
while :; do
  wait "$c"; rc=$?
  [ "$rc" -gt 128 ] || break
  kill -0 "$c" 2>/dev/null || break
done
rm -rf -- "$d/lib"
[ "$rc" -eq 0 ] || [ ! -s "$d/error.json" ] || {{ printf '%s' "{ERROR_FILE_LINE}"; tr -d '\\n' <"$d/error.json"; echo; }}
echo "clusterctl: torchrun exited with status $rc"
echo "$rc" >"$d/exit.tmp" && mv -f -- "$d/exit.tmp" "$d/exit"
exit "$rc"
"""

# $1 NODE_DIR  $2 SIGNAL  $3 JOB_ID  $4 ATTEMPT
STOP = f"""d=$1 sig=$2 jid=$3 att=$4
{_EXPAND_D}
{ALIVE}
pid=$(cat -- "$d/pid" 2>/dev/null) || {{ echo "clusterctl: no pid file in $d" >&2; exit 3; }}
# the runner wrote its exit status, or its pid is another process's now (it died without writing it): not signalled
ended=; alive "$d" || ended=1
case $sig in
  TERM|INT) [ -z "$ended" ] || exit 0; kill -s "$sig" -- "$pid" 2>/dev/null || exit 3 ;;
  KILL)
    [ -n "$ended" ] || kill -s KILL -- "-$pid" 2>/dev/null
    {_kill_by_env("CLUSTERCTL_JOB_ID=$jid", "CLUSTERCTL_ATTEMPT=$att", indent="    ")} ;;
  *) [ -z "$ended" ] || exit 0; kill -s "$sig" -- "-$pid" 2>/dev/null || exit 3 ;;
esac
exit 0
"""

# $1 JOB_DIR (jobs_root/job_id): one line per attempt: ATTEMPT STATE EXIT PID NAME (tab-separated)
LIST = f"""d=$1
{_EXPAND_D}
{ALIVE}
[ -d "$d" ] || exit 0
for a in "$d"/*/; do
  [ -d "$a" ] || continue
  a=${{a%/}}; n=${{a##*/}}
  name=$(cat -- "$a/name" 2>/dev/null); pid=$(cat -- "$a/pid" 2>/dev/null); ec=
  if [ -f "$a/exit" ]; then st=exited; ec=$(cat -- "$a/exit")
  elif alive "$a"; then st=running
  elif [ -n "$pid" ]; then st=dead
  else st=created
  fi
  printf '%s\\t%s\\t%s\\t%s\\t%s\\t%s\\n' "$n" "$st" "$ec" "$pid" "$name" "${{d##*/}}"
done
"""

# $1 JOB_DIR  $2 JOB_ID: SIGKILL every attempt still alive (files are kept for the logs)
KILL_JOB = f"""d=$1 jid=$2
{_EXPAND_D}
{ALIVE}
[ -d "$d" ] || exit 0
for a in "$d"/*/; do
  alive "${{a%/}}" && kill -s KILL -- "-$(cat -- "$a/pid")" 2>/dev/null
done
{_kill_by_env("CLUSTERCTL_JOB_ID=$jid")}
exit 0
"""

# Warm recovery (docs/design.md): the node's zygote is a process on the host, detached like the runner, started by
# the interpreter of the job's torchrun (its #! line: where torch is installed), from zygote.py in the warm dir of
# this user's checked warm root (``WARM_ROOT_SH``). It is started without the job's environment, so KILL_JOB (by
# CLUSTERCTL_JOB_ID) leaves it for the next relaunch; a forked agent or rank keeps the zygote's command line, which
# is how ZYGOTE_REMOVE finds them all.
# $1 the warm key  $2 the job's torchrun; stdin: a JSON line (py/env.json), then zygote.py. Returns once the zygote is started (it then imports
# torch for seconds before it serves <warm dir>/s/z.sock).
ZYGOTE_START = f"""k=$1 t=$2
tp=$(command -v "$t") || {{ echo "clusterctl: $t not found on PATH: no zygote" >&2; exit 127; }}
py=$(sed -n '1s/^#![[:space:]]*//p' "$tp")
case $py in */python*|*" python"*) ;; *) echo "clusterctl: $tp is not a Python script (#!$py): no zygote" >&2; exit 125;; esac
{WARM_ROOT_SH}
warm_root create || exit 125
w=$r/$k
rm -rf -- "$w" && mkdir -m 700 -- "$w" "$w/py" "$w/s" || exit 125
(umask 077 && IFS= read -r e && printf '%s\\n' "$e" >"$w/py/env.json" && cat >"$w/py/zygote.py") || exit 125
cd / || exit 125
# $py unquoted: a #! line is the interpreter and at most one argument ("/usr/bin/env python3")
setsid nohup $py "$w/py/zygote.py" serve "$w/s/z.sock" </dev/null >>"$w/zygote.log" 2>&1 &
"""

# $1 the warm key ("": every one of the job)  $2 the job's part of the warm keys: SIGKILL the zygote(s) and every
# process forked from them (a forked agent or rank keeps its zygote's command line; only this user's), then remove
# the dir(s). Nothing when the warm root is not this user's: none of them is there.
ZYGOTE_REMOVE = f"""k=$1 jk=$2
{WARM_ROOT_SH}
warm_root 2>/dev/null || exit 0
for c in /proc/[0-9]*/cmdline; do
  v=$(exec 2>/dev/null; tr '\\0' ' ' <"$c") || continue
  if [ -n "$k" ]; then case $v in *" $r/$k/py/zygote.py serve "*) ;; *) continue ;; esac
  else case $v in *" $r/$jk-"*"/py/zygote.py serve "*) ;; *) continue ;; esac
  fi
  p=${{c#/proc/}}; p=${{p%/cmdline}}
  [ -O "/proc/$p" ] || continue
  kill -s KILL -- "$p" 2>/dev/null
done
if [ -n "$k" ]; then rm -rf -- "$r/$k"; else rm -rf -- "$r/$jk"-*; fi
exit 0
"""

# $1 LOG  $2... tail options
LOGS = f'f=$1; shift; {_expand_home("f")}; exec tail "$@" -- "$f"'


def _job_dir(node_dir: str) -> str:
    return node_dir.rstrip("/").rsplit("/", 1)[0]


class BareRuntime:
    name = "bare"
    containerized = False
    info_argv = None

    def exec_argv(self, node: NodeRef, argv: list[str], *, interactive: bool = False, tty: bool = False,
                  workdir: str | None = None) -> list[str]:
        """On the host, in the job's directory (``workdir``; else the node's own dir)."""
        return ["sh", "-c", IN_DIR, "clusterctl-in-dir", workdir or node.node_dir, *argv]

    def log_path(self, node_dir: str) -> str:
        return f"{node_dir}/node.log"

    def oom_argv(self, node: NodeRef) -> list[str]:
        return ["sh", "-c", f"dmesg 2>/dev/null | tail -n 500 | tail -c {MAX_TEXT}"]   # the kernel names the pid

    def oom_killed(self, stdout: str, pid: int | None) -> bool:
        return pid is not None and oom_killed(stdout, pid)

    def run_argv(self, req: RunRequest) -> list[str]:
        if not req.workdir:
            raise ValueError("bare runtime needs a workdir")
        return ["sh", "-c", START, "clusterctl-start", req.node_dir, req.name, req.workdir, RUNNER, *req.command]

    def stop_argv(self, node: NodeRef, signal: str = "TERM") -> list[str]:
        job_id = _job_dir(node.node_dir).rsplit("/", 1)[-1]
        attempt = node.node_dir.rstrip("/").rsplit("/", 1)[-1]
        return ["sh", "-c", STOP, "clusterctl-stop", node.node_dir, signal, job_id, attempt]

    def remove_argv(self, names: list[str]) -> list[str]:
        # bare has no container to remove: everything is per job (remove_job_argv); keep the interface total
        return ["true"]

    def list_argv(self, job_id: str, *, jobs_root: str = DEFAULT_JOBS_ROOT) -> list[str]:
        return ["sh", "-c", LIST, "clusterctl-list", f"{jobs_root.rstrip('/')}/{job_id}"]

    def remove_job_argv(self, job_id: str, *, jobs_root: str = DEFAULT_JOBS_ROOT) -> list[str]:
        return ["sh", "-c", KILL_JOB, "clusterctl-kill", f"{jobs_root.rstrip('/')}/{job_id}", job_id]

    def logs_argv(self, node: NodeRef, *, tail: int | None = None, follow: bool = False) -> list[str]:
        opts = [f"-n{int(tail)}" if tail is not None else "-n+1"]
        if follow:
            opts.append("-F")
        return ["sh", "-c", LOGS, "clusterctl-logs", node.log_path or f"{node.node_dir}/node.log", *opts]

    def pid_argv(self, node: NodeRef) -> list[str]:
        # the runner's pid, until it has written its exit status (its pid may be reused afterwards)
        script = f'd=$1; {_EXPAND_D}\n{ALIVE}\nalive "$d" && cat -- "$d/pid"'
        return ["sh", "-c", script, "clusterctl-pid", node.node_dir]

    def init_gone_argv(self, node: NodeRef, confirm_s: float) -> None:
        """None: LIST itself asks whether the runner's pid lives, so a "running" bare attempt needs no second look."""
        return None

    def parse_list(self, stdout: str) -> list[Instance]:
        return parse_list(stdout)

    def gpu_args(self, flags: str | None = None) -> list[str]:
        return []      # the ranks are on the host: they see its GPUs

    # ------------------------------------------------------------------ warm recovery
    def zygote_start_argv(self, req: RunRequest, key: str) -> list[str]:
        """Start the node's zygote on the host (stdin: one line, the JSON of the job's environment for the zygote (``zygote.with_job_env``), then zygote.py's source), by the interpreter of the job's
        torchrun (``req.command[0]``), in the warm dir of ``key``. Remove an old one first (``zygote_remove_argv``)."""
        return ["sh", "-c", ZYGOTE_START, "clusterctl-zygote", key, req.command[0]]

    def warm_run_argv(self, req: RunRequest, key: str) -> list[str]:
        """``run_argv`` of a warm attempt (``req.command``: the zygote's clients at ``warm_path``, a placeholder
        that ``warm_exec`` replaces by the node's checked warm dir at the start)."""
        return warm_exec(key, self.run_argv(req))

    def warm_lib_dir(self, key: str, attempt: int) -> None:
        """None: the forked agent and ranks are on the host, they see the runner's NODE_DIR/lib."""
        return None

    def zygote_remove_argv(self, job_id: str, node: str | None = None, key: str = "") -> list[str]:
        """Kill the job's zygote on this node (``key``; "": every one of the job) and what it forked; remove
        its dir."""
        return ["sh", "-c", ZYGOTE_REMOVE, "clusterctl-zygote-rm", key, warm_job_key(job_id)]

    def zygote_exec_argv(self, job_id: str, node: str, argv: list[str], *, interactive: bool = False,
                         tty: bool = False) -> None:
        """None: a warm attempt's ranks are on the host, as a cold one's (``exec_argv``)."""
        return None

    def zygote_ping_argv(self, key: str) -> list[str]:
        """Exit 0 when the zygote of ``key`` answers (the host's python3, torch-free client; ``WARM_PING``)."""
        return zygote_ping_argv(key)


def parse_list(stdout: str) -> list[Instance]:
    out = []
    for line in stdout.splitlines():
        if not line.strip():
            continue
        parts = line.split("\t")
        if len(parts) != 6:
            raise ValueError(f"cannot parse bare status line {line!r}")
        attempt, state, ec, _pid, name, job_id = parts
        code = int(ec) if state == "exited" and ec.strip().lstrip("-").isdigit() else None
        out.append(Instance(name=name, state=state, exit_code=code,
                            labels={LABEL_JOB_ID: job_id, LABEL_ATTEMPT: attempt}))
    return out


RUNTIME = BareRuntime()
