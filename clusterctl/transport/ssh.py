"""SSH transport on paramiko. The only module that imports paramiko.

- Host keys are checked against ``~/.ssh/known_hosts`` and the host's ``clusterctl_known_hosts``: an unknown key is
  refused unless ``accept_new_host_keys`` (then recorded, like OpenSSH ``accept-new``); a changed key is always
  refused, with both fingerprints and the file:line of the recorded key.
- ``~/.ssh/config`` is honoured (HostName, User, Port, IdentityFile, ProxyJump).
- The socket is opened here with TCP_NODELAY (paramiko does not set it: ~40 ms per round trip otherwise).
- Transient connect errors are retried with tenacity (exponential backoff + jitter) inside the connect timeout;
  auth failures and host-key problems never are.
"""
from __future__ import annotations

import base64
import getpass
import hashlib
import os
import select
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import paramiko
from paramiko.hostkeys import HostKeyEntry, HostKeys
from tenacity import Retrying, retry_if_exception, stop_after_attempt, stop_after_delay, wait_random_exponential

from clusterctl.errors import AuthError, CommandTimeout, ConnectError, HostKeyError, TransportError
from clusterctl.transport.base import CommandResult, ConnectOptions, put_via_run, quote

if TYPE_CHECKING:
    from clusterctl.inventory import Host

DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")
# stream(): the remote command ends with the stream. sshd does not signal a command when its channel closes, so a
# command that waits without writing (`podman logs --follow` of a removed container, `tail -F` of a finished bare
# job) would run on forever. The channel's stdin stays open while we stream; its EOF (channel closed, connection
# lost) kills the command. fd 3 carries stdin past the /dev/null that sh gives background jobs.
STREAM_WRAPPER = ('exec 3<&0; "$@" 3<&- </dev/null & p=$!; '
                  '{ cat <&3 >/dev/null 2>&1; kill "$p" 2>/dev/null; } & w=$!; '
                  'exec 3<&-; wait "$p"; rc=$?; kill "$w" 2>/dev/null; exit "$rc"')
_known_hosts_lock = threading.Lock()


@dataclass(frozen=True)
class Target:
    """Where to connect, after ~/.ssh/config is applied (inventory values win over the config file)."""

    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    proxy_jump: str | None

    @property
    def known_hosts_name(self) -> str:
        return self.hostname if self.port == 22 else f"[{self.hostname}]:{self.port}"


def resolve_target(host: "Host", ssh_config: str | None = None) -> Target:
    path = Path(ssh_config or "~/.ssh/config").expanduser()
    cfg = paramiko.SSHConfig.from_path(str(path)).lookup(host.address) if path.exists() else {}
    user = host.user or cfg.get("user") or getpass.getuser()
    port = host.port or int(cfg.get("port", 22))
    keys = [host.key_file] if host.key_file else list(cfg.get("identityfile", []))
    if not keys:
        keys = [str(Path("~/.ssh", k).expanduser()) for k in DEFAULT_KEYS]
        keys = [k for k in keys if os.path.exists(k)]
    proxy = host.proxy_jump or cfg.get("proxyjump")
    if proxy and proxy.lower() == "none":
        proxy = None
    return Target(cfg.get("hostname", host.address), port, user,
                  tuple(os.path.expanduser(k) for k in keys), proxy)


def fingerprint(key: paramiko.PKey) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class KnownKey:
    file: str
    line: int
    key: paramiko.PKey


def known_keys(files: Sequence[str], name: str) -> list[KnownKey]:
    """Every known_hosts entry for ``name`` (plain or hashed), with its file and line."""
    found = []
    for f in files:
        try:
            lines = Path(f).expanduser().read_text().splitlines()
        except OSError:
            continue
        for n, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#") or line.startswith("@"):
                continue
            # names first, the key only for matching lines: parsing every key made each connect
            # O(file size) (~11 ms per 1000 lines, twice per connection)
            try:
                if not any(_matches(p, name) for p in line.split(None, 1)[0].split(",")):
                    continue
                entry = HostKeyEntry.from_line(line, n)
            except Exception:  # noqa: BLE001 - a malformed line is skipped, as OpenSSH does
                entry = None
            if entry is None or entry.key is None:
                continue
            found.append(KnownKey(str(f), n, entry.key))
    return found


def _matches(pattern: str, name: str) -> bool:
    return pattern == name or (pattern.startswith("|1|") and HostKeys.hash_host(name, pattern) == pattern)


