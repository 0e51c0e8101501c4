"""Preflight checks `torchrun` and `script`: the probe snippet run by a real sh, then the pure checks."""
import subprocess

from clusterctl.checks import entry
from clusterctl.checks.job import PreflightJob, PreflightOptions
from clusterctl.checks.preflight import HostProbe, evaluate_host
from clusterctl.checks.probe import Section, build_probe_script, split_sections
from clusterctl.config.inventory import Host


def probe_of(host, job, tmp_path) -> HostProbe:
    script = build_probe_script(host, job, PreflightOptions(only=frozenset({"ssh", "torchrun", "script"})))
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=30,
                       env={"PATH": f"{tmp_path}/bin:/usr/bin:/bin"})
    return HostProbe(host, job, PreflightOptions(), split_sections(r.stdout), r.returncode, r.stderr)


def test_bare_host_with_torchrun_and_script(tmp_path):
    (tmp_path / "bin").mkdir()
    tr = tmp_path / "bin" / "torchrun"
    tr.write_text("#!/bin/sh\nexit 0\n")
    tr.chmod(0o755)
    (tmp_path / "train.py").write_text("print(1)\n")
    host = Host(name="n1", address="10.0.0.1", runtime="bare", gpus=0)
    job = PreflightJob(script="train.py", workdir=str(tmp_path))
    checks = evaluate_host(probe_of(host, job, tmp_path))
    assert checks["torchrun"].status == "pass" and checks["torchrun"].detail == str(tr)
    assert checks["script"].status == "pass"


def test_bare_host_without_torchrun_or_script_fails_with_the_fix(tmp_path):
    (tmp_path / "bin").mkdir()
    host = Host(name="n1", address="10.0.0.1", runtime="bare", gpus=0)
    job = PreflightJob(script="tran.py", workdir=str(tmp_path))
    checks = evaluate_host(probe_of(host, job, tmp_path))
    assert checks["torchrun"].status == "fail" and "PATH" in checks["torchrun"].detail
    assert "`torchrun:`" in checks["torchrun"].hint
    assert checks["script"].status == "fail" and "tran.py" in checks["script"].detail and "script:" in checks["script"].hint


def test_torchrun_whose_interpreter_is_gone_fails(tmp_path):
    (tmp_path / "bin").mkdir()
    tr = tmp_path / "bin" / "torchrun"
    tr.write_text("#!/nonexistent/venv/bin/python\n")
    tr.chmod(0o755)
    host = Host(name="n1", address="10.0.0.1", runtime="bare", gpus=0)
    c = evaluate_host(probe_of(host, PreflightJob(script="/x.py", workdir=str(tmp_path)), tmp_path))["torchrun"]
    assert c.status == "fail" and "/nonexistent/venv/bin/python" in c.detail


def test_container_hosts_check_the_script_only_under_a_mounted_host_path():
    podman = Host(name="n1", address="10.0.0.1", runtime="podman", gpus=0)
    job = PreflightJob(script="/ws/train.py", mounts=("/data/ws:/ws:ro",))
    assert entry.host_script(podman, job) == "/data/ws/train.py"
    assert entry.host_script(podman, PreflightJob(script="/opt/train.py", mounts=("/data/ws:/ws",))) is None
    assert entry.host_script(podman, PreflightJob(script="train.py", container_workdir="/ws",
                                                  mounts=("/data/ws:/ws",))) == "/data/ws/train.py"
    probe = HostProbe(podman, PreflightJob(script="/opt/train.py"), PreflightOptions(),
                      {"ssh": Section("", 0)})
    assert entry.check_torchrun(probe) is None and entry.check_script(probe) is None   # inside the image
