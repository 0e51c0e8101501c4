"""The runtimes' warm-recovery commands run for real with a fake ``podman`` on the PATH (it logs its argv)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import replace

import pytest

from clusterctl.launch import runtimes
from clusterctl.launch.runtimes import RunRequest

FAKE = '''#!/bin/sh
printf '%s\\n' "$*" >>"$LOG"
case $1 in ps) echo abc123;; run) echo c0ffee;; inspect) echo 4242;; esac
exit 0
'''


@pytest.fixture
def tmp_path(tmp_path):
    """A short private TMPDIR (pytest's paths are too long for a warm root: see ``test_warm_root``) beside
    pytest's own (its key ``tmp`` links there)."""
    d = tempfile.mkdtemp(prefix="ccw-")
    (tmp_path / "tmp").symlink_to(d)
    yield tmp_path
    shutil.rmtree(d, ignore_errors=True)


def _env(tmp_path):
    (tmp_path / "podman").write_text(FAKE)
    (tmp_path / "podman").chmod(0o755)
    return dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", LOG=str(tmp_path / "log"),
                TMPDIR=os.path.realpath(tmp_path / "tmp"))


def test_zygote_start_writes_zygote_py_into_a_fresh_private_dir_then_runs_the_container(tmp_path):
    rt = runtimes.get("podman")
    job_id, node = f"w-{os.getpid()}-x", "n 1"
    key = runtimes.warm_key(job_id, node)
    root = runtimes.warm_root(tmpdir=os.path.realpath(tmp_path / "tmp"))
    wdir, inside = f"{root}/{key}", f"/run/clusterctl-warm/{key}"
    req = RunRequest(job="w", job_id=job_id, attempt=1, node=node, name="c", image="img:1", workdir="/w",
                     node_dir="/nd", command=("torchrun",), gpus=0, ulimits=())
    r = subprocess.run(rt.zygote_start_argv(req, key), input=b'{"PYTHONHASHSEED": "7"}\nprint(\'zygote\')\n',
                       env=_env(tmp_path), capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert open(f"{wdir}/py/zygote.py").read() == "print('zygote')\n"
    assert open(f"{wdir}/py/env.json").read() == '{"PYTHONHASHSEED": "7"}\n'        # the job's, for the zygote
    assert oct(os.stat(f"{wdir}/py/env.json").st_mode & 0o777) == "0o600"
    assert all(oct(os.stat(d).st_mode & 0o777) == "0o700" for d in (root, wdir, f"{wdir}/py", f"{wdir}/s"))
    line, inspect = (tmp_path / "log").read_text().splitlines()
    # the container's id printed, its host pid kept beside the warm dir's parts (the watch reads the warm ranks'
    # /proc state through it: runtimes.RANK_OS)
    assert r.stdout == b"c0ffee\n" and inspect == "inspect --format={{.State.Pid}} c0ffee"
    assert open(f"{wdir}/zpid").read() == "4242\n"
    assert line.startswith(f"run -d --name=clusterctl-zygote-{job_id}_{node} --label=clusterctl.warm={job_id} "
                           f"--label=clusterctl.node={node} --network=host")
    # the socket dir read-write, zygote.py's dir read-only: nothing a container writes is run on the host; the
    # socket dir at its host path too (every placeholder replaced): the warm ranks' view dirs are in there;
    # core dumps off as in a cold rank's container (its ranks inherit the zygote's soft limit), then zygote.py
    assert line.endswith(f"--volume={wdir}/s:{inside}/s --volume={wdir}/py:{inside}/py:ro "
                                  f"--volume={wdir}/s:{wdir}/s img:1 "
                                  f"sh -c ulimit -S -c 0 2>/dev/null; exec \"$@\" clusterctl-zygote "
                                  f"python3 {inside}/py/zygote.py serve {inside}/s/z.sock")
    with_core = replace(req, ulimits=(("core", "-1"),))
    assert rt.zygote_start_argv(with_core, key)[-4:] == ["python3", f"{inside}/py/zygote.py", "serve",
                                                         f"{inside}/s/z.sock"]
    r = subprocess.run(rt.zygote_remove_argv(job_id, node, key), env=_env(tmp_path), capture_output=True,
                       timeout=30)
    assert r.returncode == 0, r.stderr
    log = (tmp_path / "log").read_text().splitlines()
    assert log[2:] == [f"ps -aq --filter=label=clusterctl.warm={job_id} --filter=label=clusterctl.node={node}",
                       "rm -f --time=0 abc123"]
    assert not os.path.exists(wdir)


FAKE_ZYGOTE = '''import os, sys, time
d = os.path.dirname(os.path.abspath(sys.argv[0]))
def put(name, text):                   # whole or not at all (the test reads a file as soon as it exists)
    with open(os.path.join(d, name + ".tmp"), "w") as f:
        f.write(text)
    os.replace(os.path.join(d, name + ".tmp"), os.path.join(d, name))
if os.fork() == 0:                     # what a zygote forks (an agent, a rank) keeps its command line
    put("child", str(os.getpid()))
    time.sleep(60)
    os._exit(0)
put("args", " ".join(sys.argv[1:]) + " " + str(os.getpid()))
time.sleep(60)
'''


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_bare_zygote_runs_detached_by_torchruns_interpreter_and_remove_kills_what_it_forked(tmp_path):
    """bare: the zygote is a host process started by the interpreter of the job's torchrun (its #! line), detached
    (the command returns at once); removing it kills it and what it forked (same command line), then its dir."""
    import sys
    import time

    rt = runtimes.get("bare")
    job_id, node = f"wb-{os.getpid()}-x", "n1"
    env = _env(tmp_path)
    root = runtimes.warm_root(tmpdir=env["TMPDIR"])
    wdir = f"{root}/{runtimes.warm_key(job_id, node)}"
    torchrun = tmp_path / "bin" / "torchrun"
    torchrun.parent.mkdir()
    torchrun.write_text(f"#!{sys.executable}\nraise SystemExit('not run')\n")
    torchrun.chmod(0o755)
    req = RunRequest(job="w", job_id=job_id, attempt=1, node=node, name="c", image="img:1", workdir="/w",
                     node_dir="/nd", command=(str(torchrun), "--nnodes=2"), gpus=0, ulimits=())
    try:
        t0 = time.monotonic()
        r = subprocess.run(rt.zygote_start_argv(req, runtimes.warm_key(job_id, node)),
                           input=b"{}\n" + FAKE_ZYGOTE.encode(), capture_output=True, timeout=30, env=env)
        assert r.returncode == 0, r.stderr
        assert time.monotonic() - t0 < 5                          # detached: it did not wait for the zygote
        end = time.monotonic() + 10
        while not (os.path.exists(f"{wdir}/py/args") and os.path.exists(f"{wdir}/py/child")) and \
                time.monotonic() < end:
            time.sleep(0.05)
        args, pid = open(f"{wdir}/py/args").read().rsplit(" ", 1)
        assert args == f"serve {wdir}/s/z.sock"
        child = int(open(f"{wdir}/py/child").read())
        assert open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0] == sys.executable.encode()
        assert oct(os.stat(wdir).st_mode & 0o777) == "0o700"
        other = f"{root}/{runtimes.warm_key(job_id, 'n2')}"      # another node's zygote of the job is left alone
        os.makedirs(other)
        r = subprocess.run(rt.zygote_remove_argv(job_id, node, runtimes.warm_key(job_id, node)),
                           capture_output=True, timeout=30, env=env)
        assert r.returncode == 0, r.stderr
        end = time.monotonic() + 5
        while not (_gone(int(pid)) and _gone(child)) and time.monotonic() < end:
            time.sleep(0.05)
        assert _gone(int(pid)) and _gone(child)
        assert not os.path.exists(wdir) and os.path.exists(other)
    finally:
        subprocess.run(rt.zygote_remove_argv(job_id), timeout=30, env=env)      # every one of the job
        assert not os.listdir(root)


