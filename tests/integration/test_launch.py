"""`clusterctl launch/status/logs/stop` end to end on the testbed, as a user runs them (the CLI in a subprocess).

Every job runs the repo's quickstart ``train.py`` (3 nodes x 2 processes, gloo on CPU) with podman containers,
docker containers (a real dockerd per host) or bare on the hosts. Hosts are CPU hosts (``profile(gpus=0)``): with
GPUs the container runtimes add GPU flags that the testbed cannot satisfy. Every subprocess has a timeout; the
machine is small and shared, so the timeouts are generous while the assertions are exact.

CI time: the docker arms share one module-scoped docker testbed (``docker_tb3``) and run where the behaviour is
docker's own (training to completion with per-rank logs, stop); the rollback, dry-run and side-by-side cases are
runtime-independent in the controller and run for podman and bare only. For podman and bare, `stop` mid-run is
tested in the side-by-side test (one job of two stopped), for docker alone.
"""
from __future__ import annotations

import json
import os
import re
import shutil
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from clusterctl.store import paths
from tests.integration import recovery_harness as rh
from tests.testbed import profile

REPO = Path(__file__).resolve().parents[2]
TRAIN = REPO / "examples" / "quickstart" / "train.py"
QUICKSTART_JOB = REPO / "examples" / "quickstart" / "job.yaml"
VENV_BIN = Path(sys.prefix) / "bin"
RUNTIMES = ["podman", "bare"]
CONTAINER_RUNTIMES = ["podman", "bare", "docker"]       # the tests that run docker as well (see the docstring)
JOB_TIMEOUT = 420          # one attached launch of a short job, on a loaded 2-core machine
LEFTOVER_RE = re.compile(r"clusterctl|torchrun|train\.py|conmon|podman")   # clusterctl: runner, stream wrapper, node.log tail


# ------------------------------------------------------------------------------------------------ helpers
def clusterctl(state: Path, *args: str, timeout: float = 120, env: dict | None = None,
               cwd: Path | str | None = None) -> subprocess.CompletedProcess:
    e = {k: v for k, v in os.environ.items() if k not in ("CLUSTERCTL_INVENTORY", "CLUSTERCTL_STATE_DIR")}
    e.update(env or {})
    argv = [sys.executable, "-m", "clusterctl.cli", "--state-dir", str(state), *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=e,
                          cwd=cwd)


def write_inventory(tb, path: Path, runtime: str, host_overrides: dict | None = None) -> Path:
    tb.inventory(path, runtime=runtime)
    data = yaml.safe_load(path.read_text())
    for name, extra in (host_overrides or {}).items():
        data["all"]["hosts"][name].update(extra)
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def write_job(path: Path, tb, name: str, runtime: str, *, steps: int = 30, port: int = 29400,
              step_time: float = 0.0, extra: dict | None = None) -> Path:
    """``tb``: a testbed (or anything with ``shared``; then no docker mounts)."""
    shared = Path(tb.shared) / name
    job = {
        "name": name,
        "nodes": 3,
        "nproc_per_node": 2,
        "script": str(TRAIN),
        "args": ["--steps", str(steps), "--checkpoint-every", "10", "--log-every", "5",
                 "--step-time", str(step_time), "--dump-env", str(shared / "env")],
        "checkpoint": {"dir": str(shared / "ckpt")},
        "rendezvous": {"port": port, "join_timeout": 120, "last_call_timeout": 2},
        "restarts": {"max_restarts": 0, "max_failures": 0},
        "supervisor": {"probe_interval_s": 1},
        "container": {"ulimits": {}},                       # the testbed lacks CAP_SYS_RESOURCE
        "env": {"TORCH_CPP_LOG_LEVEL": "INFO"},              # every rank prints (c10d/gloo init lines)
    }
    if runtime == "bare":
        job["torchrun"] = str(VENV_BIN / "torchrun")         # the hosts' PATH (sshd SetEnv) has no venv
    if runtime == "docker":
        job["mounts"] = tb.job_mounts(runtime)               # dockerd has no containers.conf volumes
    job.update(extra or {})
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def status_json(state: Path, job: str) -> dict:
    r = clusterctl(state, "status", job, "--output", "json")
    assert r.returncode == 0, r.stderr
    return json.loads(r.stdout)


