"""Transports against a real 4-host testbed: per-host results, partitions, refused connections, host-key
policy, argv quoting, and the local transport giving the same results for the same argv.

Every test gets its own 4-host testbed (no image: it is not needed here and ``up`` takes well under a second),
so faults never leak between tests. ``ConnectOptions.known_hosts`` and ``ssh_config`` always point into
``tmp_path``: nothing here reads or writes the real ``~/.ssh``.
"""
from __future__ import annotations

import dataclasses
import subprocess
import time
from pathlib import Path

import pytest

from clusterctl.config import inventory
from clusterctl.config.inventory import Host
from clusterctl.errors import CommandTimeout, ConnectError, DeadlineExceeded, HostKeyError
from clusterctl.transport import ConnectOptions, connect, fan_out
from tests.testbed import profile

N_HOSTS = 4


@pytest.fixture
def tb(make_testbed):
    return make_testbed(N_HOSTS, [profile(gpus=0, image=False)] * N_HOSTS)


@pytest.fixture
def user_kh(tmp_path) -> Path:
    """An empty user known_hosts file (stands in for ~/.ssh/known_hosts)."""
    p = tmp_path / "user_known_hosts"
    p.write_text("")
    return p


@pytest.fixture
def opts(tmp_path, user_kh) -> ConnectOptions:
    return ConnectOptions(connect_timeout=3.0, command_timeout=20.0, known_hosts=str(user_kh),
                          ssh_config=str(tmp_path / "no_ssh_config"))


@pytest.fixture
def hosts(tb, tmp_path) -> list[Host]:
    return list(inventory.load(str(tb.inventory(tmp_path / "inventory.yaml"))).hosts)


def run_once(host: Host, argv, options: ConnectOptions, **kw):
    t = connect(host, options)
    try:
        return t.run(argv, **kw)
    finally:
        t.close()


def host_fingerprint(tb, name: str) -> str:
    pub = tb.host(name).dir / "ssh_host_ed25519_key.pub"
    return subprocess.run(["ssh-keygen", "-l", "-f", str(pub)], capture_output=True, text=True,
                          check=True).stdout.split()[1]


# ------------------------------------------------------------------------------------------ per-host results

def test_command_on_all_hosts_returns_each_hosts_own_name(tb, hosts, opts):
    assert [h.name for h in hosts] == [f"node{i}" for i in range(1, N_HOSTS + 1)]
    rs = fan_out(hosts, lambda h: run_once(h, ["hostname"], opts), host_timeout=20)
    assert [r.host for r in rs] == hosts
    for r in rs:
        assert r.ok, r.error
        assert r.value.exit_code == 0 and r.value.stdout == f"{r.host.name}\n", r.value
        assert r.value.argv == ("hostname",)
        assert r.duration_s > 0


def test_one_connection_runs_many_commands_and_non_zero_exit_is_a_value(hosts, opts):
    t = connect(hosts[0], opts)
    try:
        a = t.run(["sh", "-c", "echo out; echo err >&2; exit 7"])
        b = t.run(["cat"], stdin=b"from stdin\n")
        c = t.run(["true"])
        ciphers = (t._t.remote_cipher, t._t.local_cipher)
    finally:
        t.close()
    assert ciphers == ("aes128-gcm@openssh.com",) * 2     # OpenSSH offers GCM: no per-packet MAC in Python
    assert (a.exit_code, a.stdout, a.stderr, a.ok) == (7, "out\n", "err\n", False)
    assert (b.exit_code, b.stdout) == (0, "from stdin\n")
    assert c.ok


def test_command_timeout_is_an_error_and_bounded(hosts, opts):
    t = connect(hosts[0], opts)
    try:
        t0 = time.monotonic()
        with pytest.raises(CommandTimeout):
            t.run(["sleep", "10"], timeout=0.5)
        assert time.monotonic() - t0 < 3
        assert t.run(["echo", "still usable"]).stdout == "still usable\n"
    finally:
        t.close()


