"""The probe and phase-2 scripts run by a real ``sh`` with stub tools: syntax, sections, and quoting of user values."""
from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl.checks import cluster as cl
from clusterctl.checks.job import PreflightJob, PreflightOptions
from clusterctl.checks.preflight import HostProbe, evaluate_host
from clusterctl.checks.probe import build_probe_script, split_sections
from clusterctl.config.inventory import Host
from tests.testbed import stubs as testbed_stubs

pytestmark = pytest.mark.skipif(shutil.which("sh") is None, reason="needs sh")

STUB = """#!/bin/sh
printf '%s\\0' "--call--" "$(basename "$0")" "$@" >> "$ARGLOG"
case "$(basename "$0")" in
  nvidia-smi) echo "0, NVIDIA H100 80GB HBM3, 550.54.15, 81559, 0, No, GPU-0" ;;
  nvidia-ctk) if [ "$1" = cdi ]; then echo 'INFO[0000] Found 2 CDI devices' >&2; echo nvidia.com/gpu=0; echo nvidia.com/gpu=all;
              else echo 'NVIDIA Container Toolkit CLI version 1.14.6'; fi ;;
  podman) if [ "$1" = info ]; then echo '{"host": {"ociRuntime": {"name": "runc"}}, "store": {"graphRoot": "/"}, "version": {"Version": "4.3.1"}}';
          else echo "sha256:$(printf '%064d' 1) []"; fi ;;
esac
"""


@pytest.fixture
def stubs(tmp_path: Path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name in ("nvidia-smi", "nvidia-ctk", "podman"):
        (bin_dir / name).write_text(STUB)
        (bin_dir / name).chmod(0o755)
    lib = tmp_path / "lib"          # the cuInit probe loads libcuda.so.1: the testbed's stub (answers 0, 1 device)
    lib.mkdir()
    shutil.copyfile(testbed_stubs.libcuda(0, 1, 12040), lib / "libcuda.so.1")
    return bin_dir


def run_sh(script: str, bin_dir: Path, log: Path) -> subprocess.CompletedProcess:
    env = {"PATH": f"{bin_dir}:/usr/sbin:/usr/bin:/sbin:/bin", "ARGLOG": str(log), "HOME": str(log.parent),
           "LD_LIBRARY_PATH": str(bin_dir.parent / "lib")}
    return subprocess.run(["sh", "-c", script], capture_output=True, text=True, env=env, timeout=60)


def args_of(log: Path, tool: str) -> list[list[str]]:
    """argv (without argv[0]) of every call of ``tool``, as the stubs logged them."""
    calls = [c.split("\0")[:-1] for c in log.read_bytes().decode("utf-8", "surrogateescape").split("--call--\0")[1:]]
    return [c[1:] for c in calls if c[0] == tool]


def test_probe_script_runs_under_sh_and_every_section_parses(stubs, tmp_path):
    host = Host(name="n1", address="127.0.0.1", runtime="podman", gpus=1)
    job = PreflightJob(image="pytorch-cuda:v2.7-ssh", checkpoint_dir=str(tmp_path / "ckpt"))
    (tmp_path / "ckpt").mkdir()
    script = build_probe_script(host, job, PreflightOptions(), nonce="abc123")
    sent = time.time()
    p = run_sh(script, stubs, tmp_path / "args.log")
    received = time.time()
    sections = split_sections(p.stdout)
    assert {"clock0", "clock1", "nvidia_smi", "runtime_info", "nvidia_ctk", "cdi_list", "image", "ss",
            "df_checkpoint", "df_runtime", "timedatectl", "ip_addr", "ip_link", "ssh_conn", "nonce_write"} <= set(sections)
    assert (tmp_path / "ckpt" / ".clusterctl-preflight-abc123").read_text() == "abc123"
    probe = HostProbe(host, job, PreflightOptions(), sections, p.returncode, p.stderr, 0.0, received - sent, sent,
                      received)
    checks = evaluate_host(probe)
    for cid in ("ssh", "gpu_driver", "gpu_count", "gpu_health", "container_runtime", "nvidia_toolkit", "image",
                "clock"):
        assert checks[cid].status == "pass", (cid, checks[cid])
    assert checks["interface"].data["name"] == "lo"
    assert abs(checks["clock"].data["offset_s"]) < 1.0


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(image=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=40),
       ckpt=st.text(st.characters(blacklist_categories=("Cs",), blacklist_characters="\0"), min_size=1, max_size=40))
