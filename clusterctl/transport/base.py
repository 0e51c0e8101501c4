"""The Transport protocol and its value types. Imports no transport implementation: ``connect`` (the factory
that picks one) lives in ``transport/__init__.py``."""
from __future__ import annotations

import os
import select
import selectors
import shlex
import subprocess
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Protocol, Sequence

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    exit_code: int
    stdout: str
    stderr: str
    duration_s: float

    @property
    def ok(self) -> bool:
        return self.exit_code == 0


@dataclass(frozen=True)
class ConnectOptions:
    connect_timeout: float = 5.0
    command_timeout: float = 30.0
    keepalive_s: int = 5
    connect_retries: int = 2          # extra attempts, transient connect errors only
    refusal_retries: int = 8          # extra attempts for a handshake the server dropped (sshd MaxStartups)
    jump_concurrency: int = 8         # handshakes at once with one ProxyJump host (sshd's MaxStartups starts
                                      # dropping at 10 unauthenticated connections by default)
    accept_new_host_keys: bool = False
    ssh_config: str | None = None     # default ~/.ssh/config
    known_hosts: str | None = None    # default ~/.ssh/known_hosts


class Transport(Protocol):
    """Runs commands on one host. ``argv`` is always a list; it is quoted with ``shlex.join``."""

    host: "Host"

    def run(self, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult: ...

    def put(self, data: bytes, path: str, mode: int = 0o600) -> None: ...

    def stream(self, argv: Sequence[str], on_data: Callable[[bytes], None], stop: threading.Event) -> None:
        """Run a long-lived command (``logs -f``), passing its output (stdout+stderr) to ``on_data`` until it
        ends or ``stop`` is set. Connection loss raises ``TransportError``."""

    def close(self) -> None: ...


# run(): each of stdout and stderr keeps at most its last MAX_OUTPUT bytes (a node printing without end must not
# exhaust the controller's memory); the tail is where the errors are. Every transport's ``run`` keeps to it.
MAX_OUTPUT = 8 << 20


def append_bounded(buf: bytearray, data: bytes, limit: int | None = None) -> None:
    """``buf += data``, keeping its last ``limit`` (default ``MAX_OUTPUT``) bytes."""
    limit = MAX_OUTPUT if limit is None else limit
    buf += data
    if len(buf) > limit:
        del buf[: len(buf) - limit]


def communicate_bounded(p: subprocess.Popen, stdin: bytes, deadline: float) -> tuple[bytes, bytes]:
    """``p.communicate(stdin)`` until ``deadline`` (``time.monotonic``), keeping the last ``MAX_OUTPUT`` bytes of
    each of stdout and stderr (``communicate`` keeps everything). ``subprocess.TimeoutExpired`` at the deadline."""
    bufs = {p.stdout.fileno(): bytearray(), p.stderr.fileno(): bytearray()}
    out, err = bufs.values()
    left = memoryview(stdin)
    with selectors.DefaultSelector() as sel:
        for fd in bufs:
            os.set_blocking(fd, False)
            sel.register(fd, selectors.EVENT_READ)
        if left:
            os.set_blocking(p.stdin.fileno(), False)
            sel.register(p.stdin.fileno(), selectors.EVENT_WRITE)
        else:
            p.stdin.close()
        reading = len(bufs)
        while reading or left:
            wait = deadline - time.monotonic()
            if wait <= 0:
                raise subprocess.TimeoutExpired(p.args, 0)
            for key, _ in sel.select(wait):
                if key.fd in bufs:
                    data = os.read(key.fd, 65536)
                    if data:
                        append_bounded(bufs[key.fd], data)
                    else:
                        sel.unregister(key.fd)
                        reading -= 1
                    continue
                try:
                    left = left[os.write(key.fd, left[:65536]):]
                except BlockingIOError:
                    continue
                except BrokenPipeError:     # the command does not read its input (it may have ended)
                    left = left[:0]
                if not left:
                    sel.unregister(key.fd)
                    p.stdin.close()
    p.wait(max(0.0, deadline - time.monotonic()) or 0.01)
    return bytes(out), bytes(err)


def readable(fd: int, timeout: float) -> bool:
    """Wait up to ``timeout`` s for ``fd`` to be readable. ``poll``, not ``select.select``: select refuses fds >=
    1024, which a controller holding a connection and a few pipes per node passes at about 200 nodes."""
    p = select.poll()
    p.register(fd, select.POLLIN)
    return bool(p.poll(max(0.0, timeout) * 1000))


def quote(argv: Sequence[str]) -> str:
    """The one place argv becomes a shell string."""
    return shlex.join([str(a) for a in argv])


# Writes stdin to "$1" with a private umask, then sets the mode. Fixed text; values only as argv.
_PUT_SCRIPT = 'umask 077 && cat > "$1" && chmod "$2" "$1"'


def put_via_run(transport: Transport, data: bytes, path: str, mode: int) -> None:
    from clusterctl.errors import TransportError

    r = transport.run(["sh", "-c", _PUT_SCRIPT, "sh", path, format(mode, "o")], stdin=data)
    if not r.ok:
        raise TransportError(transport.host.name, f"cannot write {path}: {r.stderr.strip()}")
