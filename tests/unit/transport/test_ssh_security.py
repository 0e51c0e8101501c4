"""SSHTransport against a real SSH server that misbehaves (tests/fakes/sshserver.py): host keys of other types,
@revoked / @cert-authority / wildcard known_hosts entries, RSA-only records, an exec request never answered,
endless output, and ProxyJump chains (issue 11 items 1, 7, 9, 10, 11)."""
from __future__ import annotations

import shlex
import threading
import time

import pytest

from clusterctl.config.inventory import Host
from clusterctl.errors import CommandTimeout, HostKeyError, TransportError
from clusterctl.transport import ConnectOptions, ssh
from tests.fakes.sshserver import keygen, known_line


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    return {"client": d / "client", **{t: keygen(d / t, t) for t in ("ed25519", "ecdsa", "rsa")},
            "other_ed25519": keygen(d / "other_ed25519", "ed25519"), "_client": keygen(d / "client", "ed25519")}


def transport(tmp_path, keys, server, kh_text: str, *, accept_new=False, proxy_jump=None, **opts):
    (tmp_path / "cfg").write_text(f"Host *\n  IdentityFile {keys['client']}\n")   # for jump hosts
    kh = tmp_path / "known_hosts"
    kh.write_text(kh_text)
    host = Host(name="n1", address="127.0.0.1", port=server.port, key_file=str(keys["client"]),
                known_hosts=str(kh), proxy_jump=proxy_jump)
    options = ConnectOptions(connect_timeout=5, connect_retries=0, accept_new_host_keys=accept_new,
                             known_hosts=str(tmp_path / "user_known_hosts"), ssh_config=str(tmp_path / "cfg"),
                             **opts)
    return ssh.SSHTransport(host, options), kh


# ------------------------------------------------------------------------------------ item 1: host key types
@pytest.mark.parametrize("accept_new", [False, True])
def test_changed_key_of_another_type_is_refused_as_changed(tmp_path, keys, servers, accept_new):
    """Recorded: ed25519. The server offers only ecdsa: a changed key, with or without --accept-new-host-keys."""
    srv = servers([keys["ecdsa"]])
    text = known_line(srv.name, keys["ed25519"])
    t, kh = transport(tmp_path, keys, srv, text, accept_new=accept_new)
    with pytest.raises(HostKeyError) as e:
        t.connect()
    msg = str(e.value)
    assert "HOST KEY CHANGED" in msg and "unknown" not in msg, msg
    assert ssh.fingerprint(keys["ecdsa"]) in msg and ssh.fingerprint(keys["ed25519"]) in msg, msg
    assert f"{kh}:1" in msg, msg
    assert kh.read_text() == text and not (tmp_path / "user_known_hosts").exists()


def test_revoked_key_is_refused_even_with_accept_new(tmp_path, keys, servers):
    srv = servers([keys["ed25519"]])
    text = known_line("*", keys["ed25519"], marker="@revoked")
    t, kh = transport(tmp_path, keys, srv, text, accept_new=True)
    with pytest.raises(HostKeyError, match="REVOKED") as e:
        t.connect()
    assert f"{kh}:1" in str(e.value)
    assert kh.read_text() == text and not (tmp_path / "user_known_hosts").exists()


def test_revoked_key_is_refused_even_next_to_a_plain_entry(tmp_path, keys, servers):
    srv = servers([keys["ed25519"]])
    text = known_line(srv.name, keys["ed25519"]) + known_line("*", keys["ed25519"], marker="@revoked")
    t, _ = transport(tmp_path, keys, srv, text)
    with pytest.raises(HostKeyError, match="REVOKED"):
        t.connect()


def test_cert_authority_host_is_not_new(tmp_path, keys, servers):
    srv = servers([keys["ed25519"]])
    text = known_line("[127.0.0.1]:*", keys["ecdsa"], marker="@cert-authority")
    t, kh = transport(tmp_path, keys, srv, text, accept_new=True)
    with pytest.raises(HostKeyError, match="certificate authority"):
        t.connect()
    assert kh.read_text() == text and not (tmp_path / "user_known_hosts").exists()


@pytest.mark.parametrize("pattern", ["[127.0.0.*]:{port}", "[127.0.0.?]:{port}", "[127.0.0.1]:*,other",
                                     "|hashed|"])
