"""A warm "zygote": a long-lived process that has imported torch once, and forks torchrun agents and ranks from it.

Shipped to the nodes like ``checkpoint.py`` (stdlib only at import; torch is imported by ``serve`` alone).

``serve(sock)``: imports ``PRELOAD`` (no thread, no OpenMP pool is started: nothing runs a tensor op), then listens
on the unix socket ``sock``. Single-threaded: one ``select`` loop over the listening socket and the clients'
connections, and ``waitpid(WNOHANG)`` for its children, so a ``fork`` never copies a lock held by another thread.

``client(sock, kind, argv)``: torch-free and fast (run it with ``python -S``). Sends ``kind`` (``torchrun`` or
``rank``), argv, the environment and the working directory, and passes its stdin/stdout/stderr (``SCM_RIGHTS``);
the zygote forks, the child takes those fds, the environment and the directory, and runs
``torch.distributed.run.main(argv)`` (the real torchrun agent) or the rank (``runpy``: ``argv[0]`` a script,
or ``-m MODULE``: the plan's ranks are ``-m clusterctl.rankview SCRIPT|-m MODULE``, as cold ones). The client forwards TERM/INT/HUP/USR1/USR2 to the child (as ``K <signal>`` lines: the child may
live in another PID namespace, the zygote's container), and exits with the
child's exit code, or dies of the same signal. When the client goes away (killed), the zygote kills the child's
whole session (SIGKILL): nothing forked outlives the process that asked for it.

Protocol, one connection per child: client -> ``<len:4><json>`` with the three fds; zygote -> ``P <pid>\\n``, later
``X <code>\\n`` (exit code) or ``S <signal>\\n`` (``S 9 oom``: SIGKILLed while its memory cgroup counted an OOM
kill, see ``oom_kills``; the client then says ``OOM_NOTE`` before it dies of the signal); on a failure before the
fork ``E <message>\\n``. Kind ``ping`` answers ``X 0`` at once (is the zygote up and warm?). A ``torchrun`` request
first kills and reaps every child of another attempt (``CLUSTERCTL_ATTEMPT``): no two generations run on one node.
Command line: ``python zygote.py serve SOCK`` / ``python -S zygote.py client SOCK KIND ARGV...``.
"""
from __future__ import annotations

import os
import sys

if __name__ == "__main__":      # run as a script: nothing beside it is imported (clients run with -I anyway)
    sys.path[:] = [p for p in sys.path if p and p != os.path.dirname(os.path.abspath(__file__))]

import array  # noqa: E402 - after the sys.path fix above
import json  # noqa: E402
import select  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import struct  # noqa: E402
import time  # noqa: E402

PRELOAD = ("torch", "torch.distributed", "torch.distributed.run", "torch.distributed.elastic.agent.server.local_elastic_agent",
           "torch.nn.parallel", "torch.optim", "torch._dynamo")
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1, signal.SIGUSR2)
READY = "clusterctl-zygote ready"
# what the client of a rank the OOM killer ended says on its stderr (the rank's log) before it dies of SIGKILL: the
# supervisor's OOM test for a warm rank (model.causes.WARM_OOM, the same words: this file imports no clusterctl)
OOM_NOTE = "clusterctl-zygote: killed by the OOM killer (out of memory)"


