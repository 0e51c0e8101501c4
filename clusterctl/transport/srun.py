"""The ``srun`` connection: node commands as Slurm job steps, no SSH.

Each command is ``srun --overlap --nodes=1 --ntasks=1 -w HOST [--jobid=ID] -- ARGV`` run with subprocess on
this machine: inside an allocation (``SLURM_JOB_ID`` set, e.g. under ``salloc`` or in an ``sbatch`` script) the
step joins it, ``--overlap`` lets it share the allocation's CPUs with the training steps already running. The
step runs as the submitting user with only the variables ``EXPORT`` names (and Slurm's own ``SLURM_*``): not
Slurm's default ``--export=ALL``, which gave every step the supervisor's whole environment (``secret_env``
values, webhook URLs) to show in the nodes' ``/proc/PID/environ``. What a step needs of the job's environment
travels as the command's argv or stdin, as over SSH.

Semantics as SSH's (transport/ssh.py): a command's exit status is a value (``CommandResult``); a step that
Slurm could not start (node down, not in the allocation, allocation gone) raises ``TransportError``; a command
past its timeout raises ``CommandTimeout`` after the step is signalled (SIGTERM through srun, then SIGKILL).
``run`` keeps the last ``MAX_OUTPUT`` bytes of each of stdout and stderr, as SSH does (a node printing without end
must not exhaust the controller's memory).
``HOST`` is the inventory name, which must be the Slurm node name (``-i slurm`` makes it so).
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from clusterctl.errors import CommandTimeout, TransportError
from clusterctl.transport.base import CommandResult, ConnectOptions, communicate_bounded, put_via_run, readable

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host

SRUN = "srun"
# What a step takes from our environment (``--export``; Slurm adds the ``SLURM_*`` variables; a name we do not
# have is left out): what an SSH login session has, and the container engines' addresses.
EXPORT = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LC_ALL", "TZ", "TMPDIR", "XDG_RUNTIME_DIR",
          "DOCKER_HOST", "CONTAINER_HOST")
# srun's own failures (the step never ran), as opposed to the command's non-zero exit: srun prints them as
# "srun: error: ..." and exits 1. These mean "the node cannot be reached", which SSH reports as a connect error.
# Matched line by line with prefixes and substrings (a regex of ``.*`` alternatives was quadratic in a line's
# length: 1.1 s for 39 KB of stderr).
_ERROR = "srun: error: "
_STEP_FAILED_PREFIXES = ("Unable to create step", "Unable to confirm allocation", "Invalid job id",
                         "Unable to allocate resources", "Requested node configuration", "Application launch failed")
_STEP_FAILED_WORDS = ("Slurm backup controller", "Unable to contact slurm controller")
_REVOKED = re.compile(r"Job allocation \d+ has been revoked")
_NODE_STATE = re.compile(r" (?:not|is) (?:in|down|drain)")


def _step_failed(message: str) -> bool:
    """Is ``message`` (an ``srun: error:`` line without that prefix) one of srun's own failures? Linear."""
    if message.startswith(_STEP_FAILED_PREFIXES) or any(w in message for w in _STEP_FAILED_WORDS):
        return True
    if _REVOKED.match(message):
        return True
    first = min((i for i in (message.find("node"), message.find("Node")) if i >= 0), default=-1)
    return first >= 0 and _NODE_STATE.search(message, first + 4) is not None


def job_id(env: Mapping[str, str] | None = None) -> str | None:
    env = os.environ if env is None else env
    jid = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    return jid if jid and jid.isdigit() else None


def srun_argv(node: str, argv: Sequence[str], *, jobid: str | None, unbuffered: bool = False) -> list[str]:
    """The srun command line for one node command (pure; tested by equality)."""
    out = [SRUN, "--overlap", "--nodes=1", "--ntasks=1", "-w", node, "--quiet", "--kill-on-bad-exit=0",
           "--export=" + ",".join(EXPORT)]
    if jobid:
        out.append(f"--jobid={jobid}")
    if unbuffered:
        out.append("--unbuffered")
    return out + ["--", *[str(a) for a in argv]]


_EXIT_LINE = re.compile(r"^srun: error: \S+: task \d+: (Exited with exit code \d+|Killed|Terminated)\n?", re.M)


def command_stderr(stderr: str) -> str:
    """The command's stderr without srun's own report of its exit (SSH has no such line)."""
    return _EXIT_LINE.sub("", stderr)