def test_patterns_are_honoured(tmp_path, keys, servers, pattern):
    """A key recorded under a wildcard (or hashed) name is that host's key: the right one connects without
    the flag, a different one is a changed key even with the flag."""
    srv = servers([keys["ed25519"]])
    name = (ssh.HostKeys.hash_host(srv.name) if pattern == "|hashed|" else pattern.format(port=srv.port))
    t, _ = transport(tmp_path, keys, srv, known_line(name, keys["ed25519"]))
    t.connect()
    assert t.run(["true"]).ok
    t.close()
    t, kh = transport(tmp_path, keys, srv, known_line(name, keys["other_ed25519"]), accept_new=True)
    with pytest.raises(HostKeyError, match="HOST KEY CHANGED"):
        t.connect()


def test_negated_pattern_excludes_the_host(tmp_path, keys, servers):
    srv = servers([keys["ed25519"]])
    text = known_line(f"[127.0.0.*]:*,![127.0.0.1]:{srv.port}", keys["other_ed25519"])
    t, kh = transport(tmp_path, keys, srv, text)
    with pytest.raises(HostKeyError, match="unknown host key"):
        t.connect()


def test_host_matches_rules():
    assert ssh.host_matches("*.corp", "gpu1.corp") and ssh.host_matches("GPU?.corp", "gpu1.corp")
    assert not ssh.host_matches("*.corp", "gpu1.corp.evil") and not ssh.host_matches("*.corp,!gpu1.corp", "gpu1.corp")
    assert ssh.host_matches("[a]:2222", "[a]:2222") and not ssh.host_matches("[ab]:2222", "[a]:2222")


# ------------------------------------------------------------------------------------ item 11: RSA-only records
def test_rsa_only_record_connects(tmp_path, keys, servers):
    """The server has ed25519 and RSA, only the RSA key is recorded: the RSA key must be negotiated."""
    srv = servers([keys["ed25519"], keys["rsa"]])
    t, _ = transport(tmp_path, keys, srv, known_line(srv.name, keys["rsa"]))
    t.connect()
    assert t.run(["true"]).ok
    t.close()


def test_preferred_key_types_maps_ssh_rsa():
    avail = ["ssh-ed25519", "ecdsa-sha2-nistp256", "rsa-sha2-512", "rsa-sha2-256"]
    assert ssh.preferred_key_types(avail, ["ssh-rsa"])[:2] == ["rsa-sha2-512", "rsa-sha2-256"]
    assert ssh.preferred_key_types(avail, ["ecdsa-sha2-nistp256"])[0] == "ecdsa-sha2-nistp256"


# ------------------------------------------------------------------------------------ item 2: quoted fixes
def sh_words(cmd: str) -> list[str]:
    """The words a POSIX shell would see, with ; | & as separate tokens (shlex.split keeps them in words)."""
    lex = shlex.shlex(cmd, posix=True, punctuation_chars=True)
    lex.whitespace_split = True
    return list(lex)


def test_suggested_commands_quote_every_value(tmp_path, keys, servers):
    srv = servers([keys["ed25519"]])
    evil = tmp_path / "kh;touch${IFS}PWNED"
    host = Host(name="n1", address="127.0.0.1", port=srv.port, key_file=str(keys["client"]), known_hosts=str(evil))
    options = ConnectOptions(connect_timeout=5, connect_retries=0, known_hosts=str(tmp_path / "u"),
                             ssh_config=str(tmp_path / "nocfg"))
    with pytest.raises(HostKeyError) as e:
        ssh.SSHTransport(host, options).connect()
    words = sh_words(str(e.value).split("`")[1])
    assert words[-2:] == [">>", str(evil)] and words[:3] == ["ssh-keyscan", "-p", str(srv.port)], words
    evil.write_text(known_line(srv.name, keys["other_ed25519"]))
    with pytest.raises(HostKeyError) as e:
        ssh.SSHTransport(host, options).connect()
    words = sh_words(str(e.value).split("`")[1])
    assert words == ["ssh-keygen", "-R", srv.name, "-f", str(evil)], words


# ------------------------------------------------------------------------------------ item 7: exec deadline
def test_exec_request_never_answered_times_out(tmp_path, keys, servers):
    srv = servers([keys["ed25519"]], exec_mode="hang")
    t, _ = transport(tmp_path, keys, srv, known_line(srv.name, keys["ed25519"]))
    box: dict = {}

    def call():
        t0 = time.monotonic()
        try:
            t.run(["true"], timeout=1.5)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            box["error"] = e
        box["s"] = time.monotonic() - t0

    th = threading.Thread(target=call, daemon=True)
    th.start()
    th.join(15)
    assert not th.is_alive(), "run(timeout=1.5) hung on an unanswered exec request"
    assert isinstance(box.get("error"), CommandTimeout), box
    assert box["s"] < 5, box


