"""Container control selects by the job-id label, then the exact name (issue 11 item 3).

The old names ``clusterctl-{job}-{node}`` collided: job ``a`` on node ``b-c`` and job ``a-b`` on node ``c`` were
both ``clusterctl-a-b-c`` (and one job name launched from two state dirs gave the same name twice). The argv
builders run here with a real ``sh`` against a fake runtime program that lists containers from a table and logs
what it is asked to do to which container id."""
from __future__ import annotations

import os
import subprocess
import sys

import pytest

from clusterctl.launch import runtimes

FAKE = r'''import json, os, sys
table = json.load(open(os.environ["FAKE_TABLE"]))
args = sys.argv[1:]
log = open(os.environ["FAKE_LOG"], "a")
if args[0] == "ps":
    label = [a.split("=", 1)[1] for a in args if a.startswith("label=")] + \
            [args[i + 1].split("=", 1)[1] for i, a in enumerate(args) if a == "--filter"]
    want = dict(x.split("=", 1) for x in label)
    for c in table:
        if all(c["labels"].get(k) == v for k, v in want.items()):
            print(c["id"], c["name"])
else:
    log.write(json.dumps(args) + "\n")
    if args[0] == "inspect":   # a "pid"/"status" of the container in the table, else pid 4242
        c = next((c for c in table if c["id"] == args[-1]), {})
        print(c.get("status", "running") if "State.Status" in " ".join(args) else c.get("pid", 4242))
'''


@pytest.fixture
def fake(tmp_path):
    import json

    bindir = tmp_path / "bin"
    bindir.mkdir()
    for prog in ("podman", "docker"):
        (bindir / prog).write_text(f"#!{sys.executable}\n" + FAKE)
        (bindir / prog).chmod(0o755)
    # the exact old-style collision: two jobs' containers named clusterctl-a-b-c, and ours under the new name
    table = [{"id": "aaa111", "name": "clusterctl-a-b-c", "labels": {"clusterctl.job_id": "a-b-20261201-000000-beef"}},
             {"id": "bbb222", "name": "clusterctl-a-b-c", "labels": {"clusterctl.job_id": "a-20261201-000000-cafe"}},
             {"id": "ccc333", "name": runtimes.container_name("a-20261201-000000-cafe", "b-c"),
              "labels": {"clusterctl.job_id": "a-20261201-000000-cafe"}}]
    (tmp_path / "table.json").write_text(json.dumps(table))
    env = dict(os.environ, PATH=f"{bindir}:{os.environ['PATH']}", FAKE_TABLE=str(tmp_path / "table.json"),
               FAKE_LOG=str(tmp_path / "log"))

    def run(argv):
        r = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=30)
        calls = [json.loads(x) for x in (tmp_path / "log").read_text().splitlines()] if (tmp_path / "log").exists() else []
        (tmp_path / "log").unlink(missing_ok=True)
        return r, calls

    return run


class Ref:
    def __init__(self, job_id, node):
        self.job_id, self.container_name = job_id, runtimes.container_name(job_id, node)
        self.node_dir, self.log_path = "/x", None


def test_names_cannot_collide():
    assert runtimes.container_name("a-20261201-000000-cafe", "b-c") != \
        runtimes.container_name("a-b-20261201-000000-cafe", "c")
    assert runtimes.container_name("a-1", "b-c") != runtimes.container_name("a-1-b", "c")
    # job ids never hold "_": the first "_" ends the id
    assert runtimes.container_name("a-1", "b_c").split("_", 1) == ["clusterctl-a-1", "b_c"]


@pytest.mark.parametrize("program", ["podman", "docker"])
def test_control_commands_act_on_this_jobs_container_only(fake, program):
    rt = runtimes.get(program)
    ref = Ref("a-20261201-000000-cafe", "b-c")
    r, calls = fake(rt.stop_argv(ref, "TERM"))
    assert r.returncode == 0, r.stderr
    assert calls == [["kill", "--signal=TERM", "ccc333"]]
    r, calls = fake(rt.pid_argv(ref))
    assert r.stdout.strip() == "4242" and calls == [["inspect", "--format={{.State.Pid}}", "ccc333"]]
    r, calls = fake(rt.logs_argv(ref, tail=5, follow=True))
    assert calls == [["logs", "--tail=5", "--follow", "ccc333"]]


