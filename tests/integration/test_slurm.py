"""Slurm on the testbed (``Testbed(..., slurm=True)``: real munged, slurmctld and a slurmd per host; never a mock of
srun/scontrol): ``-i slurm`` over the ``srun`` transport with every sshd stopped, as a user runs it inside
``salloc``.
"""
from __future__ import annotations

import json
import os
import re
import string
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from clusterctl.config.inventory import Host
from clusterctl.transport import ConnectOptions
from clusterctl.transport.srun import SrunTransport
from tests import testbed as testbeds
from tests.integration.test_launch import JOB_TIMEOUT, clusterctl, status_json, wait_for, wait_terminal, write_job
from tests.testbed import profile
from tests.testbed.system import claim_octet


@pytest.fixture(scope="module")
def slurm_tb(tmp_path_factory, testbed_slot):
    letter = string.ascii_lowercase[testbed_slot]
    octet = claim_octet(range(220, 240))
    if octet is None:
        pytest.fail("no free 10.x.0.0/24 subnet among 220..239 for the slurm testbed", pytrace=False)
    tb = testbeds.Testbed(5, tmp_path_factory.mktemp("slurm-tb"), [profile(gpus=0)] * 5, prefix=f"tbs{letter}",
                 subnet_octet=octet, slurm=True)
    start = time.monotonic()
    try:
        tb.up()
    except Exception as e:  # noqa: BLE001 - a failure with the reason, never a skip
        pytest.fail(f"slurm testbed could not be built: {type(e).__name__}: {e}", pytrace=False)
    tb.up_s = time.monotonic() - start
    yield tb
    tb.down()


def slurm_env(tb, **extra) -> dict:
    return {**tb.slurm.env, **extra}


def salloc(tb, nodes: int, *args: str) -> str:
    """A held allocation (``salloc --no-shell``): its job id."""
    r = subprocess.run(["salloc", "--no-shell", f"--nodes={nodes}", "--time=30", *args], capture_output=True,
                       text=True, timeout=60, env=dict(os.environ, **tb.slurm.env), stdin=subprocess.DEVNULL)
    m = re.search(r"Granted job allocation (\d+)", r.stderr)
    assert m, r.stderr
    return m.group(1)


def scancel(tb, jobid: str) -> None:
    subprocess.run(["scancel", jobid], capture_output=True, timeout=30, env=dict(os.environ, **tb.slurm.env))


def job_env(tb, jobid: str) -> dict:
    """What a process inside the allocation sees (salloc/sbatch set these)."""
    r = tb.scontrol("-o", "show", "job", jobid)
    nodelist = re.search(r" NodeList=(\S+)", r.stdout).group(1)
    return slurm_env(tb, SLURM_JOB_ID=jobid, SLURM_JOB_NODELIST=nodelist)


def overlay(path: Path, **vars_) -> Path:
    path.write_text(yaml.safe_dump({"all": {"vars": {"clusterctl_runtime": "bare", "clusterctl_gpus": 0,
                                                     "clusterctl_interface": "eth0", **vars_}}}))
    return path