# ------------------------------------------------------------------------------------ item 9: bounded output
def test_output_is_bounded_and_keeps_the_tail(tmp_path, keys, servers, monkeypatch):
    monkeypatch.setattr(ssh, "MAX_OUTPUT", 1 << 20)
    big = b"x" * (6 << 20) + b"THE-END\n"
    srv = servers([keys["ed25519"]], handler=lambda cmd: (big, 3))
    t, _ = transport(tmp_path, keys, srv, known_line(srv.name, keys["ed25519"]))
    r = t.run(["yes"], timeout=60)
    t.close()
    assert r.exit_code == 3
    assert len(r.stdout) == 1 << 20 and r.stdout.endswith("THE-END\n")


def test_append_bounded():
    buf = bytearray()
    for i in range(100):
        ssh._append_bounded(buf, bytes([i]) * 10, limit=25)
        assert len(buf) <= 25
    assert bytes(buf) == bytes([97]) * 5 + bytes([98]) * 10 + bytes([99]) * 10


# ------------------------------------------------------------------------------------ item 10: ProxyJump
def test_multi_hop_proxy_jump_goes_through_every_hop(tmp_path, keys, servers):
    """a,b -> target: the client reaches a, a forwards to b, b forwards to the target (OpenSSH's order)."""
    a, b = servers([keys["ed25519"]]), servers([keys["ed25519"]])
    target = servers([keys["ed25519"]], handler=lambda cmd: (b"hello\n", 0))
    kh = known_line("[127.0.0.1]:*", keys["ed25519"])
    t, _ = transport(tmp_path, keys, target, kh, proxy_jump=f"127.0.0.1:{a.port},127.0.0.1:{b.port}")
    r = t.run(["echo", "hello"], timeout=20)
    t.close()
    assert r.stdout == "hello\n"
    assert a.forwards == [("127.0.0.1", b.port)], a.forwards
    assert b.forwards == [("127.0.0.1", target.port)], b.forwards


def test_bad_proxy_jump_from_ssh_config_is_a_clean_error(tmp_path, keys, servers):
    srv = servers([keys["ed25519"]])
    cfg = tmp_path / "cfg"
    cfg.write_text("Host 127.0.0.1\n  ProxyJump bastion:abc\n")
    host = Host(name="n1", address="127.0.0.1", port=srv.port, key_file=str(keys["client"]))
    t = ssh.SSHTransport(host, ConnectOptions(connect_timeout=3, connect_retries=0, ssh_config=str(cfg),
                                              known_hosts=str(tmp_path / "u")))
    with pytest.raises(TransportError, match="ProxyJump 'bastion:abc'.*port 'abc'"):
        t.connect()


# ------------------------------------------------------------------------------------ issue 24 item 10
def hashed_line(name: str, key) -> str:
    from paramiko.hostkeys import HostKeys

    return known_line(HostKeys.hash_host(name), key)


@pytest.mark.parametrize("recorded, refused", [("other_ed25519", True), ("ed25519", False)])
def test_hashed_entry_matches_an_uppercase_host_name(tmp_path, keys, servers, recorded, refused):
    """ssh-keyscan -H / HashKnownHosts record the lowercased name hashed; an inventory's ``LOCALHOST`` is that
    host: another key is changed (not new), even with --accept-new-host-keys, and the recorded one connects."""
    srv = servers([keys["ed25519"]])
    (tmp_path / "cfg").write_text("")
    kh = tmp_path / "known_hosts"
    kh.write_text(hashed_line(f"[localhost]:{srv.port}", keys[recorded]))
    host = Host(name="n1", address="LOCALHOST", port=srv.port, key_file=str(keys["client"]), known_hosts=str(kh))
    options = ConnectOptions(connect_timeout=5, connect_retries=0, accept_new_host_keys=True,
                             known_hosts=str(tmp_path / "user_known_hosts"), ssh_config=str(tmp_path / "cfg"))
    t = ssh.SSHTransport(host, options)
    before = kh.read_text()
    if refused:
        with pytest.raises(HostKeyError, match="HOST KEY CHANGED"):
            t.connect()
    else:
        assert t.run(["true"]).exit_code == 0
        t.close()
    assert kh.read_text() == before     # nothing recorded either way


