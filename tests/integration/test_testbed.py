"""The testbed itself: real sshd per host with checked host keys, stub GPU tools, podman, faults, shared dir."""

from __future__ import annotations

import socket
import subprocess
import sys
import time

import pytest

from tests.integration.test_launch import wait_for
from tests.testbed import IMAGE, profile


def ssh(tb, host, command: str, timeout: float = 30) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["ssh", "-i", str(tb.key), "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={tb.known_hosts}",
         "-o", "BatchMode=yes", "-o", "ConnectTimeout=3", "-F", "/dev/null", f"{tb.user}@{host.address}", command],
        capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)


def reachable(address: str, timeout: float = 1.0) -> bool:
    try:
        with socket.create_connection((address, 22), timeout=timeout):
            return True
    except OSError:
        return False


def test_each_host_answers_ssh_with_its_own_hostname(testbed):
    for h in testbed.hosts:
        r = ssh(testbed, h, "hostname; id -u")
        assert r.returncode == 0, r.stderr
        assert r.stdout.split() == [h.name, "0"]


def test_unknown_host_key_is_refused(testbed, tmp_path):
    other = tmp_path / "known_hosts"
    other.write_text(testbed.known_hosts.read_text().splitlines()[1] + "\n")  # node2's key only
    h = testbed.hosts[0]
    r = subprocess.run(
        ["ssh", "-i", str(testbed.key), "-o", "StrictHostKeyChecking=yes", "-o", f"UserKnownHostsFile={other}",
         "-o", "BatchMode=yes", "-F", "/dev/null", f"{testbed.user}@{h.address}", "true"],
        capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    assert r.returncode == 255
    assert "Host key verification failed" in r.stderr


def test_stub_nvidia_smi_follows_the_profile(testbed):
    h = testbed.hosts[0]
    q = "index,name,driver_version,memory.total,ecc.errors.uncorrected.volatile.total,retired_pages.pending,uuid"
    r = ssh(testbed, h, f"nvidia-smi --query-gpu={q} --format=csv,noheader; "
                        f"nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits; nvidia-smi -L")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    # retired_pages.pending is [N/A] on an H100 (row remapping replaced page retirement: issue 35 item 6)
    assert lines[0].startswith("0, NVIDIA H100 80GB HBM3, 550.54.15, 81559 MiB, 0, [N/A], GPU-")
    assert lines[1].startswith("1, NVIDIA H100 80GB HBM3")
    assert lines[2:4] == ["81559", "81559"]
    assert lines[4].startswith("GPU 0: NVIDIA H100 80GB HBM3 (UUID: GPU-")
    r = ssh(testbed, h, "nvidia-smi --query-remapped-rows=gpu_uuid,remapped_rows.pending,remapped_rows.failure "
                        "--format=csv,noheader; nvidia-smi --query-gpu=index,fabric.state --format=csv,noheader; "
                        "dmesg | grep -c NVRM; python3 -c 'import ctypes; print(ctypes.CDLL(\"libcuda.so.1\").cuInit(0))'")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("GPU-") and lines[0].endswith(", 0, 0") and lines[2] == "0, Completed"
    assert lines[4:] == ["1", "0"]          # the driver's load line, no Xid; the stub libcuda's cuInit: success
    r = ssh(testbed, h, "nvidia-ctk --version; nvidia-ctk cdi list")
    assert r.stdout.splitlines()[0] == "NVIDIA Container Toolkit CLI version 1.14.6"
    assert r.stdout.splitlines()[2:] == ["nvidia.com/gpu=0", "nvidia.com/gpu=1", "nvidia.com/gpu=all"]
    assert "Found 3 CDI devices" in r.stderr


def test_special_profiles(make_testbed):
    tb = make_testbed(3, [
        profile(gpus=4, ecc_uncorrectable=[0, 0, 3, 0], retired_pending=[False, True, False, False]),
        profile(mismatch=True, toolkit=False, image=False),
        profile(gpus=0, docker=True),
    ])
    bad, mismatch, cpu = tb.hosts
    r = ssh(tb, bad, "nvidia-smi --query-gpu=index,ecc.errors.uncorrected.volatile.total,retired_pages.pending "
                     "--format=csv")
    assert r.stdout.splitlines() == ["index, ecc.errors.uncorrected.volatile.total, retired_pages.pending",
                                     "0, 0, No", "1, 0, Yes", "2, 3, No", "3, 0, No"]
    r = ssh(tb, mismatch, "nvidia-smi; echo rc=$?; command -v nvidia-ctk || echo no-ctk; "
                          f"podman image exists {IMAGE} || echo no-image")
    assert r.stdout.splitlines() == ["Failed to initialize NVML: Driver/library version mismatch", "rc=18",
                                     "no-ctk", "no-image"]
    r = ssh(tb, cpu, "command -v nvidia-smi || echo no-smi; docker image exists " + IMAGE + " && echo image")
    assert r.stdout.splitlines() == ["no-smi", "image"]


def test_podman_container_on_host_network(testbed):
    h = testbed.hosts[1]
    r = ssh(testbed, h, "podman run --rm --network host --init pytorch-cuda:v2.7-ssh "
                        "sh -c 'cat /proc/net/fib_trie; python -c \"import clusterctl, sys; print(sys.prefix)\"'",
            timeout=120)
    assert r.returncode == 0, r.stderr
    assert h.address in r.stdout
    assert "/.venv" in r.stdout or "venv" in r.stdout


def test_container_left_running_is_visible_and_removable(testbed):
    h = testbed.hosts[2]
    r = ssh(testbed, h, f"podman run -d --network host --init --name tbprobe {IMAGE}", timeout=120)
    assert r.returncode == 0, r.stderr
    try:
        # `run -d` returns once the container's init runs; its child (`sleep infinity`) may come a moment later
        deadline = time.monotonic() + 10
        while not any("sleep infinity" in cmd for _, cmd in testbed.processes(h)):
            assert time.monotonic() < deadline, "the container's process never showed in the host's process list"
            time.sleep(0.1)
        assert "tbprobe" in testbed.exec(h, ["podman", "ps", "--format", "{{.Names}}"]).stdout
        # its lock is a file of this host's, gone with the testbed (not the machine's /dev/shm/libpod_lock)
        assert list((testbed.runroot / h.name / "libpod-tmp" / "locks").iterdir())
    finally:
        ssh(testbed, h, "podman rm -f -t 0 tbprobe", timeout=60)
    assert not any("sleep infinity" in cmd for _, cmd in testbed.processes(h))


def test_partition_and_heal(testbed):
    h = testbed.hosts[3]
    testbed.partition(h)
    try:
        assert not reachable(h.address)
        # from a peer too: the packets vanish, so the connection times out rather than being refused
        r = testbed.exec(testbed.hosts[0], [sys.executable, "-c",
                         f"import socket; socket.create_connection(('{h.address}', 22), timeout=1)"])
        assert "timed out" in r.stderr
    finally:
        testbed.heal(h)
    deadline = time.monotonic() + 10
    while not reachable(h.address) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert ssh(testbed, h, "hostname").stdout.strip() == h.name


def test_stop_and_start_sshd(testbed):
    h = testbed.hosts[4]
    testbed.stop_sshd(h)
    try:
        r = ssh(testbed, h, "true")
        assert r.returncode == 255 and "refused" in r.stderr
    finally:
        testbed.start_sshd(h)
    assert ssh(testbed, h, "hostname").stdout.strip() == h.name


def test_kill_by_pattern_and_occupy_port(testbed):
    h = testbed.hosts[5]
    with testbed.occupy_port(h, 29400):
        r = testbed.exec(h, [sys.executable, "-c", "import socket; s=socket.socket(); s.bind(('0.0.0.0', 29400))"])
        assert "Address already in use" in r.stderr
        assert reachable(h.address)
    ssh(testbed, h, "nohup sleep 1234 >/dev/null 2>&1 &")
    # the ssh session returns once the background job is forked; nohup execs sleep a moment later
    wait_for(lambda: any(cmd.startswith("sleep 1234") for _, cmd in testbed.processes(h)), 10, "sleep to start")
    killed = testbed.kill(h, pattern=r"^sleep 1234")
    assert len(killed) == 1
    assert testbed.sshd_pid(h) is not None  # only the matching process died


def test_shared_dir_is_visible_on_every_host(testbed):
    marker = testbed.shared / "from-node1"
    assert ssh(testbed, testbed.hosts[0], f"echo hello > {marker}").returncode == 0
    for h in testbed.hosts:
        assert ssh(testbed, h, f"cat {marker}").stdout.strip() == "hello"


def test_inventory_is_loadable_by_clusterctl(testbed, tmp_path):
    from clusterctl.config.inventory import load

    inv = load(testbed.inventory(tmp_path / "inv.yaml"))
    assert [h.address for h in inv.hosts] == [h.address for h in testbed.hosts]
    assert {h.gpus for h in inv.hosts} == {2}


@pytest.mark.parametrize("n", [2])
def test_two_testbeds_coexist(testbed, make_testbed, n):
    other = make_testbed(n, [profile(gpus=0, image=False)] * n)
    assert other.hosts[0].address != testbed.hosts[0].address
    assert ssh(other, other.hosts[1], "hostname").stdout.strip() == "node2"
    assert ssh(testbed, testbed.hosts[1], "hostname").stdout.strip() == "node2"
