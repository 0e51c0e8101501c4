"""LaunchPlan: golden plans per runtime, secrets masked, env quoting, bare process model executed for real."""
from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time

import pytest

from clusterctl.config.inventory import Host
from clusterctl.config.spec import loads_job
from clusterctl.errors import InputError, UserError
from clusterctl.launch import runtimes
from clusterctl.launch.plan import MASK, build_plan, read_secrets
from clusterctl.launch.runtimes.bare import parse_list as parse_bare
from clusterctl.launch.runtimes.docker import parse_ps

GOLDEN = os.path.join(os.path.dirname(__file__), "..", "..", "fixtures", "plans")
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"
SECRET = "s3cr'et \"$(rm -rf /)\" `id`\nline2 \\ $HOME"
NASTY = "it's \"quoted\" $(touch /tmp/pwned) `id` ${HOME}\nsecond line\ttab"


def _golden(name: str, value) -> None:
    path = os.path.join(GOLDEN, name)
    text = json.dumps(value, indent=2, sort_keys=True) + "\n"
    if UPDATE or not os.path.exists(path):
        if not UPDATE:
            pytest.fail(f"{path} missing: run with UPDATE_GOLDEN=1 to create it")
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    with open(path, encoding="utf-8") as f:
        assert json.loads(f.read()) == json.loads(text), f"{name} differs (UPDATE_GOLDEN=1 to accept)"


def _snapshot(plan) -> dict:
    return {"plan": plan.to_dict(), "render": plan.render().splitlines()}


def _hosts(runtime: str, n: int, gpus: int | None = 8) -> list[Host]:
    return [Host(name=f"gpu{i:02d}", address=f"10.1.0.{10 + i}", runtime=runtime, gpus=gpus,
                 interface="ib0" if i == 1 else None) for i in range(1, n + 1)]


DOCKER_JOB = """
name: vit-pretrain
nodes: 2
nproc_per_node: gpu
script: train.py
args: ["--epochs", "10", "--note", "-starts-with-dash"]
workdir: /workspace
env: {NCCL_DEBUG: WARN}
secret_env: [WANDB_API_KEY]
mounts: ["/shared/data:/data:ro", "/shared/ckpt:/shared/ckpt"]
checkpoint: {dir: /shared/ckpt/vit-pretrain, keep: 3, verify: size}
container: {extra_args: [--cap-add=SYS_PTRACE]}
"""

PODMAN_ELASTIC_JOB = """
name: elastic
nodes: 2:3
nproc_per_node: 2
module: pkg.train
args: [--resume]
torchrun: python3 -m torch.distributed.run
rendezvous: {host: gpu02, port: 29500}
restarts: {max_restarts: 0}
container: {ipc: private, shm_size: 16g, ulimits: {}}
"""

BARE_JOB = """
name: bare-job
nodes: 1
script: ./train.py
workdir: /home/me/proj
env:
  NASTY: "it's \\"quoted\\" $(touch /tmp/pwned) `id` ${HOME}\\nsecond line\\ttab"
  PYTHONPATH: /home/me/lib
secret_env: [WANDB_API_KEY, HF_TOKEN]
"""


def test_golden_docker():
    spec = loads_job(DOCKER_JOB, "job.yaml")
    plan = build_plan(spec, _hosts("docker", 2), job_id="vit-pretrain-20250101-a1b2", attempt=0,
                      interfaces={"gpu02": "eth1"}, infiniband={"gpu01": True}, pkg_path="/opt/clusterctl")
    _golden("docker-fixed.json", _snapshot(plan))


def test_golden_podman_elastic():
    spec = loads_job(PODMAN_ELASTIC_JOB, "job.yaml")
    hosts = _hosts("podman", 2, gpus=0)
    plan = build_plan(spec, hosts, job_id="elastic-7", attempt=3, resume_from="/ckpt/step-00000420", resume_step=420)
    _golden("podman-elastic.json", _snapshot(plan))
    assert plan.rdzv_endpoint == "10.1.0.12:29500"
    assert [n.is_rdzv_host for n in plan.nodes] == [False, True]
    assert "--nnodes=2:2" in plan.nodes[0].torchrun_argv   # a relaunch on 2 of 3 nodes: no last-call wait
    assert plan.nnodes == "2:2"


