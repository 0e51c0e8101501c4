"""SSH at scale: handshakes dropped by sshd's MaxStartups are retried with backoff, and handshakes with one
ProxyJump host are bounded (``jump_concurrency``), against a real SSH server that drops connections beyond N
unauthenticated ones (tests/fakes/sshserver.py ``max_startups``). Issue 15 item 4."""
from __future__ import annotations

import pytest

from clusterctl.config.inventory import Host
from clusterctl.errors import ConnectError
from clusterctl.transport import ConnectOptions, fan_out, ssh
from tests.fakes.sshserver import keygen, known_line


@pytest.fixture(scope="module")
def keys(tmp_path_factory):
    d = tmp_path_factory.mktemp("keys")
    return {"client": d / "client", "host": keygen(d / "host", "ed25519"), "_c": keygen(d / "client", "ed25519")}


def _hosts(tmp_path, keys, server, n, proxy_jump=None):
    kh = tmp_path / "known_hosts"
    kh.write_text(known_line("[127.0.0.1]:*", keys["host"]))
    (tmp_path / "cfg").write_text(f"Host *\n  IdentityFile {keys['client']}\n")
    return [Host(name=f"n{i}", address="127.0.0.1", port=server.port, key_file=str(keys["client"]),
                 known_hosts=str(kh), proxy_jump=proxy_jump) for i in range(n)]


def _options(tmp_path, **kw) -> ConnectOptions:
    return ConnectOptions(**{"connect_timeout": 20, "known_hosts": str(tmp_path / "u"),
                             "ssh_config": str(tmp_path / "cfg"), **kw})


def _connect_all(hosts, options):
    def one(h):
        t = ssh.SSHTransport(h, options)
        try:
            return t.run(["true"], timeout=10).exit_code
        finally:
            t.close()
    return fan_out(hosts, one, max_workers=len(hosts), host_timeout=60)


def test_handshakes_dropped_by_max_startups_are_retried_until_they_get_through(tmp_path, keys, servers):
    srv = servers([keys["host"]], max_startups=2, handshake_delay=0.1)
    results = _connect_all(_hosts(tmp_path, keys, srv, 10), _options(tmp_path, connect_retries=0))
    assert srv.dropped > 0                                   # the server did refuse some
    assert [r.error for r in results if not r.ok] == []      # and every host got through on a retry
    assert all(r.value == 0 for r in results)


def test_without_refusal_retries_a_dropped_handshake_is_a_clean_refusal(tmp_path, keys, servers):
    srv = servers([keys["host"]], max_startups=1, handshake_delay=0.3)
    results = _connect_all(_hosts(tmp_path, keys, srv, 6), _options(tmp_path, connect_retries=0, refusal_retries=0))
    failed = [r.error for r in results if not r.ok]
    assert failed and all(isinstance(e, ssh.HandshakeRefused) for e in failed), failed
    assert "MaxStartups" in str(failed[0])


def test_handshakes_with_one_bastion_are_bounded(tmp_path, keys, servers):
    """12 nodes behind a bastion that drops beyond 3 unauthenticated connections: with jump_concurrency=3
    the bastion never has to drop one, and every node is reached."""
    bastion = servers([keys["host"]], max_startups=3, handshake_delay=0.05)
    target = servers([keys["host"]])
    hosts = _hosts(tmp_path, keys, target, 12, proxy_jump=f"127.0.0.1:{bastion.port}")
    results = _connect_all(hosts, _options(tmp_path, jump_concurrency=3))
    assert [r.error for r in results if not r.ok] == []
    assert bastion.dropped == 0 and bastion.peak_unauth <= 3
    assert len(bastion.forwards) == 12


def test_refusals_are_told_apart_from_other_connect_errors():
    assert ssh._refused(EOFError()) and ssh._refused(ConnectionResetError())
    assert ssh._refused(Exception("Error reading SSH protocol banner[Errno 104] Connection reset by peer"))
    assert not ssh._refused(Exception("Authentication failed"))
    assert not ssh._refused(TimeoutError("timed out"))
    assert issubclass(ssh.HandshakeRefused, ConnectError)


def test_open_stream_hands_its_channel_to_the_selector_loop(tmp_path, keys, servers):
    import time

    from clusterctl.transport.streams import StreamMux

    srv = servers([keys["host"]], handler=lambda cmd: (b"1 10\n" * 3, 0))
    t = ssh.SSHTransport(_hosts(tmp_path, keys, srv, 1)[0], _options(tmp_path))
    mux, got, ends = StreamMux(), [], []
    try:
        mux.add("watch-n0", lambda: t.open_stream(["sh", "-c", "watch"]), got.append, on_end=ends.append,
                retry_s=60)
        end = time.monotonic() + 10
        while not ends and time.monotonic() < end:
            time.sleep(0.02)
        assert ends == [None] and b"".join(got) == b"1 10\n" * 3
        assert "clusterctl-stream" in srv.commands[0]          # the same wrapper as stream(): EOF kills it
    finally:
        mux.close()
        t.close()


def test_commands_and_streams_work_with_fds_above_1024(tmp_path, keys, servers):
    """select.select refuses fds >= 1024 (ValueError, not a transport error): at ~200 nodes a controller's
    channels are past it, and every probe and stream failed."""
    import os
    import resource
    import threading

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 1200:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    filler = [os.open("/dev/null", os.O_RDONLY) for _ in range(1100)]
    srv = servers([keys["host"]], handler=lambda cmd: (b"ok\n", 0))
    t = ssh.SSHTransport(_hosts(tmp_path, keys, srv, 1)[0], _options(tmp_path))
    try:
        assert t.run(["echo", "ok"], timeout=10).stdout == "ok\n"
        assert t._t.sock.fileno() >= 1024
        got = []
        t.stream(["sh", "-c", "x"], got.append, threading.Event())
        assert b"".join(got) == b"ok\n"
    finally:
        t.close()
        for fd in filler:
            os.close(fd)


def test_an_idle_connection_wakes_once_a_second_and_close_ends_its_thread_at_once(tmp_path, keys, servers):
    """paramiko's transport thread wakes at its socket timeout (0.1 s by default: 0.06 % of a core per idle
    connection, the supervisor holds one per node); a connected transport waits up to ssh.IDLE_WAKE_S, and close()
    shuts the socket down so the thread does not wait that long to end."""
    import time

    srv = servers([keys["host"]])
    t = ssh.SSHTransport(_hosts(tmp_path, keys, srv, 1)[0], _options(tmp_path))
    assert t.run(["true"], timeout=10).exit_code == 0
    pt = t._t
    assert pt.sock.gettimeout() == ssh.IDLE_WAKE_S >= 1
    time.sleep(0.2)
    t0 = time.monotonic()
    t.close()
    pt.join(5)
    assert not pt.is_alive() and time.monotonic() - t0 < 0.5 * ssh.IDLE_WAKE_S


def test_aes_gcm_comes_first_and_every_other_cipher_keeps_its_order():
    import paramiko

    default = list(paramiko.Transport._preferred_ciphers)
    got = ssh.aead_first(default)
    assert got[:2] == ["aes128-gcm@openssh.com", "aes256-gcm@openssh.com"]
    assert sorted(got) == sorted(default)
    assert [c for c in got if "-gcm@" not in c] == [c for c in default if "-gcm@" not in c]
    assert ssh.aead_first(["aes128-ctr", "aes256-ctr"]) == ["aes128-ctr", "aes256-ctr"]   # a server without GCM
