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

from clusterctl import runtimes

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
    if args[0] == "inspect":
        print(4242)
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
