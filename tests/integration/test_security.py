"""Security properties of clusterctl, proven on the real testbed (docs/security.md says what each test proves).

1. host identity: every connecting command refuses a changed key (always) and an unknown key (unless
   --accept-new-host-keys, which records it);
2. no injection: hostile values from the job/inventory reach the training process verbatim and run nothing;
3. secrets: secret_env values reach the process and nowhere else (outputs, state dir, node command lines);
4. files: private state dir, no deletion outside the checkpoint root, stop removes only this job's containers;
5. bad input: exit 2 with FILE[:LINE]: message, never a traceback.
"""
from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import shlex
import shutil
import stat
import string
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st

from clusterctl.config.inventory import Host
from clusterctl.config.spec import loads_job
from clusterctl.launch import runtimes
from clusterctl.launch.plan import build_plan
from clusterctl.transport.base import quote
from tests import testbed as testbed_pkg
from tests.testbed import IMAGE, profile
from tests.testbed import system as tb_system

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "quickstart" / "train.py"
TORCHRUN = str(Path(sys.prefix) / "bin" / "torchrun")
N = 3

# The training script of these tests: writes its argv, environment and cwd as JSON to $SECTEST_OUT-rank<R>.json
# (and what it sees at $SECTEST_LS), then sleeps $SECTEST_SLEEP seconds.
DUMP = '''import json, os, sys, time
out = os.environ["SECTEST_OUT"]
path = "%s-rank%s.json" % (out, os.environ.get("RANK", "0"))
ls = os.environ.get("SECTEST_LS")
data = {"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd(),
        "ls": sorted(os.listdir(ls)) if ls and os.path.isdir(ls) else None}
with open(path + ".tmp", "w") as f:
    json.dump(data, f)
os.replace(path + ".tmp", path)
time.sleep(float(os.environ.get("SECTEST_SLEEP", "0")))
'''


# ------------------------------------------------------------------------------------------------ fixtures
@pytest.fixture(scope="module")
def tb(tmp_path_factory, testbed_slot):
    """3 CPU hosts (gpus=0: no GPU flags) of our own, so faults and foreign containers touch nobody else; a dockerd
    per host for the docker arms (secrets, foreign containers)."""
    letter = string.ascii_lowercase[testbed_slot]
    octet = tb_system.claim_octet(range(160 + 3 * testbed_slot, 215))
    bed = testbed_pkg.Testbed(N, tmp_path_factory.mktemp("sectb"), [profile(gpus=0)] * N, prefix=f"tbs{letter}",
                  subnet_octet=octet, docker=True)
    try:
        bed.up()
    except Exception as e:  # noqa: BLE001 - a failure with the reason, never a skip
        pytest.fail(f"testbed could not be built: {type(e).__name__}: {e}", pytrace=False)
    (bed.shared / "dump.py").write_text(DUMP)
    yield bed
    bed.down()


@pytest.fixture(autouse=True)
def no_job_left_behind(request):
    """A test that fails midway leaves its job running (and its rendezvous port taken): remove it, so the next
    test fails only for its own reasons."""
    yield
    if "tb" in request.fixturenames:
        request.getfixturevalue("tb").reset_jobs()


@pytest.fixture
def home(tmp_path):
    """An empty HOME: ~/.ssh/known_hosts does not exist, so only the inventory's known_hosts counts."""
    h = tmp_path / "home"
    h.mkdir()
    return h


def clusterctl(*args, env: dict | None = None, home: Path | None = None, timeout: float = 180,
               state: Path | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if not k.startswith(("SECTEST", "CLUSTERCTL_"))}
    if home is not None:
        e["HOME"] = str(home)
    e.update(env or {})
    pre = ["--state-dir", str(state)] if state is not None else []
    r = subprocess.run([sys.executable, "-m", "clusterctl.cli", *pre, *map(str, args)], capture_output=True,
                       text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=e, cwd=REPO)
    assert "Traceback" not in r.stderr, r.stderr
    return r


def job_file(path: Path, tb, name: str, *, nodes: int = N, runtime: str = "podman", **over) -> Path:
    spec = {"name": name, "nodes": nodes, "nproc_per_node": 1, "image": IMAGE,
            "script": str(tb.shared / "dump.py"), "args": [],
            "env": {"SECTEST_OUT": str(tb.shared / name / "dump"), "SECTEST_SLEEP": "0"},
            "rendezvous": {"port": 29400, "join_timeout": 60, "last_call_timeout": 2},
            "restarts": {"max_restarts": 0, "max_failures": 0, "max_node_failures": 0},
            "supervisor": {"probe_interval_s": 1}, "container": {"ulimits": {}}}
    if runtime == "bare":
        spec["torchrun"] = TORCHRUN
    if runtime == "docker":
        spec["mounts"] = tb.job_mounts(runtime)      # dockerd has no containers.conf volumes
    for k, v in over.items():
        if isinstance(v, dict) and isinstance(spec.get(k), dict):
            spec[k] = {**spec[k], **v}
        else:
            spec[k] = v
    shutil.rmtree(tb.shared / name, ignore_errors=True)   # another param's dumps would satisfy wait_dump at once
    (tb.shared / name).mkdir()
    path.write_text(yaml.safe_dump(spec, sort_keys=False))
    return path


def fingerprint_of(pub_line: str) -> str:
    blob = base64.b64decode(pub_line.split()[1])
    return "SHA256:" + base64.b64encode(hashlib.sha256(blob).digest()).decode().rstrip("=")


def containers(tb, host: str, runtime: str = "podman") -> list[str]:
    return tb.container_names(host, runtime)


def wait_supervisors_gone(state: Path, timeout: float = 90) -> None:
    """`resume` only reports a live supervisor (it connects to nothing): wait for the old one to exit first."""
    end = time.monotonic() + timeout
    for f in state.glob("jobs/*/supervisor.pid"):
        pid = int(f.read_text())
        while Path(f"/proc/{pid}").exists() and b"supervise" in Path(f"/proc/{pid}/cmdline").read_bytes():
            assert time.monotonic() < end, f"supervisor {pid} still running"
            time.sleep(0.2)