def test_slurm_testbed_steps_live_in_the_nodes_namespace(slurm_tb, monkeypatch):
    tb = slurm_tb
    assert tb.up_s < 60
    jid = salloc(tb, len(tb.hosts))          # every host: a step can only run on a node of its allocation
    try:
        # issue 34 item 10: a step of the srun transport gets only srun.EXPORT (and SLURM_*) of the supervisor's
        # environment, never its secret_env values (srun's default --export=ALL gave it everything)
        monkeypatch.setenv("SLURM_CONF", tb.slurm.env["SLURM_CONF"])
        monkeypatch.setenv("CLUSTERCTL_TEST_SECRET", "s3cr3t-value-of-the-job")
        t = SrunTransport(Host(name="node2", address=tb.hosts[1].address, connection="srun"), ConnectOptions(),
                          env={"SLURM_JOB_ID": jid})
        r = t.run(["sh", "-c", "tr '\\0' '\\n' </proc/$$/environ"])
        assert r.ok, r.stderr
        assert "s3cr3t-value" not in r.stdout and "CLUSTERCTL_TEST_SECRET" not in r.stdout, r.stdout
        assert f"SLURM_JOB_ID={jid}" in r.stdout and "\nHOME=" in r.stdout, r.stdout
        for h in tb.hosts:
            r = subprocess.run(["srun", f"--jobid={jid}", "--overlap", "--nodes=1", "--ntasks=1", "-w", h.name,
                                "sh", "-c", 'hostname; readlink /proc/self/ns/net; '
                                'echo "$PATH"'],
                               capture_output=True, text=True, timeout=60, env=dict(os.environ, **tb.slurm.env))
            assert r.returncode == 0, r.stderr
            lines = r.stdout.split()
            assert lines[0] == h.name
            ns_inode = os.stat(f"/run/netns/{h.ns}").st_ino
            assert lines[1] == f"net:[{ns_inode}]", (lines, ns_inode)
            assert lines[2].split(":")[0] == str(h.bin_dir)        # the host's own PATH (TaskProlog)
    finally:
        scancel(tb, jid)


def test_preflight_and_launch_from_slurm_allocation_over_srun_without_ssh(slurm_tb, tmp_path):
    tb = slurm_tb
    for h in tb.hosts:
        tb.stop_sshd(h)
    jid = salloc(tb, 3)
    try:
        env = job_env(tb, jid)
        ov = overlay(tmp_path / "overlay.yaml")
        state = tmp_path / "state"
        state.mkdir()                         # inventory and preflight read a state dir that exists
        r = clusterctl(state, "inventory", "-i", f"slurm:{ov}", "--output", "json", env=env)
        assert r.returncode == 0, r.stderr
        inv = json.loads(r.stdout)
        assert [(h["name"], h["address"], h["connection"]) for h in inv["hosts"]] == \
            [(h.name, h.address, "srun") for h in tb.hosts[:3]]

        job = write_job(tmp_path / "job.yaml", tb, "slurmdemo", "bare")
        r = clusterctl(state, "preflight", "-i", f"slurm:{ov}", str(job), "--output", "json", env=env, timeout=300)
        assert r.returncode == 0, f"stdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-4000:]}"

        r = clusterctl(state, "launch", str(job), "-i", f"slurm:{ov}", env=env, timeout=JOB_TIMEOUT)
        assert r.returncode == 0, f"stdout:\n{r.stdout[-4000:]}\nstderr:\n{r.stderr[-4000:]}"
        assert "done: step 30" in r.stdout
        dumps = [json.loads((Path(tb.shared) / "slurmdemo" / f"env-rank{k}.json").read_text()) for k in range(6)]
        assert sorted({d["hostname"] for d in dumps}) == ["node1", "node2", "node3"]
        assert {d["env"]["MASTER_ADDR"] for d in dumps} == {tb.hosts[0].address}
        assert status_json(state, "slurmdemo")["state"] == "SUCCEEDED"
        assert all(tb.sshd_pid(h) is None for h in tb.hosts)            # no SSH was there to use
    finally:
        scancel(tb, jid)
        for h in tb.hosts:
            tb.start_sshd(h)