def test_put_writes_file_with_mode(tb, hosts, opts):
    path = tb.shared / "put-target"
    t = connect(hosts[1], opts)
    try:
        t.put(b"payload\x00\xff\n", str(path), mode=0o640)
    finally:
        t.close()
    assert path.read_bytes() == b"payload\x00\xff\n"
    assert path.stat().st_mode & 0o777 == 0o640


# ------------------------------------------------------------------------------------------ faults

def test_partitioned_host_times_out_alone_within_connect_timeout(tb, hosts, opts):
    victim = hosts[1]
    tb.partition(victim.name)
    try:
        t0 = time.monotonic()
        rs = fan_out(hosts, lambda h: run_once(h, ["hostname"], opts))
        wall = time.monotonic() - t0
    finally:
        tb.heal(victim.name)
    assert wall < opts.connect_timeout + 2, f"fan-out took {wall:.2f}s"
    by_name = {r.host.name: r for r in rs}
    bad = by_name.pop(victim.name)
    assert isinstance(bad.error, (ConnectError, DeadlineExceeded)), repr(bad.error)
    assert bad.error.host == victim.name
    assert isinstance(bad.error, DeadlineExceeded) or "timed out" in str(bad.error), str(bad.error)
    assert bad.duration_s < opts.connect_timeout + 2
    for name, r in by_name.items():
        assert r.ok, (name, r.error)
        assert r.value.stdout == f"{name}\n"


def test_partitioned_host_with_host_timeout_is_deadline_exceeded(tb, hosts, tmp_path, user_kh):
    """A host_timeout shorter than the connect timeout cuts the host off at host_timeout."""
    slow = ConnectOptions(connect_timeout=10.0, known_hosts=str(user_kh), ssh_config=str(tmp_path / "none"))
    tb.partition(hosts[0].name)
    try:
        t0 = time.monotonic()
        rs = fan_out(hosts, lambda h: run_once(h, ["true"], slow), host_timeout=1.5)
        wall = time.monotonic() - t0
    finally:
        tb.heal(hosts[0].name)
    assert wall < 1.5 + 2, f"fan-out took {wall:.2f}s"
    assert isinstance(rs[0].error, DeadlineExceeded), repr(rs[0].error)
    assert all(r.ok for r in rs[1:]), [r.error for r in rs[1:]]


def test_stopped_sshd_is_a_fast_connect_error(tb, hosts, opts):
    victim = hosts[2]
    tb.stop_sshd(victim.name)
    try:
        t0 = time.monotonic()
        with pytest.raises(ConnectError) as ei:
            run_once(victim, ["true"], opts)
        elapsed = time.monotonic() - t0
    finally:
        tb.start_sshd(victim.name)
    assert elapsed < 1.5, f"refused connection took {elapsed:.2f}s"
    assert "refused" in str(ei.value).lower()
    assert ei.value.host == victim.name
    assert run_once(victim, ["hostname"], opts).stdout == f"{victim.name}\n"


# ------------------------------------------------------------------------------------------ host keys

def test_unknown_host_key_is_refused_with_how_to_add_it(tb, hosts, opts, user_kh):
    h = dataclasses.replace(hosts[0], known_hosts=None)  # no clusterctl_known_hosts, empty user file
    with pytest.raises(HostKeyError) as ei:
        run_once(h, ["true"], opts)
    msg = str(ei.value)
    assert "unknown host key" in msg
    assert host_fingerprint(tb, h.name) in msg
    assert f"ssh-keyscan -p 22 {h.address} >> {user_kh}" in msg
    assert "--accept-new-host-keys" in msg
    assert user_kh.read_text() == "", "an unknown key must not be recorded without the opt-in"


def test_unknown_host_key_in_empty_clusterctl_known_hosts_is_refused(tb, hosts, opts, tmp_path):
    empty = tmp_path / "cluster_known_hosts"
    empty.write_text("# nothing yet\n")
    h = dataclasses.replace(hosts[0], known_hosts=str(empty))
    with pytest.raises(HostKeyError) as ei:
        run_once(h, ["true"], opts)
    assert f">> {empty}" in str(ei.value)  # records go to the host's own known_hosts file
    assert empty.read_text() == "# nothing yet\n"