def wait_dump(prefix: Path, ranks: int = 1, timeout: float = 90) -> list[dict]:
    end = time.monotonic() + timeout
    paths = [Path(f"{prefix}-rank{r}.json") for r in range(ranks)]
    while not all(p.exists() for p in paths):
        assert time.monotonic() < end, f"no dump {paths}"
        time.sleep(0.2)
    return [json.loads(p.read_text()) for p in paths]


# ------------------------------------------------------------------------------------------------ 1. host identity
def assert_changed_key_message(text: str, tb, kh: Path) -> None:
    h2 = tb.hosts[1]
    offered = fingerprint_of((h2.dir / "ssh_host_ed25519_key.pub").read_text())
    recorded = fingerprint_of((tb.hosts[0].dir / "ssh_host_ed25519_key.pub").read_text())
    assert "HOST KEY CHANGED" in text, text
    assert offered in text and recorded in text, text          # both fingerprints
    assert f"{kh}:2" in text, text                             # the known_hosts file and line
    assert f"ssh-keygen -R {shlex.quote(h2.address)} -f {kh}" in text, text   # how to fix it
    assert "ssh-keyscan" not in text, text   # appending the new key would leave the stale one next to it


def test_changed_host_key_refused_by_every_connecting_command(tb, tmp_path, home):
    good = tb.known_hosts.read_text()
    kh = tmp_path / "known_hosts"
    kh.write_text(good)
    inv = tb.inventory(tmp_path / "inv.yaml", extra_vars={"clusterctl_known_hosts": str(kh)})
    state = tmp_path / "state"
    job = job_file(tmp_path / "job.yaml", tb, "hk-changed", env={"SECTEST_SLEEP": "600"})
    r = clusterctl("launch", job, "-i", inv, "-d", home=home, state=state)
    assert r.returncode == 0, r.stderr
    wait_dump(tb.shared / "hk-changed" / "dump", ranks=N)

    # node2's line now holds node1's key: a changed key for node2 (a MITM, or a reinstall)
    lines = good.splitlines()
    lines[1] = lines[1].split()[0] + " " + lines[0].split(None, 1)[1]
    bad = "\n".join(lines) + "\n"
    kh.write_text(bad)
    job2 = job_file(tmp_path / "job2.yaml", tb, "hk-changed2")
    for args in (["preflight", "-i", inv], ["preflight", "-i", inv, "--accept-new-host-keys"],
                 ["launch", job2, "-i", inv], ["launch", job2, "-i", inv, "--skip-preflight"],
                 ["--accept-new-host-keys", "launch", job2, "-i", inv, "--skip-preflight"],
                 ["stop", "hk-changed", "--grace", "1"], ["resume", "hk-changed", "-d"],
                 ["resume", "hk-changed", "-d", "--accept-new-host-keys"]):
        if args[0] == "resume":
            wait_supervisors_gone(state)
        t0 = time.monotonic()
        r = clusterctl(*args, home=home, state=state, timeout=60)
        assert r.returncode != 0, (args, r.stdout, r.stderr)
        assert_changed_key_message(r.stdout + r.stderr, tb, kh)
        assert time.monotonic() - t0 < 30, f"{args}: refused only after waiting"
        assert kh.read_text() == bad, f"{args} modified {kh}"
        assert not (home / ".ssh" / "known_hosts").exists(), f"{args} recorded a key"
    # nothing of the second job started (the first job's supervisor may have cleaned up after `stop` marked it
    # stopped: its connections were verified with the good key when it opened them)
    assert not any("hk-changed2" in c for h in tb.hosts for c in containers(tb, h.name))

    kh.write_text(good)   # the key is verified out of band and fixed: stop now works and cleans everything
    r = clusterctl("stop", "hk-changed", "--grace", "1", home=home, state=state)
    assert r.returncode == 0, r.stderr
    assert not any(c.startswith("clusterctl-hk-changed") for h in tb.hosts for c in containers(tb, h.name))


def test_unknown_host_key_refused_unless_accept_new(tb, tmp_path, home):
    state = tmp_path / "state"
    # an inventory without clusterctl_known_hosts: the keys are in ~/.ssh/known_hosts at launch, then HOME is
    # emptied (the job record keeps the hosts as resolved at launch: the known_hosts files must change, not the
    # inventory): no key is known for any host
    with_kh = tb.inventory(tmp_path / "inv.yaml")
    data = yaml.safe_load(with_kh.read_text())
    del data["all"]["vars"]["clusterctl_known_hosts"]
    with_kh.write_text(yaml.safe_dump(data))
    user_kh = home / ".ssh" / "known_hosts"
    user_kh.parent.mkdir(mode=0o700)
    user_kh.write_text(tb.known_hosts.read_text())
    job = job_file(tmp_path / "job.yaml", tb, "hk-unknown", env={"SECTEST_SLEEP": "600"})
    r = clusterctl("launch", job, "-i", with_kh, "-d", home=home, state=state)
    assert r.returncode == 0, r.stderr
    wait_dump(tb.shared / "hk-unknown" / "dump", ranks=N)
    shutil.rmtree(user_kh.parent)
    job2 = job_file(tmp_path / "job2.yaml", tb, "hk-unknown2")
    for args in (["preflight", "-i", with_kh], ["launch", job2, "-i", with_kh],
                 ["launch", job2, "-i", with_kh, "--skip-preflight"],
                 ["stop", "hk-unknown", "--grace", "1"], ["resume", "hk-unknown", "-d"]):
        if args[0] == "resume":
            wait_supervisors_gone(state)
        r = clusterctl(*args, home=home, state=state, timeout=60)
        assert r.returncode != 0, (args, r.stdout, r.stderr)
        text = r.stdout + r.stderr
        for h in tb.hosts if args[0] == "preflight" else tb.hosts[:1]:
            assert f"unknown host key for {h.address}" in text, text
            assert fingerprint_of((h.dir / "ssh_host_ed25519_key.pub").read_text()) in text, text
        assert "--accept-new-host-keys" in text and str(user_kh) in text, text
        assert not user_kh.exists() or user_kh.read_text() == "", f"{args} recorded a key"

    # with the flag: recorded (like OpenSSH accept-new), then used without the flag
    r = clusterctl("preflight", "-i", with_kh, "--accept-new-host-keys", home=home, state=state)
    assert r.returncode == 0 and "unknown host key" not in r.stdout + r.stderr, r.stdout + r.stderr
    recorded = user_kh.read_text().splitlines()
    assert sorted(recorded) == sorted(ln for ln in tb.known_hosts.read_text().splitlines()), recorded
    assert stat.S_IMODE(user_kh.parent.stat().st_mode) == 0o700
    r = clusterctl("stop", "hk-unknown", "--grace", "1", home=home, state=state)
    assert r.returncode == 0, r.stderr
    assert not any(c.startswith("clusterctl-hk-unknown") for h in tb.hosts for c in containers(tb, h.name))


