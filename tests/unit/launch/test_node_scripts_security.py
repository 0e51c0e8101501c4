"""Node-side shell snippets under a real ``sh`` (issue 11 items 8, 12, 13)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from clusterctl.launch import runtimes


# ------------------------------------------------------------------------------------ item 12: any env name
@pytest.mark.parametrize("name", ["S", "f", "d", "p", "r", "rc", "i", "cid", "IFS_X", "v", "_cc_lib"])
def test_container_apply_delivers_every_env_name(tmp_path, name):
    """CONTAINER_APPLY used to keep the script in `S` and `unset S` after the eval, and the checkpoint installer
    its directory in `_cc_lib` (unset at its end): job env vars with those names vanished."""
    from clusterctl.launch.plan import checkpoint_installer

    mnt, tmp = tmp_path / "mnt", tmp_path / "tmp"
    mnt.mkdir()
    tmp.mkdir()
    (mnt / "env").write_text(f"export {name}='v a l'\nexport OTHER=1\n" + checkpoint_installer("X = 1\n"))
    script = runtimes.CONTAINER_APPLY.replace(runtimes.ENV_MOUNT, str(mnt))
    r = subprocess.run(["sh", "-c", script, "clusterctl-env", sys.executable, "-c",
                        f"import os; print(repr(os.environ.get({name!r})))"],
                       capture_output=True, text=True, env={"PATH": os.environ["PATH"], "TMPDIR": str(tmp)},
                       timeout=30)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == repr("v a l"), r.stdout
    assert not (mnt / "env").exists()


# ------------------------------------------------------------------------------------ item 13: no env file left
def _default_signals() -> None:
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)


def test_killed_start_wrapper_leaves_no_env_file(tmp_path):
    """The wrapper is signalled while the runtime runs (the SSH session dropped, a timeout): its 0600 env file
    and directory are removed, not left in $TMPDIR."""
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "podman").write_text("#!/bin/sh\necho started >\"$FAKE_MARK\"\nexec sleep 30\n")
    (bindir / "podman").chmod(0o755)
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", TMPDIR=str(tmp), FAKE_MARK=str(tmp_path / "m"))
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        # default dispositions, as sshd gives a session: a signal ignored on entry (pytest run under nohup, or in the
        # background of a non-interactive shell) cannot be trapped by a POSIX sh
        p = subprocess.Popen(["sh", "-c", runtimes.CONTAINER_START, "clusterctl-start", "podman", "run", "", "",
                              "img"],
                             stdin=subprocess.PIPE, env=env, start_new_session=True, preexec_fn=_default_signals)
        p.stdin.write(b"export SECRET='s3cr3t'\n")
        p.stdin.close()
        end = time.monotonic() + 10
        while not (tmp_path / "m").exists():
            assert time.monotonic() < end
            time.sleep(0.02)
        (tmp_path / "m").unlink()
        assert len(list(tmp.iterdir())) == 1            # the private dir with the env file exists now
        # signal it once it waits for the runtime (`wait "$c"`, in sigsuspend): a signal between `& c=$!` and `wait` is acted on
        # only when the runtime returns (sh's own race: harmless on a node, where `podman run -d` returns at once;
        # here the fake runtime sleeps 30 s)
        while not (wchan := open(f"/proc/{p.pid}/wchan").read()).startswith(("do_wait", "sigsuspend")):
            assert time.monotonic() < end, wchan
            time.sleep(0.02)
        os.kill(p.pid, sig)
        assert p.wait(10) != 0
        try:
            os.killpg(p.pid, signal.SIGKILL)            # the fake runtime, if the trap did not end it
        except ProcessLookupError:
            pass
        assert list(tmp.iterdir()) == [], f"{sig!r} left {list(tmp.rglob('*'))}"


def test_bare_runner_removes_the_checkpoint_lib(tmp_path):
    """/tmp/clusterctl-lib.* was never removed on bare nodes: the runner gives the installer NODE_DIR/lib and
    removes it once torchrun ends; the training process could import from it, and $TMPDIR stays empty."""
    from clusterctl.launch.plan import checkpoint_installer
    from clusterctl.launch.runtimes.bare import RUNNER

    tmp, d = tmp_path / "tmp", tmp_path / "node"
    tmp.mkdir()
    d.mkdir()
    prelude = checkpoint_installer("X = 41\n")
    env = {"PATH": os.environ["PATH"], "TMPDIR": str(tmp), runtimes.ENV_SCRIPT_VAR: prelude}
    r = subprocess.run(["sh", "-c", RUNNER, "clusterctl-runner", str(d), sys.executable, "-c",
                        "import os, clusterctl.checkpoint as c; print(c.X + 1, os.environ.get('CLUSTERCTL_LIB_DIR'))"],
                       capture_output=True, text=True, env=env, cwd=tmp_path, timeout=30)
    assert r.returncode == 0, r.stderr
    assert "42 None" in r.stdout, r.stdout + r.stderr
    assert (d / "exit").read_text().strip() == "0"
    assert not (d / "lib").exists() and list(tmp.iterdir()) == []


# ------------------------------------------------------------------------------------ item 8: stale pid
class _Node:
    def __init__(self, node_dir: str):
        self.node_dir, self.container_name, self.log_path, self.job_id = node_dir, "x", None, "j-1"


@pytest.mark.parametrize("sig", ["TERM", "INT", "KILL", "HUP"])
def test_bare_stop_never_signals_the_pid_of_a_finished_attempt(tmp_path, sig):
    """The attempt ended (exit file written); its pid now belongs to an unrelated process: stop leaves it alone."""
    node_dir = tmp_path / "jobs" / "j-1" / "1"
    node_dir.mkdir(parents=True)
    other = subprocess.Popen(["sleep", "30"], start_new_session=True)
    try:
        (node_dir / "pid").write_text(f"{other.pid}\n")
        (node_dir / "exit").write_text("0\n")
        r = subprocess.run(runtimes.get("bare").stop_argv(_Node(str(node_dir)), sig), capture_output=True,
                           text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        time.sleep(0.2)
        assert other.poll() is None, f"stop {sig} signalled an unrelated process"
    finally:
        other.kill()
        other.wait()
