"""A real SSH server in the test process (paramiko's server side on 127.0.0.1), for transport tests that need a
server to misbehave in ways sshd never does: offer only chosen host key types, never answer an exec request,
print without end. Also forwards direct-tcpip channels (a bastion for ProxyJump tests).

Not a fake of the client: ``SSHTransport`` connects to it over TCP, checks its host key and authenticates.
"""
from __future__ import annotations

import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

import paramiko


def keygen(path: Path, key_type: str) -> paramiko.PKey:
    """A fresh key of ``key_type`` (ed25519, ecdsa, rsa) written with ssh-keygen; returns it loaded."""
    if not path.exists():
        extra = ["-b", "2048"] if key_type == "rsa" else []
        subprocess.run(["ssh-keygen", "-q", "-t", key_type, *extra, "-N", "", "-f", str(path)], check=True,
                       timeout=60, stdout=subprocess.DEVNULL)
    return paramiko.PKey.from_path(str(path))


def known_line(names: str, key: paramiko.PKey, marker: str = "") -> str:
    return f"{marker + ' ' if marker else ''}{names} {key.get_name()} {key.get_base64()}\n"


class SSHServer:
    """``exec_mode``: "ok" runs ``handler(command) -> (stdout bytes, exit code)``; "hang" never answers."""

    def __init__(self, host_keys: Sequence[paramiko.PKey], exec_mode: str = "ok",
                 handler: Callable[[str], tuple[bytes, int]] | None = None, max_startups: int | None = None,
                 handshake_delay: float = 0.0):
        """``max_startups``: like sshd's ``MaxStartups N:100:N``, a connection accepted while N others are not yet
        authenticated is closed at once (``dropped`` counts them, ``peak_unauth`` is the most seen at once).
        ``handshake_delay``: seconds each authentication takes (a busy server)."""
        self.host_keys, self.exec_mode = list(host_keys), exec_mode
        self.max_startups, self.handshake_delay = max_startups, handshake_delay
        self.unauth = self.peak_unauth = self.dropped = 0
        self.count_lock = threading.Lock()
        self.handler = handler or (lambda cmd: (b"", 0))
        self.commands: list[str] = []
        self.forwards: list[tuple[str, int]] = []
        self.channels: list[paramiko.Channel] = []
        self.closed = threading.Event()
        self._transports: list[paramiko.Transport] = []
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.port = self.sock.getsockname()[1]
        threading.Thread(target=self._accept, daemon=True).start()

    @property
    def name(self) -> str:
        return f"[127.0.0.1]:{self.port}"

    def _accept(self) -> None:
        while not self.closed.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            with self.count_lock:
                if self.max_startups is not None and self.unauth >= self.max_startups:
                    self.dropped += 1
                    conn.close()              # what sshd does beyond MaxStartups: no banner, just a close
                    continue
                self.unauth += 1
                self.peak_unauth = max(self.peak_unauth, self.unauth)
            t = paramiko.Transport(conn)
            for k in self.host_keys:
                t.add_server_key(k)
            self._transports.append(t)
            iface = _Interface(self)
            iface.transport = t
            try:
                t.start_server(server=iface)
            except (paramiko.SSHException, EOFError, OSError):
                iface.authenticated()
                continue
            threading.Thread(target=self._channels, args=(t,), daemon=True).start()

    def _channels(self, t: paramiko.Transport) -> None:
        while t.is_active() and not self.closed.is_set():
            chan = t.accept(0.2)   # handled in the interface's callbacks; kept (a dropped Channel closes itself)
            if chan is not None:
                self.channels.append(chan)

    def close(self) -> None:
        self.closed.set()
        self.sock.close()
        for t in self._transports:
            t.close()


class _Interface(paramiko.ServerInterface):
    def __init__(self, server: SSHServer):
        self.server = server
        self.transport: paramiko.Transport | None = None
        self._counted = True

    def authenticated(self) -> None:
        with self.server.count_lock:
            if self._counted:
                self._counted = False
                self.server.unauth -= 1

    def get_allowed_auths(self, username):
        return "publickey"

    def check_auth_publickey(self, username, key):
        if self.server.handshake_delay:
            time.sleep(self.server.handshake_delay)
        self.authenticated()
        return paramiko.AUTH_SUCCESSFUL

    def check_channel_request(self, kind, chanid):
        return paramiko.OPEN_SUCCEEDED if kind == "session" else paramiko.OPEN_FAILED_ADMINISTRATIVELY_PROHIBITED

    def check_channel_exec_request(self, channel, command):
        s = self.server
        s.commands.append(command.decode())
        if s.exec_mode == "hang":
            s.closed.wait(60)            # never answers (until the test ends)
            return False

        def run() -> None:
            # the channel may close only after paramiko has sent the exec request's answer, or the client reads
            # "Channel closed." (a fixed 0.05 s sleep lost that race on a loaded machine): clusterctl's client
            # half-closes (shutdown_write) once it has that answer; another client gets 2 s
            end = time.monotonic() + 2
            while not channel.eof_received and time.monotonic() < end:
                time.sleep(0.005)
            out, code = s.handler(command.decode())
            for i in range(0, len(out), 32768):
                channel.sendall(out[i:i + 32768])
            channel.send_exit_status(code)
            channel.shutdown_write()
            channel.close()

        threading.Thread(target=run, daemon=True).start()
        return True

    def check_channel_direct_tcpip_request(self, chanid, origin, destination):
        self.server.forwards.append(destination)
        try:
            sock = socket.create_connection(destination, timeout=5)
        except OSError:
            return paramiko.OPEN_FAILED_CONNECT_FAILED
        threading.Thread(target=_pair_later, args=(self.transport, chanid, sock), daemon=True).start()
        return paramiko.OPEN_SUCCEEDED


def _pair_later(t: paramiko.Transport, chanid: int, sock: socket.socket) -> None:
    """Copy bytes both ways between the forwarded channel and ``sock`` until either side closes."""
    import select
    import time

    chan = None
    end = time.monotonic() + 5
    while chan is None and time.monotonic() < end:
        chan = t._channels.get(chanid)
        if chan is None:
            time.sleep(0.01)
    if chan is None:
        sock.close()
        return
    try:
        while True:
            r, _, _ = select.select([chan, sock], [], [], 1.0)
            if chan in r:
                data = chan.recv(65536)
                if not data:
                    break
                sock.sendall(data)
            if sock in r:
                data = sock.recv(65536)
                if not data:
                    break
                chan.sendall(data)
            if chan.closed:
                break
    except OSError:
        pass
    finally:
        sock.close()
        try:
            chan.close()
        except (EOFError, OSError):     # the client's transport went first
            pass
