"""``clusterctl shell``: an interactive shell where a job runs (its container, or for a bare job the host in the
job's directory), over the same SSH transport and host-key policy as everything else.

With a terminal on stdin: a remote pty (``exec -it``), the local terminal in raw mode, window size changes
forwarded. Without one (a pipe): no pty, stdin streamed and closed at its end, stdout and stderr kept apart.
The exit code is the remote shell's (255 when the connection is lost, as ``ssh`` does).
"""
from __future__ import annotations

import os
import select
import shutil
import signal
import subprocess
import sys
import threading
from typing import TYPE_CHECKING

from clusterctl.transport.base import quote

if TYPE_CHECKING:
    from clusterctl.oncall.jobnodes import JobNodes

# the shell to start: $SHELL when it is set and executable there, else bash, else sh (fixed text)
PICK_SHELL = ('if [ -n "${SHELL:-}" ] && [ -x "$SHELL" ]; then exec "$SHELL"; fi; '
              'command -v bash >/dev/null 2>&1 && exec bash; exec sh')


def argv(jn: "JobNodes", node: str, *, tty: bool) -> list[str]:
    from clusterctl.oncall.jobnodes import in_job_argv

    return in_job_argv(jn, node, ["sh", "-c", PICK_SHELL], interactive=True, tty=tty)


def run(transport, command: list[str], *, tty: bool, stdin=None, stdout=None, stderr=None) -> int:
    """Run ``command`` interactively on ``transport``'s host; returns its exit code."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    stderr = stderr or sys.stderr
    session = getattr(transport, "session", None)
    if session is None:           # a local host: the command inherits this terminal
        return subprocess.call(command, stdin=stdin, stdout=stdout, stderr=stderr)
    chan = session()
    options = getattr(transport, "options", None)
    wait_s = getattr(options, "connect_timeout", None) or ANSWER_S
    host = getattr(getattr(transport, "host", None), "name", "?")
    try:
        if tty:
            size = shutil.get_terminal_size()
            _answered(chan, lambda: chan.get_pty(term=os.environ.get("TERM", "xterm"), width=size.columns,
                                                 height=size.lines), wait_s, host, "the pty request")
        _answered(chan, lambda: chan.exec_command(quote(command)), wait_s, host, "the exec request")
        return _pump(chan, stdin.fileno(), stdout.fileno(), stderr.fileno(), tty)
    finally:
        chan.close()


ANSWER_S = 10.0     # the default deadline for the server's answer to the pty and exec requests


def _answered(chan, request, seconds: float, host: str, what: str) -> None:
    """``request()`` (paramiko waits for the server's answer without a deadline), closed at ``seconds``: a server
    that never answers cannot hold ``clusterctl shell`` forever (issue 24). Raises ``CommandTimeout``."""
    from clusterctl.errors import CommandTimeout

    expired = threading.Event()

    def expire() -> None:
        expired.set()
        chan.close()

    timer = threading.Timer(seconds, expire)
    timer.daemon = True
    timer.start()
    try:
        request()
    except Exception:  # noqa: BLE001 - a request failed by the expiry's close is the timeout below
        if not expired.is_set():
            raise
    finally:
        timer.cancel()
    if expired.is_set():
        raise CommandTimeout(host, f"no answer to {what} within {seconds:g}s")


def _pump(chan, in_fd: int, out_fd: int, err_fd: int, tty: bool) -> int:
    old = None
    if tty:
        import termios
        import tty as ttymod

        old = termios.tcgetattr(in_fd)
        ttymod.setraw(in_fd, termios.TCSANOW)     # keep what was typed ahead (TCSAFLUSH drops it)
        prev = signal.signal(signal.SIGWINCH, lambda *_: _resize(chan))
    try:
        stdin_open = True
        while True:
            fds = [chan] + ([in_fd] if stdin_open else [])
            ready, _, _ = select.select(fds, [], [], 0.5)
            if chan in ready or chan.recv_ready() or chan.recv_stderr_ready():
                while chan.recv_ready():
                    _write(out_fd, chan.recv(65536))
                while chan.recv_stderr_ready():
                    _write(err_fd, chan.recv_stderr(65536))
            if (chan.eof_received or chan.closed) and not chan.recv_ready() and not chan.recv_stderr_ready():
                break
            if stdin_open and in_fd in ready:
                data = os.read(in_fd, 65536)
                if data:
                    chan.sendall(data)
                else:
                    stdin_open = False
                    chan.shutdown_write()
        chan.status_event.wait(5)
        code = chan.exit_status if chan.exit_status_ready() else -1
        return 255 if code < 0 else code
    finally:
        if old is not None:
            import termios

            termios.tcsetattr(in_fd, termios.TCSADRAIN, old)
            signal.signal(signal.SIGWINCH, prev)


def _resize(chan) -> None:
    size = shutil.get_terminal_size()
    try:
        chan.resize_pty(width=size.columns, height=size.lines)
    except Exception:  # noqa: BLE001 - a resize racing the channel's end is harmless
        pass


def _write(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]
