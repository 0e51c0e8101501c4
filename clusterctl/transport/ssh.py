"""SSH transport on paramiko. The only module that imports paramiko.

- Host keys are checked against ``~/.ssh/known_hosts`` and the host's ``clusterctl_known_hosts`` (plain, hashed and
  wildcard names, ``!`` negation, ``@revoked``, ``@cert-authority``): a host with no entry is refused unless
  ``accept_new_host_keys`` (then recorded, like OpenSSH ``accept-new``); a host with a recorded key of any type
  that offers another key is refused as changed, always, with both fingerprints and the file:line of the
  recorded key; a revoked key is always refused.
- Every wait on the server has a deadline (connect, handshake, authentication: all within ``connect_timeout``;
  channel open, the exec request, the command).
- ``~/.ssh/config`` is honoured (HostName, User, Port, IdentityFile, ProxyJump; several jump hosts too).
- The socket is opened here with TCP_NODELAY (paramiko does not set it: ~40 ms per round trip otherwise).
- Transient connect errors are retried with tenacity (exponential backoff + jitter) inside the connect timeout;
  auth failures and host-key problems never are. A handshake the server dropped before its banner or reset
  (sshd's ``MaxStartups`` refusing unauthenticated connections beyond its limit) is retried more often
  (``refusal_retries``), and handshakes with one ProxyJump host are bounded (``jump_concurrency``), so a fan-out
  to hundreds of nodes behind one bastion does not trip its ``MaxStartups``.
"""
from __future__ import annotations

import base64
import getpass
import hashlib
import os
import re
import shlex
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Sequence

import paramiko
from paramiko.hostkeys import HostKeyEntry, HostKeys
from tenacity import Retrying, retry_if_exception, wait_random_exponential

from clusterctl.errors import AuthError, CommandTimeout, ConnectError, HostKeyError, TransportError
from clusterctl.transport.base import (MAX_OUTPUT, CommandResult, ConnectOptions, append_bounded, put_via_run,
                                      quote, readable)

if TYPE_CHECKING:
    from clusterctl.config.inventory import Host

DEFAULT_KEYS = ("id_ed25519", "id_ecdsa", "id_rsa")
GLOBAL_KNOWN_HOSTS = ("/etc/ssh/ssh_known_hosts", "/etc/ssh/ssh_known_hosts2")   # OpenSSH's default
# stream(): the remote command ends with the stream. sshd does not signal a command when its channel closes, so a
# command that waits without writing (`podman logs --follow` of a removed container, `tail -F` of a finished bare
# job) would run on forever. The channel's stdin stays open while we stream; its EOF (channel closed, connection
# lost) kills the command. fd 3 carries stdin past the /dev/null that sh gives background jobs.
STREAM_WRAPPER = ('exec 3<&0; "$@" 3<&- </dev/null & p=$!; '
                  '{ cat <&3 >/dev/null 2>&1; kill "$p" 2>/dev/null; } & w=$!; '
                  'exec 3<&-; wait "$p"; rc=$?; kill "$w" 2>/dev/null; exit "$rc"')
_known_hosts_lock = threading.Lock()
# paramiko's transport thread wakes at its socket's timeout (0.1 s by default) to look for a close and a keepalive
# due: ~0.6 ms of CPU per second per idle connection, 0.06 % of a core per supervised node. Once connected, a wake
# a second is enough: keepalives are whole seconds, and close() shuts the socket down so the thread ends at once.
IDLE_WAKE_S = 1.0


def _append_bounded(buf: bytearray, data: bytes, limit: int | None = None) -> None:
    append_bounded(buf, data, MAX_OUTPUT if limit is None else limit)   # ssh.MAX_OUTPUT: tests lower it


@dataclass(frozen=True)
class Target:
    """Where to connect, after ~/.ssh/config is applied (inventory values win over the config file)."""

    hostname: str
    port: int
    user: str
    key_files: tuple[str, ...]
    proxy_jump: str | None
    user_known_hosts: tuple[str, ...] | None = None    # ssh_config's UserKnownHostsFile (None: not set)
    global_known_hosts: tuple[str, ...] = GLOBAL_KNOWN_HOSTS   # ssh_config's GlobalKnownHostsFile

    @property
    def known_hosts_name(self) -> str:
        """The name known_hosts records this host under. Lowercased, as OpenSSH does before it looks a name up or
        hashes it (issue 24: a hashed entry of ``node1`` must match ``NODE1``, or ``--accept-new-host-keys``
        would record a second, different key for it)."""
        host = self.hostname.lower()
        return host if self.port == 22 else f"[{host}]:{self.port}"