def test_worker_node_killed_relaunches_inside_the_allocation_and_drains_it(slurm_tb, tmp_path):
    """4 allocated nodes, a 3-node job: node3 dies whole (its slurmd too) -> the supervisor relaunches on node1,
    node2, node4 from the checkpoint, inside the same allocation, and (slurm_drain, cordon_after: 1) drains node3."""
    tb = slurm_tb
    jid = salloc(tb, 4, "--no-kill")        # a failed node does not end the allocation (Slurm's default does)
    try:
        env = job_env(tb, jid)
        ov = overlay(tmp_path / "overlay.yaml")
        state = tmp_path / "state"
        job = write_job(tmp_path / "job.yaml", tb, "slurmdrain", "bare", steps=60, step_time=0.25,
                        extra={"supervisor": {"probe_interval_s": 1, "cordon_after": 1, "slurm_drain": True},
                               "restarts": {"max_restarts": 0, "max_failures": 0, "max_node_failures": 3}})
        r = clusterctl(state, "launch", str(job), "-i", f"slurm:{ov}", "--detach", env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        ckpt = Path(tb.shared) / "slurmdrain" / "ckpt"
        wait_for(lambda: list(ckpt.glob("step-*")), JOB_TIMEOUT, "a first checkpoint", interval=1)
        tb.kill("node3")
        v = wait_terminal(state, "slurmdrain", JOB_TIMEOUT * 2)
        assert v["state"] == "SUCCEEDED", v
        assert v["checkpoint"]["step"] == 60, v
        r = clusterctl(state, "events", "slurmdrain", "--output", "json", env=env)
        events = json.loads(r.stdout)
        kinds = [e["kind"] for e in events]
        assert "slurm_drain" in kinds and "cordon" in kinds, kinds
        starts = [e["message"] for e in events if e["kind"] == "start"]
        assert "node3" not in starts[-1] and "resuming from" in starts[-1], starts
        node = tb.scontrol("-o", "show", "node", "node3").stdout
        assert "DRAIN" in re.search(r" State=(\S+)", node).group(1), node
        assert "Reason=clusterctl:" in node, node
    finally:
        scancel(tb, jid)
        tb.start_slurmd("node3")


def test_sbatch_submit_requeues_after_the_supervisor_node_dies_and_resumes_one_job(slurm_tb, tmp_path):
    """The batch host (the supervisor's node) is killed whole (slurmd included): Slurm marks it DOWN and requeues
    the job; the next run of the script resumes the same clusterctl job from its newest checkpoint, to the end.
    node1 (slurmctld's host) is left out of the job (`-- --exclude=node1`), so 3 of 4 nodes run it and one is spare."""
    tb = slurm_tb
    ov = overlay(tmp_path / "overlay.yaml")
    job = write_job(tmp_path / "job.yaml", tb, "slurmreq", "bare", steps=80, step_time=0.25)
    state = Path(tb.shared) / "state-slurmreq"
    env = slurm_env(tb)
    r = clusterctl(state, "sbatch", str(job), "--overlay", str(ov), "--dry-run", env=env)
    assert r.returncode == 0 and "#SBATCH --requeue" in r.stdout and "#SBATCH --signal=B:USR1@" in r.stdout, r
    r = clusterctl(state, "sbatch", str(job), "--overlay", str(ov), "--submit", "--output", "json", "--",
                   "--exclude=node1", "--time=20", env=env)
    assert r.returncode == 0, r.stderr
    sjid = json.loads(r.stdout)["slurm_job_id"]
    ckpt = Path(tb.shared) / "slurmreq" / "ckpt"
    try:
        wait_for(lambda: list(ckpt.glob("step-*")), JOB_TIMEOUT, "a first checkpoint", interval=1)
        info = tb.scontrol("-o", "show", "job", sjid).stdout
        batch_host = re.search(r" BatchHost=(\S+)", info).group(1)
        assert batch_host != "node1"
        tb.kill(batch_host)                         # the node dies: its slurmd, the batch script, the supervisor

        def finished():
            out = tb.scontrol("-o", "show", "job", sjid).stdout
            return re.search(r"JobState=(COMPLETED|FAILED|CANCELLED|TIMEOUT)", out) and out
        out = wait_for(finished, JOB_TIMEOUT * 2, "the requeued Slurm job to end", interval=2)
        assert "JobState=COMPLETED" in out and re.search(r" Restarts=[1-9]", out), out
        v = status_json(state, "slurmreq")
        assert v["state"] == "SUCCEEDED", v
        assert v["checkpoint"]["step"] == 80, v
        r = clusterctl(state, "status", "--output", "json")
        assert r.returncode == 0
        r = clusterctl(state, "events", "slurmreq", "--output", "json")
        assert r.returncode == 0, r.stderr
        text = r.stdout
        assert "SLURM_RESTART_COUNT=0" in text and "SLURM_RESTART_COUNT=1" in text, text[-3000:]
        # the dead batch host left the allocation: its guard died with it, so the record says what may be left
        assert f"could not clean up {batch_host}: it left the allocation and its Slurm guard did not report" \
            in text, text[-3000:]
        assert f"could not clean up {batch_host}: srun" not in text, text[-3000:]    # resume does not try srun
        markers = [p for p in (state / "slurm").iterdir() if p.name.isdigit()]
        assert len(markers) == 1          # one Slurm job -> one clusterctl job
        log = (state / "slurm" / f"slurmreq-{sjid}.out").read_text(errors="replace")
        assert re.search(r"\] resumed from \S+ at step [1-9]", log), log[-3000:]   # from a checkpoint, not scratch
    finally:
        subprocess.run(["scancel", sjid], capture_output=True, timeout=30, env=dict(os.environ, **tb.slurm.env))
        for h in tb.hosts:
            tb.start_slurmd(h)


def job_processes(tb, job_id: str) -> list[tuple[str, int, str]]:
    """(host, pid, cmdline) of every process on the testbed's hosts that carries the job's environment (bare
    runners, torchrun, ranks)."""
    found = []
    needle = f"CLUSTERCTL_JOB_ID={job_id}".encode()
    for h in tb.hosts:
        for pid, cmd in tb.processes(h):
            try:
                if needle in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                    found.append((h.name, pid, cmd))
            except OSError:
                pass
    return found


def test_sbatch_guard_removes_what_the_job_left_when_the_slurm_job_ends(slurm_tb, tmp_path):
    """issue 34 item 6: detached bare runners (and docker's containers) are outside the steps Slurm kills when its
    job ends, is requeued or cancelled: they ran on in nodes Slurm hands to other jobs. The script's per-node guard
    removes them when the allocation ends and says so (`<state>/slurm/<id>.left/<node>.json`)."""
    tb = slurm_tb
    ov = overlay(tmp_path / "overlay.yaml")
    job = write_job(tmp_path / "job.yaml", tb, "slurmguard", "bare", steps=2000, step_time=0.25,
                    extra={"nodes": 2})
    state = Path(tb.shared) / "state-slurmguard"
    env = slurm_env(tb)
    r = clusterctl(state, "sbatch", str(job), "--overlay", str(ov), "--submit", "--output", "json", "--",
                   "--exclude=node1", "--time=20", env=env)
    assert r.returncode == 0, r.stderr
    sjid = json.loads(r.stdout)["slurm_job_id"]
    try:
        ckpt = Path(tb.shared) / "slurmguard" / "ckpt"
        wait_for(lambda: list(ckpt.glob("step-*")), JOB_TIMEOUT, "a first checkpoint", interval=1)
        job_id = (state / "slurm" / sjid).read_text().strip()
        nodes = sorted({h for h, _, _ in job_processes(tb, job_id)})
        assert len(nodes) == 2, job_processes(tb, job_id)
        scancel(tb, sjid)
        wait_for(lambda: "JobState=CANCELLED" in tb.scontrol("-o", "show", "job", sjid).stdout, 60,
                 "the Slurm job to be cancelled")
        wait_for(lambda: not job_processes(tb, job_id), 30, "the job's processes to go", interval=0.5)
        for n in nodes:
            report = json.loads((state / "slurm" / f"{sjid}.left" / f"{n}.json").read_text())
            assert report["ok"] and report["job_id"] == job_id and report["restart"] == 0, report
    finally:
        scancel(tb, sjid)
        time.sleep(1)
        for _, pid, _ in job_processes(tb, job_id) if "job_id" in locals() else []:
            os.kill(pid, 9)