def check_host_key(host_name: str, name: str, key: paramiko.PKey, entries: Sequence[KnownKey],
                   files: Sequence[str], record_file: str, accept_new: bool) -> None:
    """``entries``: ``known_keys(files, name)``, read once per connection."""
    same_type = [e for e in entries if e.key.get_name() == key.get_name()]
    if any(e.key.asbytes() == key.asbytes() for e in same_type):
        return
    if same_type:
        old = same_type[0]
        raise HostKeyError(host_name, (
            f"HOST KEY CHANGED for {name}: the server offered {key.get_name()} {fingerprint(key)} but "
            f"{old.file}:{old.line} records {fingerprint(old.key)}. This may be a man-in-the-middle attack, or the "
            f"host was reinstalled. Verify the new key out of band, then remove the old one with "
            f"`ssh-keygen -R '{name}' -f {old.file}` and connect again with --accept-new-host-keys."))
    if not accept_new:
        raise HostKeyError(host_name, (
            f"unknown host key for {name} ({key.get_name()} {fingerprint(key)}); not in {', '.join(files)}. "
            f"Verify the fingerprint, then add it with `ssh-keyscan -p {name.rsplit(':', 1)[-1] if name.startswith('[') else 22} "
            f"{name.strip('[').split(']')[0]} >> {record_file}` or rerun with --accept-new-host-keys."))
    with _known_hosts_lock:
        path = Path(record_file).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(path, "a") as f:
            f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


def _is_transient(e: BaseException) -> bool:
    return isinstance(e, ConnectError)