def _files(value: str | None) -> tuple[str, ...] | None:
    """An ssh_config file list (``UserKnownHostsFile a b``; ``none``: no file); None when not set."""
    if value is None:
        return None
    words = value.split() if isinstance(value, str) else [w for v in value for w in str(v).split()]
    return tuple(os.path.expanduser(w) for w in words if w.lower() != "none")


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
    glob = _files(cfg.get("globalknownhostsfile"))
    return Target(cfg.get("hostname", host.address), port, user,
                  tuple(os.path.expanduser(k) for k in keys), proxy,
                  _files(cfg.get("userknownhostsfile")), GLOBAL_KNOWN_HOSTS if glob is None else glob)


def known_hosts_files(host: "Host", target: Target, known_hosts: str | None = None) -> tuple[list[str], str]:
    """(the known_hosts files to check, the file that records a new key). ``known_hosts`` (an explicit override),
    else ssh_config's ``UserKnownHostsFile`` (the first of several records), else ``~/.ssh/known_hosts``; then the
    host's ``clusterctl_known_hosts`` (which records when set); then ssh_config's ``GlobalKnownHostsFile``
    (default ``/etc/ssh/ssh_known_hosts{,2}``), read only, as OpenSSH does."""
    default = str(Path("~/.ssh/known_hosts").expanduser())
    user_files = ([known_hosts] if known_hosts else
                  list(target.user_known_hosts) if target.user_known_hosts is not None else [default])
    files = user_files + ([host.known_hosts] if host.known_hosts else [])
    files += [f for f in target.global_known_hosts if f not in files]
    return files, host.known_hosts or (user_files[0] if user_files else default)


def fingerprint(key: paramiko.PKey) -> str:
    return "SHA256:" + base64.b64encode(hashlib.sha256(key.asbytes()).digest()).decode().rstrip("=")


@dataclass(frozen=True)
class KnownKey:
    file: str
    line: int
    key: paramiko.PKey
    marker: str | None = None     # None, "@revoked" or "@cert-authority"


MARKERS = ("@revoked", "@cert-authority")
# paramiko 5 negotiates RSA host keys as rsa-sha2-512/256 (it no longer lists ssh-rsa); a recorded key's type
# names the key, not the signature algorithm
KEY_TYPE_ALGORITHMS = {"ssh-rsa": ("rsa-sha2-512", "rsa-sha2-256", "ssh-rsa")}


def known_keys(files: Sequence[str], name: str) -> list[KnownKey]:
    """Every known_hosts entry for ``name`` (plain, hashed or a pattern with ``*``/``?``/``!``; ``@revoked`` and
    ``@cert-authority`` lines with their marker), with its file and line."""
    found = []
    for f in files:
        try:
            lines = Path(f).expanduser().read_text().splitlines()
        except OSError:
            continue
        for n, line in enumerate(lines, 1):
            line = line.strip()
            if not line or line.startswith("#"):
                continue
            marker = None
            if line.startswith("@"):
                marker, _, line = line.partition(" ")
                line = line.strip()
                if marker not in MARKERS:
                    continue            # an unknown marker: OpenSSH ignores the line too
            # names first, the key only for matching lines: parsing every key made each connect
            # O(file size) (~11 ms per 1000 lines, twice per connection)
            try:
                if not host_matches(line.split(None, 1)[0], name):
                    continue
                entry = HostKeyEntry.from_line(line, n)
            except Exception:  # noqa: BLE001 - a malformed line is skipped, as OpenSSH does
                entry = None
            if entry is None or entry.key is None:
                continue
            found.append(KnownKey(str(f), n, entry.key, marker))
    return found


def host_matches(patterns: str, name: str) -> bool:
    """OpenSSH's rule for a known_hosts name field: some pattern matches and no negated (``!``) one does.
    Patterns: a plain or hashed (``|1|``) name, or a glob with ``*`` and ``?`` (case-insensitive)."""
    matched = False
    for p in patterns.split(","):
        negated = p.startswith("!")
        if negated:
            p = p[1:]
        if _matches(p, name):
            if negated:
                return False
            matched = True
    return matched


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("|1|"):
        return HostKeys.hash_host(name.lower(), pattern) == pattern   # OpenSSH hashes the lowercased name
    if "*" in pattern or "?" in pattern:
        rx = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
        return re.fullmatch(rx, name, re.IGNORECASE) is not None
    return pattern.lower() == name.lower()


