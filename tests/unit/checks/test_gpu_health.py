"""gpu_health on A100/H100/H200 and cuInit in gpu_driver (issue 35 items 4 and 6), over recorded outputs
(tests/fixtures/checks: gpu_modes, remapped_rows, gpu_fabric, cuda_init; each cites NVIDIA's documentation)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.checks import gpu
from clusterctl.checks.job import PreflightJob, PreflightOptions
from clusterctl.checks.probe import build_probe_script
from clusterctl.config.inventory import Host
from tests.unit.checks.test_preflight import check, cluster, run

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "checks"
UUIDS = [f"GPU-3b0a5b0e-7d1c-4f4e-8a55-{i:012d}" for i in range(8)]


def fixture(kind: str, case: str) -> tuple[str, int]:
    d = json.loads((FIX / kind / f"{case}.json").read_text())
    return d["output"], d.get("rc", 0)


def smi(n: int, retired: str = "[N/A]") -> tuple[str, int]:
    """The base query as an H100 answers it: retired_pages.pending is [N/A] (row remapping replaced it)."""
    return "".join(f"{i}, NVIDIA H100 80GB HBM3, 550.54.15, 81559, 0, {retired}, {UUIDS[i]}\n" for i in range(n)), 0


def one(cid: str, gpus: int = 2, **sections):
    hosts, fakes = cluster(1, gpus=gpus, node1={"sections": {"nvidia_smi": smi(gpus), **sections}})
    return check(run(hosts, fakes)[0], "node1", cid)


def test_h100_clean_passes_and_retired_pages_na_is_not_an_error():
    c = one("gpu_health", smi_remap=fixture("remapped_rows", "h100x2_clean"))
    assert c.status == "pass", c
    assert c.data["remapped_rows_pending"] == [] and c.data["remapped_rows_failure"] == [] and c.data["unknown"] == []


def test_remapped_rows_pending_warns_reset():
    c = one("gpu_health", smi_remap=fixture("remapped_rows", "pending_and_failure"))
    assert c.status == "fail" and "row remapping failed on GPU 1" in c.detail and "RMA" in c.hint, c
    c = one("gpu_health", smi_remap=("\n".join([f"{UUIDS[0]}, 0, 0", f"{UUIDS[1]}, 1, 0"]), 0))
    assert c.status == "warn" and "row remapping pending on GPU 1" in c.detail, c
    assert "nvidia-smi -r -i 1" in c.hint and c.data["remapped_rows_pending"] == [1]


def test_mig_and_compute_modes():
    modes = ("0, Enabled, Enabled, Default\n1, Disabled, Enabled, Default\n", 0)
    c = one("gpu_health", smi_modes=modes)
    assert c.status == "warn" and "MIG mode enabled on GPU 0" in c.detail and "-mig 0" in c.hint, c
    c = one("gpu_health", gpus=3, smi_modes=fixture("gpu_modes", "a100_mig_exclusive"))
    assert c.status == "fail" and "Prohibited on GPU 2" in c.detail and "-c DEFAULT" in c.hint, c
    c = one("gpu_health", smi_modes=("0, Disabled, Enabled, Default\n1, Disabled, Disabled, Exclusive_Process\n", 0))
    assert c.status == "warn" and "Exclusive_Process on GPU 1" in c.detail, c


def test_a_failed_extra_query_leaves_the_base_verdict_standing():
    c = one("gpu_health", smi_modes=fixture("gpu_modes", "unknown_field_old_driver"),
            smi_remap=("Field \"remapped_rows.pending\" is not a valid field to query.", 2))
    assert c.status == "pass" and sorted(c.data["unknown"]) == ["modes", "remapped_rows"], c
    assert "remapped rows not reported" in c.detail


def test_each_extra_field_set_is_its_own_nvidia_smi_call():
    script = build_probe_script(Host(name="n", address="10.0.0.1", runtime="podman", gpus=8), PreflightJob(),
                                PreflightOptions())
    calls = [ln for ln in script.splitlines() if " nvidia-smi --query" in ln]
    assert len(calls) == 4, calls
    assert "retired_pages.pending" in calls[0] and "mig.mode.current" not in calls[0]
    assert sum("fabric.state" in c for c in calls) == 1 and sum("remapped_rows.pending" in c for c in calls) == 1


def test_cuinit_802_fails_with_fabric_manager_while_nvidia_smi_is_fine():
    c = one("gpu_driver", cuda_init=fixture("cuda_init", "fabric_manager_down_802"),
            smi_fabric=fixture("gpu_fabric", "fabric_manager_down"))
    assert c.status == "fail", c
    assert "cuInit returned 802 CUDA_ERROR_SYSTEM_NOT_READY \"system not yet initialized\"" in c.detail
    assert "GPU 0: In Progress" in c.detail and "GPU 1: Not Started" in c.detail
    assert "systemctl enable --now nvidia-fabricmanager" in c.hint
    # the checks from nvidia-smi alone still pass: the fault is visible only to cuInit
    for cid in ("gpu_count", "gpu_health"):
        assert one(cid, cuda_init=fixture("cuda_init", "fabric_manager_down_802")).status == "pass"


def test_cuinit_802_without_fabric_data_still_names_fabric_manager():
    c = one("gpu_driver", cuda_init=fixture("cuda_init", "fabric_manager_down_802"),
            smi_fabric=fixture("gpu_fabric", "unknown_field_r470"))
    assert c.status == "fail" and "nvidia-fabricmanager" in c.hint, c


@pytest.mark.parametrize("case,status,words", [
    ("ok_h100x8", "pass", "cuInit ok, 8 devices, CUDA driver 12.4"),
    ("no_device_100", "fail", "CUDA_ERROR_NO_DEVICE"),
    ("libcuda_missing", "fail", "libcuda.so.1: cannot open shared object file"),
    ("python3_missing", "pass", "python3 not on the host: cuInit not probed"),
])
def test_cuda_outcomes(case, status, words):
    c = one("gpu_driver", gpus=8, cuda_init=fixture("cuda_init", case))
    assert c.status == status and words in c.detail, c


def test_cuinit_hang_is_a_failure_with_the_bound():
    c = one("gpu_driver", cuda_init=("", 124))
    assert c.status == "fail" and "did not return within 15 s" in c.detail, c


def test_fabric_not_complete_with_cuinit_ok_warns():
    c = one("gpu_driver", cuda_init=fixture("cuda_init", "ok_h100x8"), smi_fabric=("0, In Progress, [N/A]\n1, Completed, Success\n", 0))
    assert c.status == "warn" and "GPU 0: In Progress" in c.detail, c


def test_the_cuda_probe_is_a_child_python_with_fixed_text():
    script = build_probe_script(Host(name="n", address="10.0.0.1", runtime="bare", gpus=8), PreflightJob(),
                                PreflightOptions())
    assert "b cuda_init; if command -v nvidia-smi >/dev/null 2>&1; then to 15 python3 -c " in script
    assert "ctypes.CDLL(" in gpu.CUDA_PROGRAM and "cuInit(0)" in gpu.CUDA_PROGRAM
    cpu = build_probe_script(Host(name="n", address="10.0.0.1", runtime="bare", gpus=0), PreflightJob(),
                             PreflightOptions())
    assert "cuda_init" not in cpu


def test_a_host_without_nvidia_smi_starts_no_python_and_reads_no_kernel_log(tmp_path):
    """clusterctl_gpus unset and no driver (a laptop, the embedded default): the quick preflight stays quick."""
    import subprocess

    from clusterctl.checks.probe import split_sections

    log = tmp_path / "calls"
    for tool in ("python3", "dmesg", "journalctl"):
        (tmp_path / tool).write_text(f"#!/bin/sh\necho {tool} >> {log}\n")
        (tmp_path / tool).chmod(0o755)
    script = build_probe_script(Host(name="n", address="127.0.0.1", runtime="bare", gpus=None), PreflightJob(),
                                PreflightOptions(only=frozenset({"ssh", "gpu_driver", "gpu_health"})))
    p = subprocess.run(["sh", "-c", script], capture_output=True, text=True, timeout=60,
                       env={"PATH": f"{tmp_path}:/usr/bin:/bin"})
    sections = split_sections(p.stdout)
    assert {n: sections[n].rc for n in ("nvidia_smi", "cuda_init", "xid", "smi_remap")} == dict.fromkeys(
        ("nvidia_smi", "cuda_init", "xid", "smi_remap"), 127)
    assert not log.exists(), log.read_text()


def test_a_real_h200_passes_driver_count_and_health():
    """Every output as this workplace's H200 gave it (device run 2026-12-04, driver 580.159.04: h200_x1_real): the
    GPU checks pass, and they read what nvidia-smi said (not a default)."""
    real = {s: fixture(k, "h200_x1_real") for s, k in (("nvidia_smi", "nvidia_smi"), ("smi_modes", "gpu_modes"),
                                                       ("smi_remap", "remapped_rows"), ("smi_fabric", "gpu_fabric"),
                                                       ("cuda_init", "cuda_init"), ("xid", "xid"))}
    hosts, fakes = cluster(1, gpus=1, node1={"sections": real})
    results = run(hosts, fakes)[0]
    driver, count, health = (check(results, "node1", c) for c in ("gpu_driver", "gpu_count", "gpu_health"))
    assert (driver.status, count.status, health.status) == ("pass", "pass", "pass"), (driver, count, health)
    assert "580.159.04" in driver.detail and "cuInit ok, 1 devices" in driver.detail, driver
    assert count.detail == "1 x NVIDIA H200", count