def test_bare_zygote_refuses_a_torchrun_that_is_not_a_python_script(tmp_path):
    rt = runtimes.get("bare")
    torchrun = tmp_path / "torchrun"
    torchrun.write_text("#!/bin/sh\nexec python3 -m torch.distributed.run \"$@\"\n")
    torchrun.chmod(0o755)
    env = _env(tmp_path)
    req = RunRequest(job="w", job_id="j", attempt=1, node="n1", name="c", image="i", workdir="/w", node_dir="/nd",
                     command=(str(torchrun),), gpus=0, ulimits=())
    r = subprocess.run(rt.zygote_start_argv(req, runtimes.warm_key("j", "n1")), input="", capture_output=True,
                       text=True, timeout=30, env=env)
    assert r.returncode == 125 and "is not a Python script" in r.stderr
    assert not os.path.exists(runtimes.warm_root(tmpdir=env["TMPDIR"]))


# ------------------------------------------------------------------------------------------------ the warm root
PLANT = "import os\nopen(os.environ['MARK'], 'w').write('ran')\n"


def _ping(env, key="k"):
    return subprocess.run(runtimes.zygote_ping_argv(key), env=env, capture_output=True, text=True, timeout=30)


def _plant(root: str, key: str, owner: int = 65534) -> None:
    """What another user leaves in a warm root it made: a zygote.py that reports when it runs, a socket path."""
    for d in (root, f"{root}/{key}", f"{root}/{key}/py", f"{root}/{key}/s"):
        os.makedirs(d, exist_ok=True)
        os.chown(d, owner, owner)
    os.chmod(root, 0o1777)
    with open(f"{root}/{key}/py/zygote.py", "w") as f:
        f.write(PLANT)
    with open(f"{root}/{key}/py/json.py", "w") as f:
        f.write(PLANT)