class SSHTransport:
    def __init__(self, host: "Host", options: ConnectOptions, *, _jump_depth: int = 0):
        self.host, self.options = host, options
        self.target = resolve_target(host, options.ssh_config)
        user_kh = options.known_hosts or str(Path("~/.ssh/known_hosts").expanduser())
        self.known_files = [user_kh] + ([host.known_hosts] if host.known_hosts else [])
        self.record_file = host.known_hosts or user_kh
        self._jump: SSHTransport | None = None
        self._t: paramiko.Transport | None = None
        self._depth = _jump_depth
        self.connect_s = 0.0

    # ------------------------------------------------------------------ connect
    def connect(self) -> None:
        if self._t is not None and self._t.is_active():
            return
        start = time.monotonic()
        deadline = start + self.options.connect_timeout
        for attempt in Retrying(
            retry=retry_if_exception(_is_transient),
            stop=stop_after_attempt(1 + self.options.connect_retries) | stop_after_delay(self.options.connect_timeout),
            wait=wait_random_exponential(multiplier=0.1, max=1.0),
            reraise=True,
        ):
            with attempt:
                self._t = self._connect_once(deadline)
        self.connect_s = time.monotonic() - start

    def _open_socket(self, deadline: float):
        t = self.target
        remaining = max(0.05, deadline - time.monotonic())
        if t.proxy_jump:
            return self._via_jump(remaining)
        try:
            sock = socket.create_connection((t.hostname, t.port), timeout=remaining)
        except socket.timeout:
            raise ConnectError(self.host.name, f"connect to {t.hostname}:{t.port} timed out after "
                                               f"{self.options.connect_timeout:g}s") from None
        except OSError as e:
            raise ConnectError(self.host.name, f"cannot connect to {t.hostname}:{t.port}: {e.strerror or e}") from None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _via_jump(self, remaining: float):
        from clusterctl.inventory import Host

        if self._depth > 3:
            raise ConnectError(self.host.name, "ProxyJump chain too long")
        spec = self.target.proxy_jump.split(",")[0]
        user, _, hostport = spec.rpartition("@")
        hname, _, port = hostport.partition(":")
        jump_host = Host(name=f"{self.host.name} via {hname}", address=hname, port=int(port) if port else None,
                         user=user or None, known_hosts=self.host.known_hosts)
        self._jump = SSHTransport(jump_host, self.options, _jump_depth=self._depth + 1)
        self._jump.connect()
        try:
            return self._jump._t.open_channel("direct-tcpip", (self.target.hostname, self.target.port),
                                              ("127.0.0.1", 0), timeout=remaining)
        except (paramiko.SSHException, OSError) as e:
            raise ConnectError(self.host.name, f"bastion {hname} cannot reach "
                                               f"{self.target.hostname}:{self.target.port}: {e}") from None

    def _connect_once(self, deadline: float) -> paramiko.Transport:
        sock = self._open_socket(deadline)
        t = paramiko.Transport(sock)
        t.banner_timeout = t.handshake_timeout = max(0.1, deadline - time.monotonic())
        name = self.target.known_hosts_name
        known = known_keys(self.known_files, name)
        if known:  # prefer a key type we already know, as OpenSSH does
            opts = t.get_security_options()
            types = [k.key.get_name() for k in known]
            opts.key_types = [k for k in opts.key_types if k in types] + [k for k in opts.key_types if k not in types]
        try:
            t.start_client(timeout=max(0.1, deadline - time.monotonic()))
        except (paramiko.SSHException, EOFError, OSError) as e:
            t.close()
            raise ConnectError(self.host.name, f"SSH handshake with {self.target.hostname}:{self.target.port} "
                                               f"failed: {e or e.__class__.__name__}") from None
        try:
            check_host_key(self.host.name, name, t.get_remote_server_key(), known, self.known_files,
                           self.record_file, self.options.accept_new_host_keys)
            self._auth(t)
        except TransportError:
            t.close()
            raise
        t.set_keepalive(self.options.keepalive_s)
        return t

    def _auth(self, t: paramiko.Transport) -> None:
        target, errors = self.target, []
        for path in target.key_files:
            try:
                key = paramiko.PKey.from_path(path)
            except (OSError, paramiko.SSHException, ValueError) as e:
                errors.append(f"cannot read key {path}: {getattr(e, 'strerror', None) or e}")
                continue
            try:
                t.auth_publickey(target.user, key)
                return
            except paramiko.AuthenticationException:
                errors.append(f"key {path} rejected")
            except (paramiko.SSHException, OSError) as e:
                raise ConnectError(self.host.name, f"connection lost during authentication: {e}") from None
        try:
            for key in paramiko.Agent().get_keys():
                try:
                    t.auth_publickey(target.user, key)
                    return
                except paramiko.AuthenticationException:
                    errors.append("agent key rejected")
        except paramiko.SSHException:
            pass
        raise AuthError(self.host.name, f"authentication as {target.user!r} failed: "
                                        f"{'; '.join(errors) or 'no key (set ansible_ssh_private_key_file)'}")

    # ------------------------------------------------------------------ run
    def run(self, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        argv = tuple(str(a) for a in argv)
        self.connect()
        timeout = timeout or self.options.command_timeout
        start = time.monotonic()
        deadline = start + timeout
        try:
            chan = self._t.open_session(timeout=timeout)
            chan.exec_command(quote(argv))
            if stdin:
                chan.sendall(stdin)
            chan.shutdown_write()
            out, err = self._collect(chan, deadline, argv, timeout)
            code = chan.recv_exit_status()
            chan.close()
        except (paramiko.SSHException, EOFError, OSError) as e:
            self.close()
            raise ConnectError(self.host.name, f"connection lost: {e or e.__class__.__name__}") from None
        return CommandResult(argv, code, out.decode(errors="replace"), err.decode(errors="replace"),
                             time.monotonic() - start)

    def _collect(self, chan, deadline, argv, timeout) -> tuple[bytes, bytes]:
        out, err = bytearray(), bytearray()
        fd = chan.fileno()
        while True:
            while chan.recv_ready():
                out += chan.recv(65536)
            while chan.recv_stderr_ready():
                err += chan.recv_stderr(65536)
            if chan.exit_status_ready() and chan.eof_received and not chan.recv_ready() \
                    and not chan.recv_stderr_ready():
                return bytes(out), bytes(err)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                chan.close()
                raise CommandTimeout(self.host.name, f"command timed out after {timeout:g}s: {argv[0]}")
            ready, _, _ = select.select([fd], [], [], remaining)
            if ready and chan.eof_received and not chan.recv_ready() and not chan.recv_stderr_ready():
                chan.status_event.wait(min(remaining, 0.05))

    def put(self, data: bytes, path: str, mode: int = 0o600) -> None:
        put_via_run(self, data, path, mode)

    def session(self, timeout: float | None = None) -> paramiko.Channel:
        """A new session channel on this host's connection (interactive use: ``clusterctl shell``)."""
        self.connect()
        try:
            return self._t.open_session(timeout=timeout or self.options.connect_timeout)
        except (paramiko.SSHException, EOFError, OSError) as e:
            self.close()
            raise ConnectError(self.host.name, f"connection lost: {e or e.__class__.__name__}") from None

    def stream(self, argv: Sequence[str], on_data: Callable[[bytes], None], stop: threading.Event) -> None:
        self.connect()
        try:
            chan = self._t.open_session(timeout=self.options.connect_timeout)
            chan.set_combine_stderr(True)
            chan.exec_command(quote(["sh", "-c", STREAM_WRAPPER, "clusterctl-stream", *argv]))
            fd = chan.fileno()
            while not stop.is_set():
                select.select([fd], [], [], 0.5)
                if chan.recv_ready():
                    on_data(chan.recv(65536))
                elif chan.eof_received or chan.closed:
                    break
            chan.close()
        except (paramiko.SSHException, EOFError, OSError) as e:
            self.close()
            raise ConnectError(self.host.name, f"connection lost: {e or e.__class__.__name__}") from None

    def close(self) -> None:
        for t in (self._t, self._jump):
            if t is not None:
                t.close()
        self._t = self._jump = None


def check_key_files(hosts: Sequence["Host"]) -> None:
    """Input validation before any connection: every ``ansible_ssh_private_key_file`` of an SSH host must be a
    readable private key. Raises ``InputError`` at the inventory line that set it (exit 2)."""
    from clusterctl.errors import InputError

    seen: dict[str, str | None] = {}
    for h in hosts:
        if h.connection != "ssh" or not h.key_file:
            continue
        path = os.path.expanduser(h.key_file)
        if path not in seen:
            try:
                paramiko.PKey.from_path(path)
                seen[path] = None
            except paramiko.PasswordRequiredException:
                seen[path] = None      # encrypted keys are for the agent; authentication will say more
            except (OSError, paramiko.SSHException, ValueError) as e:
                seen[path] = getattr(e, "strerror", None) or str(e) or e.__class__.__name__
        if seen[path]:
            file, line = h.origin.get("ansible_ssh_private_key_file", ("<inventory>", None))
            raise InputError(file, line, f"cannot use private key {h.key_file} (host {h.name}): {seen[path]}",
                             key="ansible_ssh_private_key_file")