def swap_host_key(tb, h, key_type: str, tmp: Path) -> str:
    """Restart ``h``'s sshd with only a fresh ``key_type`` host key (its sessions die with the old one: every
    client must reconnect). Returns the new public key line; ``restore_host_key`` undoes it."""
    key = tmp / f"{h.name}_host_{key_type}_key"
    subprocess.run(["ssh-keygen", "-q", "-t", key_type, "-N", "", "-f", str(key)], check=True, timeout=60,
                   stdout=subprocess.DEVNULL)
    cfg = h.dir / "sshd_config"
    orig = h.dir / "sshd_config.orig"
    if not orig.exists():
        orig.write_text(cfg.read_text())
    old = f"HostKey {h.dir / 'ssh_host_ed25519_key'}"
    assert old in orig.read_text()
    cfg.write_text(orig.read_text().replace(old, f"HostKey {key}"))
    _restart_sshd(tb, h)
    return key.with_suffix(".pub").read_text()


def restore_host_key(tb, h) -> None:
    orig = h.dir / "sshd_config.orig"
    if orig.exists():
        (h.dir / "sshd_config").write_text(orig.read_text())
        orig.unlink()
        _restart_sshd(tb, h)


def _restart_sshd(tb, h) -> None:
    tb.kill(h.name, r"^sshd|/sshd ")                 # the listener and every session
    end = time.monotonic() + 10
    while tb.sshd_pid(h.name) is not None:
        assert time.monotonic() < end, "sshd did not stop"
        time.sleep(0.05)
    tb.start_sshd(h.name)


def test_host_key_of_another_type_is_changed_even_with_accept_new(tb, tmp_path, home):
    """Issue 11 item 1, on a real sshd: node3 is recorded with ed25519, then serves only an ECDSA key (a MITM that
    offers another type). Every command refuses it as CHANGED, with and without --accept-new-host-keys, and records
    nothing; the supervisor of a job launched with --accept-new-host-keys does not run in accept-new mode, so its
    reconnects to node3 refuse the new key too."""
    h3 = tb.hosts[2]
    kh = tmp_path / "known_hosts"
    kh.write_text(tb.known_hosts.read_text())
    good = kh.read_text()
    inv = tb.inventory(tmp_path / "inv.yaml", extra_vars={"clusterctl_known_hosts": str(kh)})
    state = tmp_path / "state"
    job = job_file(tmp_path / "job.yaml", tb, "hk-type", env={"SECTEST_SLEEP": "600"})
    r = clusterctl("--accept-new-host-keys", "launch", job, "-i", inv, "-d", home=home, state=state)
    assert r.returncode == 0, r.stdout + r.stderr
    (pid_file,) = state.glob("jobs/*/supervisor.pid")
    sup = int(pid_file.read_text())
    assert b"accept-new" not in Path(f"/proc/{sup}/cmdline").read_bytes(), "the supervisor runs in accept-new mode"
    wait_dump(tb.shared / "hk-type" / "dump", ranks=N)
    t_swap = time.time()
    try:
        new_pub = swap_host_key(tb, h3, "ecdsa", tmp_path)
        offered = fingerprint_of(new_pub)
        recorded = fingerprint_of((h3.dir / "ssh_host_ed25519_key.pub").read_text())
        job2 = job_file(tmp_path / "job2.yaml", tb, "hk-type2")
        for args in (["preflight", "-i", inv], ["preflight", "-i", inv, "--accept-new-host-keys"],
                     ["--accept-new-host-keys", "preflight", "-i", inv],
                     ["launch", job2, "-i", inv, "--accept-new-host-keys"],
                     ["--accept-new-host-keys", "launch", job2, "-i", inv, "--skip-preflight"]):
            r = clusterctl(*args, home=home, state=state, timeout=60)
            text = r.stdout + r.stderr
            assert r.returncode != 0, (args, text)
            assert f"HOST KEY CHANGED for {h3.address}" in text and "unknown host key" not in text, (args, text)
            assert offered in text and recorded in text, (args, text)
            assert f"{kh}:3" in text and f"ssh-keygen -R {shlex.quote(h3.address)} -f {kh}" in text, (args, text)
            assert kh.read_text() == good, f"{args} recorded the new key"
            assert not (home / ".ssh" / "known_hosts").exists(), f"{args} recorded a key"
        assert not any("hk-type2" in c for h in tb.hosts for c in containers(tb, h.name))
        # the supervisor lost its sessions to node3 with the old sshd: it has reconnected (and been refused)
        # by the time it declares node3 lost
        end = time.monotonic() + 90
        while True:
            evs = json.loads(clusterctl("events", "hk-type", "-o", "json", home=home, state=state).stdout)
            if any(e["time"] >= t_swap and (e["node"] == h3.name or h3.name in e["message"]) for e in evs):
                break
            assert time.monotonic() < end, evs
            time.sleep(1)
        assert kh.read_text() == good, "the supervisor recorded node3's new key"
        assert not (home / ".ssh" / "known_hosts").exists()
    finally:
        restore_host_key(tb, h3)
        r = clusterctl("stop", "hk-type", "--grace", "1", home=home, state=state)
    assert r.returncode == 0, r.stdout + r.stderr
    wait_supervisors_gone(state)
    assert not any(c.startswith("clusterctl-hk-type") for h in tb.hosts for c in containers(tb, h.name))