# ------------------------------------------------------------------------------------------------ client
def _send(conn: socket.socket, payload: dict, fds: list[int]) -> None:
    data = json.dumps(payload).encode()
    conn.sendmsg([struct.pack("!I", len(data)) + data],
                 [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else [])


def client(sock: str, kind: str, argv: list[str], connect_timeout_s: float = 5.0) -> int:
    """Run ``argv`` as ``kind`` in a child of the zygote at ``sock``; returns its exit code (or re-raises its
    signal on this process). Exit 125 when the zygote cannot be reached or does not answer in time (the caller
    then runs cold): its first answer within ``connect_timeout_s`` for a ping, and for a fork within that plus the
    zygote's wait for an old generation's end (``GONE_S``)."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    conn.settimeout(connect_timeout_s)
    try:
        conn.connect(sock)
        if kind == "ping":      # nothing of this process (the host's SSH session) goes to the zygote
            _send(conn, {"kind": kind, "argv": [], "env": {}, "cwd": "/"}, [])
        else:
            _send(conn, {"kind": kind, "argv": argv, "env": dict(os.environ), "cwd": os.getcwd()}, [0, 1, 2])
            conn.settimeout(connect_timeout_s + GONE_S + 5.0)
        f = conn.makefile("r")
        first = f.readline()
        conn.settimeout(None)
    except OSError as e:
        print(f"clusterctl-zygote: cannot reach {sock}: {e}", file=sys.stderr)
        return 125
    if kind == "ping" and first.startswith("X "):
        return int(first[2:])
    if not first.startswith("P "):
        print(f"clusterctl-zygote: {first[2:].strip() or 'the zygote closed the connection'}", file=sys.stderr)
        return 125
    pid = int(first[2:])

    def forward(signum, _frame):       # through the zygote: the child may be in another PID namespace
        try:
            conn.sendall(f"K {signum}\n".encode())
        except OSError:
            pass

    for s in FORWARDED:
        signal.signal(s, forward)
    while True:
        try:
            line = f.readline()
            break
        except InterruptedError:    # pragma: no cover - PEP 475 retries; kept for old Pythons
            continue
    if line.startswith("X "):
        return int(line[2:])
    if line.startswith("S "):
        sig, *why = line[2:].split()
        if why == ["oom"]:
            try:
                print(f"{OOM_NOTE}: its memory cgroup counted an OOM kill while it ran (pid {pid} in the zygote's "
                      "namespace)", file=sys.stderr, flush=True)
            except (OSError, ValueError):     # nowhere to say it: the signal is still the rank's
                pass
        sig = int(sig)
        die_of(sig)
        return 128 + sig
    print("clusterctl-zygote: lost the zygote before the child ended", file=sys.stderr)
    return 125


def oom_kills(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> int | None:
    """The OOM kills counted in this process's memory cgroup (the zygote's container, or its host session), or
    None where none can be read: cgroup v1 ``memory.oom_control``'s ``oom_kill`` (kernel >= 4.13), v2
    ``memory.events``' ``oom_kill`` (every OOM kill of a process of the cgroup, by its own limit or the host's).
    A container without a cgroup namespace sees its own cgroup at the mount's root, not under the path
    /proc/self/cgroup names: that path first, then the root."""
    try:
        with open(proc_cgroup) as f:
            entries = [line.split(":", 2) for line in f.read().splitlines() if line.count(":") >= 2]
    except OSError:
        return None
    v1 = [path for _, ctrls, path in entries if "memory" in ctrls.split(",")]
    if v1:
        files = [f"{root}/memory{v1[0].rstrip('/')}/memory.oom_control", f"{root}/memory/memory.oom_control"]
    else:
        v2 = [path for _, ctrls, path in entries if ctrls == ""]
        files = [f"{root}{v2[0].rstrip('/')}/memory.events", f"{root}/memory.events"] if v2 else []
    for name in files:
        try:
            with open(name) as f:
                for line in f:
                    key, _, value = line.partition(" ")
                    if key == "oom_kill" and value.strip().isdigit():
                        return int(value)
        except OSError:
            continue
    return None


def die_of(sig: int) -> None:
    """End this process by signal ``sig``, as its child ended: whoever waits for it (torchrun's agent, the runner)
    sees the wait status of a cold rank (killed by SIGKILL: the OOM killer's signal). The default action is
    restored first where a handler can be set at all (SIGKILL and SIGSTOP have none to restore)."""
    try:
        signal.signal(sig, signal.SIG_DFL)
    except (OSError, ValueError):
        pass
    signal.pthread_sigmask(signal.SIG_UNBLOCK, [sig])
    os.kill(os.getpid(), sig)


def peer_uid(conn: socket.socket) -> int:
    """The uid of the process at the other end of unix socket ``conn`` (``SO_PEERCRED``, as the kernel saw it at
    ``connect``; in this process's user namespace)."""
    _pid, uid, _gid = struct.unpack("3i", conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED,
                                                          struct.calcsize("3i")))
    return uid


def may_fork_for(uid: int) -> bool:
    """Only this zygote's own uid, or root, may have it fork (anyone who reaches the socket may ping it)."""
    return uid in (0, os.getuid())


# ------------------------------------------------------------------------------------------------ server
MAX_REQUEST = 16 << 20     # bytes of one request (argv, environment): more is refused
REQUEST_S = 5.0            # a connection must have sent its whole request within this after it was accepted
GONE_S = 10.0              # a fork waits at most this for the process groups of another attempt to be gone


class Request:
    """A connection whose request is being read, without blocking the zygote: ``<len:4><json>`` with up to three
    fds (``SCM_RIGHTS``). Every fd received is closed by ``close`` unless a fork took it (``take``)."""

    def __init__(self, conn: socket.socket, uid: int):
        self.conn, self.uid = conn, uid
        self.deadline = time.monotonic() + REQUEST_S
        self.data = b""
        self.fds: list[int] = []

    def read(self) -> dict | None:
        """Read what is there; the request once whole, else None. Raises OSError/ValueError on a bad one."""
        fds = array.array("i")
        msg, anc, _flags, _addr = self.conn.recvmsg(1 << 20, socket.CMSG_SPACE(3 * fds.itemsize))
        for level, typ, data in anc:
            if level == socket.SOL_SOCKET and typ == socket.SCM_RIGHTS:
                fds.frombytes(data[: len(data) - (len(data) % fds.itemsize)])
        self.fds += list(fds)
        if not msg:
            raise OSError("the client closed the connection before its request was whole")
        self.data += msg
        if len(self.data) < 4:
            return None
        (n,) = struct.unpack("!I", self.data[:4])
        if n > MAX_REQUEST:
            raise ValueError(f"request of {n} bytes (at most {MAX_REQUEST})")
        if len(self.data) < 4 + n:
            return None
        req = json.loads(self.data[4:4 + n])
        if not isinstance(req, dict) or req.get("kind") not in ("ping", "torchrun", "rank") or \
                not isinstance(req.get("argv"), list) or not isinstance(req.get("env"), dict) or \
                not isinstance(req.get("cwd"), str) or (req["kind"] != "ping" and len(self.fds) != 3):
            raise ValueError("malformed request")
        return req

    def take(self) -> list[int]:
        fds, self.fds = self.fds, []
        return fds

    def close(self) -> None:
        for fd in self.take():
            try:
                os.close(fd)
            except OSError:
                pass


def _run_child(req: dict) -> int:
    """In the forked child: become what the client asked for. Returns the exit code."""
    os.environ.clear()
    os.environ.update(req["env"])
    os.chdir(req["cwd"])
    argv = list(req["argv"])
    if os.environ.get("PYTHONUNBUFFERED"):
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.reconfigure(write_through=True)
            except (AttributeError, ValueError):
                pass
    for entry in reversed([p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]):
        if entry not in sys.path:           # sys.path was made when the zygote started: the job's entries go first
            sys.path.insert(0, entry)
    torch = sys.modules.get("torch")
    if torch is not None and os.environ.get("OMP_NUM_THREADS", "").isdigit():
        # read by the OpenMP runtime when the zygote imported torch, not now: torchrun sets it to 1 per rank
        # when nproc_per_node > 1 (without this, every forked rank ran one thread per core: 2x the step time)
        torch.set_num_threads(max(1, int(os.environ["OMP_NUM_THREADS"])))
    try:
        if req["kind"] == "torchrun":
            sys.argv = ["torchrun", *argv]
            from torch.distributed.run import main
            own = argv[:argv.index("--no-python")] if "--no-python" in argv else argv   # torchrun's, not the script's
            await_store(own)
            _quicker_rendezvous(rdzv_poll_s(own))
            main(argv)
        else:
            import runpy
            if argv and argv[0] == "-m":      # as `python -m MODULE`: the working directory first on sys.path
                sys.argv = [argv[1], *argv[2:]]   # (clusterctl.rankview, which runs every rank's entry, counts on it)
                sys.path.insert(0, os.getcwd())
                runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
            else:
                sys.argv = argv
                sys.path[0:0] = [os.path.dirname(os.path.abspath(argv[0]))]
                runpy.run_path(argv[0], run_name="__main__")
        return 0
    except SystemExit as e:
        code = e.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001 - what python itself would print, then exit 1
        import traceback
        traceback.print_exc()
        return 1


def _option(argv: list[str], name: str) -> str | None:
    """torchrun's ``--name=value`` or ``--name value`` in ``argv`` (its last one), else None."""
    value = None
    for i, a in enumerate(argv):
        if a.startswith(f"--{name}="):
            value = a.split("=", 1)[1]
        elif a == f"--{name}" and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def rdzv_poll_s(argv: list[str]) -> float:
    """How often the forked agent's c10d rendezvous looks at its store: ``--nnodes`` MAX / 1000 s, between 0.1 s
    and torch's own 1 s (up to 100 nodes every 0.1 s; a 1,000-node job polls as torch does)."""
    try:
        nnodes = int((_option(argv, "nnodes") or "1").rsplit(":", 1)[-1])
    except ValueError:
        nnodes = 1
    return min(1.0, max(0.1, nnodes / 1000))


def _quicker_rendezvous(poll_s: float) -> None:
    """In the forked agent only (torchrun stays the agent, c10d the rendezvous): torch's dynamic rendezvous sleeps
    1 s between its looks at the store, answers a look from a cache for 1 s after the last read, and sleeps a
    random 0-0.3 s before joining round 0, all to spare the store of a large job. So the agent that joined first
    learned that the last one had joined up to ~1 s later, and every agent waited on it (the rank-0 agent
    publishes the workers' store). Here, while the agent rendezvouses (``next_rendezvous``), those delays and the
    cache's age are ``poll_s`` times torch's; afterwards the cache is torch's again (the agent's monitor asks for
    the rendezvous state every 0.1 s while training: one store read a second, as with torch's values). Measured
    (two agents forked from a zygote, c10d on localhost, this box): their start -> their workers' 1.2-1.4 s with
    torch's values, 0.2-0.25 s with these. A torch without these private names is left as it is."""
    try:
        from torch.distributed.elastic.rendezvous import dynamic_rendezvous as dr
    except ImportError:
        return
    delay = getattr(dr, "_delay", None)
    if delay is not None:
        def scaled(seconds):
            delay(seconds=tuple(s * poll_s for s in seconds) if isinstance(seconds, tuple) else seconds * poll_s)
        dr._delay = scaled
    handler = getattr(dr, "DynamicRendezvousHandler", None)
    rendezvous = getattr(handler, "next_rendezvous", None)
    if rendezvous is None:
        return

    def next_rendezvous(self, *args, **kw):
        holder = getattr(self, "_state_holder", None)
        cache_s = getattr(holder, "_cache_duration", None)
        if cache_s is not None:
            holder._cache_duration = cache_s * poll_s
        try:
            return rendezvous(self, *args, **kw)
        finally:
            if cache_s is not None:
                holder._cache_duration = cache_s
    handler.next_rendezvous = next_rendezvous


def await_store(argv: list[str], bound_s: float = 10.0, every_s: float = 0.02) -> bool:
    """A torchrun agent that does not host the c10d store (``is_host=0``): wait until the store listens, trying
    every ``every_s``, before the agent starts. torch's own client, refused, waits a growing backoff (0.2-1 s and
    more) between its tries: the agents of a warm relaunch start within a fraction of a second of each other, and
    one that came before the rendezvous host's store waited out that backoff. Bounded by ``bound_s`` (then torch
    tries, and times out, as it would have). Returns whether the store answered."""
    conf = dict(kv.split("=", 1) for kv in (_option(argv, "rdzv-conf") or "").split(",") if "=" in kv)
    host, _, port = (_option(argv, "rdzv-endpoint") or "").rpartition(":")
    if conf.get("is_host", "1") != "0" or not host or not port.isdigit():
        return False
    deadline = time.monotonic() + bound_s
    while True:
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
            return True
        except OSError:
            if time.monotonic() >= deadline:
                return False
            time.sleep(every_s)


def _name(req: dict) -> None:
    """Name the child as ``ps``/``top`` show it (``/proc/PID/comm``; a fork keeps the zygote's command line):
    ``cc-rank-<attempt>`` for a rank; ``cc-agent-<attempt>`` for a torchrun agent until torch renames it
    ``pt_elastic``, as it does a cold one."""
    kind = "agent" if req.get("kind") == "torchrun" else "rank"
    name = f"cc-{kind}-{req.get('env', {}).get('CLUSTERCTL_ATTEMPT', '')}".rstrip("-")[:15]
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(15, name.encode(), 0, 0, 0)   # PR_SET_NAME = 15
    except (OSError, AttributeError):
        pass


def _retitle(req: dict) -> None:
    """What ``ps`` shows for a forked child (a fork keeps the zygote's command line): ``clusterctl rank N attempt A
    job NAME <zygote.py> serve`` (``agent`` for torchrun's), written over the command line's own memory
    (``/proc/self/mem``, between ``arg_start`` and ``arg_end``; the job's name is cut to fit). It keeps the
    zygote's path and ``serve``: the zygote's removal and ``stacks`` find what a zygote forked by them."""
    env = req.get("env", {})
    what = f"rank {env.get('RANK', '?')}" if req.get("kind") == "rank" else "agent"
    head = f"clusterctl {what} attempt {env.get('CLUSTERCTL_ATTEMPT', '?')} job "
    tail = f" {os.path.abspath(__file__)} serve "
    try:
        with open("/proc/self/stat", "rb") as f:
            fields = f.read().rsplit(b")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])       # arg_start, arg_end (fields 48 and 49)
        room = end - start - 1 - len(head.encode()) - len(tail.encode())
        if room < 1:
            return
        job = str(env.get("CLUSTERCTL_JOB", "?")).encode()[:room].decode(errors="ignore")
        title = f"{head}{job}{tail}".encode()
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            mem.write(title + b"\0" * (end - start - len(title)))
    except (OSError, ValueError, IndexError):
        pass


def _die_with_parent(parent: int) -> None:
    """SIGKILL this child when the zygote dies (Linux ``PR_SET_PDEATHSIG``): a killed zygote leaves no agent or
    rank running on (in a container its removal ends them all; on a bare host nothing else would)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)   # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):       # not Linux: the zygote's kill of the session is all there is
        return
    if os.getppid() != parent:              # it died between the fork and the prctl
        os._exit(137)


def _fork(req: dict, fds: list[int], listener: socket.socket, conns: list[socket.socket]) -> int:
    zygote = os.getpid()
    pid = os.fork()
    if pid:
        return pid
    code = 1
    marker = ""
    try:
        if req["kind"] == "rank" and "RANK" in req["env"]:
            # how `clusterctl stacks` finds a forked rank (its /proc environ is the zygote's): ATTEMPT RANK
            marker = os.path.join(os.path.dirname(listener.getsockname()), "ranks", str(os.getpid()))
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            with open(marker, "w") as f:
                f.write(f"{req['env'].get('CLUSTERCTL_ATTEMPT', '')} {req['env']['RANK']}\n")
        os.setsid()                          # its own session: the zygote kills the whole of it
        _die_with_parent(zygote)
        _name(req)
        _retitle(req)
        signal.set_wakeup_fd(-1)
        for s in FORWARDED + (signal.SIGCHLD,):
            signal.signal(s, signal.SIG_DFL)
        listener.close()
        for c in conns:
            c.close()
        for target, fd in zip((0, 1, 2), fds):
            os.dup2(fd, target)
        for fd in fds:
            if fd > 2:
                os.close(fd)
        code = _run_child(req)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001
                pass
        if marker:
            try:
                os.unlink(marker)
            except OSError:
                pass
        os._exit(code if 0 <= code < 256 else 1)


def serve(sock: str, preload: tuple[str, ...] = PRELOAD) -> None:
    """Serve ``sock`` until SIGTERM. One loop, never blocked by one client: a request is read as it arrives (a
    connection silent for ``REQUEST_S`` is dropped, a malformed one answered ``E`` and closed, its fds with it);
    the children of an attempt that ends are SIGKILLed all at once (each its session: ``killpg``) and reaped as
    they go (``WNOHANG``), while pings are answered; only the next fork waits for those groups to be gone, at most
    ``GONE_S`` (a rank stuck in the driver must not wedge the node's zygote)."""
    import importlib
    import selectors

    for name in preload:
        importlib.import_module(name)
    try:
        os.unlink(sock)
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o077)
    try:
        listener.bind(sock)
    finally:
        os.umask(old)
    listener.listen(64)
    listener.setblocking(False)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    wake_r, wake_w = os.pipe()                      # SIGCHLD wakes the loop (no polling while idle)
    os.set_blocking(wake_r, False)
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    signal.set_wakeup_fd(wake_w)
    sel = selectors.DefaultSelector()
    sel.register(listener, selectors.EVENT_READ)
    sel.register(wake_r, selectors.EVENT_READ)
    reading: dict[socket.socket, Request] = {}       # connections whose request is not whole yet
    waiting: list[tuple[Request, dict, float]] = []  # fork requests waiting for the old groups to be gone
    children: dict[socket.socket, int] = {}         # connection -> child pid (its session and group id)
    attempt_of: dict[int, str] = {}                 # child pid -> CLUSTERCTL_ATTEMPT of its request
    agents: set[int] = set()                        # the children that are torchrun agents
    oom_at: dict[int, int | None] = {}              # child pid -> its memory cgroup's OOM kills when it was forked
    dying: set[int] = set()                         # process groups SIGKILLed, not all gone yet
    print(READY, flush=True)

    def drop(conn: socket.socket) -> None:
        try:
            sel.unregister(conn)
        except (KeyError, ValueError):
            pass
        conn.close()

    def answer(conn: socket.socket, line: str) -> None:
        try:
            conn.setblocking(True)
            conn.settimeout(1.0)
            conn.sendall(f"{line}\n".encode())
        except OSError:
            pass

    def kill_group(pid: int) -> None:
        try:
            os.killpg(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        dying.add(pid)

    def kill_attempts(keep: str | None = None, only: str | None = None) -> None:
        """SIGKILL the sessions of the children of other attempts than ``keep`` (or of attempt ``only``), all at
        once; their clients learn how they ended when they are reaped."""
        for pid in list(children.values()):
            a = attempt_of.get(pid)
            if not ((keep is not None and a == keep) or (only is not None and a != only)):
                kill_group(pid)

    def finish(conn: socket.socket, pid: int, status: int | None) -> None:
        children.pop(conn, None)
        attempt_of.pop(pid, None)
        agents.discard(pid)
        before = oom_at.pop(pid, None)
        if status is not None:
            sig = os.WTERMSIG(status) if os.WIFSIGNALED(status) else None
            oom = sig == signal.SIGKILL and before is not None and (oom_kills() or 0) > before
            answer(conn, (f"S {sig}" + (" oom" if oom else "")) if sig else f"X {os.WEXITSTATUS(status)}")
        drop(conn)

    def gone(pgid: int) -> bool:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            return False
        return False

    def fork(r: Request, req: dict) -> None:
        conns = [r.conn, *children, *reading, *(w[0].conn for w in waiting)]
        fds = r.take()
        base = oom_kills()          # before the fork: a kill counted later happened while the child lived
        try:
            pid = _fork(req, fds, listener, conns)
        finally:
            for fd in fds:          # the child has its copies
                os.close(fd)
        answer(r.conn, f"P {pid}")
        r.conn.setblocking(False)
        children[r.conn] = pid
        oom_at[pid] = base
        attempt_of[pid] = str(req["env"].get("CLUSTERCTL_ATTEMPT", ""))
        if req["kind"] == "torchrun":
            agents.add(pid)
        sel.register(r.conn, selectors.EVENT_READ)

    def handle(r: Request, req: dict) -> None:
        if req["kind"] == "ping":
            answer(r.conn, "X 0")
            r.close()
            drop(r.conn)
            return
        if not may_fork_for(r.uid):
            raise PermissionError(f"uid {r.uid} may not have the zygote of uid {os.getuid()} fork")
        if req["kind"] == "torchrun":
            kill_attempts(keep=str(req["env"].get("CLUSTERCTL_ATTEMPT", "")))    # no two generations on a node
        waiting.append((r, req, time.monotonic() + GONE_S))

    def fail(r: Request, e: BaseException) -> None:
        answer(r.conn, f"E {e}")
        r.close()
        drop(r.conn)

    try:
        while True:
            now = time.monotonic()
            deadlines = [r.deadline for r in reading.values()] + [w[2] for w in waiting]
            timeout = max(0.0, min(deadlines) - now) if deadlines else None
            if dying or waiting:
                timeout = min(timeout if timeout is not None else 0.05, 0.05)   # look at the groups' end
            for key, _ in sel.select(timeout):
                c = key.fileobj
                if c == wake_r:
                    try:
                        os.read(wake_r, 512)
                    except BlockingIOError:
                        pass
                elif c is listener:
                    try:
                        conn, _ = listener.accept()
                    except (BlockingIOError, InterruptedError):
                        continue
                    conn.setblocking(False)
                    try:
                        uid = peer_uid(conn)
                    except OSError:
                        conn.close()
                        continue
                    reading[conn] = Request(conn, uid)
                    sel.register(conn, selectors.EVENT_READ)
                elif c in reading:
                    r = reading[c]
                    try:
                        req = r.read()
                    except BlockingIOError:
                        continue
                    except Exception as e:  # noqa: BLE001 - that request fails, the zygote stays
                        del reading[c]
                        fail(r, e)
                        continue
                    if req is None:
                        continue
                    del reading[c]
                    sel.unregister(c)
                    try:
                        handle(r, req)
                    except Exception as e:  # noqa: BLE001
                        fail(r, e)
                elif c in children:
                    pid = children[c]
                    try:
                        data = c.recv(256)
                    except BlockingIOError:
                        continue
                    except OSError:
                        data = b""
                    if data:                         # "K <signal>" lines: the client forwards a signal
                        for line in data.decode(errors="replace").splitlines():
                            if line.startswith("K ") and line[2:].strip().isdigit():
                                try:
                                    os.kill(pid, int(line[2:]))
                                except (ProcessLookupError, ValueError, OverflowError):
                                    pass
                        continue
                    # the client went away: its child goes too (reaped below, or when it has ended)
                    kill_group(pid)
                    attempt = attempt_of.get(pid)
                    was_agent = pid in agents
                    finish(c, pid, None)
                    if was_agent:               # an agent killed from outside: its ranks (their clients are its
                        kill_attempts(only=attempt)   # children, in its session, gone with it) go too
            conn_of = {pid: conn for conn, pid in children.items()}
            while True:        # reap every child, and orphans too (docker: the zygote is the container's PID 1)
                try:
                    pid, status = os.waitpid(-1, os.WNOHANG)
                except ChildProcessError:
                    break
                if not pid:
                    break
                if pid in conn_of:
                    kill_group(pid)                  # what the child left in its session
                    finish(conn_of.pop(pid), pid, status)
            dying.difference_update([g for g in dying if gone(g)])
            now = time.monotonic()
            for c in [c for c, r in reading.items() if r.deadline <= now]:
                fail(reading.pop(c), TimeoutError(f"no whole request within {REQUEST_S:g}s"))
            while waiting and (not dying or waiting[0][2] <= now):   # the old groups gone, or waited enough
                r, req, _ = waiting.pop(0)
                try:
                    fork(r, req)
                except Exception as e:  # noqa: BLE001
                    fail(r, e)
    finally:
        for pid in children.values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.unlink(sock)
        except OSError:
            pass


ENV_FILE = "env.json"                  # beside zygote.py: the job's environment for the zygote (see with_job_env)
STARTED_WITH = "CLUSTERCTL_ZYGOTE_ENV"  # set in the zygote once it runs with that environment


def with_job_env(argv: list[str]) -> None:
    """``serve``: run with the job's environment (``ENV_FILE`` beside this file: the job's plain variables, no
    secret, no ``CLUSTERCTL_*``), so that what an interpreter or a library reads once at its start is what a cold
    rank sees: ``PYTHONHASHSEED``, ``PYTHONOPTIMIZE``, ``LD_LIBRARY_PATH``/``LD_PRELOAD`` (an NCCL net plugin),
    ``TORCH_LOGS``, ``TORCHINDUCTOR_*``, OpenMP/MKL settings read when torch is imported. The interpreter is
    started again once (``execve``) with them on top of its own environment; a forked child then gets its
    client's whole environment as before."""
    path = os.path.join(os.path.dirname(os.path.abspath(__file__)), ENV_FILE)
    if os.environ.get(STARTED_WITH) or not os.path.isfile(path):
        return
    with open(path) as f:
        job = json.load(f)
    env = {**os.environ, **{str(k): str(v) for k, v in job.items()}, STARTED_WITH: "1"}
    os.execve(sys.executable, [sys.executable, os.path.abspath(__file__), *argv], env)


def main(argv: list[str]) -> int:
    if len(argv) >= 2 and argv[0] == "serve":    # serve SOCK [MODULE,MODULE...] (default PRELOAD; "" none)
        with_job_env(argv)
        serve(argv[1], tuple(m for m in argv[2].split(",") if m) if len(argv) > 2 else PRELOAD)
        return 0
    if len(argv) >= 3 and argv[0] == "client":
        return client(argv[1], argv[2], argv[3:])
    print("usage: zygote.py serve SOCK | client SOCK torchrun|rank ARGV...", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
