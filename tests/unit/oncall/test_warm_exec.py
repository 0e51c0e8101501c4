"""``exec --in-container``/``shell`` on a warm attempt enter the container that holds its ranks: the node's zygote
container (the attempt's container holds only their clients); a cold attempt's as before (issue 34 item 9)."""
from __future__ import annotations

import subprocess

import pytest

from clusterctl.config.inventory import Host
from clusterctl.config.spec import loads_job
from clusterctl.launch.runtimes import LABEL_WARM
from clusterctl.model import record
from clusterctl.model.events import Relaunch
from clusterctl.oncall import jobnodes
from clusterctl.store.state import Store

JOB = 'name: j\nnodes: "2:3"\nscript: train.py\ncontainer: {ulimits: {}}\n'


@pytest.mark.parametrize("runtime", ["podman", "bare"])
def test_exec_on_a_warm_attempt_enters_the_zygotes_container(tmp_path, runtime):
    spec = loads_job(JOB, str(tmp_path / "job.yaml"))
    hosts = tuple(Host(name=f"n{i}", address=f"10.0.0.{i}", runtime=runtime, gpus=0) for i in (1, 2, 3))
    store = Store(tmp_path / "state.db")
    rec = record.JobRecord(spec=spec, source=str(tmp_path / "job.yaml"), hosts=hosts, interfaces={})
    job_id = store.create_job("j", rec.to_json(), None, str(tmp_path / "job.yaml"))
    store.start_attempt(job_id, 1, "n1", f"{job_id}-1", ["n1", "n2", "n3"])
    store.start_attempt(job_id, 2, "n1", f"{job_id}-2", ["n1", "n2"])
    for node, mode in (("n1", "cold"), ("n2", "warm")):
        r = Relaunch(2, node, mode, "x")
        store.add_event(job_id, "relaunch", r.message(), attempt=2, node=node, klass=mode)
    jn = jobnodes.load(store, job_id)
    assert jn.warm == frozenset({"n2"})
    if runtime == "bare":                  # the ranks are on the host either way
        assert jobnodes.in_job_argv(jn, "n2", ["id"]) == jobnodes.in_job_argv(jn, "n1", ["id"])[:-1] + ["id"]
        return
    fake, calls = tmp_path / "podman", tmp_path / "calls"
    fake.write_text(f"""#!/bin/sh
echo "$*" >> {calls}
case "$*" in
  *"ps -a --no-trunc --filter label={LABEL_WARM}={job_id} "*) echo "beef01 clusterctl-zygote-{job_id}_n2";;
  *"ps -a --no-trunc --filter label=clusterctl.job_id={job_id} "*) echo "c0ffee clusterctl-{job_id}_n1";;
esac
""")
    fake.chmod(0o755)

    def run(node):
        argv = jobnodes.in_job_argv(jn, node, ["echo", "a b"], interactive=True)
        return subprocess.run([*argv[:3], str(fake), *argv[4:]], capture_output=True, text=True,
                              env={"PATH": "/usr/bin:/bin"}, timeout=10)

    r = run("n2")
    assert r.returncode == 0, r.stderr
    assert calls.read_text().splitlines()[-1] == "exec -i beef01 echo a b"      # the zygote's container
    r = run("n1")
    assert r.returncode == 0, r.stderr
    assert calls.read_text().splitlines()[-1] == "exec -i c0ffee echo a b"      # cold: the attempt's