# ------------------------------------------------------------------------------------------------ 2. no injection
def canary_payloads(canary: Path) -> list[str]:
    c = shlex.quote(str(canary))
    return [f"$(touch {c})", f"`touch {c}`", f"; touch {c}", f"&& touch {c}", f"| touch {c}", f"\ntouch {c}\n",
            f"'; touch {c}; '", f'"; touch {c}; "', f"$(touch {c})'\"`", f"-oProxyCommand=touch {c}",
            f"--rdzv-endpoint=$(touch {c})", "--", "-", "-m", "--help", "", " ", "'", '"', "\\", "\\'", "$HOME",
            "${IFS}", "*", "~", "%s%n", "\t\r", "ünï©ødé 💥", "a\n\nb\n\n", "\x1b[31mred", "\x7f\x01\x02"]


hostile = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=16),
    st.text(st.sampled_from(list("$()`;&|<>\n'\"\\ -*?~#=!{}[]")), min_size=1, max_size=10),
    st.builds(lambda s: "-" + s, st.text(max_size=8).filter(lambda s: "\x00" not in s)),
)


def check_roundtrip(text: str, want_args: list[str], want_env: dict[str, str]) -> None:
    spec = loads_job(text, "job.yaml")   # the job file carries the values unchanged
    assert list(spec.args) == want_args
    assert {k: spec.env[k] for k in want_env} == want_env


FAKE_TORCHRUN = '''import json, os, sys
with open(os.environ["SECTEST_OUT"], "w") as f:
    json.dump({"argv": sys.argv, "env": dict(os.environ), "cwd": os.getcwd()}, f)
'''
FAKE_PODMAN = '''import json, os, sys
# what the container's first shell does: read the mounted env file and delete it
mount = [a for a in sys.argv if a.startswith("--volume=") and a.endswith(":/run/clusterctl-env")][0]
env_file = os.path.join(mount[len("--volume="):-len(":/run/clusterctl-env")], "env")
script = open(env_file, "rb").read().decode("utf-8", "surrogateescape")
os.unlink(env_file)
with open(os.environ["SECTEST_PODMAN_OUT"], "w") as f:
    json.dump({"argv": sys.argv[1:], "script": script, "env_has_script": "CLUSTERCTL_ENV_SCRIPT" in os.environ}, f)
'''


@pytest.fixture(scope="module")
def local_bin(tmp_path_factory):
    d = tmp_path_factory.mktemp("bin")
    (d / "fake_torchrun.py").write_text(FAKE_TORCHRUN)
    (d / "podman").write_text(f"#!{sys.executable} -S\n" + FAKE_PODMAN)
    (d / "podman").chmod(0o755)
    return d


# the shell variable names our node-side snippets use (and a few more): a job env var may have any of them
SHELL_NAMES = ["S", "f", "d", "p", "r", "c", "i", "w", "n", "a", "e", "rc", "cid", "ec", "st", "sig", "pid", "jid",
               "att", "name", "wd", "runner", "ended", "_cc_lib", "ids", "v"]


@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))
@given(args=st.lists(hostile, min_size=1, max_size=6), values=st.lists(hostile, min_size=1, max_size=4),
       names=st.lists(st.sampled_from(SHELL_NAMES), unique=True, max_size=4),
       secret=hostile, wd=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00\n\r/,"),
                                  min_size=1, max_size=10),
       iface=st.text(st.sampled_from(list("$();`'\"&|ab0")), min_size=1, max_size=8))