def preferred_key_types(available: Sequence[str], known: Sequence[str]) -> list[str]:
    """``available`` host key algorithms, those of the recorded key types first (as OpenSSH orders them)."""
    want = {a for k in known for a in KEY_TYPE_ALGORITHMS.get(k, (k,))}
    return [a for a in available if a in want] + [a for a in available if a not in want]


def aead_first(ciphers: Sequence[str]) -> list[str]:
    """paramiko's ciphers, AES-GCM first (issue 15). paramiko prefers AES-CTR + HMAC, whose MAC it computes and
    compares per packet in Python; GCM's tag is checked inside ``cryptography``: ~12 % less CPU per packet in
    paramiko's thread, and a supervised node's watch and log lines are a packet each. OpenSSH offers GCM by
    default; a server without it still gets the other ciphers, in paramiko's order."""
    gcm = [c for c in ciphers if "-gcm@" in c]
    return gcm + [c for c in ciphers if c not in gcm]


def check_host_key(host_name: str, name: str, key: paramiko.PKey, entries: Sequence[KnownKey],
                   files: Sequence[str], record_file: str, accept_new: bool) -> None:
    """``entries``: ``known_keys(files, name)``, read once per connection.

    A key marked ``@revoked`` is always refused. A host with any recorded key (of any type) must offer one of
    them: anything else is a changed key, refused with or without ``accept_new``. A host vouched for by a
    ``@cert-authority`` line is refused (host certificates are not verified here). Only a host with no entry at
    all is unknown: refused, or recorded with ``accept_new``."""
    offered = key.asbytes()
    for e in entries:
        if e.marker == "@revoked" and e.key.asbytes() == offered:
            raise HostKeyError(host_name, (
                f"HOST KEY REVOKED for {name}: the server offered {key.get_name()} {fingerprint(key)}, which "
                f"{e.file}:{e.line} marks @revoked. Refusing to connect; do not use this host until its key is "
                f"replaced."))
    plain = [e for e in entries if e.marker is None]
    if any(e.key.asbytes() == offered for e in plain):
        return
    if plain:
        same_type = [e for e in plain if e.key.get_name() == key.get_name()]
        old = (same_type or plain)[0]
        other = "" if same_type else (
            f" (a {old.key.get_name()} key is recorded and the server did not offer it: a server that offers only "
            f"another key type is treated as changed)")
        raise HostKeyError(host_name, (
            f"HOST KEY CHANGED for {name}: the server offered {key.get_name()} {fingerprint(key)} but "
            f"{old.file}:{old.line} records {old.key.get_name()} {fingerprint(old.key)}{other}. This may be a "
            f"man-in-the-middle attack, or the host was reinstalled. Verify the new key out of band, then remove "
            f"the old one with `ssh-keygen -R {shlex.quote(name)} -f {shlex.quote(old.file)}` and connect again with "
            f"--accept-new-host-keys."))
    cas = [e for e in entries if e.marker == "@cert-authority"]
    if cas:
        raise HostKeyError(host_name, (
            f"{name} is vouched for by a certificate authority ({cas[0].file}:{cas[0].line}, @cert-authority) and "
            f"clusterctl does not verify host certificates; it will not record a plain key for it either. Verify "
            f"the host's key ({key.get_name()} {fingerprint(key)}) out of band and add it to {record_file}."))
    if not accept_new:
        host, port = (name[1:].split("]:", 1) if name.startswith("[") else (name, "22"))
        raise HostKeyError(host_name, (
            f"unknown host key for {name} ({key.get_name()} {fingerprint(key)}); not in {', '.join(files)}. "
            f"Verify the fingerprint, then add it with `ssh-keyscan -p {shlex.quote(port)} {shlex.quote(host)} >> "
            f"{shlex.quote(record_file)}` or rerun with --accept-new-host-keys."))
    with _known_hosts_lock:
        path = Path(record_file).expanduser()
        path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        with open(path, "a") as f:
            f.write(f"{name} {key.get_name()} {key.get_base64()}\n")


def _is_transient(e: BaseException) -> bool:
    return isinstance(e, ConnectError)


class HandshakeRefused(ConnectError):
    """The server closed or reset the connection before or during the handshake: what sshd does to connections
    beyond ``MaxStartups`` (and a bastion meets first). Retried with backoff up to ``refusal_retries`` times."""