def test_nnodes_is_min_max_on_the_first_attempt_and_min_k_on_a_smaller_relaunch():
    spec = loads_job(PODMAN_ELASTIC_JOB, "job.yaml")
    first = build_plan(spec, _hosts("podman", 2, gpus=0), job_id="e-1", attempt=1)
    assert all("--nnodes=2:3" in n.torchrun_argv for n in first.nodes)     # the job's MIN:MAX, as written
    full = build_plan(spec, _hosts("podman", 3, gpus=0), job_id="e-1", attempt=2)
    assert all("--nnodes=2:3" in n.torchrun_argv for n in full.nodes)      # all MAX nodes back: MIN:MAX
    small = build_plan(spec, _hosts("podman", 2, gpus=0), job_id="e-1", attempt=2)
    assert all("--nnodes=2:2" in n.torchrun_argv for n in small.nodes)


def test_golden_bare_env_quoting():
    spec = loads_job(BARE_JOB, "job.yaml")
    plan = build_plan(spec, _hosts("bare", 1, gpus=0), job_id="bare-job-1", attempt=1, pkg_path="/opt/cc")
    _golden("bare-fixed.json", _snapshot(plan))
    node = plan.nodes[0]
    assert node.env["NASTY"] == NASTY
    assert node.env["PYTHONPATH"] == "/opt/cc:/home/me/lib"
    script = node.env_script({"WANDB_API_KEY": SECRET, "HF_TOKEN": "hf_x"}).decode()
    _golden("bare-env-script.json", script.splitlines())


def test_torchrun_argv_shape():
    spec = loads_job(DOCKER_JOB, "job.yaml")
    plan = build_plan(spec, _hosts("docker", 2), job_id="j1", attempt=2)
    a, b = (n.torchrun_argv for n in plan.nodes)
    assert a[0] == "torchrun" and a[-5:] == ("train.py", "--epochs", "10", "--note", "-starts-with-dash")
    assert "--rdzv-backend=c10d" in a and "--rdzv-id=j1-2" in a and "--max-restarts=3" in a
    assert "--nproc-per-node=8" in a and "--nnodes=2:2" in a
    assert "--local-addr=10.1.0.11" in a and "--local-addr=10.1.0.12" in b
    conf_a = next(x for x in a if x.startswith("--rdzv-conf="))
    conf_b = next(x for x in b if x.startswith("--rdzv-conf="))
    assert conf_a.startswith("--rdzv-conf=is_host=1,") and conf_b.startswith("--rdzv-conf=is_host=0,")
    assert "join_timeout=300" in conf_a and "last_call_timeout=30" in conf_a
    assert plan.nodes[0].env["GLOO_SOCKET_IFNAME"] == "ib0" and "NCCL_SOCKET_IFNAME" not in plan.nodes[1].env


def test_secrets_never_in_plan():
    spec = loads_job(DOCKER_JOB, "job.yaml")
    plan = build_plan(spec, _hosts("docker", 2), job_id="j1", attempt=0)
    for n in plan.nodes:
        assert n.env["WANDB_API_KEY"] == MASK
        assert n.secret_names == ("WANDB_API_KEY",)
        # no environment value at all on the command line: only the name of the one carrier variable
        assert not any("NCCL_DEBUG" in a or "WARN" == a for a in n.runtime_argv)
    text = json.dumps(plan.to_dict()) + plan.render()
    assert "***" in text
    script = plan.nodes[0].env_script({"WANDB_API_KEY": "hunter2"})
    assert b"hunter2" in script and "hunter2" not in text