def test_plan_and_start_scripts_pass_values_verbatim(tmp_path_factory, local_bin, args, values, names, secret, wd,
                                                     iface):
    """The plan + the runtimes' node-side scripts, executed by a real `sh` the way sshd does (`sh -c
    shlex.join(argv)`, env script + checkpoint installer on stdin): every value arrives as one argv element / env
    value under its name (whatever the name), and nothing runs: every arg and env value also carries the payloads
    that would create the canary if any were executed."""
    from clusterctl.supervise.recovery import CHECKPOINT_INSTALLER

    tmp = tmp_path_factory.mktemp("inj")
    canary = tmp / "CANARY"
    payloads = [p.replace("/CANARY-PATH", str(canary)) for p in canary_payloads(Path("/CANARY-PATH"))]
    assert all(str(canary) in p for p in payloads[:11])
    args = args + payloads
    workdir = tmp / ("w" + wd)
    workdir.mkdir()
    env = {(names[i] if i < len(names) else f"SECTEST_V{i}"): v for i, v in enumerate(values)}
    env.update({f"SECTEST_P{i}": p for i, p in enumerate(payloads)})
    env["SECTEST_OUT"] = str(tmp / "torchrun.json")
    text = yaml.safe_dump({"name": "inj", "script": "/abs/train.py", "args": args, "env": env,
                           "secret_env": ["SECTEST_SECRET"], "workdir": str(workdir),
                           "checkpoint": {"dir": str(tmp / ("ck" + wd))},
                           "torchrun": [sys.executable, "-S", str(local_bin / "fake_torchrun.py")]})
    check_roundtrip(text, args, env)
    spec = loads_job(text, "job.yaml")
    for rt in ("bare", "podman"):
        out = Path(env["SECTEST_OUT"])
        out.unlink(missing_ok=True)
        host = Host(name="n1", address="127.0.0.1", connection="local", runtime=rt, gpus=0, interface=iface)
        plan = build_plan(spec, [host], job_id="inj-1", attempt=1, jobs_root=str(tmp / "jobs"))
        node = plan.nodes[0]
        stdin = node.env_script({"SECTEST_SECRET": secret}, CHECKPOINT_INSTALLER)
        penv = dict(os.environ, PATH=f"{local_bin}:{os.environ['PATH']}", SECTEST_PODMAN_OUT=str(tmp / "podman.json"),
                    TMPDIR=str(tmp))
        r = subprocess.run(["sh", "-c", quote(node.runtime_argv)], input=stdin, capture_output=True, env=penv,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        if rt == "podman":
            got = json.loads((tmp / "podman.json").read_text())
            assert got["argv"][0] == "run" and got["argv"][1].startswith("--volume=")
            # the start script's own arguments: program, "run", the rank view's dir and its link (node side of
            # issue 37), then podman's; the view dir arrives mounted at its own path and named in the env
            view = node.runtime_argv[6]
            assert view and list(node.runtime_argv[4:6]) == ["podman", "run"]
            assert got["argv"][2:] == [f"--volume={view}:{view}", f"--env=CLUSTERCTL_VIEW_DIR={view}",
                                       *node.runtime_argv[8:]], "podman got different argv elements"
            assert not got["env_has_script"], "the env script must not reach the container config"
            apply = runtimes.NO_CORE_DUMPS + runtimes.CONTAINER_APPLY        # core dumps off, then the env
            inner = ["sh", "-c", apply, "clusterctl-env", *node.torchrun_argv]
            assert got["argv"][-len(inner):] == inner and got["argv"][-len(inner) - 1] == spec.image
            assert f"--workdir={workdir}" in got["argv"]
            # what the container's init runs: the same inner shell, reading the env file from its mount
            mnt = tmp / "mnt"
            mnt.mkdir(exist_ok=True)
            (mnt / "env").write_bytes(got["script"].encode("utf-8", "surrogateescape"))
            inner[2] = apply.replace(runtimes.ENV_MOUNT, str(mnt))
            r = subprocess.run(inner, env={"PATH": os.environ["PATH"], "TMPDIR": str(tmp)}, cwd=workdir,
                               capture_output=True, timeout=30)
            assert r.returncode == 0, r.stderr
            assert not (mnt / "env").exists(), "the container's shell deletes the env file once read"
        else:
            end = time.monotonic() + 20
            exit_file = tmp / "jobs" / "inj-1" / "1" / "exit"
            while not exit_file.exists():
                assert time.monotonic() < end, (tmp / "jobs" / "inj-1" / "1" / "node.log").read_text()
                time.sleep(0.02)
            assert exit_file.read_text().strip() == "0"
        dump = json.loads(out.read_text())
        assert dump["argv"][1:] == list(node.torchrun_argv[3:]), "torchrun got different argv"
        assert dump["argv"][-len(args):] == args
        for k, v in env.items():
            assert dump["env"][k] == v
        assert dump["env"]["SECTEST_SECRET"] == secret
        assert dump["env"]["CLUSTERCTL_CHECKPOINT_DIR"] == str(tmp / ("ck" + wd))
        assert dump["env"]["GLOO_SOCKET_IFNAME"] == iface
        assert runtimes.ENV_SCRIPT_VAR not in dump["env"]
        assert dump["cwd"] == str(workdir)
        assert not canary.exists(), "an injected command ran"


@pytest.mark.parametrize("runtime", ["podman", "bare"])
def test_hostile_values_reach_training_verbatim_on_testbed(tb, tmp_path, home, runtime):
    """One real launch per runtime with many hostile values (fixed ones + a hypothesis-generated batch)."""
    canary = tb.shared / f"PWNED-{uuid.uuid4().hex[:8]}"
    name = f"inj-{runtime}"
    odd = f"d $(touch {canary.name});`touch {canary.name}`'q\"&&z"   # a path component: a relative canary
    mnt_src = tb.shared / ("m " + odd)
    mnt_src.mkdir()
    (mnt_src / "seen.txt").write_text("x")
    workdir = tb.shared / ("w " + odd)
    workdir.mkdir()
    state = tmp_path / "state"
    inv = tb.inventory(tmp_path / "inv.yaml", runtime=runtime, hosts=["node1"],
                       extra_vars={"clusterctl_interface": "eth0"})
    seen = {}

    @settings(max_examples=1, deadline=None, phases=[Phase.generate], database=None,
              suppress_health_check=list(HealthCheck))
    @given(batch=st.lists(hostile, min_size=25, max_size=25))
    def run(batch):
        args = canary_payloads(canary) + batch
        env = {f"SECTEST_V{i}": v for i, v in enumerate(args)}
        env.update(SECTEST_OUT=str(tb.shared / name / "dump"), SECTEST_LS="/mnt/s p'$(x)")
        extra = [f"--env=SECTEST_EXTRA={odd}"] if runtime != "bare" else []
        job = job_file(tmp_path / "job.yaml", tb, name, nodes=1, runtime=runtime, args=args, env=env,
                       workdir=str(workdir), mounts=[f"{mnt_src}:/mnt/s p'$(x):ro"],
                       checkpoint={"dir": str(tb.shared / ("ck " + odd))}, container={"extra_args": extra})
        check_roundtrip(job.read_text(), args, env)
        r = clusterctl("launch", job, "-i", inv, home=home, state=state, env={"HOME": str(home)})
        seen.update(r=r, args=args, env=env)

    (home / ".ssh").mkdir()
    (home / ".ssh" / "known_hosts").write_text(tb.known_hosts.read_text())
    run()
    r, args, env = seen["r"], seen["args"], seen["env"]
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    (dump,) = wait_dump(tb.shared / name / "dump", timeout=5)
    assert dump["argv"][1:] == args                      # every arg one element, byte for byte
    for k, v in env.items():
        assert dump["env"][k] == v, k
    assert dump["cwd"] == str(workdir)
    assert dump["env"]["CLUSTERCTL_CHECKPOINT_DIR"] == str(tb.shared / ("ck " + odd))
    if runtime != "bare":
        assert dump["env"]["SECTEST_EXTRA"] == odd
        assert dump["ls"] == ["seen.txt"]
    assert not canary.exists(), "an injected command ran"
    for d in (tb.shared, home):       # the canary is relative: look wherever a command could have run
        assert not list(d.rglob(canary.name)), d
    for d in (Path("/tmp"), REPO, tb.home, workdir, Path("/")):
        assert not (d / canary.name).exists(), d


@pytest.mark.parametrize("where,yaml_text,needle", [
    ("inventory", "all:\n  hosts:\n    'node1;touch /tmp/x':\n", "invalid host name"),
    ("inventory", "all:\n  hosts:\n    node1:\n      ansible_host: -oProxyCommand=id\n", "ansible_host"),
    ("inventory", "all:\n  hosts:\n    node1:\n      ansible_user: -lroot\n", "ansible_user"),
    ("inventory", "all:\n  hosts:\n    node1:\n      clusterctl_interface: 'eth0 x'\n", "clusterctl_interface"),
    ("inventory", "all:\n  hosts:\n    node1:\n      ansible_host: '*'\n", "ansible_host"),
    ("inventory", "all:\n  hosts:\n    node1:\n      ansible_host: '*.corp'\n", "ansible_host"),
    ("inventory", "all:\n  hosts:\n    node1:\n      ansible_host: 'a,b'\n", "ansible_host"),
    ("inventory", "all:\n  hosts:\n    node1:\n      ansible_host: '$(id)'\n", "ansible_host"),
    ("inventory", "all:\n  hosts:\n    node1:\n      clusterctl_proxy_jump: 'bastion:abc'\n", "port 'abc'"),
    ("inventory", "all:\n  hosts:\n    node1:\n      clusterctl_proxy_jump: '::1'\n", "brackets"),
    ("inventory", "all:\n  hosts:\n    node1:\n      clusterctl_proxy_jump: '*.corp'\n", "clusterctl_proxy_jump"),
    ("inventory", "all:\n  children:\n    'g;x':\n      hosts: {node1: }\n", "invalid group name"),
    ("job", "name: 'a;b'\nscript: /t.py\n", "invalid job name"),
    ("job", "name: a/b\nscript: /t.py\n", "must not contain '/'"),
    ("job", "name: ok\nscript: /t.py\nenv: {'A B': x}\n", "invalid environment variable name"),
    ("job", "name: ok\nscript: /t.py\nenv: {'$(id)': x}\n", "invalid environment variable name"),
    ("job", "name: ok\nscript: /t.py\nsecret_env: ['X;Y']\n", "invalid environment variable name"),
    ("job", "name: ok\nscript: -x.py\n", "must not start with '-'"),
    ("job", "name: ok\nscript: /t.py\nimage: '--privileged'\n", "invalid image reference"),
    ("job", "name: ok\nscript: /t.py\nimage: 'a b'\n", "invalid image reference"),
    ("job", "name: ok\nscript: /t.py\nmounts: ['/a:/b,/c']\n", "mount"),
    ("job", "name: ok\nscript: /t.py\nmounts: ['-v:/b']\n", "mount"),
    ("job", "name: ok\nscript: /t.py\nworkdir: 'rel'\n", "absolute"),
    ("job", "name: ok\nscript: /t.py\nhosts: ['-x']\n", "invalid host"),
    ("job", "name: ok\nscript: /t.py\ntorchrun: ['-x']\n", "program name"),
    ("job", "name: ok\nscript: /t.py\nmodule: 'a;b'\n", "module"),
])
def test_identifiers_validated_with_clear_errors(tmp_path, where, yaml_text, needle):
    f = tmp_path / f"{where}.yaml"
    f.write_text(yaml_text)
    if where == "inventory":
        r = clusterctl("inventory", "-i", f)
    else:
        inv = tmp_path / "inv.yaml"
        inv.write_text("all:\n  hosts:\n    node1:\n")
        r = clusterctl("launch", f, "-i", inv, "--dry-run")
    assert r.returncode == 2, r.stdout + r.stderr
    assert needle in r.stderr, r.stderr
    assert re.search(rf"{re.escape(str(f))}:\d+: ", r.stderr), r.stderr


# ------------------------------------------------------------------------------------------------ 3. secrets
@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_secret_reaches_training_only(tb, tmp_path, home, runtime):
    # the quote makes shlex.quote's form differ from the raw value: the unique prefix (which survives quoting)
    # is searched for as well, so a quoted leak (an env script in a log or a command line) is caught
    prefix = f"s3cr3t-{uuid.uuid4().hex}"
    secret = f"{prefix}-'$(touch /tmp/never)`;"
    state = tmp_path / "state"
    inv = tb.inventory(tmp_path / "inv.yaml", runtime=runtime)
    job = job_file(tmp_path / "job.yaml", tb, "secret", runtime=runtime, secret_env=["SECTEST_TOKEN"],
                   env={"SECTEST_SLEEP": "6"}, args=["--x", "y"])
    envs = {"SECTEST_TOKEN": secret}

    outputs = []
    r = clusterctl("launch", job, "-i", inv, "--dry-run", env=envs, home=home, state=state)
    assert r.returncode == 0 and "SECTEST_TOKEN=***" in r.stdout, r.stdout
    outputs.append(r)
    outputs.append(clusterctl("--debug", "launch", job, "-i", inv, "--dry-run", "-o", "json", env=envs,
                              home=home, state=state))
    r = clusterctl("launch", job, "-i", inv, env={}, home=home, state=state)     # missing secret: clean error
    assert r.returncode == 2 and "SECTEST_TOKEN" in r.stderr, r.stderr

    # sample every process command line on this machine (the testbed hosts share its pid namespace) while it runs,
    # and the container engine's view of every container on the nodes (`inspect`: config, env, args, mounts)
    stop, leaks, samples, inspected = threading.Event(), [], [0], set()

    def inspect_all():
        for h in tb.hosts:
            r = tb.exec(h.name, ["sh", "-c", 'ids=$("$0" ps -aq) && [ -n "$ids" ] && "$0" inspect $ids', runtime],
                        timeout=30)
            if r.returncode == 0 and "clusterctl.job_id" in r.stdout:
                inspected.add(h.name)
                if prefix in r.stdout:
                    leaks.append((h.name, "inspect", r.stdout))

    def sample():
        while not stop.is_set():
            if samples[0] % 10 == 5:
                inspect_all()
            for pid in os.listdir("/proc"):
                if pid.isdigit():
                    try:
                        cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
                    except OSError:
                        continue
                    if prefix.encode() in cmd:
                        leaks.append((pid, cmd))
            samples[0] += 1
            time.sleep(0.1)

    t = threading.Thread(target=sample, daemon=True)
    t.start()
    try:
        r = clusterctl("--debug", "launch", job, "-i", inv, env=envs, home=home, state=state)
    finally:
        stop.set()
        t.join()
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-2000:]
    outputs.append(r)
    assert samples[0] > 20 and not leaks, leaks
    assert inspected == {h.name for h in tb.hosts}, inspected        # every node's container was inspected
    for args in (["status"], ["status", "secret", "-o", "json"], ["events", "secret"], ["events", "secret", "-o",
                 "json"], ["logs", "secret"], ["inventory", "-i", inv]):
        rr = clusterctl(*args, env=envs, home=home, state=state)
        assert rr.returncode == 0, rr.stderr
        outputs.append(rr)
    outputs.append(clusterctl("stop", "secret", env=envs, home=home, state=state))
    for o in outputs:
        assert prefix not in o.stdout and prefix not in o.stderr, o.args
    files = [p for p in state.rglob("*") if p.is_file()]
    assert any(p.name == "state.db" for p in files) and any(p.name == "output.log" for p in files)
    assert any(p.name == "supervisor.log" for p in files)
    for p in files:
        assert prefix.encode() not in p.read_bytes(), p
    # the training process did get it, value for value (the dump is written by the script itself; remove it)
    dumps = wait_dump(tb.shared / "secret" / "dump", ranks=N, timeout=5)
    assert all(d["env"]["SECTEST_TOKEN"] == secret for d in dumps)
    assert all(runtimes.ENV_SCRIPT_VAR not in d["env"] for d in dumps)
    for rank in range(N):
        Path(f"{tb.shared / 'secret' / 'dump'}-rank{rank}.json").unlink()
    assert not Path("/tmp/never").exists()


