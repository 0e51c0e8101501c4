"""docker's differences from podman, each on output recorded from a real Docker Engine (20.10.24 daemon, 28.x
CLI) on the testbed (tests/fixtures/runtimes/docker_*.json, written by tests/fixtures/runtimes/record.py).

The control commands run with a real ``sh`` against a fake ``docker`` that answers from those recordings."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.launch import runtimes
from clusterctl.launch.runtimes.docker import parse_ps

FIX = Path(__file__).resolve().parents[2] / "fixtures" / "runtimes"
JOB_ID = "rec-20261201-000000-beef"


def rec(case: str) -> dict:
    return json.loads((FIX / f"docker_{case}.json").read_text())


# A `docker` that answers from the recordings: ps (json, ids, "ID Names") from ps_json, the other commands from the
# case named in FAKE_CASES (subcommand -> case); every call is logged.
FAKE = r'''import json, os, sys
fix = os.environ["FAKE_FIX"]
cases = json.loads(os.environ.get("FAKE_CASES", "{}"))
args = sys.argv[1:]
open(os.environ["FAKE_LOG"], "a").write(json.dumps(args) + "\n")
def load(case):
    return json.load(open(os.path.join(fix, "docker_%s.json" % case)))
if args[0] == "ps":
    rows = [json.loads(l) for l in load("ps_json")["output"].splitlines() if l.strip()]
    gone = set(os.environ.get("FAKE_GONE", "").split())
    rows = [r for r in rows if r["Names"] not in gone]
    fmt = next((a.split("=", 1)[1] for a in args if a.startswith("--format=")), None)
    if fmt is None and "--format" in args:
        fmt = args[args.index("--format") + 1]
    for r in rows:
        if "-aq" in args or "-q" in args:
            print(r["ID"][:12])
        elif fmt == "{{json .}}":
            print(json.dumps(r))
        else:
            print(r["ID"], r["Names"])
    sys.exit(0)
c = load(cases[args[0]])
sys.stdout.write(c["output"])
sys.exit(c["rc"])
'''


class Ref:
    def __init__(self, name: str):
        self.job_id, self.container_name, self.node_dir, self.log_path = JOB_ID, name, "/x", None


@pytest.fixture
def docker(tmp_path):
    bindir = tmp_path / "bin"
    bindir.mkdir()
    (bindir / "docker").write_text(f"#!{sys.executable}\n" + FAKE)
    (bindir / "docker").chmod(0o755)
    log = tmp_path / "log"

    def run(argv, cases=None, gone=()):
        env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FAKE_FIX=str(FIX), FAKE_LOG=str(log),
                   FAKE_CASES=json.dumps(cases or {}), FAKE_GONE=" ".join(gone))
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
        calls = [json.loads(x) for x in log.read_text().splitlines()] if log.exists() else []
        log.unlink(missing_ok=True)
        return r, calls

    return run


def test_ps_labels_are_one_k_v_string_and_exit_codes_come_from_the_status():
    """`docker ps --format '{{json .}}'`: Labels is "k=v,k=v" (podman: a map), no ExitCode field: the code is in
    Status ("Exited (137) 2 seconds ago"); a KILL is 137, a TERM the process handled is its own code."""
    out = rec("ps_json")["output"]
    assert '"Labels":"clusterctl.job_id=' in out
    got = {i.name: i for i in parse_ps(out)}
    assert {n: (i.state, i.exit_code) for n, i in got.items()} == {
        "rec-term": ("exited", 143), "rec-killed": ("exited", 137), "rec-exit3": ("exited", 3),
        "rec-running": ("running", None)}
    assert all(i.labels == {"clusterctl.job_id": JOB_ID, "clusterctl.node": "node1"} for i in got.values())


def test_inspect_agrees_with_ps_after_kill():
    assert rec("inspect_killed")["output"].split() == ["0", "137", "exited"]
    assert rec("inspect_term")["output"].split() == ["0", "143", "exited"]
    assert rec("inspect_exit3")["output"].split() == ["0", "3", "exited"]
    assert rec("inspect_running")["output"].split()[1:] == ["0", "running"]


def test_no_init_for_docker():
    """docker's --init bind-mounts its init at /sbin/docker-init: in an image whose /sbin is a symlink into the
    read-only host /usr it is not there, the start fails (127) and leaves a created container behind. So docker
    runs without --init (torchrun is PID 1); podman's catatonit is not mounted into the image and stays."""
    r = rec("init_readonly")
    assert r["rc"] == 127 and '"/sbin/docker-init": stat /sbin/docker-init: no such file' in r["output"]
    req = runtimes.RunRequest(job="a", job_id=JOB_ID, attempt=1, node="n1", name="c", image="img", workdir=None,
                              node_dir="/x", command=("torchrun", "t.py"), gpus=0)
    docker = runtimes.get("docker").run_argv(req)
    podman = runtimes.get("podman").run_argv(req)
    assert "--init" not in docker and "--init" in podman
    assert [a for a in docker if a != "--init"] == [a if a != "podman" else "docker" for a in podman
                                                     if a not in ("--init",)]


