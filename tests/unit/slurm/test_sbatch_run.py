"""``sbatch``/``sbatch-run`` without a Slurm: the marker a requeued run finds (issue 34 item 11) and the GPUs the
script asks for (issue 39 item 11). The real sbatch and requeue run in tests/integration/test_slurm.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from click.testing import CliRunner

from clusterctl.cli import app
from clusterctl.config.inventory import Host
from clusterctl.config.spec import load_job
from clusterctl.errors import InputError
from clusterctl.model import record
from clusterctl.slurm import guard, sbatch
from clusterctl.store import paths
from clusterctl.store.ledger import Ledger
from clusterctl.store.state import JobState, Store
from clusterctl.usecases import base
from clusterctl.usecases import slurm as uslurm

JOB = "name: demo\nnodes: 2\nnproc_per_node: {nproc}\nscript: train.py\n"
INVENTORY = """all:
  vars: {clusterctl_connection: local, clusterctl_runtime: bare, clusterctl_gpus: 0}
  hosts:
    n1: {ansible_host: 127.0.0.1}
    n2: {ansible_host: 127.0.0.1}
"""   # the new allocation


@pytest.fixture
def ws(tmp_path):
    root = paths.ensure_state_dir(tmp_path / "state")
    return base.Workspace(root, Store(paths.db_path(root)))


def files(tmp_path, nproc="1"):
    job = tmp_path / "job.yaml"
    job.write_text(JOB.format(nproc=nproc))
    inv = tmp_path / "inventory.yaml"
    inv.write_text(INVENTORY)
    return str(job), str(inv)


def record_job(ws, job: str) -> str:
    """What ``launch`` records (a PENDING job of the file's name)."""
    spec = load_job(job)
    rec = record.JobRecord(spec=spec, source=job, hosts=(), interfaces={})
    return ws.store.create_job(spec.name, rec.to_json(), None, job)


def test_first_run_marks_the_slurm_job_before_it_launches_and_a_requeue_in_between_resumes_that_job(ws, tmp_path):
    """The marker was written after the launch: a requeue between the two found none and launched a second job."""
    job, inv = files(tmp_path)
    old = record_job(ws, job)                        # an earlier job of that name (another Slurm job's, ended)
    Ledger(ws.store).state_changed(old, JobState.FAILED, "earlier")
    first = uslurm.slurm_run(ws, job, inv, "77", "run 0")
    assert first.action == "launch"
    marker = sbatch.marker(ws.root, "77")
    assert marker.read_text().startswith("launching demo ")             # written before anything was launched
    assert [p.name for p in marker.parent.iterdir()] == ["77"]           # atomically: no temporary file left

    again = uslurm.slurm_run(ws, job, inv, "77", "run 1")                  # requeued before it recorded a job
    assert again.action == "launch"                                      # the earlier job is not taken for it

    launched = record_job(ws, job)                                       # run 1 recorded its job, then died
    requeued = uslurm.slurm_run(ws, job, inv, "77", "run 2")
    assert (requeued.action, requeued.job_id) == ("resume", launched)    # never a second job
    assert marker.read_text() == launched + "\n"
    assert uslurm.slurm_run(ws, job, inv, "77", "run 3").job_id == launched


def test_marker_is_replaced_atomically_and_a_foreign_file_is_an_input_error(tmp_path):
    path = tmp_path / "slurm" / "5"
    sbatch.write_marker(path, sbatch.launching("demo", 12.5))
    assert sbatch.read_marker(path) == sbatch.Marker(None, "demo", 12.5)
    sbatch.write_marker(path, "demo-20261204-000000-abcdefabcdef")
    assert sbatch.read_marker(path) == sbatch.Marker("demo-20261204-000000-abcdefabcdef")
    assert sorted(p.name for p in path.parent.iterdir()) == ["5"]
    path.write_text("two words\n")
    with pytest.raises(InputError, match="move it aside"):
        sbatch.read_marker(path)
    assert sbatch.read_marker(tmp_path / "none") is None


def overlay(tmp_path, gpus, name="overlay.yaml") -> str:
    p = tmp_path / name
    p.write_text("all:\n  vars:\n    clusterctl_runtime: bare\n"
                 + (f"    clusterctl_gpus: {gpus}\n" if gpus is not None else ""))
    return str(p)


def test_sbatch_asks_for_the_gpus_of_nproc_per_node_gpu_and_dry_run_shows_it(tmp_path):
    job, _ = files(tmp_path, nproc="gpu")
    state = str(paths.ensure_state_dir(tmp_path / "state"))
    r = CliRunner().invoke(app, ["--state-dir", state, "sbatch", job, "--overlay", overlay(tmp_path, 8),
                                 "--dry-run"])
    assert r.exit_code == 0, r.output
    assert "#SBATCH --gpus-per-node=8\n" in r.output
    r = CliRunner().invoke(app, ["--state-dir", state, "sbatch", job, "--overlay", overlay(tmp_path, 8),
                                 "--dry-run", "-o", "json"])
    assert json.loads(r.output)["gpus_per_node"] == 8
    # the user's own GPU request wins; a CPU overlay asks for none
    r = CliRunner().invoke(app, ["--state-dir", state, "sbatch", job, "--overlay", overlay(tmp_path, 8),
                                 "--dry-run", "--", "--gres=gpu:a100:4"])
    assert r.exit_code == 0 and "--gpus-per-node" not in r.output and "--gres=gpu:a100:4" in r.output
    job1, _ = files(tmp_path / ".", nproc="1")
    r = CliRunner().invoke(app, ["--state-dir", state, "sbatch", job1, "--overlay", overlay(tmp_path, 0), "--dry-run"])
    assert r.exit_code == 0 and "--gpus-per-node" not in r.output


def test_sbatch_nproc_gpu_without_a_gpu_count_is_a_usage_error(tmp_path):
    job, _ = files(tmp_path, nproc="gpu")
    state = str(paths.ensure_state_dir(tmp_path / "state"))
    r = subprocess.run([sys.executable, "-m", "clusterctl.cli", "--state-dir", state, "sbatch", job, "--dry-run"],
                       capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert f"{job}:3" in r.stderr and "clusterctl_gpus" in r.stderr and "--gpus-per-node" in r.stderr, r.stderr
    for ov, where in ((overlay(tmp_path, None), f"{job}:3"), (overlay(tmp_path, '"eight"', "bad.yaml"), "bad.yaml:4")):
        r = CliRunner().invoke(app, ["--state-dir", state, "sbatch", job, "--overlay", ov, "--dry-run"])
        assert isinstance(r.exception, InputError) and r.exception.exit_code == 2, r.output
        assert where in str(r.exception), str(r.exception)


def test_gpus_per_node_is_pure():
    class Spec:
        nproc_per_node = 2
    assert sbatch.gpus_per_node("job.yaml", Spec(), None) is None
    assert sbatch.asks_for_gpus(["--gpus-per-node=2"]) and sbatch.asks_for_gpus(["-G", "4"])
    assert not sbatch.asks_for_gpus(["--gres=shard:2", "--time=1:00"])


# ------------------------------------------------------------------------- issue 34 item 6: the Slurm guard
def test_guard_runs_its_nodes_commands_when_slurm_ends_it_and_reports(tmp_path):
    """A real guard process: it waits; Slurm's SIGTERM (the allocation ends) makes it run its node's removal
    commands and write its report."""
    done = tmp_path / "removed"
    guard.write_plan(tmp_path, "42", "demo-1", {"n1": [["sh", "-c", 'echo "$0" > "$1"', "n1", str(done)]],
                                                "n2": [["false"]]})
    p = subprocess.Popen([sys.executable, "-m", guard.MODULE, str(tmp_path), "42"],
                         env={**os.environ, "SLURMD_NODENAME": "n1", "SLURM_RESTART_COUNT": "3"})
    time.sleep(1.0)
    assert p.poll() is None and not done.exists()          # it only waits
    p.send_signal(signal.SIGTERM)
    assert p.wait(timeout=20) == 0
    assert done.read_text() == "n1\n"
    report = guard.read_report(tmp_path, "42", "n1")
    assert (report["ok"], report["restart"], report["job_id"]) == (True, 3, "demo-1")
    bad = guard.clean(tmp_path, "42", "n2", 0)
    assert not bad["ok"] and "false" in bad["detail"]
    assert guard.clean(tmp_path, "43", "n1", 0) == {**guard.read_report(tmp_path, "43", "n1"), "ok": True}


def test_a_requeued_run_drops_the_hosts_that_left_with_what_their_guards_said(ws, tmp_path):
    """Hosts of the last run that the new allocation lacks cannot be reached (srun runs steps on the allocation's
    nodes only): they leave with resume (--exclude), and their guard's word is recorded: cleaned (a cleanup event)
    or cleanup_pending with the reason."""
    job, inv = files(tmp_path)
    spec = load_job(job)
    hosts = tuple(Host(name=n, address="127.0.0.1", connection="local", runtime="bare", gpus=0)
                  for n in ("n1", "n2", "n3", "n4"))
    job_id = ws.store.create_job(spec.name, record.JobRecord(spec=spec, source=job, hosts=hosts,
                                                             interfaces={}).to_json(), None, job)
    sbatch.write_marker(sbatch.marker(ws.root, "9"), job_id)
    guard.write_plan(ws.root, "9", job_id, {})
    guard.clean(ws.root, "9", "n3", 0)                   # n3's guard cleaned it when run 0 ended; n4's never spoke
    run = uslurm.slurm_run(ws, job, inv, "9", "run 1", restart=1)
    assert (run.action, run.job_id, run.leaving) == ("resume", job_id, ("n3", "n4"))   # resume --exclude, not asked
    assert list(Ledger(ws.store).record(ws.store.get_job(job_id)).host_names) == ["n1", "n2", "n3", "n4"]
    events = [(e.kind, e.node) for e in ws.store.events(job_id)]
    assert ("cleanup", "n3") in events and ("cleanup_pending", "n4") in events
    pending = [e.message for e in ws.store.events(job_id) if e.kind == "cleanup_pending"]
    assert "did not report" in pending[0]
    plan = json.loads(guard.plan_path(ws.root, "9").read_text())      # this run's guards know the job's hosts
    assert plan["job_id"] == job_id and {"n1", "n2"} <= set(plan["nodes"])
    assert all(plan["nodes"][n] for n in ("n1", "n2"))


def test_the_script_starts_a_guard_on_every_node_before_the_supervisor():
    text = sbatch.BatchScript(job_path="/j/job.yaml", job_name="demo", nodes="2", state_dir="/st",
                              inventory="slurm", python="/py").render()
    guard_line = next(line for line in text.splitlines() if "clusterctl.slurm.guard" in line)
    assert guard_line.startswith("srun --overlap --ntasks-per-node=1 ") and guard_line.endswith(" &")
    assert '--nodes="${SLURM_JOB_NUM_NODES}"' in guard_line and "--export=PATH," in guard_line
    assert text.index("clusterctl.slurm.guard") < text.index("sbatch-run")


def test_a_supervisor_being_started_here_counts_when_the_last_one_ran_on_another_batch_host(tmp_path):
    """A requeued run resumes on a new batch host; the dead supervisor's claim names the old one (stale heartbeat).
    The supervisor resume just started here (its pid file) is alive: an attached follower reconciled the job under
    it (the requeue test ended FAILED: 'attempt 1 had ended ... and the supervisor was gone')."""
    from types import SimpleNamespace

    from clusterctl.supervise import controller

    job_id = "demo-20261204-000000-abcdefabcdef"
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "clusterctl.supervise", job_id])
    end = time.monotonic() + 10
    while not open(f"/proc/{child.pid}/cmdline", "rb").read() and time.monotonic() < end:
        time.sleep(0.01)     # Popen may return while the child's exec is under way (its cmdline empty)
    try:
        root = paths.ensure_state_dir(tmp_path / "state")
        paths.ensure_job_dir(root, job_id)
        paths.supervisor_pid_path(root, job_id).write_text(f"{child.pid}\n")
        job = SimpleNamespace(job_id=job_id, supervisor_pid=4242, supervisor_host="old-batch-host",
                              supervisor_boot="b", supervisor_seen_at=time.time() - 120, terminal=False)
        assert controller.live_supervisor(root, job) == child.pid
        view = controller.supervision(root, job)
        assert view["supervised"] and view["pid"] == child.pid
        child.kill()
        child.wait()
        assert not controller.supervision(root, job)["supervised"]       # nothing here, nothing beating there
    finally:
        child.kill()
        child.wait()
