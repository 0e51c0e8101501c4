"""Node-side runtime snippets run by a real sh against a fake container CLI."""
from __future__ import annotations

import subprocess
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from clusterctl.launch import runtimes

FAKE_PODMAN = """#!/bin/sh
# ps -aq: the ids still present; rm: fails the first FAIL_RM times (podman's "container state improper")
echo "$*" >>"$STATE/calls"
case $1 in
  ps) cat "$STATE/ids" ;;
  rm) n=$(cat "$STATE/fails"); if [ "$n" -gt 0 ]; then echo $((n - 1)) >"$STATE/fails";
        echo 'Error: cannot remove container abc as it could not be stopped: container state improper' >&2; exit 125; fi
      : >"$STATE/ids" ;;
esac
"""


def _fake(tmp_path, fails: int):
    prog = tmp_path / "podman"
    prog.write_text(FAKE_PODMAN)
    prog.chmod(0o755)
    (tmp_path / "ids").write_text("abc\n")
    (tmp_path / "fails").write_text(f"{fails}\n")
    argv = runtimes.get("podman").remove_job_argv("job-1")
    argv[3] = str(prog)                                   # "$0" of the snippet: the runtime's program
    return argv


def test_remove_job_retries_a_refused_rm(tmp_path):
    argv = _fake(tmp_path, fails=1)
    t = time.monotonic()
    r = subprocess.run(argv, capture_output=True, text=True, env={"STATE": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert time.monotonic() - t < 0.4            # the first retry at once (podman's refusal synced its state)
    assert r.returncode == 0, r.stderr
    calls = (tmp_path / "calls").read_text().splitlines()
    assert [c.split()[0] for c in calls] == ["ps", "rm", "ps", "rm"]
    assert calls[0] == "ps -aq --filter=label=clusterctl.job_id=job-1"


def test_remove_job_gives_up_after_ten_seconds_of_refusals(tmp_path):
    """dockerd refuses a removal while another is in progress, podman one whose conmon died: retried, 10 s."""
    argv = _fake(tmp_path, fails=30)
    r = subprocess.run(argv, capture_output=True, text=True, env={"STATE": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 1 and "state improper" in r.stderr
    assert [c.split()[0] for c in (tmp_path / "calls").read_text().splitlines()].count("rm") == 21


def test_remove_job_with_nothing_to_remove(tmp_path):
    argv = _fake(tmp_path, fails=0)
    (tmp_path / "ids").write_text("")
    r = subprocess.run(argv, capture_output=True, text=True, env={"STATE": str(tmp_path), "PATH": "/usr/bin:/bin"})
    assert r.returncode == 0 and (tmp_path / "calls").read_text().split() == ["ps", "-aq",
                                                                             "--filter=label=clusterctl.job_id=job-1"]


FAILING_ENTRY = """from torch.distributed.elastic.multiprocessing.errors import record

@record
def main():
    raise RuntimeError("CUDA out of memory (a test)")

main()
"""


def test_bare_runner_copies_torchruns_error_file_into_the_log(tmp_path):
    """A real torchrun under the bare runner: the rank's @record error reaches torchrun's TORCHELASTIC_ERROR_FILE
    (NODE_DIR/error.json), the runner copies it into node.log, and causes reads the message back from the log."""
    import shutil
    import sys
    import time

    from clusterctl.launch.runtimes import bare
    from clusterctl.model import causes

    (tmp_path / "entry.py").write_text(FAILING_ENTRY)
    node_dir = tmp_path / "node"
    torchrun = shutil.which("torchrun") or str(__import__("pathlib").Path(sys.executable).parent / "torchrun")
    argv = ["sh", "-c", bare.START, "clusterctl-start", str(node_dir), "n1", str(tmp_path), bare.RUNNER,
            torchrun, "--standalone", "--nproc-per-node=1", str(tmp_path / "entry.py")]
    r = subprocess.run(argv, input=b"", capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    deadline = time.monotonic() + 60
    while not (node_dir / "exit").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert (node_dir / "exit").read_text().strip() == "1"
    assert "CUDA out of memory (a test)" in (node_dir / "error.json").read_text()
    log = (node_dir / "node.log").read_text()
    assert causes.error_file_in(log).startswith("RuntimeError: CUDA out of memory (a test)")


@pytest.mark.parametrize("value,expected", [
    ("~/.clusterctl/nodes/n1", "/home/u/.clusterctl/nodes/n1"),
    ("/abs/~/x", "/abs/~/x"),
    ("~other/x", "~other/x"),          # only the user's own home, as before
    ("~", "~"),
])
def test_bare_expands_a_leading_tilde_slash_on_the_node(value, expected):
    from clusterctl.launch.runtimes import bare

    r = subprocess.run(["sh", "-c", f'{bare._expand_home("v")}; printf %s "$v"', "sh"], capture_output=True,
                       text=True, env={"v": value, "HOME": "/home/u", "PATH": "/usr/bin:/bin"}, timeout=10)
    assert r.stdout == expected


def test_bare_kill_by_environment_needs_every_needle(tmp_path):
    """One loop (``bare._kill_by_env``) behind STOP's KILL (job id and attempt) and KILL_JOB (job id only)."""
    import uuid

    from clusterctl.launch.runtimes import bare

    jid, other = f"kt-{uuid.uuid4().hex}", f"kt-{uuid.uuid4().hex}"

    def sleeper(job_id, attempt):
        return subprocess.Popen(["sleep", "60"], env={"PATH": "/usr/bin:/bin", "CLUSTERCTL_JOB_ID": job_id,
                                                      "CLUSTERCTL_ATTEMPT": attempt})

    a, b, c = sleeper(jid, "2"), sleeper(jid, "3"), sleeper(other, "2")
    try:
        script = f'jid=$1 att=$2\n{bare._kill_by_env("CLUSTERCTL_JOB_ID=$jid", "CLUSTERCTL_ATTEMPT=$att")}'
        subprocess.run(["sh", "-c", script, "sh", jid, "2"], check=True, timeout=30)
        assert a.wait(timeout=10) == -9
        assert b.poll() is None and c.poll() is None
        (tmp_path / jid).mkdir()                      # the job's directory, no attempt in it: only the loop acts
        subprocess.run(["sh", "-c", bare.KILL_JOB, "sh", str(tmp_path / jid), jid], check=True, timeout=30)
        assert b.wait(timeout=10) == -9
        assert c.poll() is None
    finally:
        for p in (a, b, c):
            p.kill()
            p.wait()


def test_bare_a_dead_runner_whose_pid_was_reused_is_neither_running_nor_signalled(tmp_path):
    """A runner killed before it could write ``exit`` (clusterctl's KILL, the OOM killer, a reboot) leaves its
    pid file; once that pid belongs to another process (here: an unrelated `sleep` in its own process group, as a
    reused pid would be), LIST says ``dead``, and STOP, KILL_JOB and the pid lookup leave the process alone."""
    import time

    from clusterctl.launch.runtimes import bare

    job_dir = tmp_path / "jobs" / "job-1"
    node_dir = job_dir / "1"
    argv = ["sh", "-c", bare.START, "clusterctl-start", str(node_dir), "n1", str(tmp_path), bare.RUNNER,
            "sleep", "60"]
    r = subprocess.run(argv, input=b"", capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    runner = int(r.stdout.strip())
    listing = lambda: bare.parse_list(subprocess.run(["sh", "-c", bare.LIST, "l", str(job_dir)], capture_output=True,
                                                     text=True, timeout=30, check=True).stdout)
    assert [i.state for i in listing()] == ["running"]
    subprocess.run(["kill", "-KILL", "--", f"-{runner}"], check=False)       # the runner dies without `exit`
    deadline = time.monotonic() + 10
    while Path(f"/proc/{runner}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    victim = subprocess.Popen(["sleep", "60"], start_new_session=True)      # "reuses" the pid
    try:
        (node_dir / "pid").write_text(f"{victim.pid}\n")
        assert [i.state for i in listing()] == ["dead"]
        for sig in ("TERM", "KILL"):
            subprocess.run(["sh", "-c", bare.STOP, "s", str(node_dir), sig, "job-1", "1"], timeout=30)
        subprocess.run(["sh", "-c", bare.KILL_JOB, "k", str(job_dir), "job-1"], timeout=30)
        ref = SimpleNamespace(node_dir=str(node_dir))
        assert subprocess.run(bare.RUNTIME.pid_argv(ref), capture_output=True, text=True, timeout=30).stdout == ""
        time.sleep(0.3)
        assert victim.poll() is None, "an unrelated process was signalled"
    finally:
        victim.kill()
        victim.wait()


def test_bare_a_killed_runner_not_reaped_yet_is_dead_not_running(tmp_path):
    """A runner killed without writing ``exit`` stays a zombie until its parent reaps it (the host's init; on
    some hosts seconds later, or never under an init that does not reap). /proc/PID and its start time are still
    there, so the identity matched: LIST said ``running`` while the watch said gone (issue 34 item 13). A zombie
    is not the runner alive: LIST says ``dead`` and the pid lookup prints nothing."""
    from clusterctl.launch.runtimes import bare

    job_dir = tmp_path / "jobs" / "job-1"
    node_dir = job_dir / "1"
    node_dir.mkdir(parents=True)
    runner = subprocess.Popen(["sleep", "60"])            # this test is its parent: it stays a zombie until waited
    try:
        (node_dir / "name").write_text("n1\n")
        ident = subprocess.run(["sh", "-c", f'{bare._IDENT}\nident "$1"', "i", str(runner.pid)],
                               capture_output=True, text=True, timeout=30, check=True).stdout
        (node_dir / "ident").write_text(ident)
        (node_dir / "pid").write_text(f"{runner.pid}\n")
        listing = lambda: [i.state for i in bare.parse_list(subprocess.run(
            ["sh", "-c", bare.LIST, "l", str(job_dir)], capture_output=True, text=True, timeout=30, check=True).stdout)]
        pid_of = lambda: subprocess.run(bare.RUNTIME.pid_argv(SimpleNamespace(node_dir=str(node_dir))),
                                        capture_output=True, text=True, timeout=30).stdout.strip()
        assert listing() == ["running"] and pid_of() == str(runner.pid)
        runner.kill()                                      # not waited for: a zombie
        deadline = time.monotonic() + 10
        while "State:\tZ" not in Path(f"/proc/{runner.pid}/status").read_text():
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert listing() == ["dead"]
        assert pid_of() == ""
    finally:
        runner.kill()
        runner.wait()
