"""The runtimes' warm-recovery commands run for real with a fake ``podman`` on the PATH (it logs its argv)."""
from __future__ import annotations

import os
import subprocess

from clusterctl.launch import runtimes
from clusterctl.launch.runtimes import RunRequest

FAKE = '''#!/bin/sh
printf '%s\\n' "$*" >>"$LOG"
case $1 in ps) echo abc123;; esac
exit 0
'''


def _env(tmp_path):
    (tmp_path / "podman").write_text(FAKE)
    (tmp_path / "podman").chmod(0o755)
    return dict(os.environ, PATH=f"{tmp_path}:{os.environ['PATH']}", LOG=str(tmp_path / "log"))


def test_zygote_start_writes_zygote_py_into_a_fresh_private_dir_then_runs_the_container(tmp_path):
    rt = runtimes.get("podman")
    job_id, node = f"w-{os.getpid()}-x", "n 1"
    wdir = runtimes.warm_dir(job_id, node)
    req = RunRequest(job="w", job_id=job_id, attempt=1, node=node, name="c", image="img:1", workdir="/w",
                     node_dir="/nd", command=("torchrun",), gpus=0, ulimits=())
    try:
        r = subprocess.run(rt.zygote_start_argv(req, wdir), input=b"print('zygote')\n", env=_env(tmp_path),
                           capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr
        assert open(f"{wdir}/zygote.py").read() == "print('zygote')\n"
        assert oct(os.stat(wdir).st_mode & 0o777) == "0o700"
        line = (tmp_path / "log").read_text()
        assert line.startswith(f"run -d --name=clusterctl-zygote-{job_id}_{node} --label=clusterctl.warm={job_id} "
                               f"--label=clusterctl.node={node} --network=host")
        assert line.rstrip().endswith(f"--volume={wdir}:{wdir} img:1 python3 {wdir}/zygote.py serve {wdir}/z.sock")
        r = subprocess.run(rt.zygote_remove_argv(job_id, node, wdir), env=_env(tmp_path), capture_output=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        log = (tmp_path / "log").read_text().splitlines()
        assert log[1:] == [f"ps -aq --filter=label=clusterctl.warm={job_id} --filter=label=clusterctl.node={node}",
                           "rm -f --time=0 abc123"]
        assert not os.path.exists(wdir)
    finally:
        subprocess.run(["rm", "-rf", "--", wdir])


FAKE_ZYGOTE = '''import os, sys, time
d = os.path.dirname(os.path.abspath(sys.argv[0]))
if os.fork() == 0:                     # what a zygote forks (an agent, a rank) keeps its command line
    open(os.path.join(d, "child"), "w").write(str(os.getpid()))
    time.sleep(60)
    os._exit(0)
open(os.path.join(d, "args"), "w").write(" ".join(sys.argv[1:]) + " " + str(os.getpid()))
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
    wdir = runtimes.warm_dir(job_id, node)
    torchrun = tmp_path / "bin" / "torchrun"
    torchrun.parent.mkdir()
    torchrun.write_text(f"#!{sys.executable}\nraise SystemExit('not run')\n")
    torchrun.chmod(0o755)
    req = RunRequest(job="w", job_id=job_id, attempt=1, node=node, name="c", image="img:1", workdir="/w",
                     node_dir="/nd", command=(str(torchrun), "--nnodes=2"), gpus=0, ulimits=())
    try:
        t0 = time.monotonic()
        r = subprocess.run(rt.zygote_start_argv(req, wdir), input=FAKE_ZYGOTE.encode(), capture_output=True,
                           timeout=30)
        assert r.returncode == 0, r.stderr
        assert time.monotonic() - t0 < 5                          # detached: it did not wait for the zygote
        end = time.monotonic() + 10
        while not (os.path.exists(f"{wdir}/args") and os.path.exists(f"{wdir}/child")) and time.monotonic() < end:
            time.sleep(0.05)
        args, pid = open(f"{wdir}/args").read().rsplit(" ", 1)
        assert args == f"serve {wdir}/z.sock"
        child = int(open(f"{wdir}/child").read())
        assert open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")[0] == sys.executable.encode()
        assert oct(os.stat(wdir).st_mode & 0o777) == "0o700"
        other = runtimes.warm_dir(job_id, "n2")             # another node's zygote of the job is left alone
        os.makedirs(other)
        r = subprocess.run(rt.zygote_remove_argv(job_id, node, wdir), capture_output=True, timeout=30)
        assert r.returncode == 0, r.stderr
        end = time.monotonic() + 5
        while not (_gone(int(pid)) and _gone(child)) and time.monotonic() < end:
            time.sleep(0.05)
        assert _gone(int(pid)) and _gone(child)
        assert not os.path.exists(wdir) and os.path.exists(other)
    finally:
        subprocess.run(rt.zygote_remove_argv(job_id), timeout=30)      # every one of the job
        assert not os.path.exists(runtimes.warm_dir(job_id, "n2"))


def test_bare_zygote_refuses_a_torchrun_that_is_not_a_python_script(tmp_path):
    rt = runtimes.get("bare")
    torchrun = tmp_path / "torchrun"
    torchrun.write_text("#!/bin/sh\nexec python3 -m torch.distributed.run \"$@\"\n")
    torchrun.chmod(0o755)
    wdir = runtimes.warm_dir(f"wb-{os.getpid()}-y", "n1")
    req = RunRequest(job="w", job_id="j", attempt=1, node="n1", name="c", image="i", workdir="/w", node_dir="/nd",
                     command=(str(torchrun),), gpus=0, ulimits=())
    r = subprocess.run(rt.zygote_start_argv(req, wdir), input="", capture_output=True, text=True, timeout=30)
    assert r.returncode == 125 and "is not a Python script" in r.stderr and not os.path.exists(wdir)