# what a connection dropped by MaxStartups looks like from paramiko: no banner, EOF, or a reset
_REFUSED = re.compile(r"protocol banner|reset by peer|connection reset|broken pipe|closed by remote|eoferror",
                      re.IGNORECASE)


def _refused(e: BaseException) -> bool:
    return isinstance(e, (EOFError, ConnectionResetError, BrokenPipeError)) or bool(
        _REFUSED.search(str(e) or e.__class__.__name__))


_jump_slots: dict[tuple[str, int], threading.BoundedSemaphore] = {}
_jump_slots_lock = threading.Lock()


def jump_slot(jump: str, limit: int) -> threading.BoundedSemaphore:
    """The semaphore bounding concurrent handshakes with the ProxyJump host ``jump`` (one per process)."""
    with _jump_slots_lock:
        return _jump_slots.setdefault((jump, limit), threading.BoundedSemaphore(max(1, limit)))


class SSHTransport:
    def __init__(self, host: "Host", options: ConnectOptions, *, _jump_depth: int = 0):
        self.host, self.options = host, options
        self.target = resolve_target(host, options.ssh_config)
        self.known_files, self.record_file = known_hosts_files(host, self.target, options.known_hosts)
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
        o = self.options

        def give_up(state) -> bool:
            e = state.outcome.exception() if state.outcome else None
            tries = 1 + (o.refusal_retries if isinstance(e, HandshakeRefused) else o.connect_retries)
            return state.attempt_number >= tries or time.monotonic() >= deadline

        for attempt in Retrying(
            retry=retry_if_exception(_is_transient),
            stop=give_up,
            wait=wait_random_exponential(multiplier=0.1, max=1.0),
            sleep=lambda s: time.sleep(max(0.0, min(s, deadline - time.monotonic()))),
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
        from clusterctl.config.inventory import Host, parse_proxy_jump

        if self._depth > 3:
            raise ConnectError(self.host.name, "ProxyJump chain too long")
        try:
            hops = parse_proxy_jump(self.target.proxy_jump)
        except ValueError as e:   # from ~/.ssh/config (the inventory's value was checked when it was loaded)
            raise TransportError(self.host.name, f"cannot use ProxyJump {self.target.proxy_jump!r}: {e}") from None
        # a,b,c -> target: connect to c through "a,b" (the last hop is the one that reaches the target)
        last = hops[-1]
        jump_host = Host(name=f"{self.host.name} via {last.host}", address=last.host, port=last.port,
                         user=last.user, known_hosts=self.host.known_hosts,
                         proxy_jump=",".join(str(h) for h in hops[:-1]) or None)
        self._jump = SSHTransport(jump_host, self.options, _jump_depth=self._depth + 1)
        slot = jump_slot(str(last), self.options.jump_concurrency)
        if not slot.acquire(timeout=remaining):
            raise ConnectError(self.host.name, f"no handshake slot for bastion {last.host} within "
                                               f"{remaining:.1f}s ({self.options.jump_concurrency} at once)")
        try:
            self._jump.connect()
        finally:
            slot.release()
        try:
            return self._jump._t.open_channel("direct-tcpip", (self.target.hostname, self.target.port),
                                              ("127.0.0.1", 0), timeout=remaining)
        except (paramiko.SSHException, OSError) as e:
            raise ConnectError(self.host.name, f"bastion {last.host} cannot reach "
                                               f"{self.target.hostname}:{self.target.port}: {e}") from None

    def _connect_once(self, deadline: float) -> paramiko.Transport:
        sock = self._open_socket(deadline)
        t = paramiko.Transport(sock)
        t.banner_timeout = t.handshake_timeout = max(0.1, deadline - time.monotonic())
        name = self.target.known_hosts_name
        known = known_keys(self.known_files, name)
        recorded = [k.key.get_name() for k in known if k.marker is None]
        opts = t.get_security_options()
        opts.ciphers = aead_first(opts.ciphers)
        if recorded:  # prefer a key type we already know, as OpenSSH does
            opts.key_types = preferred_key_types(opts.key_types, recorded)
        try:
            t.start_client(timeout=max(0.1, deadline - time.monotonic()))
        except (paramiko.SSHException, EOFError, OSError) as e:
            t.close()
            kind = HandshakeRefused if _refused(e) else ConnectError
            raise kind(self.host.name, f"SSH handshake with {self.target.hostname}:{self.target.port} "
                                       f"failed: {e or e.__class__.__name__}"
                       + (" (dropped by the server: MaxStartups?)" if kind is HandshakeRefused else "")) from None
        try:
            check_host_key(self.host.name, name, t.get_remote_server_key(), known, self.known_files,
                           self.record_file, self.options.accept_new_host_keys)
            self._auth(t, deadline)
        except TransportError:
            t.close()
            raise
        t.set_keepalive(self.options.keepalive_s)
        t.sock.settimeout(IDLE_WAKE_S)
        return t

    def _auth(self, t: paramiko.Transport, deadline: float) -> None:
        """Public-key authentication within the connect deadline (issue 24: paramiko's ``auth_timeout`` is 30 s per
        attempt by default, outside ``connect_timeout``; a server slow to answer held a caller 30 s per key)."""
        target, errors = self.target, []

        def attempt(key) -> bool:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise self._auth_timeout()
            t.auth_timeout = remaining
            try:
                t.auth_publickey(target.user, key)
                return True
            except paramiko.AuthenticationException:
                if time.monotonic() >= deadline:
                    raise self._auth_timeout() from None
                return False
            except (paramiko.SSHException, OSError) as e:
                raise ConnectError(self.host.name, f"connection lost during authentication: {e}") from None

        for path in target.key_files:
            try:
                key = paramiko.PKey.from_path(path)
            except (OSError, paramiko.SSHException, ValueError) as e:
                errors.append(f"cannot read key {path}: {getattr(e, 'strerror', None) or e}")
                continue
            if attempt(key):
                return
            errors.append(f"key {path} rejected")
        try:
            for key in paramiko.Agent().get_keys():
                if attempt(key):
                    return
                errors.append("agent key rejected")
        except paramiko.SSHException:
            pass
        raise AuthError(self.host.name, f"authentication as {target.user!r} failed: "
                                        f"{'; '.join(errors) or 'no key (set ansible_ssh_private_key_file)'}")

    def _auth_timeout(self) -> ConnectError:
        return ConnectError(self.host.name, f"authentication with {self.target.hostname}:{self.target.port} did not "
                                            f"finish within the connect timeout ({self.options.connect_timeout:g}s)")

    # ------------------------------------------------------------------ run
    def run(self, argv: Sequence[str], *, timeout: float | None = None, stdin: bytes | None = None) -> CommandResult:
        argv = tuple(str(a) for a in argv)
        self.connect()
        timeout = timeout or self.options.command_timeout
        start = time.monotonic()
        deadline = start + timeout
        try:
            chan = self._t.open_session(timeout=timeout)
            self._exec(chan, quote(argv), deadline, f"command timed out after {timeout:g}s: {argv[0]}")
            if stdin:
                chan.settimeout(max(0.05, deadline - time.monotonic()))
                try:
                    chan.sendall(stdin)
                except socket.timeout:
                    chan.close()
                    raise CommandTimeout(self.host.name, f"command timed out after {timeout:g}s (the node did "
                                                         f"not read its input): {argv[0]}") from None
            chan.shutdown_write()
            out, err = self._collect(chan, deadline, argv, timeout)
            code = chan.recv_exit_status()
            chan.close()
        except (paramiko.SSHException, EOFError, OSError) as e:
            self.close()
            raise ConnectError(self.host.name, f"connection lost: {e or e.__class__.__name__}") from None
        return CommandResult(argv, code, out.decode(errors="replace"), err.decode(errors="replace"),
                             time.monotonic() - start)

    def _exec(self, chan: paramiko.Channel, command: str, deadline: float, message: str) -> None:
        """``chan.exec_command`` with a deadline: paramiko waits for the server's answer to the exec request
        without one, so a server that never answers would hang the caller. At the deadline the channel is
        closed (which wakes paramiko up), the connection is dropped, and ``CommandTimeout`` is raised."""
        expired = threading.Event()

        def expire() -> None:
            expired.set()
            chan.close()

        timer = threading.Timer(max(0.0, deadline - time.monotonic()), expire)
        timer.daemon = True
        timer.start()
        try:
            chan.exec_command(command)
        except (paramiko.SSHException, EOFError, OSError):
            if not expired.is_set():
                raise
        finally:
            timer.cancel()
        if expired.is_set():
            self.close()
            raise CommandTimeout(self.host.name, f"{message} (no answer to the exec request)")

    def _collect(self, chan, deadline, argv, timeout) -> tuple[bytes, bytes]:
        """stdout and stderr until the command ends; each keeps at most its last ``MAX_OUTPUT`` bytes."""
        out, err = bytearray(), bytearray()
        fd = chan.fileno()
        while True:
            while chan.recv_ready():
                _append_bounded(out, chan.recv(65536))
            while chan.recv_stderr_ready():
                _append_bounded(err, chan.recv_stderr(65536))
            if chan.exit_status_ready() and chan.eof_received and not chan.recv_ready() \
                    and not chan.recv_stderr_ready():
                return bytes(out), bytes(err)
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                chan.close()
                raise CommandTimeout(self.host.name, f"command timed out after {timeout:g}s: {argv[0]}")
            ready = readable(fd, remaining)
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
        chan = self._start_stream(argv)
        try:
            fd = chan.fileno()
            while not stop.is_set():
                readable(fd, 0.5)
                if chan.recv_ready():
                    on_data(chan.recv(65536))
                elif chan.eof_received or chan.closed:
                    break
            chan.close()
        except (paramiko.SSHException, EOFError, OSError) as e:
            self.close()
            raise ConnectError(self.host.name, f"connection lost: {e or e.__class__.__name__}") from None

    def _start_stream(self, argv: Sequence[str]):
        """A channel running ``argv`` under the stream wrapper, stderr merged into stdout."""
        self.connect()
        try:
            chan = self._t.open_session(timeout=self.options.connect_timeout)
            chan.set_combine_stderr(True)
            self._exec(chan, quote(["sh", "-c", STREAM_WRAPPER, "clusterctl-stream", *argv]),
                       time.monotonic() + self.options.command_timeout, f"stream of {argv[0]} did not start")
        except (paramiko.SSHException, EOFError, OSError) as e:
            self.close()
            raise ConnectError(self.host.name, f"connection lost: {e or e.__class__.__name__}") from None
        return chan

    def open_stream(self, argv: Sequence[str]) -> "SSHStream":
        """``stream`` for a selector loop (``transport.streams.StreamMux``): the started command's channel,
        read when its ``fileno()`` is readable; no thread of its own."""
        return SSHStream(self, self._start_stream(argv))

    def close(self) -> None:
        if self._t is not None:
            if isinstance(self._t.sock, socket.socket):   # wakes paramiko's thread now, not at its next timeout
                try:                                      # (over ProxyJump it reads a channel: close() wakes it)
                    self._t.sock.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass
            self._t.close()
        if self._jump is not None:
            self._jump.close()
        self._t = self._jump = None


class SSHStream:
    """A started ``open_stream`` command: ``read()`` -> bytes, ``b""`` once it ended, ``None`` for nothing yet."""

    def __init__(self, transport: SSHTransport, chan: paramiko.Channel):
        self.transport, self.chan = transport, chan

    def fileno(self) -> int:
        """paramiko makes the channel's pipe on the first call (readable at once when output or the end came
        before), then writes a byte to it per packet: a stream that is only polled never calls this."""
        return self.chan.fileno()

    def read(self) -> bytes | None:
        try:
            if self.chan.recv_ready():
                return self.chan.recv(65536)
            if self.chan.eof_received or self.chan.closed:
                return b""
            return None
        except (paramiko.SSHException, EOFError, OSError) as e:
            self.transport.close()
            raise ConnectError(self.transport.host.name, f"connection lost: {e or e.__class__.__name__}") from None

    def close(self) -> None:
        try:
            self.chan.close()
        except Exception:  # noqa: BLE001 - the connection may be gone already
            pass


def check_key_files(hosts: Sequence["Host"]) -> None:
    """Input validation before any connection: every ``ansible_ssh_private_key_file`` of an SSH host must be a
    readable private key. Raises ``InputError`` (``InputErrors`` for several) at the inventory line that set it
    (exit 2)."""
    from clusterctl.errors import raise_all

    raise_all(key_file_problems(hosts))


def key_file_problems(hosts: Sequence["Host"]) -> list:
    """Every unusable ``ansible_ssh_private_key_file`` as an ``InputError`` at its inventory line (once per file)."""
    from clusterctl.errors import InputError

    problems, reported = [], set()
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
            if (file, line) not in reported:
                reported.add((file, line))
                problems.append(InputError(file, line, f"cannot use private key {h.key_file} (host {h.name}): "
                                                       f"{seen[path]}", key="ansible_ssh_private_key_file"))
    return problems