# ------------------------------------------------------------------------------------------------ 4. files
@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_state_dir_private_and_stop_removes_only_this_jobs_containers(tb, tmp_path, home, runtime):
    state = tmp_path / "state"
    inv = tb.inventory(tmp_path / "inv.yaml", runtime=runtime)
    rt = [runtime, *([f"--volume={m}" for m in tb.job_mounts(runtime)])]   # foreign: `sleep` from the host's /usr
    # foreign containers on node1: same image; one named exactly what the old scheme (clusterctl-<job>-<node>) gave
    # this job on node1 (and job "fs-node1" on a node "1", or job "fs" from another state dir) and carrying
    # another job's labels, one named with our prefix, one with another job's labels
    foreign = {"foreign-plain": [], "clusterctl-fs-node1-x": [],
               "clusterctl-fs-node1": ["--label=clusterctl.job=fs", "--label=clusterctl.job_id=fs-other-state-dir"],
               "foreign-labelled": ["--label=clusterctl.job=fs", "--label=clusterctl.job_id=fs-other-id"]}
    for n, extra in foreign.items():
        tb.exec("node1", [rt[0], "run", "-d", "--network=host", f"--name={n}", *rt[1:], *extra, IMAGE, "sleep", "600"],
                check=True, timeout=60)
    try:
        job = job_file(tmp_path / "job.yaml", tb, "fs", runtime=runtime, env={"SECTEST_SLEEP": "600"})
        os.umask(0o022)
        r = clusterctl("launch", job, "-i", inv, "-d", home=home, state=state)
        assert r.returncode == 0, r.stderr
        wait_dump(tb.shared / "fs" / "dump", ranks=N)
        (job_id,) = [p.name for p in (state / "jobs").iterdir()]
        ours = f"clusterctl-{job_id}_node1"
        assert ours in containers(tb, "node1", runtime)
        r = clusterctl("stop", "fs", "--grace", "1", home=home, state=state)   # TERM first: by label, not name
        assert r.returncode == 0, r.stderr
        left = containers(tb, "node1", runtime)
        assert ours not in left
        assert set(foreign) <= set(left), left
        running = tb.exec("node1", [runtime, "ps", "--format", "{{.Names}}"]).stdout.split()
        assert set(foreign) <= set(running), running
    finally:
        tb.exec("node1", [runtime, "rm", "-f", *(["-t", "0"] if runtime == "podman" else []), *foreign], timeout=60)
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    for p in state.rglob("*"):
        mode = stat.S_IMODE(p.stat().st_mode)
        assert mode == (0o700 if p.is_dir() else 0o600), (p, oct(mode))