def test_a_warm_root_another_user_made_first_disables_warm_and_nothing_of_it_runs(tmp_path):
    """The root pre-created by uid 65534 (sticky, world-writable, as the old /tmp/clusterctl-warm): the ping, the
    zygote's start and a warm start all refuse it with the reason (exit 3 / 125), and its zygote.py never runs."""
    env = _env(tmp_path)
    env["MARK"] = str(tmp_path / "ran")
    job_id, node = "j-1", "n1"
    key = runtimes.warm_key(job_id, node)
    root = runtimes.warm_root(tmpdir=env["TMPDIR"])
    _plant(root, key)
    r = _ping(env, key)
    assert r.returncode == 3, r
    assert f"warm disabled: {root} is not a private directory of uid 0 (owner uid 65534, mode drwxrwxrwt)" in r.stderr
    req = RunRequest(job="w", job_id=job_id, attempt=1, node=node, name="c", image="img:1", workdir="/w",
                     node_dir="/nd", command=("torchrun",), gpus=0, ulimits=())
    torchrun = tmp_path / "torchrun"
    torchrun.write_text(f"#!{sys.executable}\n")
    torchrun.chmod(0o755)
    for rt in (runtimes.get("podman"), runtimes.get("bare")):
        start = rt.zygote_start_argv(req, key) if rt.containerized else \
            rt.zygote_start_argv(replace(req, command=(str(torchrun),)), key)
        r = subprocess.run(start, input="", env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 125 and "warm disabled" in r.stderr, r
        warm = rt.warm_run_argv(replace(req, command=tuple(runtimes.zygote_client(
            runtimes.warm_path(key, rt.containerized), "torchrun"))), key)
        r = subprocess.run(warm, input="", env=env, capture_output=True, text=True, timeout=30)
        assert r.returncode == 3 and "warm disabled" in r.stderr, r
        r = subprocess.run(rt.zygote_remove_argv(job_id, node, key), env=env, capture_output=True, timeout=30)
        assert r.returncode == 0 and os.path.exists(f"{root}/{key}/py/zygote.py")   # not ours: left alone
    assert "run" not in [line.split()[0] for line in (tmp_path / "log").read_text().splitlines()]
    assert not (tmp_path / "ran").exists()


@pytest.mark.parametrize("case", ["symlink", "mode", "parent"])
def test_a_warm_root_that_is_not_private_disables_warm(tmp_path, case):
    env = _env(tmp_path)
    root = runtimes.warm_root(tmpdir=env["TMPDIR"])
    if case == "symlink":                                # to a private dir of ours: still not followed
        os.mkdir(tmp_path / "elsewhere", 0o700)
        os.symlink(tmp_path / "elsewhere", root)
        why = "mode lrwxrwxrwx"
    elif case == "mode":
        os.mkdir(root, 0o755)
        os.chmod(root, 0o755)
        why = "mode drwxr-xr-x"
    else:                                                # anyone may rename our root away and put theirs there
        os.chmod(env["TMPDIR"], 0o777)
        why = "others may rename entries of"
    r = _ping(env)
    assert r.returncode == 3 and why in r.stderr, r


def test_a_fresh_warm_root_is_made_private_and_a_long_tmpdir_disables_warm(tmp_path):
    env = _env(tmp_path)
    root = runtimes.warm_root(tmpdir=env["TMPDIR"])
    r = _ping(env)
    assert r.returncode == 4 and "no warm root" in r.stderr     # none yet: no zygote (not "disabled")
    warm = runtimes.warm_exec("k", ["sh", "-c", 'printf "%s\\n" "$@"', "x", f"a{runtimes.WARM_PLACEHOLDER}/b",
                                    "--v=" + runtimes.WARM_PLACEHOLDER])
    os.mkdir(root, 0o700)
    r = subprocess.run(warm, env=env, capture_output=True, text=True, timeout=30)
    assert r.stdout.split() == [f"a{root}/k/b", f"--v={root}/k"], r
    r = _ping(env)
    assert r.returncode == 4 and "no zygote in" in r.stderr
    long = tmp_path / ("x" * 60)
    long.mkdir()
    r = _ping(dict(env, TMPDIR=str(long)))
    assert r.returncode == 3 and "bytes long: its socket paths would pass 107 bytes" in r.stderr


def test_socket_paths_are_short_whatever_the_job_and_node_names():
    """A 40-character job name and a 32-character node name (an FQDN alias): warm dirs are keyed by hashes, so the
    socket path is the same length as for any other job (the old <job_id>_<node> dir passed 107 bytes)."""
    job_id = "j" * 40 + "-20261204-081500-0123456789ab"       # as the store makes it: <name>-<stamp>-<12 hex>
    node = "node-with-a-long-name.example.io"
    assert len(node) == 32
    key = runtimes.warm_key(job_id, node)
    assert len(key) == 19 and key.startswith(runtimes.warm_job_key(job_id) + "-")
    host = f"{runtimes.warm_root(uid=4294967294, tmpdir='/tmp')}/{key}/s/z.sock"
    inside = f"{runtimes.warm_path(key, True)}/s/z.sock"
    assert len(host.encode()) <= 107 and len(inside.encode()) <= 107, (host, inside)
    assert len(f"/tmp/clusterctl-warm/{job_id}_{node}/z.sock") > 107      # what it was
    assert len(runtimes.warm_root(uid=4294967294, tmpdir="/" + "t" * 50)) <= runtimes.MAX_WARM_ROOT