def _other_key(tmp_path) -> tuple[str, str]:
    """(public key line 'ssh-ed25519 AAAA...', fingerprint) of a fresh key that no host has."""
    k = tmp_path / "impostor"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(k)], check=True)
    pub = (tmp_path / "impostor.pub").read_text().split()
    fp = subprocess.run(["ssh-keygen", "-l", "-f", str(k) + ".pub"], capture_output=True, text=True,
                        check=True).stdout.split()[1]
    return f"{pub[0]} {pub[1]}", fp


@pytest.mark.parametrize("accept_new", [False, True])
def test_changed_host_key_is_refused_with_both_fingerprints_and_file_line(tb, hosts, opts, user_kh, tmp_path,
                                                                            accept_new):
    h = dataclasses.replace(hosts[1], known_hosts=None)
    other, other_fp = _other_key(tmp_path)
    content = f"# a comment\n{hosts[0].address} {other}\n{h.address} {other}\n"  # line 3 is h's (wrong) key
    user_kh.write_text(content)
    with pytest.raises(HostKeyError) as ei:
        run_once(h, ["true"], dataclasses.replace(opts, accept_new_host_keys=accept_new))
    msg = str(ei.value)
    assert "HOST KEY CHANGED" in msg
    assert host_fingerprint(tb, h.name) in msg  # what the server offered
    assert other_fp in msg                      # what the file records
    assert f"{user_kh}:3" in msg
    assert user_kh.read_text() == content, "a changed key must never be recorded"


def test_changed_key_in_clusterctl_known_hosts_is_refused_even_if_user_file_is_empty(tb, hosts, opts, tmp_path):
    other, other_fp = _other_key(tmp_path)
    ckh = tmp_path / "cluster_known_hosts"
    ckh.write_text(f"{hosts[2].address} {other}\n")
    h = dataclasses.replace(hosts[2], known_hosts=str(ckh))
    with pytest.raises(HostKeyError) as ei:
        run_once(h, ["true"], dataclasses.replace(opts, accept_new_host_keys=True))
    assert f"{ckh}:1" in str(ei.value) and other_fp in str(ei.value)


def test_accept_new_records_the_key_then_plain_connect_works(tb, hosts, opts, user_kh):
    h = dataclasses.replace(hosts[3], known_hosts=None)
    r = run_once(h, ["hostname"], dataclasses.replace(opts, accept_new_host_keys=True))
    assert r.stdout == f"{h.name}\n"
    lines = user_kh.read_text().splitlines()
    pub = (tb.host(h.name).dir / "ssh_host_ed25519_key.pub").read_text().split()
    assert lines == [f"{h.address} {pub[0]} {pub[1]}"]
    # the recorded key is what OpenSSH itself accepts, too
    ssh = subprocess.run(["ssh", "-F", "/dev/null", "-i", str(tb.key), "-o", "BatchMode=yes",
                          "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={user_kh}",
                          "-o", "ConnectTimeout=3", f"{tb.user}@{h.address}", "hostname"],
                         capture_output=True, text=True, timeout=20, stdin=subprocess.DEVNULL)
    assert ssh.returncode == 0 and ssh.stdout == f"{h.name}\n", ssh.stderr
    # a second connect without the flag works, and records nothing more
    assert run_once(h, ["hostname"], opts).stdout == f"{h.name}\n"
    assert user_kh.read_text().splitlines() == lines


def test_big_user_known_hosts_with_hashed_and_malformed_lines(tb, hosts, opts, user_kh, tmp_path):
    """A real ~/.ssh/known_hosts: thousands of other hosts, a malformed hashed line, the host's key hashed
    (Debian's HashKnownHosts default). Connecting works and stays cheap."""
    from paramiko.hostkeys import HostKeys

    other, _ = _other_key(tmp_path)
    pub = (tb.host(hosts[0].name).dir / "ssh_host_ed25519_key.pub").read_text().split()
    lines = ["|1|not-base64|x " + other, "10.255.0.1 ssh-ed25519 !!!not-a-key!!!"]
    lines += [f"10.254.{i // 250}.{i % 250} {other}" for i in range(2000)]
    lines.append(f"{HostKeys.hash_host(hosts[0].address)} {pub[0]} {pub[1]}")
    user_kh.write_text("\n".join(lines) + "\n")
    h = dataclasses.replace(hosts[0], known_hosts=None)
    t0 = time.monotonic()
    for _ in range(3):
        assert run_once(h, ["hostname"], opts).stdout == f"{h.name}\n"
    assert time.monotonic() - t0 < 3