def step_failure(exit_code: int, stderr: str) -> str | None:
    """The srun error line when srun itself failed to run the step, else None (the command's own exit)."""
    if exit_code == 0:
        return None
    return next((line for line in stderr.split("\n")
                 if line.startswith(_ERROR) and _step_failed(line[len(_ERROR):])), None)


class SrunTransport:
    def __init__(self, host: "Host", options: ConnectOptions, env: Mapping[str, str] | None = None):
        self.host, self.options = host, options
        self.jobid = str(host.vars.get("clusterctl_slurm_job_id") or "") or job_id(env)
        self.connect_s = 0.0

    def argv(self, argv: Sequence[str], unbuffered: bool = False) -> list[str]:
        return srun_argv(self.host.name, argv, jobid=self.jobid, unbuffered=unbuffered)

    def run(self, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        argv = tuple(str(a) for a in argv)
        timeout = timeout or self.options.command_timeout
        start = time.monotonic()
        try:
            p = subprocess.Popen(self.argv(argv), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                 stderr=subprocess.PIPE, start_new_session=True)
        except OSError as e:
            raise TransportError(self.host.name, f"cannot run {SRUN}: {e.strerror}") from None
        try:
            out, err = communicate_bounded(p, stdin or b"", start + timeout)
        except subprocess.TimeoutExpired:
            _end(p)
            raise CommandTimeout(self.host.name, f"command timed out after {timeout:g}s: {argv[0]}") from None
        finally:
            for f in (p.stdin, p.stdout, p.stderr):
                f.close()
        stderr = err.decode(errors="replace")
        if (failed := step_failure(p.returncode, stderr)) is not None:
            raise TransportError(self.host.name, f"srun could not run a step on {self.host.name}: {failed}")
        return CommandResult(argv, p.returncode, out.decode(errors="replace"), command_stderr(stderr),
                             time.monotonic() - start)

    def put(self, data: bytes, path: str, mode: int = 0o600) -> None:
        put_via_run(self, data, path, mode)

    def _popen(self, argv: Sequence[str]) -> subprocess.Popen:
        try:
            return subprocess.Popen(self.argv(argv, unbuffered=True), stdin=subprocess.DEVNULL,
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as e:
            raise TransportError(self.host.name, f"cannot run {SRUN}: {e.strerror}") from None

    def stream(self, argv: Sequence[str], on_data: Callable[[bytes], None], stop: threading.Event) -> None:
        s = self.open_stream(argv)
        try:
            while not stop.is_set():
                readable(s.fileno(), 0.5)
                data = s.read()
                if data == b"":
                    break
                if data:
                    on_data(data)
        finally:
            s.close()

    def open_stream(self, argv: Sequence[str]) -> "SrunStream":
        """``stream`` for a selector loop (``transport.streams.StreamMux``): srun's stdout pipe."""
        return SrunStream(self, self._popen(argv))

    def close(self) -> None:
        pass


class SrunStream:
    """A started streaming step: ``read()`` -> bytes, ``b""`` once it ended, ``None`` for nothing yet."""

    def __init__(self, transport: SrunTransport, proc: subprocess.Popen):
        self.transport, self.proc = transport, proc
        self._tail = b""
        os.set_blocking(proc.stdout.fileno(), False)

    def fileno(self) -> int:
        return self.proc.stdout.fileno()

    def read(self) -> bytes | None:
        try:
            data = os.read(self.proc.stdout.fileno(), 65536)
        except BlockingIOError:
            return None
        except OSError as e:
            raise TransportError(self.transport.host.name, f"stream lost: {e.strerror}") from None
        if data:
            self._tail = (self._tail + data)[-4096:]
            return data
        code = self.proc.wait()
        if (failed := step_failure(code, self._tail.decode(errors="replace"))) is not None:
            raise TransportError(self.transport.host.name, f"srun could not run a step: {failed}")
        return b""

    def close(self) -> None:
        if self.proc.poll() is None:
            _end(self.proc)
        self.proc.stdout.close()


def _end(p: subprocess.Popen, grace: float = 2.0) -> None:
    """Stop a running srun: SIGTERM (srun forwards it to the step and waits for it to end), then SIGKILL."""
    try:
        p.send_signal(signal.SIGTERM)
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    except ProcessLookupError:
        pass
