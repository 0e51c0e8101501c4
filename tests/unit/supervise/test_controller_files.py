"""The controller's own files and buffers (issue 11 items 4, 7, 9): a state dir another user controls is refused,
files are never opened through a symlink, output without newlines and long logs use bounded memory, and a node's
garbage output does not crash the supervisor."""
from __future__ import annotations

import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from clusterctl.config.spec import loads_job
from clusterctl.errors import UserError
from clusterctl.store import paths
from clusterctl.store.logcopy import MAX_LINE, LogSink
from clusterctl.supervise.cluster_ops import ClusterOps
from clusterctl.transport.base import CommandResult

REPO = Path(__file__).resolve().parents[3]
NOBODY = 65534


def cli(*args, state):
    return subprocess.run([sys.executable, "-m", "clusterctl.cli", "--state-dir", str(state), *args],
                          capture_output=True, text=True, timeout=60, cwd=REPO, stdin=subprocess.DEVNULL)


# ------------------------------------------------------------------------------------ item 4: state dir
@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to chown")   # the testbed machines run as root
def test_state_dir_of_another_user_is_refused(tmp_path):
    d = tmp_path / "state"
    d.mkdir(mode=0o700)
    os.chown(d, NOBODY, NOBODY)
    with pytest.raises(UserError, match="owned by uid 65534"):
        paths.ensure_state_dir(d)
    r = cli("status", state=d)
    assert r.returncode == 2 and "owned by uid 65534" in r.stderr and "chown" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr


@pytest.mark.parametrize("mode", [0o770, 0o707, 0o777, 0o1777])
def test_state_dir_writable_by_others_is_refused(tmp_path, mode):
    d = tmp_path / "state"
    d.mkdir()
    d.chmod(mode)
    with pytest.raises(UserError, match="writable by group/others"):
        paths.ensure_state_dir(d)
    r = cli("status", state=d)
    assert r.returncode == 2 and f"chmod 700 {d}" in r.stderr, r.stderr
    assert stat.S_IMODE(d.stat().st_mode) == mode      # refused, not silently "fixed"


def test_jobs_dir_writable_by_others_is_refused(tmp_path):
    root = paths.ensure_state_dir(tmp_path / "state")
    (root / "jobs").mkdir()
    (root / "jobs").chmod(0o777)
    with pytest.raises(UserError, match="writable by group/others"):
        paths.ensure_job_dir(root, "j-1")


def test_readable_state_dir_of_ours_is_made_private(tmp_path):
    d = tmp_path / "state"
    d.mkdir()
    d.chmod(0o755)
    paths.ensure_state_dir(d)
    assert stat.S_IMODE(d.stat().st_mode) == 0o700


def test_symlinked_state_db_is_refused(tmp_path):
    root = paths.ensure_state_dir(tmp_path / "state")
    (tmp_path / "elsewhere.db").write_bytes(b"")
    (root / "state.db").symlink_to(tmp_path / "elsewhere.db")
    with pytest.raises(UserError, match="symlink"):
        paths.db_path(root)
    r = cli("status", state=root)
    assert r.returncode == 2 and "symlink" in r.stderr, r.stderr


def test_files_are_never_opened_through_a_symlink(tmp_path):
    target = tmp_path / "target"
    target.write_text("precious\n")
    link = tmp_path / "output.log"
    link.symlink_to(target)
    with pytest.raises(UserError):
        LogSink(link)
    with pytest.raises(UserError):
        paths.open_private(link)
    assert target.read_text() == "precious\n"


# ------------------------------------------------------------------------------------ item 9: bounded buffers
def test_logsink_output_without_newlines_stays_bounded(tmp_path):
    sink = LogSink(tmp_path / "out.log")
    chunk = b"x" * 4096
    t0 = time.monotonic()
    for _ in range(2560):                       # 10 MiB without a newline
        sink.feed("n1", chunk)
        assert len(sink.partial["n1"]) <= MAX_LINE
    sink.feed("n1", b"end\n")
    assert time.monotonic() - t0 < 5
    lines = (tmp_path / "out.log").read_text().splitlines()
    assert sum(len(ln) - len("[n1/-] ") for ln in lines) == 10 * (1 << 20) + 3
    assert lines[-1].endswith("end")


# ------------------------------------------------------------------------------------ item 7: node output
class _Garbage:
    def __init__(self, host, out):
        self.host, self.out = host, out

    def run(self, argv, *, timeout=None, stdin=None):
        return CommandResult(tuple(argv), 0, self.out, "", 0.01)

    def close(self):
        pass


@pytest.mark.parametrize("out", ["not json", "[1, 2]", "3", '{"path": "/c/step-1", "step": "x"}', "\x00\xff"])
def test_latest_checkpoint_survives_garbage_from_a_node(tmp_path, out):
    from clusterctl.config.inventory import Host

    hosts = {"n1": Host(name="n1", address="10.0.0.1", runtime="podman", gpus=0),
             "n2": Host(name="n2", address="10.0.0.2", runtime="podman", gpus=0)}
    answers = {"n1": out, "n2": '{"path": "/c/step-7", "step": 7}'}
    spec = loads_job("name: j\nscript: t.py\ncheckpoint: {dir: /c}\n", "j.yaml")
    ops = ClusterOps(spec=spec, hosts=hosts, job_id="j-1", store=None, sink=LogSink(tmp_path / "o.log"),
                     connect=lambda h, o: _Garbage(h, answers[h.name]))
    assert ops.latest_checkpoint(["n1", "n2"]) == ("/c/step-7", 7)    # the garbage node is skipped
    assert ops.latest_checkpoint(["n1"]) is None                        # no node could tell (not a crash)


@pytest.mark.parametrize("digests", ["5", '"sha256:x@y"', '{"a": 1}', "[1, null]", "not json"])
def test_image_inspect_parser_survives_garbage_digests(digests):
    from clusterctl.checks.runtime import parse_image_inspect

    image_id = "sha256:" + "a" * 64
    r = parse_image_inspect(f"{image_id} {digests}\n")
    assert r == {"present": True, "id": image_id, "digest": image_id, "error": None}