def wait_for(pred, timeout: float, what: str, interval: float = 1.0):
    end = time.monotonic() + timeout
    while True:
        value = pred()
        if value:
            return value
        if time.monotonic() > end:
            pytest.fail(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(interval)


def wait_for_logs(state: Path, job: str, pred, what: str) -> None:
    """Until ``pred(lines)`` holds for the job's output as `clusterctl logs` prints it: looks at the controller's
    copy (``<state>/jobs/<id>/output.log``, what `logs` reads) every second, for a `clusterctl logs` process per look
    costs ~1 s of CPU on the 2 cores the job's own start needs; then checks `clusterctl logs` itself once."""
    path = paths.job_dir(state, status_json(state, job)["job_id"]) / "output.log"
    wait_for(lambda: path.exists() and pred(path.read_text(errors="replace").splitlines()), JOB_TIMEOUT, what)
    assert pred(logs(state, job)), f"`clusterctl logs {job}` does not show {what}"


def containers(tb, host) -> list[str]:
    """Every container on the host: podman's, and docker's on a docker testbed."""
    return tb.container_names(host) + (tb.container_names(host, "docker") if tb.docker else [])


def job_processes(tb, host) -> list[tuple[int, str]]:
    return [(pid, cmd) for pid, cmd in tb.processes(host) if LEFTOVER_RE.search(cmd) and not tb.is_daemon(cmd)]


def assert_nothing_left(tb, hosts=None, timeout: float = 30) -> None:
    """No container (podman/docker ps -a) and no process of a job on any host; processes get a moment to exit."""
    hosts = hosts or [h.name for h in tb.hosts]
    for h in hosts:
        assert containers(tb, h) == [], f"containers left on {h}"
    wait_for(lambda: not any(job_processes(tb, h) for h in hosts), timeout,
             "job processes to go: " + repr({h: job_processes(tb, h) for h in hosts}))


def wait_terminal(state: Path, job: str, timeout: float) -> dict:
    """Wait until the job is terminal and its supervisor has exited (looking at the state DB, not a CLI process
    per second: see recovery_harness.Run.wait_end); then what `clusterctl status` says."""
    return rh.Run(None, state, Path(), Path(), job, 0, Path()).wait_end(timeout)


def logs(state: Path, job: str, *args: str) -> list[str]:
    r = clusterctl(state, "logs", job, *args)
    assert r.returncode == 0, r.stderr
    return r.stdout.splitlines()


def cleanup_hosts(tb) -> None:
    """After a failed assertion: leave no job behind for the next test (the testbed is torn down anyway)."""
    for h in tb.hosts:
        tb.remove_containers(h)
        tb.kill(h, r"torchrun|train\.py|clusterctl-runner")


@pytest.fixture(scope="module")
def docker_tb3(tmp_path_factory, testbed_slot):
    """3 CPU hosts, each with its own dockerd, shared by this module's docker arms (each leaves nothing behind)."""
    letter = string.ascii_lowercase[testbed_slot]
    tb = rh.cpu_testbed(3, tmp_path_factory.mktemp("docker-tb"), f"tbd{letter}", range(200, 220), docker=True)
    yield tb
    tb.down()


@pytest.fixture
def tb3(request, make_testbed):
    """3 CPU hosts: a fresh testbed per test for podman and bare, the module's docker testbed for docker."""
    if request.node.callspec.params.get("runtime") == "docker":
        tb = request.getfixturevalue("docker_tb3")
    else:
        tb = make_testbed(3, [profile(gpus=0)] * 3)
    yield tb
    cleanup_hosts(tb)


# ------------------------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("runtime", CONTAINER_RUNTIMES)
def test_three_nodes_train_to_completion(tb3, tmp_path, runtime):
    tb = tb3
    inv = write_inventory(tb, tmp_path / "inventory.yaml", runtime)
    job = write_job(tmp_path / "job.yaml", tb, "tbdemo", runtime)
    state = tmp_path / "state"
    r = clusterctl(state, "launch", str(job), "-i", str(inv), timeout=JOB_TIMEOUT)
    assert r.returncode == 0, f"stdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-4000:]}"
    assert "done: step 30" in r.stdout              # the attached launch followed the output
    # and the attempt's start-up (issue 39 item 11): its first step, with how many ranks had started by then
    assert re.search(r"clusterctl: attempt 1: first step: step \d+ \([1-6]/6 ranks started\), [\d.]+s after the "
                     r"start", r.stdout), r.stdout[-4000:]

    # every rank: WORLD_SIZE 6, one MASTER_ADDR (the rendezvous host's address), its own node
    dumps = {}
    for rank in range(6):
        path = Path(tb.shared) / "tbdemo" / f"env-rank{rank}.json"
        dumps[rank] = json.loads(path.read_text())
    addresses = {h.name: h.address for h in tb.hosts}
    assert {d["env"]["WORLD_SIZE"] for d in dumps.values()} == {"6"}
    assert {d["env"]["MASTER_ADDR"] for d in dumps.values()} == {tb.hosts[0].address}
    nodes_seen = {}
    for rank, d in dumps.items():
        node = d["env"]["CLUSTERCTL_NODE"]
        assert node in addresses
        assert d["hostname"] == node                   # the rank really ran on that host
        nodes_seen.setdefault(node, []).append(rank)
    assert sorted(nodes_seen) == ["node1", "node2", "node3"]
    assert all(len(ranks) == 2 for ranks in nodes_seen.values()), nodes_seen

    v = status_json(state, "tbdemo")
    assert v["state"] == "SUCCEEDED", v
    assert v["checkpoint"] and v["checkpoint"]["step"] == 30
    assert v["startup"]["phase"] == "first_step", v["startup"]

    for rank in range(6):
        node = dumps[rank]["env"]["CLUSTERCTL_NODE"]
        lines = logs(state, "tbdemo", "--rank", str(rank))
        assert lines, f"no output for rank {rank}"
        assert all(line.startswith(f"[{node}/{rank}] ") for line in lines), lines[:5]
    assert "done: step 30" in "\n".join(logs(state, "tbdemo", "--rank", "0"))

    assert_nothing_left(tb)


@pytest.mark.parametrize("runtime", ["docker"])     # podman, bare: test_two_jobs_side_by_side_... stops one of two
def test_stop_mid_run_leaves_nothing_and_keeps_checkpoints(tb3, tmp_path, runtime):
    tb = tb3
    inv = write_inventory(tb, tmp_path / "inventory.yaml", runtime)
    job = write_job(tmp_path / "job.yaml", tb, "tbstop", runtime, steps=100000, step_time=0.05)
    state = tmp_path / "state"
    r = clusterctl(state, "launch", str(job), "-i", str(inv), "--detach", timeout=180)
    assert r.returncode == 0, r.stderr

    def checkpointed(out):
        return any(re.match(r"\[node1/0\] checkpoint ", ln) for ln in out) and \
            any(re.match(r"\[node1/0\] step \d+", ln) for ln in out)
    wait_for_logs(state, "tbstop", checkpointed, "training steps and a checkpoint")
    assert status_json(state, "tbstop")["state"] == "RUNNING"

    r = clusterctl(state, "stop", "tbstop", timeout=180)
    assert r.returncode == 0, r.stderr
    assert "STOPPED" in r.stderr
    v = wait_terminal(state, "tbstop", 120)
    assert v["state"] == "STOPPED", v
    assert_nothing_left(tb)
    ckpts = sorted(p.name for p in (Path(tb.shared) / "tbstop" / "ckpt").glob("step-*"))
    assert ckpts, "the checkpoints were deleted"


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_a_node_that_cannot_start_rolls_back_the_others(make_testbed, tmp_path, runtime):
    """node3 has no image: its `podman run` fails. With runtime bare, node1/node2 are bare and node3 is podman
    (a mixed cluster), so the bare nodes' runners have started when the rollback kills them."""
    tb = make_testbed(3, [profile(gpus=0), profile(gpus=0), profile(gpus=0, image=False)])
    try:
        inv = write_inventory(tb, tmp_path / "inventory.yaml", runtime,
                              {"node3": {"clusterctl_runtime": "podman"}})
        job = write_job(tmp_path / "job.yaml", tb, "tbroll", runtime, steps=100000, step_time=0.05)
        state = tmp_path / "state"
        r = clusterctl(state, "launch", str(job), "-i", str(inv), "--skip-preflight", timeout=300)
        assert r.returncode == 1, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
        v = status_json(state, "tbroll")
        assert v["state"] == "FAILED", v
        assert "node3" in v["reason"], v["reason"]
        assert "node3" in r.stderr
        wait_terminal(state, "tbroll", 60)
        assert_nothing_left(tb)
    finally:
        cleanup_hosts(tb)


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_dry_run_masks_secrets_and_touches_no_host(tmp_path, runtime):
    # addresses in TEST-NET-1 (RFC 5737): any connection attempt would hang until a timeout
    inv = tmp_path / "inventory.yaml"
    inv.write_text(yaml.safe_dump({"all": {
        "hosts": {f"n{i}": {"ansible_host": f"192.0.2.{i}"} for i in (1, 2, 3)},
        "vars": {"clusterctl_runtime": runtime, "clusterctl_gpus": 0, "ansible_user": "nobody",
                 "clusterctl_known_hosts": str(tmp_path / "no_known_hosts")}}}))

    class _Tb:   # write_job only needs the shared directory
        shared = tmp_path / "shared"
    job = write_job(tmp_path / "job.yaml", _Tb, "tbdry", runtime, extra={"secret_env": ["TBDRY_TOKEN"]})
    secret = "s3cr3t-'value'-$(reboot)"
    state = tmp_path / "state"
    env = {"TBDRY_TOKEN": secret}

    t0 = time.monotonic()
    r = clusterctl(state, "launch", str(job), "-i", str(inv), "--dry-run", env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert time.monotonic() - t0 < 30
    assert secret not in r.stdout + r.stderr
    assert "TBDRY_TOKEN=***" in r.stdout
    for h in ("n1", "n2", "n3"):
        assert f"[{h}] 192.0.2." in r.stdout
    assert "--rdzv-backend=c10d" in r.stdout

    r = clusterctl(state, "launch", str(job), "-i", str(inv), "--dry-run", "--output", "json", env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert secret not in r.stdout + r.stderr
    plan = json.loads(r.stdout)
    assert [n["host"] for n in plan["nodes"]] == ["n1", "n2", "n3"]
    assert all(n["env"]["TBDRY_TOKEN"] == "***" for n in plan["nodes"])
    assert all(n["runtime"] == runtime for n in plan["nodes"])
    assert [n["is_rdzv_host"] for n in plan["nodes"]] == [True, False, False]

    # nothing was recorded either
    r = clusterctl(state, "status", "--output", "json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["jobs"] == []

    # a secret that is not set: a usage error before anything else
    # a secret that is not set: --dry-run needs no secret value (it prints ***); a launch is a usage error at once
    r = clusterctl(state, "launch", str(job), "-i", str(inv), "--dry-run", timeout=60)
    assert r.returncode == 0 and "TBDRY_TOKEN=***" in r.stdout, r.stderr
    t0 = time.monotonic()
    r = clusterctl(state, "launch", str(job), "-i", str(inv), "--skip-preflight", timeout=60)
    assert r.returncode == 2 and "TBDRY_TOKEN" in r.stderr, r.stderr
    assert time.monotonic() - t0 < 30


@pytest.mark.parametrize("runtime", RUNTIMES)
def test_two_jobs_side_by_side_same_name_refused_and_stop_takes_only_its_own(tb3, tmp_path, runtime):
    """Job A runs until stopped; a second launch of A is refused (exit 2); job B (another name and port) launches
    beside it and both train. `stop A` mid-run: A is STOPPED with nothing of it left on any host and its
    checkpoints kept, while B trains on to SUCCEEDED; then nothing of either is left."""
    tb = tb3
    inv = write_inventory(tb, tmp_path / "inventory.yaml", runtime)
    state = tmp_path / "state"
    # 2 nodes of the 3, 1 process per node: two jobs' ranks side by side, not their count, are what this test is
    # about (each rank started costs ~10 s of a loaded CI core)
    one = {"nodes": 2, "nproc_per_node": 1}
    job_a = write_job(tmp_path / "a.yaml", tb, "tbsidea", runtime, steps=100000, step_time=0.1, port=29400,
                      extra=one)
    job_b = write_job(tmp_path / "b.yaml", tb, "tbsideb", runtime, steps=120, step_time=0.1, port=29401, extra=one)

    r = clusterctl(state, "launch", str(job_a), "-i", str(inv), "--detach", timeout=180)
    assert r.returncode == 0, r.stderr
    r = clusterctl(state, "launch", str(job_a), "-i", str(inv), "--detach", timeout=180)
    assert r.returncode == 2, f"stdout:\n{r.stdout}\nstderr:\n{r.stderr}"
    assert "tbsidea" in r.stderr and "already" in r.stderr, r.stderr
    assert len(json.loads(clusterctl(state, "status", "--output", "json").stdout)["jobs"]) == 1

    r = clusterctl(state, "launch", str(job_b), "-i", str(inv), "--detach", timeout=180)
    assert r.returncode == 0, r.stderr

    def training(out):
        return any(re.match(r"\[node1/0\] step \d+", ln) for ln in out)

    def checkpointed(out):
        return training(out) and any(re.match(r"\[node1/0\] checkpoint ", ln) for ln in out)
    wait_for_logs(state, "tbsidea", checkpointed, "tbsidea to train and checkpoint")
    wait_for_logs(state, "tbsideb", training, "tbsideb to train")
    states = {j: status_json(state, j)["state"] for j in ("tbsidea", "tbsideb")}
    assert states == {"tbsidea": "RUNNING", "tbsideb": "RUNNING"}, states

    b_containers = {h.name: [c for c in containers(tb, h.name) if "tbsideb" in c] for h in tb.hosts}
    r = clusterctl(state, "stop", "tbsidea", timeout=180)
    assert r.returncode == 0, r.stderr
    assert "STOPPED" in r.stderr
    v = wait_terminal(state, "tbsidea", 120)
    assert v["state"] == "STOPPED", v
    for h in tb.hosts:       # nothing of A left (containers, processes); B's containers untouched
        assert not [c for c in containers(tb, h.name) if "tbsidea" in c], containers(tb, h.name)
        assert [c for c in containers(tb, h.name) if "tbsideb" in c] == b_containers[h.name]
    wait_for(lambda: not [c for h in tb.hosts for _, c in job_processes(tb, h.name) if "tbsidea" in c], 30,
             "tbsidea's processes to go")
    assert status_json(state, "tbsideb")["state"] == "RUNNING"
    assert sorted((Path(tb.shared) / "tbsidea" / "ckpt").glob("step-*")), "A's checkpoints were deleted"

    v = wait_terminal(state, "tbsideb", JOB_TIMEOUT)
    assert v["state"] == "SUCCEEDED", v
    assert any("done: step 120" in ln for ln in logs(state, "tbsideb", "--rank", "0"))
    assert_nothing_left(tb)


def test_embedded_default_runs_the_quickstart_on_this_machine(tmp_path):
    """No inventory anywhere: the job runs bare on this machine over the local connection."""
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    # the quickstart's fixed checkpoint dir: a previous run's step 200 would make this run a no-op
    shutil.rmtree("/tmp/clusterctl-quickstart/checkpoints", ignore_errors=True)
    env = {"PATH": f"{VENV_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"}   # an activated venv: torchrun
    state = tmp_path / "state"
    t0 = time.monotonic()
    r = clusterctl(state, "launch", str(QUICKSTART_JOB), env=env, cwd=cwd, timeout=300)
    took = time.monotonic() - t0
    assert r.returncode == 0, f"stdout:\n{r.stdout[-3000:]}\nstderr:\n{r.stderr[-3000:]}"
    assert re.search(r"done: step 200 loss \d+\.\d+", r.stdout), r.stdout[-2000:]
    assert "SUCCEEDED" in r.stderr
    v = status_json(state, "quickstart")
    assert v["state"] == "SUCCEEDED"
    assert [n["node"] for n in v["nodes"]] == ["localhost"]
    assert took < 60, f"the quickstart took {took:.0f}s"
    wait_for(lambda: not [p for p in Path("/proc").glob("[0-9]*/cmdline")
                          if _reads(p).find(v["job_id"].encode()) >= 0], 30, "the job's processes to exit")


def _reads(p: Path) -> bytes:
    try:
        return p.read_bytes()
    except OSError:
        return b""