def test_checkpoint_cleanup_stays_inside_its_root(tb, tmp_path, home):
    """Retention (keep: 1) deletes old checkpoints of the job's root only: not a symlink that looks like a
    checkpoint, not what it points to, not other files in the root or next to it."""
    root = tb.shared / "ckroot"
    outside = tb.shared / "outside"
    for d in (root, outside / "step-000000001"):
        d.mkdir(parents=True)
    (outside / "step-000000001" / "precious").write_text("keep me")
    (root / "step-000000001").symlink_to(outside / "step-000000001")
    (root / "notes.txt").write_text("mine")
    inv = tb.inventory(tmp_path / "inv.yaml", hosts=["node1"])
    job = job_file(tmp_path / "job.yaml", tb, "ck", nodes=1, script=str(TRAIN),
                   args=["--steps", "6", "--checkpoint-every", "2"], checkpoint={"dir": str(root), "keep": 1})
    r = clusterctl("launch", job, "-i", inv, home=home, state=tmp_path / "state")
    assert (outside / "step-000000001" / "precious").read_text() == "keep me"
    assert (root / "notes.txt").read_text() == "mine"
    assert (root / "step-000000001").is_symlink()
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-2000:]


# ------------------------------------------------------------------------------------------------ 5. bad input
INV_OK = "all:\n  hosts:\n    node1:\n    node2:\n"
JOB_OK = "name: ok\nscript: /t.py\nnodes: 2\n"
BAD_INPUTS = [
    ("malformed inventory", "all:\n  hosts: [\n", JOB_OK, "inv", r"malformed YAML"),
    ("malformed job", INV_OK, "name: ok\nscript: /t.py\nargs: [a\n", "job", r"malformed YAML"),
    ("wrong type", INV_OK, "name: ok\nscript: /t.py\nnodes: [1]\n", "job", r"nodes"),
    ("wrong var type", "all:\n  hosts:\n    node1:\n      ansible_port: '22'\n", JOB_OK, "inv", r"ansible_port"),
    ("unknown job key", INV_OK, "name: ok\nscript: /t.py\nnodez: 2\n", "job", r"unknown key 'nodez'"),
    ("unknown inventory key", "all:\n  hostz: {}\n", JOB_OK, "inv", r"unknown key 'hostz'"),
    ("unknown var", "all:\n  vars:\n    clusterctl_runtme: bare\n  hosts: {n1: }\n", JOB_OK, "inv", "unknown variable"),
    ("empty inventory", "", JOB_OK, "inv", r"empty"),
    ("inventory without hosts", "all:\n  vars: {a: 1}\n", JOB_OK, "inv", r"no hosts"),
    ("port out of range", "all:\n  hosts:\n    node1:\n      ansible_port: 70000\n", JOB_OK, "inv", r"range"),
    ("rendezvous port out of range", INV_OK, "name: ok\nscript: /t.py\nrendezvous: {port: 0}\n", "job", r"port"),
    ("duplicate host", "all:\n  hosts:\n    node1:\n    node1:\n", JOB_OK, "inv", r"duplicate"),
    ("duplicate job key", INV_OK, "name: ok\nname: ok2\nscript: /t.py\n", "job", r"duplicate"),
    ("job name with slash", INV_OK, "name: a/b\nscript: /t.py\n", "job", r"'/'"),
    ("nodes larger than inventory", INV_OK, "name: ok\nscript: /t.py\nnodes: 5\n", "job", r"needs at least 5"),
    ("empty job", INV_OK, "", "job", r"empty"),
    ("job is a list", INV_OK, "- a\n", "job", r"mapping"),
    ("binary job", INV_OK, "\udcff", "job", r"cannot read|NUL|malformed|not UTF-8"),
]