def test_env_script_round_trips_through_sh():
    spec = loads_job(BARE_JOB, "job.yaml")
    node = build_plan(spec, _hosts("bare", 1, gpus=0), job_id="b1", attempt=0).nodes[0]
    script = node.env_script({"WANDB_API_KEY": SECRET, "HF_TOKEN": ""})
    dump = f"import json, os; print(json.dumps({{k: os.environ.get(k) for k in {sorted(node.env)!r}}}))"
    r = subprocess.run(["sh", "-c", 'eval "$(cat)" && exec "$@"', "sh", sys.executable, "-c", dump],
                       input=script, capture_output=True, timeout=30, env={"PATH": os.environ["PATH"]})
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert got["NASTY"] == NASTY and got["WANDB_API_KEY"] == SECRET and got["HF_TOKEN"] == ""
    assert got["CLUSTERCTL_ATTEMPT"] == "0" and got["PYTHONUNBUFFERED"] == "1"


def test_missing_secret_is_user_error():
    with pytest.raises(UserError, match="HF_TOKEN"):
        read_secrets(["WANDB_API_KEY", "HF_TOKEN"], {"WANDB_API_KEY": "x"})
    assert read_secrets(["A"], {"A": "1", "B": "2"}) == {"A": "1"}
    node = build_plan(loads_job(BARE_JOB), _hosts("bare", 1), job_id="b", attempt=0).nodes[0]
    with pytest.raises(UserError, match="HF_TOKEN"):
        node.env_script({"WANDB_API_KEY": "x"})


@pytest.mark.parametrize("hosts,msg", [
    (1, "needs 2 to 3 node"), (4, "needs 2 to 3 node"),
])
def test_node_count_checked(hosts, msg):
    spec = loads_job("name: a\nscript: t.py\nnodes: 2:3\n")
    with pytest.raises(UserError, match=msg):
        build_plan(spec, _hosts("docker", hosts), job_id="a1", attempt=0)


def test_plan_errors():
    spec = loads_job("name: a\nscript: t.py\nnproc_per_node: gpu\n")
    with pytest.raises(UserError, match="no known GPUs"):
        build_plan(spec, _hosts("docker", 1, gpus=0), job_id="a1", attempt=0)
    spec = loads_job("name: a\nscript: t.py\nnodes: 2\nrendezvous: {host: gpu09}\n")
    with pytest.raises(UserError, match="gpu09"):
        build_plan(spec, _hosts("docker", 2), job_id="a1", attempt=0)
    spec = loads_job("name: a\nscript: t.py\n")
    with pytest.raises(UserError, match="job id"):
        build_plan(spec, _hosts("docker", 1), job_id="../x", attempt=0)
    with pytest.raises(UserError, match="unknown runtime"):
        build_plan(spec, [Host(name="h", address="1.2.3.4", runtime="lxc")], job_id="a1", attempt=0)
    with pytest.raises(UserError, match="not one of"):
        build_plan(spec, _hosts("docker", 1), job_id="a1", attempt=0, rdzv_host=Host(name="zz", address="1.1.1.1"))


def test_ipv6_endpoint_and_rdzv_override():
    spec = loads_job("name: a\nscript: t.py\nnodes: 2\n")
    hosts = [Host(name="a", address="fd00::1"), Host(name="b", address="fd00::2")]
    plan = build_plan(spec, hosts, job_id="a1", attempt=0, rdzv_host=hosts[1])
    assert plan.rdzv_endpoint == "[fd00::2]:29400" and plan.nodes[1].is_rdzv_host


def test_gpu_flags_per_runtime():
    spec = loads_job("name: a\nscript: t.py\n")
    for rt, flag in (("docker", "--gpus=all"), ("podman", "--device=nvidia.com/gpu=all")):
        with_gpu = build_plan(spec, _hosts(rt, 1, gpus=4), job_id="a1", attempt=0).nodes[0].runtime_argv
        without = build_plan(spec, _hosts(rt, 1, gpus=0), job_id="a1", attempt=0).nodes[0].runtime_argv
        assert flag in with_gpu and flag not in without
        assert "--ulimit=memlock=-1" in with_gpu and "--ulimit=stack=67108864" in with_gpu
        assert not any(a.startswith("--shm-size") for a in with_gpu)


