"""nvidia_toolkit on docker judges a real GPU container (issue 35 item 2): dockerd offers ``--gpus`` whenever
nvidia-container-runtime-hook is on its PATH (moby daemon/nvidia_linux.go), with or without a registered
``nvidia`` runtime; one bounded ``docker run --gpus=all IMAGE nvidia-smi -L`` proves hook, libraries and devices
and says how many GPUs the container sees. Recorded outputs: tests/fixtures/checks/gpu_run."""
from __future__ import annotations

import json
from pathlib import Path

from clusterctl.checks.probe import build_probe_script
from clusterctl.checks.job import PreflightJob, PreflightOptions
from clusterctl.config.inventory import Host
from tests.unit.checks.test_preflight import check, cluster, run

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "checks"


def fixture(kind: str, case: str) -> tuple[str, int]:
    d = json.loads((FIX / kind / f"{case}.json").read_text())
    return d["output"], d.get("rc", 0)


def toolkit(gpus=2, **sections):
    hosts, fakes = cluster(1, runtime="docker", gpus=gpus,
                           node1={"sections": {"runtime_info": fixture("docker_info", "daemon_up_without_nvidia_runtime"),
                                               **sections}})
    report = run(hosts, fakes)[0]
    return check(report, "node1", "nvidia_toolkit"), report


def test_hook_on_path_without_nvidia_runtime_passes_on_the_container_run():
    c, report = toolkit(gpu_run=fixture("gpu_run", "hook_on_path_two_gpus"))
    assert c.status == "pass", c
    assert c.data["gpu_flags"] == "gpus" and c.data["container_gpus"] == 2 and c.data["host_gpus"] == 2
    assert "--gpus=all" in c.detail and "sees 2 GPUs" in c.detail
    assert report.gpu_flags() == {"node1": "gpus"}


def test_the_container_run_passes_even_without_nvidia_ctk():
    c, _ = toolkit(gpu_run=fixture("gpu_run", "hook_on_path_two_gpus"), nvidia_ctk=("sh: nvidia-ctk: not found", 127))
    assert c.status == "pass" and c.data["version"] is None, c


def test_fewer_gpus_in_the_container_than_on_the_host_fails():
    c, report = toolkit(gpus=4, gpu_run=fixture("gpu_run", "hook_on_path_two_gpus"))
    assert c.status == "fail" and "sees 2 of the host's 4 GPUs" in c.detail, c
    assert report.gpu_flags() == {}


def test_no_hook_fails_with_the_docker_error_and_the_restart_hint():
    c, report = toolkit(gpu_run=fixture("gpu_run", "no_hook_no_cdi_docker20"))
    assert c.status == "fail", c
    assert 'could not select device driver "" with capabilities: [[gpu]]' in c.detail
    assert "nvidia-container-runtime-hook" in c.hint and "systemctl restart docker" in c.hint
    assert '"cdi": true' in c.hint
    assert report.gpu_flags() == {}


def test_a_hook_error_names_the_driver_fix():
    c, _ = toolkit(gpu_run=fixture("gpu_run", "hook_driver_not_loaded"))
    assert c.status == "fail" and "driver not loaded" in c.detail, c
    assert "modprobe nvidia" in c.hint


def test_image_missing_falls_back_to_the_configuration_hook_found():
    c, report = toolkit(gpu_run=fixture("gpu_run", "image_missing"),
                        nvidia_hook=("/usr/bin/nvidia-container-runtime-hook", 0))
    assert c.status == "pass" and "nvidia-container-runtime-hook on the PATH" in c.detail, c
    assert "not proven" in c.detail
    assert report.gpu_flags() == {"node1": "gpus"}


def test_image_missing_and_no_hook_fails_with_both_fixes():
    c, _ = toolkit(gpu_run=fixture("gpu_run", "image_missing"), nvidia_hook=("", 1))
    assert c.status == "fail" and "no nvidia-container-runtime-hook" in c.detail, c
    assert "nvidia-ctk runtime configure --runtime=docker" in c.hint and '"cdi": true' in c.hint


def test_the_probe_runs_one_bounded_container_per_way_on_docker_only():
    job = PreflightJob(image="img:1")
    o = PreflightOptions()
    docker = build_probe_script(Host(name="n", address="10.0.0.1", runtime="docker", gpus=8), job, o)
    line = next(ln for ln in docker.splitlines() if ln.startswith("b gpu_run;"))
    assert line.count("to 15 docker run --rm --pull=never") == 2
    assert "--entrypoint=nvidia-smi" in line and line.index("--gpus=all") < line.index("--device=nvidia.com/gpu=all")
    assert "-- img:1 -L" in line and " || " in line
    assert "b nvidia_hook; command -v nvidia-container-runtime-hook" in docker
    podman = build_probe_script(Host(name="n", address="10.0.0.1", runtime="podman", gpus=8), job, o)
    cpu = build_probe_script(Host(name="n", address="10.0.0.1", runtime="docker", gpus=0), job, o)
    assert "gpu_run" not in podman and "gpu_run" not in cpu