@pytest.mark.parametrize("case,inv_text,job_text,bad,needle", BAD_INPUTS, ids=[c[0] for c in BAD_INPUTS])
def test_bad_input_exit_2_with_location(tmp_path, case, inv_text, job_text, bad, needle):
    inv, job = tmp_path / "inv.yaml", tmp_path / "job.yaml"
    inv.write_text(inv_text)
    job.write_bytes(job_text.encode("utf-8", "surrogateescape"))
    cmds = [["launch", job, "-i", inv]] + ([["preflight", job, "-i", inv]] if "nodes larger" not in case else [])
    for cmd in cmds:
        r = clusterctl(*cmd, state=tmp_path / "state", home=tmp_path)
        assert r.returncode == 2, (cmd, r.stdout, r.stderr)
        assert re.search(needle, r.stderr), r.stderr
        target = inv if bad == "inv" else job
        assert r.stderr.startswith(f"error: {target}:") or f"{target}:" in r.stderr, r.stderr


def test_missing_files_exit_2(tmp_path):
    inv = tmp_path / "inv.yaml"
    inv.write_text(INV_OK)
    for cmd in (["launch", tmp_path / "nope.yaml", "-i", inv], ["launch", tmp_path / "nope.yaml", "--dry-run"],
                ["inventory", "-i", tmp_path / "nope.yaml"], ["preflight", "-i", tmp_path / "nope.yaml"]):
        r = clusterctl(*cmd, state=tmp_path / "state", home=tmp_path)
        assert r.returncode == 2 and "nope.yaml: file not found" in r.stderr, r.stderr
    for cmd in (["status", "nope"], ["logs", "nope"], ["events", "nope"], ["stop", "nope"], ["resume", "nope"]):
        r = clusterctl(*cmd, state=tmp_path / "state", home=tmp_path)
        assert r.returncode == 2 and "no job" in r.stderr, (cmd, r.stderr)


@pytest.mark.parametrize("key_state", ["missing", "chmod000", "garbage", "directory"])
def test_unusable_private_key_is_a_clean_per_host_error(tb, tmp_path, home, key_state):
    key = tmp_path / "key"
    if key_state == "chmod000":
        key.write_bytes(tb.key.read_bytes())
        key.chmod(0)
    elif key_state == "garbage":
        key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n")
    elif key_state == "directory":
        key.mkdir()
    inv = tb.inventory(tmp_path / "inv.yaml", hosts=["node1"],
                       extra_vars={"ansible_ssh_private_key_file": str(key)})
    r = clusterctl("preflight", "-i", inv, home=home, state=tmp_path / "state", timeout=60)
    if key_state == "chmod000" and os.geteuid() == 0:   # root reads a mode-000 file: the key works
        assert r.returncode == 0, r.stdout + r.stderr
        return
    assert r.returncode == 2, r.stdout + r.stderr          # bad input: FILE:LINE of the var, before connecting
    assert f"{inv}:" in r.stderr and "ansible_ssh_private_key_file" in r.stderr, r.stderr
    assert "node1" in r.stderr and str(key) in r.stderr and "Traceback" not in r.stderr, r.stderr
    job = job_file(tmp_path / "job.yaml", tb, f"key-{key_state}", nodes=1)
    r = clusterctl("launch", job, "-i", inv, "--skip-preflight", home=home, state=tmp_path / "state", timeout=60)
    assert r.returncode == 2 and str(key) in r.stderr, r.stdout + r.stderr