# ------------------------------------------------------------------ runtime builders and parsers

class _Ref:
    def __init__(self, name="clusterctl-a-1_n1", node_dir="~/.clusterctl/jobs/j1/0", log_path=None, job_id="a-1"):
        self.container_name, self.node_dir, self.log_path, self.job_id = name, node_dir, log_path, job_id


def test_container_control_argv():
    d, p = runtimes.get("docker"), runtimes.get("podman")
    ref = _Ref()
    # by label, then exact name (tests/unit/launch/test_container_select.py runs these against a fake runtime)
    assert d.stop_argv(ref)[:2] == ["sh", "-c"] and d.stop_argv(ref)[3:] == ["docker", "a-1", "clusterctl-a-1_n1",
                                                                              "TERM"]
    assert p.remove_argv(["x", "y"]) == ["podman", "rm", "-f", "--time=0", "x", "y"]
    assert d.remove_argv(["x"]) == ["docker", "rm", "-f", "x"]
    assert d.list_argv("j1") == ["docker", "ps", "-a", "--no-trunc", "--filter=label=clusterctl.job_id=j1",
                                 "--format={{json .}}"]
    assert p.list_argv("j1")[-1] == "--format=json"
    assert d.logs_argv(ref, tail=100, follow=True)[3:] == ["docker", "a-1", "clusterctl-a-1_n1", "--tail=100",
                                                           "--follow"]
    assert p.logs_argv(ref)[3:] == ["podman", "a-1", "clusterctl-a-1_n1"]
    assert d.remove_job_argv("j1")[-3:] == ["docker", "clusterctl.job_id", "j1"]
    assert set(runtimes.names()) == {"docker", "podman", "bare"}
    with pytest.raises(ValueError):
        runtimes.get("lxc")


def test_parse_docker_ps_lines():
    out = "\n".join([
        json.dumps({"Names": "clusterctl-a-n1", "State": "exited", "Status": "Exited (137) 5 seconds ago",
                    "Labels": "clusterctl.job=a,clusterctl.job_id=j1,clusterctl.attempt=2,clusterctl.node=n1"}),
        json.dumps({"Names": "clusterctl-a-n2", "State": "running", "Status": "Up 3 minutes", "Labels": ""}),
        json.dumps({"Names": "old", "Status": "Created"}),
    ]) + "\n"
    a, b, c = parse_ps(out)
    assert (a.name, a.state, a.exit_code, a.attempt) == ("clusterctl-a-n1", "exited", 137, 2)
    assert a.labels["clusterctl.node"] == "n1"
    assert (b.state, b.exit_code) == ("running", None)
    assert c.state == "created"
    assert parse_ps("") == [] and parse_ps("[]") == []


def test_parse_podman_ps_json():
    out = json.dumps([
        {"Names": ["clusterctl-a-n1"], "State": "exited", "ExitCode": 1, "Exited": True,
         "Labels": {"clusterctl.job_id": "j1", "clusterctl.attempt": "0"}},
        {"Names": ["clusterctl-a-n2"], "State": "running", "ExitCode": 0, "Labels": None},
        {"Names": ["x"], "State": "stopped", "ExitCode": 143},
        {"Names": ["y"], "State": "weird"},
    ])
    a, b, c, d = parse_ps(out)
    assert (a.state, a.exit_code, a.labels["clusterctl.job_id"]) == ("exited", 1, "j1")
    assert (b.state, b.exit_code, b.labels) == ("running", None, {})
    assert (c.state, c.exit_code) == ("exited", 143)
    assert d.state == "unknown"
    with pytest.raises(ValueError):
        parse_ps("not json")


def test_parse_bare_list():
    out = "0\texited\t143\t123\tclusterctl-a-n1\tj1\n1\trunning\t\t456\tclusterctl-a-n1\tj1\n2\tdead\t\t9\tn\tj1\n"
    a, b, c = parse_bare(out)
    assert (a.state, a.exit_code, a.attempt) == ("exited", 143, 0)
    assert (b.state, b.exit_code, b.attempt) == ("running", None, 1)
    assert c.state == "dead"
    with pytest.raises(ValueError):
        parse_bare("garbage\n")


