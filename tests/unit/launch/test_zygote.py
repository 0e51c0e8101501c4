"""The zygote and its client as real processes: fork, SCM_RIGHTS, signals (no torch: nothing preloaded)."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl.launch import zygote

ZYGOTE = zygote.__file__


@pytest.fixture
def sock(tmp_path):
    path = str(tmp_path / "z.sock")
    proc = subprocess.Popen([sys.executable, ZYGOTE, "serve", path, ""], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == zygote.READY
    yield path
    proc.terminate()
    proc.wait(10)


def client(sock, *argv, **kw):
    return [sys.executable, "-S", ZYGOTE, "client", sock, *argv]


def test_rank_exit_code_output_env_and_cwd(sock, tmp_path):
    script = tmp_path / "r.py"
    script.write_text("import os, sys\nprint('out', os.getcwd(), os.environ['X'], sys.argv[1:])\n"
                      "print('err', file=sys.stderr)\nsys.exit(7)\n")
    r = subprocess.run(client(sock, "rank", str(script), "a", "b c"), cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, X="y z"), timeout=20)
    assert r.returncode == 7
    assert r.stdout == f"out {tmp_path} y z ['a', 'b c']\n"
    assert r.stderr == "err\n"


def test_module_and_pythonpath(sock, tmp_path):
    (tmp_path / "lib").mkdir()
    (tmp_path / "lib" / "mymod.py").write_text("import sys\nprint('module', __name__, sys.argv[1:])\n")
    r = subprocess.run(client(sock, "rank", "-m", "mymod", "x"), capture_output=True, text=True, timeout=20,
                       env=dict(os.environ, PYTHONPATH=str(tmp_path / "lib")))
    assert (r.returncode, r.stdout) == (0, "module __main__ ['x']\n")


def test_ping_and_no_zygote(sock, tmp_path):
    assert subprocess.run(client(sock, "ping"), timeout=20).returncode == 0
    r = subprocess.run(client(str(tmp_path / "none.sock"), "ping"), capture_output=True, text=True, timeout=20)
    assert r.returncode == 125 and "cannot reach" in r.stderr


def test_signal_is_forwarded_and_the_client_dies_of_it(sock, tmp_path):
    script = tmp_path / "r.py"
    script.write_text("import signal, sys, time\nprint('up', flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen(client(sock, "rank", str(script)), stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "up\n"
    p.send_signal(signal.SIGTERM)
    assert p.wait(20) == -signal.SIGTERM


def test_a_killed_client_takes_its_child_along(sock, tmp_path):
    script = tmp_path / "r.py"
    pidfile = tmp_path / "pid"
    script.write_text(f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
                      "print('up', flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen(client(sock, "rank", str(script)), stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline() == "up\n"
    child = int(pidfile.read_text())
    p.kill()
    p.wait(10)
    deadline = time.monotonic() + 5
    while Path(f"/proc/{child}").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not Path(f"/proc/{child}").exists()


def test_stacks_finds_a_rank_forked_by_the_zygote(tmp_path):
    """``/proc/PID/environ`` of a forked rank is the zygote's: stacks' node script finds it by the zygote's marker
    (the real script, the real py-spy from the venv)."""
    import shutil

    from clusterctl.launch import runtimes
    from clusterctl.oncall import stacks

    job_id, node = f"zyg-{os.getpid()}-t", "n1"
    wdir = runtimes.warm_dir(job_id, node)
    os.makedirs(wdir, exist_ok=True)
    sock = f"{wdir}/z.sock"
    shutil.copy(ZYGOTE, f"{wdir}/zygote.py")            # as on a node: zygote.py in the warm dir
    z = subprocess.Popen([sys.executable, f"{wdir}/zygote.py", "serve", sock, ""], stdout=subprocess.PIPE, text=True)
    script = tmp_path / "r.py"
    script.write_text("import time\ndef hidden_wait_forever():\n    print('up', flush=True)\n    time.sleep(60)\n"
                      "hidden_wait_forever()\n")
    p = None
    try:
        assert z.stdout.readline().strip() == zygote.READY
        p = subprocess.Popen(client(sock, "rank", str(script)), stdout=subprocess.PIPE, text=True,
                             env=dict(os.environ, CLUSTERCTL_ATTEMPT="2", RANK="3"))
        assert p.stdout.readline() == "up\n"
        spy = str(Path(sys.executable).parent / "py-spy")
        r = subprocess.run(["sh", "-c", stacks.NODE_SCRIPT, "stacks", job_id, "2", spy, "20", node],
                           capture_output=True, text=True, timeout=60)
        assert "@@clusterctl-rank " in r.stdout and r.stdout.split("@@clusterctl-rank ")[1].split()[1] == "3", r.stdout
        assert "hidden_wait_forever" in r.stdout
        r = subprocess.run(["sh", "-c", stacks.NODE_SCRIPT, "stacks", job_id, "1", spy, "20", node],
                           capture_output=True, text=True, timeout=60)
        assert "@@clusterctl-rank " not in r.stdout            # another attempt's ranks are not this one's
    finally:
        if p is not None:
            p.kill()
            p.wait(10)
        z.terminate()
        z.wait(10)
        shutil.rmtree(wdir, ignore_errors=True)


def test_a_killed_zygote_takes_its_children_along(tmp_path):
    """PR_SET_PDEATHSIG: a forked agent or rank dies with its zygote (on a bare host nothing else would end it)."""
    path = str(tmp_path / "z.sock")
    proc = subprocess.Popen([sys.executable, ZYGOTE, "serve", path, ""], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == zygote.READY
    script, pidfile = tmp_path / "r.py", tmp_path / "pid"
    script.write_text(f"import os, time\nopen({str(pidfile)!r}, 'w').write(str(os.getpid()))\n"
                      "print('up', flush=True)\ntime.sleep(60)\n")
    p = subprocess.Popen(client(path, "rank", str(script)), stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline() == "up\n"
        child = int(pidfile.read_text())
        proc.kill()
        proc.wait(10)
        deadline = time.monotonic() + 5

        def gone() -> bool:
            try:
                return Path(f"/proc/{child}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
            except OSError:
                return True
        while not gone() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert gone()
    finally:
        p.kill()
        p.wait(10)


def test_a_forked_rank_is_named_after_its_kind_and_attempt(sock, tmp_path):
    """A fork keeps the zygote's command line: ``ps``/``top`` tell agents and ranks apart by their name."""
    script = tmp_path / "r.py"
    script.write_text("print(open('/proc/self/comm').read().strip())\n")
    r = subprocess.run(client(sock, "rank", str(script)), cwd=tmp_path, capture_output=True, text=True,
                       env=dict(os.environ, CLUSTERCTL_ATTEMPT="7"), timeout=20)
    assert r.returncode == 0 and r.stdout.strip() == "cc-rank-7", r.stderr