def test_a_dead_containers_pid_is_not_alive():
    """inspect of an exited container prints pid 0: the watch reports it gone (and a gone container prints
    nothing and exits 1: also gone)."""
    for case in ("inspect_killed", "inspect_exit3", "inspect_gone"):
        out = rec(case)["output"].split(" ")[0] if rec(case)["rc"] == 0 else ""
        w = subprocess.Popen(["sh", "-c", runtimes.WATCH, "w", "", "sh", "-c", 'printf %s "$0"', out],
                             stdout=subprocess.PIPE, text=True)
        try:
            assert w.stdout.readline().strip() == "0", case
        finally:
            w.kill()
            w.wait()


def test_logs_follow_of_a_removed_container_ends_and_the_next_follow_finds_nothing(docker):
    """`docker logs --follow` of a container removed meanwhile ends with 0 and no error; the follower's next
    round (it reconnects every second) selects nothing and exits 1 with a message, without calling `logs`."""
    assert rec("logs_follow_removed")["output"] == "rc=0\n"
    rt = runtimes.get("docker")
    argv = rt.logs_argv(Ref("rec-running"), follow=True)
    r, calls = docker(argv, {"logs": "logs_follow_removed"})
    assert r.returncode == 0 and calls[-1][:2] == ["logs", "--follow"]
    r, calls = docker(argv, {"logs": "logs_gone"}, gone=["rec-running"])
    assert r.returncode == 1 and "no container rec-running" in r.stderr
    assert [c[0] for c in calls] == ["ps"]


def test_rm_f_of_a_container_already_gone_succeeds(docker):
    """docker 28's `rm -f` of a missing container prints the error and exits 0 (the daemon removed it between
    `ps` and `rm`): the job's cleanup is done, not retried."""
    assert rec("rm_gone")["rc"] == 0 and "No such container" in rec("rm_gone")["output"]
    r, calls = docker(runtimes.get("docker").remove_job_argv(JOB_ID), {"rm": "rm_gone"})
    assert r.returncode == 0
    assert [c[0] for c in calls] == ["ps", "rm"] and calls[1][:1] == ["rm"] and "-f" in calls[1]


def test_stop_and_pid_select_by_label_then_name(docker):
    rt = runtimes.get("docker")
    r, calls = docker(rt.stop_argv(Ref("rec-running"), "TERM"), {"kill": "kill_TERM"})
    assert r.returncode == 0
    running_id = next(json.loads(line)["ID"] for line in rec("ps_json")["output"].splitlines()
                      if json.loads(line)["Names"] == "rec-running")
    assert calls[-1] == ["kill", "--signal=TERM", running_id]
    r, calls = docker(rt.pid_argv(Ref("rec-exit3")), {"inspect": "inspect_exit3"})
    assert r.stdout.split()[0] == "0" and calls[-1][0] == "inspect"


def test_info_of_the_real_daemon():
    from clusterctl.checks.runtime import choose_gpu_flags, parse_runtime_info

    info = parse_runtime_info(rec("info")["output"], rec("info")["rc"])
    assert info["flavor"] == "docker" and info["version"].startswith("20.10") and info["error"] is None
    assert info["cdi"] is False and "nvidia" not in info["runtimes"]
    assert choose_gpu_flags(info, cdi_gpus=8) is None          # docker 20.10 reads no CDI spec