# ------------------------------------------------------------------ bare runtime, executed for real

def _bare_plan(tmp_path, torchrun: list[str], secret: bool = True):
    job = f"name: bare-job\nscript: train.py\nworkdir: {tmp_path}\ntorchrun: {json.dumps(torchrun)}\n"
    job += f"env: {{NASTY: {json.dumps(NASTY)}}}\n" + ("secret_env: [WANDB_API_KEY]\n" if secret else "")
    spec = loads_job(job)
    return build_plan(spec, _hosts("bare", 1, gpus=0), job_id="bj-1", attempt=0, jobs_root=str(tmp_path / "jobs"))


def _start(node, secrets):
    r = subprocess.run(list(node.runtime_argv), input=node.env_script(secrets), capture_output=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return int(r.stdout)


def _wait_for(path, timeout=10.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if os.path.exists(path):
            return open(path).read().strip()
        time.sleep(0.05)
    raise AssertionError(f"{path} never appeared")


def _list(tmp_path):
    rt = runtimes.get("bare")
    r = subprocess.run(rt.list_argv("bj-1", jobs_root=str(tmp_path / "jobs")), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    return rt.parse_list(r.stdout)


def test_bare_runs_detached_with_env_log_and_exit_code(tmp_path):
    prog = ("import os, sys; print('ARGV', sys.argv[1:]); print('NASTY', repr(os.environ['NASTY']));"
            "print('SECRET', repr(os.environ['WANDB_API_KEY'])); print('CWD', os.getcwd());"
            "print('SID', os.getsid(0) == os.getpgid(0)); sys.exit(3)")
    node = _bare_plan(tmp_path, [sys.executable, "-c", prog]).nodes[0]
    pid = _start(node, {"WANDB_API_KEY": SECRET})
    assert pid > 1
    assert _wait_for(os.path.join(node.node_dir, "exit")) == "3"
    log = open(node.log_path).read()
    assert f"NASTY {NASTY!r}" in log and f"SECRET {SECRET!r}" in log and f"CWD {tmp_path}" in log
    assert "'train.py'" in log and "--rdzv-backend=c10d" in log
    assert open(os.path.join(node.node_dir, "name")).read().strip() == "clusterctl-bj-1_gpu01"
    assert (os.stat(node.node_dir).st_mode & 0o777) == 0o700
    assert not any("env" in f for f in os.listdir(node.node_dir))          # nothing of the env on disk
    [inst] = _list(tmp_path)
    assert (inst.state, inst.exit_code, inst.attempt) == ("exited", 3, 0)


def test_bare_stop_term_reaches_agent(tmp_path):
    prog = ("import signal, sys, time\n"
            "signal.signal(signal.SIGTERM, lambda *a: (print('GOT TERM', flush=True), sys.exit(7)))\n"
            "print('READY', flush=True)\ntime.sleep(60)\n")
    (tmp_path / "agent.py").write_text(prog)
    node = _bare_plan(tmp_path, [sys.executable, str(tmp_path / "agent.py")], secret=False).nodes[0]
    _start(node, {})
    end = time.monotonic() + 10
    while "READY" not in open(node.log_path).read() and time.monotonic() < end:
        time.sleep(0.05)
    assert [i.state for i in _list(tmp_path)] == ["running"]
    rt = runtimes.get("bare")
    r = subprocess.run(rt.stop_argv(node, "TERM"), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr
    assert _wait_for(os.path.join(node.node_dir, "exit")) == "7"
    assert "GOT TERM" in open(node.log_path).read()


def test_bare_kill_reaches_workers_in_their_own_session(tmp_path):
    # like torch: the agent starts a worker with start_new_session=True, then both sleep
    prog = ("import subprocess, sys, time\n"
            "w = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)'], start_new_session=True)\n"
            "print('WORKER', w.pid, flush=True)\ntime.sleep(60)\n")
    (tmp_path / "agent.py").write_text(prog)
    node = _bare_plan(tmp_path, [sys.executable, str(tmp_path / "agent.py")], secret=False).nodes[0]
    runner = _start(node, {})
    end = time.monotonic() + 10
    while "WORKER" not in open(node.log_path).read() and time.monotonic() < end:
        time.sleep(0.05)
    worker = int(open(node.log_path).read().split("WORKER", 1)[1].split()[0])
    try:
        r = subprocess.run(runtimes.get("bare").stop_argv(node, "KILL"), capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
        end = time.monotonic() + 10
        while time.monotonic() < end and (_alive(worker) or _alive(runner)):
            time.sleep(0.05)
        assert not _alive(worker) and not _alive(runner)
    finally:
        for p in (worker, runner):
            if _alive(p):
                os.kill(p, signal.SIGKILL)


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def test_bare_logs_argv_runs(tmp_path):
    node = _bare_plan(tmp_path, ["sh", "-c", "echo hello; echo world"], secret=False).nodes[0]
    _start(node, {})
    _wait_for(os.path.join(node.node_dir, "exit"))
    r = subprocess.run(runtimes.get("bare").logs_argv(node, tail=2), capture_output=True, text=True, timeout=30)
    assert r.returncode == 0 and "torchrun exited with status 0" in r.stdout
    r = subprocess.run(runtimes.get("bare").logs_argv(node), capture_output=True, text=True, timeout=30)
    assert r.stdout.startswith("hello")


def test_bare_home_relative_dir_expands(tmp_path):
    node = _bare_plan(tmp_path, ["true"], secret=False).nodes[0]
    argv = list(node.runtime_argv)
    i = argv.index(node.node_dir)
    argv[i] = "~/jobs/x/0"
    r = subprocess.run(argv, input=node.env_script({}), capture_output=True, timeout=30,
                       env={**os.environ, "HOME": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    _wait_for(str(tmp_path / "jobs" / "x" / "0" / "exit"))


def test_render_is_readable():
    plan = build_plan(loads_job(DOCKER_JOB), _hosts("docker", 2), job_id="j1", attempt=0)
    text = plan.render()
    assert "WANDB_API_KEY=***" in text and "(rendezvous host)" in text
    assert shlex.split(text.split("  torchrun ", 1)[1].splitlines()[0])[0] == "torchrun"


# ------------------------------------------------------------------ issue 35: pids limit, InfiniBand, core dumps

def test_every_container_of_a_podman_or_docker_plan_carries_the_pids_limit():
    """podman's default pids_limit (2048, threads counted) is exhausted by 8 GPU ranks (podman#25703); in warm mode
    every rank lives in the zygote's container: the attempt's, the warm attempt's and the zygote's all carry it."""
    for rt in ("podman", "docker"):
        for job, flag in (("", "--pids-limit=-1"), ("container: {pids_limit: 65536}\n", "--pids-limit=65536")):
            spec = loads_job(f"name: a\nnodes: 2\nscript: t.py\n{job}")
            plan = build_plan(spec, _hosts(rt, 2), job_id="a1", attempt=2)
            for n in plan.nodes:
                assert n.warm_argv and n.zygote_argv
                for argv in (n.runtime_argv, n.warm_argv, n.zygote_argv):
                    assert argv.count(flag) == 1, (rt, argv)
                assert flag in plan.render()
    bare = build_plan(loads_job("name: a\nscript: t.py\n"), _hosts("bare", 1), job_id="a1", attempt=1)
    assert not any("--pids-limit" in a for a in bare.nodes[0].runtime_argv)      # no container


def test_infiniband_from_the_inventory_var_else_what_the_node_has():
    spec = loads_job("name: a\nnodes: 3\nscript: t.py\ncontainer: {ulimits: {}}\n")
    hosts = [Host(name=n, address=f"10.1.0.{i}", runtime="podman", gpus=8, infiniband=ib)
             for i, (n, ib) in enumerate((("auto", None), ("forced", True), ("off", False)), 1)]
    plan = build_plan(spec, hosts, job_id="a1", attempt=1, infiniband={"auto": True, "off": True})
    ib = ["--device=/dev/infiniband", "--cap-add=IPC_LOCK", "--ulimit=memlock=-1"]
    for name, on in (("auto", True), ("forced", True), ("off", False)):
        argv = plan.node(name).runtime_argv
        assert all((f in argv) is on for f in ib), (name, argv)
        assert "--ulimit=core=0" not in argv                  # podman would add its nofile: refused unprivileged
        assert any(a.startswith("ulimit -S -c 0 2>/dev/null; ") for a in argv)   # core dumps off in the container
    plan = build_plan(spec, hosts, job_id="a1", attempt=1)   # auto without a fact: off
    assert "--device=/dev/infiniband" not in plan.node("auto").runtime_argv
    # the job's own limits win: its memlock, its core
    spec = loads_job("name: a\nnodes: 3\nscript: t.py\ncontainer: {ulimits: {memlock: 1024, core: -1}}\n")
    argv = build_plan(spec, hosts, job_id="a1", attempt=1).node("forced").runtime_argv
    assert "--ulimit=memlock=1024" in argv and "--ulimit=core=-1" in argv
    assert "--ulimit=memlock=-1" not in argv and not any(a.startswith("ulimit -S -c 0") for a in argv)


def test_pids_limit_zero_is_refused():
    with pytest.raises(Exception, match="pids_limit"):
        loads_job("name: a\nscript: t.py\ncontainer: {pids_limit: 0}\n")


def test_nccl_gets_the_exact_nic_and_cuda_the_pci_order():
    spec = loads_job("name: a\nnodes: 2\nscript: t.py\n")
    plan = build_plan(spec, _hosts("podman", 2), job_id="a1", attempt=1, interfaces={"gpu02": "eth1"})
    env = plan.node("gpu02").env
    assert env["NCCL_SOCKET_IFNAME"] == "=eth1" and env["GLOO_SOCKET_IFNAME"] == "eth1"   # NCCL: "=" exact match
    assert env["CUDA_DEVICE_ORDER"] == "PCI_BUS_ID"
    spec = loads_job("name: a\nscript: t.py\nenv: {NCCL_SOCKET_IFNAME: ib, CUDA_DEVICE_ORDER: FASTEST_FIRST}\n")
    env = build_plan(spec, _hosts("podman", 1), job_id="a1", attempt=1).nodes[0].env
    assert (env["NCCL_SOCKET_IFNAME"], env["CUDA_DEVICE_ORDER"]) == ("ib", "FASTEST_FIRST")   # the job's win


def test_a_job_whose_visible_gpus_are_fewer_than_its_ranks_is_refused_with_the_reason():
    with pytest.raises(InputError, match=r"job.yaml:3: env: CUDA_VISIBLE_DEVICES='0,1' leaves 2 GPU\(s\).* 4 ranks"):
        loads_job("name: a\nscript: t.py\nenv: {CUDA_VISIBLE_DEVICES: '0,1'}\nnproc_per_node: 4\n", "job.yaml")
    for ok in ("'0,1,2,3'", "''", "'-1'"):      # enough, or a CPU job that hides every GPU
        loads_job(f"name: a\nscript: t.py\nnproc_per_node: 4\nenv: {{CUDA_VISIBLE_DEVICES: {ok}}}\n")
    spec = loads_job("name: a\nscript: t.py\nnproc_per_node: gpu\nenv: {CUDA_VISIBLE_DEVICES: '0,1'}\n")
    with pytest.raises(UserError, match="gpu01: CUDA_VISIBLE_DEVICES='0,1' leaves 2 GPU"):
        build_plan(spec, _hosts("podman", 1, gpus=8), job_id="a1", attempt=1)
    assert build_plan(spec, _hosts("podman", 1, gpus=2), job_id="a1", attempt=1).nodes[0].nproc == 2


def test_flight_recorder_dumps_on_timeout_into_the_jobs_checkpoint_dir(tmp_path):
    from clusterctl.launch.plan import checkpoint_installer

    spec = loads_job(f"name: a\nscript: t.py\ncheckpoint: {{dir: {tmp_path}/ck}}\n")
    env = build_plan(spec, _hosts("podman", 1), job_id="a-1", attempt=3).nodes[0].env
    assert (env["TORCH_FR_BUFFER_SIZE"], env["TORCH_NCCL_DUMP_ON_TIMEOUT"]) == ("2000", "1")
    assert env["TORCH_FR_DUMP_TEMP_FILE"] == f"{tmp_path}/ck/flight_recorder/a-1-3/rank_"   # every rank, one dir
    assert "TORCH_NCCL_TRACE_BUFFER_SIZE" not in env       # deprecated in torch 2.13: a warning per rank
    assert "TORCH_FR_DUMP_TEMP_FILE" not in build_plan(loads_job("name: a\nscript: t.py\n"), _hosts("podman", 1),
                                                       job_id="a-1", attempt=3).nodes[0].env
    # the start shell makes the dump dir before torchrun (not every torch release makes it)
    script = f"export TORCH_FR_DUMP_TEMP_FILE={shlex.quote(env['TORCH_FR_DUMP_TEMP_FILE'])}\n" + \
        checkpoint_installer("# checkpoint.py\n") + 'echo "$PYTHONPATH"\n'
    r = subprocess.run(["sh", "-c", script], capture_output=True, text=True, env={"PATH": os.environ["PATH"],
                                                                                 "TMPDIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert (tmp_path / "ck" / "flight_recorder" / "a-1-3").is_dir()


def test_where_infiniband_is_on_nccl_says_which_network_it_uses():
    hosts = [Host("ib", "10.1.0.1", runtime="podman", gpus=8, infiniband=True),
             Host("eth", "10.1.0.2", runtime="podman", gpus=8, infiniband=False)]
    plan = build_plan(loads_job("name: a\nnodes: 2\nscript: t.py\n"), hosts, job_id="a1", attempt=1)
    assert (plan.node("ib").env["NCCL_DEBUG"], plan.node("ib").env["NCCL_DEBUG_SUBSYS"]) == ("INFO", "INIT,NET")
    assert plan.node("ib").infiniband and not plan.node("eth").infiniband
    assert "NCCL_DEBUG" not in plan.node("eth").env
    plan = build_plan(loads_job("name: a\nnodes: 2\nscript: t.py\nenv: {NCCL_DEBUG: WARN}\n"), hosts, job_id="a1",
                      attempt=1)
    assert plan.node("ib").env["NCCL_DEBUG"] == "WARN" and "NCCL_DEBUG_SUBSYS" not in plan.node("ib").env


def test_compile_caches_live_on_a_per_node_volume_in_every_container():
    spec = loads_job("name: cc\nnodes: 2\nscript: t.py\n")
    for rt in ("podman", "docker"):
        plan = build_plan(spec, _hosts(rt, 2), job_id="cc-1", attempt=2)
        for n in plan.nodes:
            assert n.env["TORCHINDUCTOR_CACHE_DIR"] == "/var/cache/clusterctl/inductor"
            assert n.env["TRITON_CACHE_DIR"] == "/var/cache/clusterctl/triton"
            for argv in (n.runtime_argv, n.warm_argv, n.zygote_argv):      # a warm rank lives in the zygote's
                assert "--volume=clusterctl-cache-cc:/var/cache/clusterctl" in argv
    bare = build_plan(spec, _hosts("bare", 2), job_id="cc-1", attempt=1).nodes[0]
    assert "TORCHINDUCTOR_CACHE_DIR" not in bare.env          # the host's defaults outlive the processes
    env = build_plan(loads_job("name: cc\nscript: t.py\nenv: {TRITON_CACHE_DIR: /x}\n"), _hosts("podman", 1),
                     job_id="cc-1", attempt=1).nodes[0].env
    assert env["TRITON_CACHE_DIR"] == "/x"