def test_user_values_reach_the_tools_verbatim(stubs, tmp_path, image, ckpt):
    log = tmp_path / f"args-{time.monotonic_ns()}.log"
    host = Host(name="n1", address="127.0.0.1", runtime="podman", gpus=1)
    job = PreflightJob(image=image, checkpoint_dir="/nonexistent-" + ckpt)
    p = run_sh(build_probe_script(host, job, PreflightOptions(pull=True), nonce="abc"), stubs, log)
    assert "clock1" in split_sections(p.stdout)
    podman = args_of(log, "podman")
    assert ["pull", "-q", "--", image] in podman
    assert ["image", "inspect", "--format", "{{.Id}} {{json .RepoDigests}}", "--", image] in podman
    assert not any(tmp_path.glob("pwned*"))


def test_listener_and_peer_scripts_talk_over_loopback(tmp_path):
    if shutil.which("python3") is None:
        pytest.skip("needs python3")
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    nonce_file = tmp_path / ".clusterctl-preflight-xyz"
    nonce_file.write_text("xyz")
    listener = subprocess.Popen(["sh", "-c", cl.listener_script(port, 1, 10, False, str(nonce_file))],
                                stdout=subprocess.PIPE, text=True)
    peer = subprocess.run(["sh", "-c", cl.peer_script("127.0.0.1", port, 5, str(nonce_file))], capture_output=True,
                          text=True, timeout=30)
    out, _ = listener.communicate(timeout=30)
    assert cl.parse_peer(peer.stdout, peer.returncode) == {"nonce": "xyz", "nonce_error": None, "connected": True,
                                                          "connect_error": None}
    parsed = cl.parse_listener(out, listener.returncode)
    assert parsed["peers"] == ["127.0.0.1"] and parsed["removed"] and not nonce_file.exists()


def test_peer_connect_failure_is_bounded(tmp_path):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    t = time.monotonic()
    peer = subprocess.run(["sh", "-c", cl.peer_script("127.0.0.1", port, 1, None)], capture_output=True, text=True,
                          timeout=30)
    assert time.monotonic() - t < 10
    r = cl.parse_peer(peer.stdout, peer.returncode)
    assert r["connected"] is False and r["connect_error"]


def test_controller_cpu_per_host_is_small():
    """Parsing + evaluating one host's probe (large real podman info / ip outputs) stays well under 5 ms."""
    fx = Path(__file__).resolve().parents[2] / "fixtures" / "checks"
    load = lambda p: json.loads((fx / p).read_text())["output"]  # noqa: E731
    parts = {"clock0": "1717171717.1", "clock1": "1717171717.3", "runtime_info": load("podman_info/podman43_root_real.json"),
             "ip_addr": load("ip_addr/vm_real.json"), "ip_link": load("ip_link/vm_real.json") * 20,
             "ss": load("ss_listen/namespace_v4_v6_real.json"), "df_runtime": load("df/root_real.json"),
             "nvidia_smi": "\n".join(f"{i}, NVIDIA H100 80GB HBM3, 550.54.15, 81559, 0, No, GPU-{i}" for i in range(8)),
             "nvidia_ctk": "NVIDIA Container Toolkit CLI version 1.14.6", "cdi_list": load("cdi_list/eight_gpus.json"),
             "image": load("image_inspect/podman_local_import.json"), "timedatectl": "yes", "ssh_conn": ""}
    stdout = "".join(f"@@cc<{k}\n{v}\n\n@@cc>{k} 0\n" for k, v in parts.items())
    host = Host(name="n1", address="192.0.2.2", runtime="podman", gpus=8)
    job = PreflightJob()
    n = 200
    t = time.process_time()
    for _ in range(n):
        evaluate_host(HostProbe(host, job, PreflightOptions(), split_sections(stdout), 0, "", 0.01, 0.3,
                                1717171717.0, 1717171717.3))
    per_host = (time.process_time() - t) / n
    assert per_host < 0.005, per_host
