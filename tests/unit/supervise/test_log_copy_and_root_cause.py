"""Pure parts of ClusterOps (supervise/cluster_ops.py): torchrun's failure summary, the [node/rank] log copy."""
from clusterctl.store.logcopy import LogSink
from clusterctl.model.causes import root_cause, signal_of

SUMMARY = """\
[node2/-] ============================================================
[node2/-] /ws/train.py FAILED
[node2/-] Failures:
[node2/0]
[node2/-]   rank      : 2 (local_rank: 0)
[node2/-]   exitcode  : -15 (pid: 31972)  (SIGTERM)
[node2/-] Root Cause (first observed failure):
[node2/0]
[node2/-]   time      : 2026-11-29_16:04:36
[node2/-]   host      : node2
[node2/-]   rank      : 3 (local_rank: 1)
[node2/-]   exitcode  : 1 (pid: 31973)
"""


def test_root_cause_takes_the_first_observed_failure():
    assert root_cause(SUMMARY) == (3, 1)
    assert root_cause("no summary here") is None


def test_signal_of():
    assert (signal_of(137), signal_of(143), signal_of(1), signal_of(None)) == ("SIGKILL", "SIGTERM", None, None)


def test_log_sink_prefixes_ranks_and_joins_partial_lines(tmp_path):
    echoed = []
    sink = LogSink(tmp_path / "out.log", echo=echoed.append)
    sink.feed("node1", b"[0]:step 1 loss 0.5\n[1]:step 1 lo")
    sink.feed("node1", b"ss 0.4\nagent line\n")
    assert echoed == ["[node1/0] step 1 loss 0.5", "[node1/1] step 1 loss 0.4", "[node1/-] agent line"]
    assert (tmp_path / "out.log").read_text().splitlines() == echoed
    assert oct((tmp_path / "out.log").stat().st_mode & 0o777) == "0o600"


def test_checkpoint_installer_makes_the_module_importable_anywhere(tmp_path):
    """The start script installs clusterctl.checkpoint into a private temp dir on PYTHONPATH (in containers too)."""
    import os
    import subprocess
    import sys

    from clusterctl.supervise.recovery import CHECKPOINT_INSTALLER

    script = "export PYTHONPATH=/elsewhere\n" + CHECKPOINT_INSTALLER
    code = ("import os; from clusterctl import checkpoint; print(checkpoint.__file__); print(os.environ['PYTHONPATH']); "
            "print(os.path.join(os.path.dirname(checkpoint.__file__), 'sampler.py'))")
    r = subprocess.run(["sh", "-c", 'eval "$S"; exec "$@"', "sh", sys.executable, "-S", "-c", code],
                       env={"S": script, "PATH": "/usr/bin:/bin", "TMPDIR": str(tmp_path)}, cwd=tmp_path,
                       capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    path, pythonpath, sampler = r.stdout.split()
    assert path.startswith(str(tmp_path)) and path.endswith("clusterctl/checkpoint.py")
    assert pythonpath.endswith(":/elsewhere")
    # the resumable sampler is shipped beside it, byte for byte (it imports torch, so compare the text)
    import clusterctl

    with open(sampler) as f:
        shipped = f.read()
    with open(os.path.join(os.path.dirname(clusterctl.__file__), "sampler.py")) as f:
        assert shipped == f.read()


def test_checkpoint_installer_refuses_bad_names_and_the_delimiter():
    import pytest

    from clusterctl.launch.plan import checkpoint_installer

    with pytest.raises(ValueError):
        checkpoint_installer("x = 1\n", {"../evil.py": "x = 1\n"})
    with pytest.raises(ValueError):
        checkpoint_installer("x = 1\n", {"sampler.py": "__CLUSTERCTL_CHECKPOINT_PY__\n"})
