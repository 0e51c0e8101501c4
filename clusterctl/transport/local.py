"""The ``local`` connection: the same interface as SSH, run with subprocess on this machine."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING, Callable, Mapping, Sequence

from clusterctl.errors import CommandTimeout
from clusterctl.transport.base import CommandResult, ConnectOptions, communicate_bounded, put_via_run, readable

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host


def local_path(environ: Mapping[str, str] | None = None) -> str:
    """The PATH of commands on this machine (the ``local`` connection): clusterctl's own, then the directory of its
    interpreter when it is not on it already, so that the torchrun installed beside clusterctl (``make install``:
    its venv's bin, where only ``clusterctl`` is linked onto PATH) is found where PATH has none."""
    path = (os.environ if environ is None else environ).get("PATH", os.defpath)
    here = os.path.dirname(sys.executable)
    return path if not here or here in path.split(os.pathsep) else (f"{path}{os.pathsep}{here}" if path else here)


def which_local(name: str, environ: Mapping[str, str] | None = None) -> str | None:
    """Where a ``local`` host's command ``name`` is (as ``LocalTransport`` runs it), or None."""
    return shutil.which(name, path=local_path(environ))


def _env() -> dict[str, str]:
    return {**os.environ, "PATH": local_path()}


class LocalTransport:
    def __init__(self, host: "Host", options: ConnectOptions):
        self.host, self.options = host, options
        self.connect_s = 0.0

    def run(self, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        argv = tuple(str(a) for a in argv)
        timeout = timeout or self.options.command_timeout
        start = time.monotonic()
        try:
            p = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 start_new_session=True, env=_env())
        except OSError as e:
            return CommandResult(argv, 127, "", f"{argv[0]}: {e.strerror}", time.monotonic() - start)
        try:       # the last MAX_OUTPUT bytes of each stream, as over SSH and srun (subprocess.run keeps everything)
            out, err = communicate_bounded(p, stdin or b"", start + timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            raise CommandTimeout(self.host.name, f"command timed out after {timeout:g}s: {argv[0]}") from None
        finally:
            for f in (p.stdin, p.stdout, p.stderr):
                f.close()
        return CommandResult(argv, p.returncode, out.decode(errors="replace"), err.decode(errors="replace"),
                             time.monotonic() - start)

    def put(self, data: bytes, path: str, mode: int = 0o600) -> None:
        put_via_run(self, data, path, mode)

    def stream(self, argv: Sequence[str], on_data: Callable[[bytes], None], stop: threading.Event) -> None:
        p = subprocess.Popen([str(a) for a in argv], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, start_new_session=True, env=_env())
        try:
            while not stop.is_set():
                if readable(p.stdout.fileno(), 0.5):
                    data = os.read(p.stdout.fileno(), 65536)
                    if not data:
                        break
                    on_data(data)
        finally:
            if p.poll() is None:
                p.kill()
            p.wait()
            p.stdout.close()

    def close(self) -> None:
        pass