def test_known_hosts_files_of_ssh_config_are_honoured(tmp_path, keys, servers):
    srv = servers([keys["ed25519"]])
    user, glob = tmp_path / "user_kh", tmp_path / "global_kh"
    (tmp_path / "cfg").write_text(f"Host *\n  UserKnownHostsFile {user}\n  GlobalKnownHostsFile {glob}\n")
    host = Host(name="n1", address="127.0.0.1", port=srv.port, key_file=str(keys["client"]))
    options = ConnectOptions(connect_timeout=5, connect_retries=0, accept_new_host_keys=True,
                             ssh_config=str(tmp_path / "cfg"))
    t = ssh.SSHTransport(host, options)
    assert t.known_files == [str(user), str(glob)] and t.record_file == str(user)
    glob.write_text(known_line(srv.name, keys["other_ed25519"]))   # the global file's key wins over accept-new
    with pytest.raises(HostKeyError, match="HOST KEY CHANGED") as e:
        t.connect()
    assert f"{glob}:1" in str(e.value) and not user.exists()
    glob.write_text("")
    t.connect()                                                    # a new key is recorded in UserKnownHostsFile
    t.close()
    assert user.read_text() == known_line(srv.name, keys["ed25519"])


def test_default_known_hosts_files(tmp_path):
    (tmp_path / "cfg").write_text("")
    host = Host(name="n1", address="h1", known_hosts="/x/kh")
    t = ssh.SSHTransport(host, ConnectOptions(ssh_config=str(tmp_path / "cfg")))
    home = ssh.Path("~/.ssh/known_hosts").expanduser()
    assert t.known_files == [str(home), "/x/kh", *ssh.GLOBAL_KNOWN_HOSTS] and t.record_file == "/x/kh"
    assert ssh.resolve_target(Host(name="n1", address="Node1.Example"), str(tmp_path / "cfg")).known_hosts_name \
        == "node1.example"


# ------------------------------------------------------------------------------------ issue 24 item 7
def test_authentication_is_bounded_by_the_connect_timeout(tmp_path, keys, servers):
    """A server that takes 10 s to answer each key: the connect fails within its 1.5 s deadline (paramiko's own
    auth_timeout was 30 s per key, outside the connect deadline)."""
    from clusterctl.errors import ConnectError

    srv = servers([keys["ed25519"]], handshake_delay=10)
    t, _ = transport(tmp_path, keys, srv, known_line(srv.name, keys["ed25519"]))
    t.options = ConnectOptions(connect_timeout=1.5, connect_retries=0, known_hosts=t.options.known_hosts,
                               ssh_config=t.options.ssh_config)
    t.target = ssh.Target(t.target.hostname, t.target.port, t.target.user, (str(keys["client"]),) * 2, None)
    box: dict = {}

    def call():
        t0 = time.monotonic()
        try:
            t.connect()
        except Exception as e:  # noqa: BLE001 - the test inspects it
            box["error"] = e
        box["s"] = time.monotonic() - t0

    th = threading.Thread(target=call, daemon=True)
    th.start()
    th.join(40)
    assert not th.is_alive() and box["s"] < 4, box
    assert isinstance(box.get("error"), ConnectError) and "connect timeout" in str(box["error"]), box


def test_shell_exec_request_never_answered_times_out(tmp_path, keys, servers):
    """``clusterctl shell``: the exec request goes unanswered; the shell ends with CommandTimeout at the connect
    timeout instead of hanging."""
    import io

    from clusterctl.oncall import shell

    srv = servers([keys["ed25519"]], exec_mode="hang")
    t, _ = transport(tmp_path, keys, srv, known_line(srv.name, keys["ed25519"]))
    t.options = ConnectOptions(connect_timeout=1.5, connect_retries=0, known_hosts=t.options.known_hosts,
                               ssh_config=t.options.ssh_config)
    r, w = __import__("os").pipe()
    box: dict = {}

    def call():
        t0 = time.monotonic()
        try:
            with open(r, "rb") as stdin:
                shell.run(t, ["sh"], tty=False, stdin=stdin, stdout=io.open(w, "wb"), stderr=None)
        except Exception as e:  # noqa: BLE001 - the test inspects it
            box["error"] = e
        box["s"] = time.monotonic() - t0

    th = threading.Thread(target=call, daemon=True)
    th.start()
    th.join(30)
    t.close()
    assert not th.is_alive(), "shell hung on an unanswered exec request"
    assert isinstance(box.get("error"), CommandTimeout) and box["s"] < 5, box