@pytest.mark.parametrize("program", ["podman", "docker"])
def test_a_same_named_container_of_another_job_is_never_touched(fake, program):
    """Our job's id with the colliding old name: the container of that name belongs to another job (or to a
    job of the same id from another state dir under the old scheme): nothing is signalled or inspected."""
    rt = runtimes.get(program)

    class Old:
        job_id, container_name, node_dir, log_path = "a-b-20261201-000000-other", "clusterctl-a-b-c", "/x", None

    for argv in (rt.stop_argv(Old(), "KILL"), rt.pid_argv(Old()), rt.logs_argv(Old())):
        r, calls = fake(argv)
        assert r.returncode == 1 and calls == [], (argv, calls)
        assert "no container clusterctl-a-b-c of job" in r.stderr


# the snippet the launcher ran inline before it moved into the runtimes (issue 9): the argv must not change
INIT_GONE_BEFORE = (runtimes.PID_ALIVE + '; ' + runtimes.SELECT_CONTAINER.replace("exit 1", "exit 0") + '; '
                    'p=$("$0" inspect --format "{{.State.Pid}}" "$cid" 2>/dev/null) || exit 0; '
                    '[ "${p:-0}" -gt 0 ] 2>/dev/null || exit 0; alive "$p" && exit 0; sleep "$3"; '
                    's=$("$0" inspect --format "{{.State.Status}}" "$cid" 2>/dev/null) || exit 0; '
                    '[ "$s" = running ] && exit 3; exit 0')


@pytest.mark.parametrize("program", ["podman", "docker"])
def test_init_gone_argv_is_the_launchers_old_command(program):
    ref = Ref("a-20261201-000000-cafe", "b-c")
    assert runtimes.get(program).init_gone_argv(ref, 0.5) == [
        "sh", "-c", INIT_GONE_BEFORE, program, "a-20261201-000000-cafe", ref.container_name, "0.5"]


def test_bare_needs_no_second_look_at_a_running_attempt():
    assert runtimes.get("bare").init_gone_argv(Ref("a-20261201-000000-cafe", "b-c"), 0.5) is None


NO_PID = 4194305     # above the largest pid_max Linux allows (2**22): never a live process


@pytest.mark.parametrize("program", ["podman", "docker"])
@pytest.mark.parametrize("pid,status,code,inspects", [
    ("self", "running", 0, 1),        # init alive: a normal running container, no second inspect
    (NO_PID, "running", 3, 2),        # init gone, still listed as running after the wait: killed with conmon
    (NO_PID, "exited", 0, 2),         # init gone and the runtime caught up: a normal exit, the listing decides
    (0, "running", 0, 1),             # no pid to look at: cannot tell, the listing is believed
])
def test_init_gone_runs_against_the_runtime(fake, tmp_path, program, pid, status, code, inspects):
    import json

    table = json.loads((tmp_path / "table.json").read_text())
    table[2].update(pid=os.getpid() if pid == "self" else pid, status=status)
    (tmp_path / "table.json").write_text(json.dumps(table))
    r, calls = fake(runtimes.get(program).init_gone_argv(Ref("a-20261201-000000-cafe", "b-c"), 0))
    assert r.returncode == code, r.stderr
    assert calls == [["inspect", "--format", "{{.State.Pid}}", "ccc333"],
                     ["inspect", "--format", "{{.State.Status}}", "ccc333"]][:inspects]


@pytest.mark.parametrize("program", ["podman", "docker"])
def test_init_gone_never_inspects_another_jobs_container(fake, program):
    class Old:
        job_id, container_name, node_dir, log_path = "a-b-20261201-000000-other", "clusterctl-a-b-c", "/x", None

    r, calls = fake(runtimes.get(program).init_gone_argv(Old(), 0))
    assert r.returncode == 0 and calls == []
