"""The rdma check (issue 35 items 1 and 3: RDMA devices, port state, nvidia_peermem; clusterctl_infiniband;
rootless podman and memlock) and gpu_health's kernel-log part (item 5: NVRM Xid lines), over recorded
outputs (tests/fixtures/checks: rdma, memlock, xid; each cites its source)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from clusterctl.checks.gpu import XID_MEANING, parse_xid
from clusterctl.checks.job import PreflightJob, PreflightOptions
from clusterctl.checks.probe import build_probe_script
from clusterctl.config.inventory import Host
from tests.fakes.checks import FakeHost, sections_for
from tests.unit.checks.test_preflight import check, run

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "checks"
ROOTLESS = ('{"host": {"ociRuntime": {"name": "crun"}, "security": {"rootless": true}}, '
            '"store": {"graphRoot": "/home/u/.local/share/containers/storage"}, "version": {"Version": "4.9.3"}}')


def fixture(kind: str, case: str) -> tuple[str, int]:
    d = json.loads((FIX / kind / f"{case}.json").read_text())
    return d["output"], d.get("rc", 0)


def one(cid: str, infiniband=None, runtime="podman", gpus=8, **sections):
    host = Host(name="node1", address="10.77.0.11", runtime=runtime, gpus=gpus, infiniband=infiniband)
    fake = FakeHost(sections_for(host.address, "node1", runtime=runtime, gpus=gpus))
    fake.sections.update(sections)
    return check(run([host], {"node1": fake})[0], "node1", cid)


def test_ib_active_with_peermem_passes_and_reports():
    c = one("rdma", rdma=fixture("rdma", "hgx_8x_ib_active_peermem"))
    assert c.status == "pass" and "2 RDMA devices, 2 ports ACTIVE (InfiniBand); nvidia_peermem loaded" in c.detail, c
    assert c.data["uverbs"] == ["/dev/infiniband/uverbs0", "/dev/infiniband/uverbs1"] and c.data["nvidia_peermem"]


def test_roce_without_peermem_passes_with_the_note():
    c = one("rdma", rdma=fixture("rdma", "roce_no_peermem"))
    assert c.status == "pass" and "(Ethernet)" in c.detail and "nvidia_peermem not loaded" in c.detail, c


def test_infiniband_true_without_devices_fails_with_the_fix():
    c = one("rdma", infiniband=True, rdma=fixture("rdma", "none"))
    assert c.status == "fail" and "clusterctl_infiniband: true but no RDMA device" in c.detail, c
    assert "modprobe" in c.hint and "clusterctl_infiniband: false" in c.hint


def test_auto_without_devices_is_a_skip_and_false_skips_the_probe():
    assert one("rdma", rdma=fixture("rdma", "none")).status == "skip"
    c = one("rdma", infiniband=False, rdma=fixture("rdma", "hgx_8x_ib_active_peermem"))
    assert c.status == "skip" and "clusterctl_infiniband: false" in c.detail
    script = build_probe_script(Host(name="n", address="10.0.0.1", runtime="podman", gpus=8, infiniband=False),
                                PreflightJob(), PreflightOptions())
    assert "b rdma;" not in script and "b memlock;" not in script


def test_no_active_port_fails():
    c = one("rdma", rdma=fixture("rdma", "ib_port_init_no_subnet_manager"))
    assert c.status == "fail" and "no port ACTIVE (mlx5_0/1 INIT)" in c.detail and "subnet manager" in c.hint, c


def test_rootless_podman_with_a_hard_memlock_limit_fails_with_the_fix():
    c = one("rdma", rdma=fixture("rdma", "hgx_8x_ib_active_peermem"), runtime_info=(ROOTLESS, 0),
            memlock=fixture("memlock", "debian_default_8mib"))
    assert c.status == "fail" and "rootless podman refuses --ulimit memlock=-1" in c.detail and "8192 KiB" in c.detail
    assert "memlock unlimited" in c.hint and "/etc/security/limits.conf" in c.hint
    ok = one("rdma", rdma=fixture("rdma", "hgx_8x_ib_active_peermem"), runtime_info=(ROOTLESS, 0),
             memlock=fixture("memlock", "unlimited"))
    assert ok.status == "pass", ok
    rootful = one("rdma", rdma=fixture("rdma", "hgx_8x_ib_active_peermem"), memlock=fixture("memlock", "debian_default_8mib"))
    assert rootful.status == "pass", rootful


@pytest.mark.parametrize("case,status,words", [
    ("dmesg_fallen_off_the_bus", "fail", "Xid 79 (GPU has fallen off the bus) on PCI 0000:3b:00"),
    ("dbe_and_nvlink", "fail", "Xid 74 (NVLink error) on PCI 0000:18:00; 2 such lines"),
    ("dmesg_h100_ecc_contained_and_uncontained", "fail", "Xid 95 (uncontained ECC error)"),
    ("journalctl_gsp_timeout_and_app_error", "fail", "Xid 119 (GSP RPC timeout)"),
    ("none", "pass", "no uncorrectable ECC errors"),
])
def test_gpu_xid_outcomes(case, status, words):
    c = one("gpu_health", xid=fixture("xid", case))
    assert c.status == status and words in c.detail, c
    if status == "fail":
        assert "nvidia-smi -r" in c.hint and c.data["xids"]


def test_contained_ecc_alone_warns_and_an_app_xid_alone_passes():
    line = fixture("xid", "dmesg_h100_ecc_contained_and_uncontained")[0].splitlines()[0]
    c = one("gpu_health", xid=(line, 0))
    assert c.status == "warn" and "contained ECC error" in c.detail, c
    app = fixture("xid", "journalctl_gsp_timeout_and_app_error")[0].splitlines()[0]
    c = one("gpu_health", xid=(app, 0))
    assert c.status == "pass" and c.data["other"] == [13] and c.data["xids"] == [], c


def test_unreadable_kernel_log_is_a_skip():
    c = one("gpu_health", xid=("dmesg: read kernel buffer failed: Operation not permitted", 3))
    assert c.status == "pass" and "GPU faults not checked" in c.detail, c


def test_parse_xid_reads_any_text_and_names_the_catalogs_fatal_set():
    assert set(XID_MEANING) == {48, 74, 79, 94, 95, 119, 120}
    text = ("rank 3: RuntimeError: CUDA error: unspecified launch failure\n"
            "kernel: NVRM: Xid (PCI:0000:3b:00): 120, pid=1, name=python, GSP task error\n")
    [x] = parse_xid(text)
    assert (x["xid"], x["pci"], x["fatal"], x["seconds"]) == (120, "0000:3b:00", True, None)
    assert parse_xid("no xid here\nNVRM: loading NVIDIA UNIX x86_64 Kernel Module 550.54.15") == []