def test_accept_new_from_many_threads_records_each_key_once(tb, hosts, opts, user_kh):
    bare = [dataclasses.replace(h, known_hosts=None) for h in hosts]
    accept = dataclasses.replace(opts, accept_new_host_keys=True)
    rs = fan_out(bare, lambda h: run_once(h, ["true"], accept))
    assert all(r.ok for r in rs), [r.error for r in rs]
    names = sorted(line.split()[0] for line in user_kh.read_text().splitlines())
    assert names == sorted(h.address for h in hosts)


# ------------------------------------------------------------------------------------------ argv quoting

NASTY = [
    "plain",
    "",
    " leading and trailing spaces ",
    "it's",
    '"double" quotes',
    "$(touch {canary})",
    "`touch {canary}`",
    "; touch {canary}",
    "&& touch {canary} ||",
    "| touch {canary}",
    "$HOME ${PATH} $0 $$ $? $#",
    "line1\nline2\n; touch {canary}",
    "\ttab\\backslash\\\\n",
    "* ? [a-z] ~ ~root",
    "-n",
    "--",
    "a=b c=d",
    "> {canary}",
    "#comment",
    "üñíçødé ✓",
    "'$(touch {canary})'",
    '"$(touch {canary})"',
    "\\'",
]


def nasty_args(canary: Path) -> list[str]:
    return [v.replace("{canary}", str(canary)) for v in NASTY]


def test_argv_values_come_back_verbatim_without_injection(tb, hosts, opts):
    canary = tb.shared / "canary"
    args = nasty_args(canary)
    rs = fan_out(hosts[:2], lambda h: run_once(h, ["printf", "%s\\n", *args], opts))
    for r in rs:
        assert r.ok, r.error
        assert r.value.exit_code == 0, r.value.stderr
        assert r.value.stdout == "".join(a + "\n" for a in args)
    # through a remote `sh -c SCRIPT sh ARG...` as well: values stay data
    r = run_once(hosts[0], ["sh", "-c", 'for a in "$@"; do printf "<%s>\\n" "$a"; done', "sh", *args], opts)
    assert r.stdout == "".join(f"<{a}>\n" for a in args)
    assert not canary.exists(), "an argument was executed by a shell"
    assert not (Path(tb.home) / "canary").exists()


# ------------------------------------------------------------------------------------------ local transport

LOCAL = Host(name="localhost", address="127.0.0.1", connection="local", runtime="bare")

SAME_ARGV = [
    (["printf", "%s\\n"], None),  # + NASTY values, appended below
    (["sh", "-c", "echo out; echo err >&2; exit 3"], None),
    (["cat"], b"line one\nline two\x00\xc3\xa9\n"),
    (["sh", "-c", 'printf "%s|" "$@"', "sh", "a b", "$(x)", "'"], None),
    (["false"], None),
    (["test", "-d", "/"], None),
]


def test_local_transport_gives_same_results_as_ssh(tb, hosts, opts, tmp_path):
    canary = tmp_path / "canary"
    local = connect(LOCAL, opts)
    remote = connect(hosts[0], opts)
    try:
        for argv, stdin in SAME_ARGV:
            if argv[0] == "printf":
                argv = argv + nasty_args(canary)
            lr, rr = local.run(argv, stdin=stdin), remote.run(argv, stdin=stdin)
            assert (lr.argv, lr.exit_code, lr.stdout, lr.stderr) == (rr.argv, rr.exit_code, rr.stdout, rr.stderr)
        with pytest.raises(CommandTimeout):
            local.run(["sleep", "10"], timeout=0.3)
        with pytest.raises(CommandTimeout):
            remote.run(["sleep", "10"], timeout=0.3)
    finally:
        local.close()
        remote.close()
    assert not canary.exists()
