"""Fault injection on a 3-node testbed: the quickstart job (`nodes: "2:3"`, 1 rank per node -- 2 where a rank,
not a node, is the victim -- a checkpoint every 10 steps, 0.1 s per step, every trained step recorded by rank 0) must finish after each fault with the final
step reached, every step trained, each attempt training consecutive steps from the checkpoint it resumed, the
failure classified in `clusterctl status -o json`, the timeline in `clusterctl events`, and nothing of the job
left on any host.

Faults kill only the job's processes (`tb.kill(host, pattern=JOB_PATTERN)`): `tb.kill(host)` without a pattern
would also kill the host's sshd.

The testbed runs a dockerd per host too: docker meets every fault of this module's podman tests in one run
(`test_docker_meets_every_fault_in_one_run`, one launch instead of one per fault: CI time).
"""
from __future__ import annotations

import json
import os
import signal
import string
import time
from pathlib import Path

import pytest

from tests.integration import fault_series as fs
from tests.integration import recovery_harness as rh

JOBS = Path(__file__).parent / "jobs"
from tests.testbed import Testbed as _Testbed, profile  # aliased so pytest does not try to collect it
from tests.testbed.system import claim_octet



@pytest.fixture(scope="module")
def rtb(tmp_path_factory, testbed_slot):
    """One 3-host testbed (no GPUs, a dockerd per host) for the module: each test uses its own job name and shared
    sub-directory."""
    letter = string.ascii_lowercase[testbed_slot]
    tb = _Testbed(3, tmp_path_factory.mktemp("recovery-tb"), [profile(gpus=0)] * 3, prefix=f"tbr{letter}",
                 subnet_octet=claim_octet(range(240 + testbed_slot, 250)), docker=True)
    try:
        tb.up()
    except Exception as e:  # noqa: BLE001 - a failure with the reason, never a skip
        pytest.fail(f"testbed could not be built: {type(e).__name__}: {e}", pytrace=False)
    yield tb
    tb.down()


@pytest.fixture
def job(rtb, tmp_path, request):
    runs: list[rh.Run] = []

    def make(**kw) -> rh.Run:
        name = "rec" + "".join(c for c in request.node.name.replace("test_", "") if c.isalnum())[-28:]
        run = rh.new_run(rtb, tmp_path, name, **kw)
        runs.append(run)
        return run

    yield make
    for h in rtb.hosts:            # undo faults, whatever happened
        if rtb.partitioned(h.name):
            rtb.heal(h.name)
        if rtb.sshd_pid(h.name) is None:
            rtb.start_sshd(h.name)
    for run in runs:
        st = run.cli("status", run.name, "-o", "json", check=False, timeout=30)
        if st.returncode == 0 and '"supervisor_pid": null' not in st.stdout:
            run.cli("stop", run.name, "--grace", "0", check=False, timeout=120)
        for line in run.log[-6:]:
            print(line)


def failure_of(run: rh.Run, klass: str | tuple[str, ...]) -> dict:
    klasses = (klass,) if isinstance(klass, str) else klass
    fails = run.status()["failures"]
    assert fails, "no failure recorded in status"
    f = fails[0]
    assert f["class"] in klasses, fails
    assert f["node"] and f["message"]
    return f


def timeline(run: rh.Run) -> list[str]:
    text = run.events_text()
    kinds = [e["kind"] for e in run.events()]
    for k in ("start", "verdict", "gang_stop", "end"):
        assert k in kinds, f"{k} missing from events:\n{text}"
    return kinds


def finish(run: rh.Run, *, timeout=480) -> dict:
    st = run.wait_end(timeout)
    assert st["state"] == "SUCCEEDED", f"{st['state']}: {st['reason']}\n{run.events_text()}"
    return st


# --------------------------------------------------------------------------------------------- the faults

def test_kill_one_worker(job, rtb):
    run = job(steps=80, nproc=2)      # its sibling rank on the node is taken down with it
    run.launch()
    run.wait_step(25)
    victim = rh.other_host(run)
    pid = rh.rank_pids(rtb, victim)[0]          # a rank, not one of its DataLoader workers
    os.kill(pid, signal.SIGKILL)
    st = finish(run)
    f = failure_of(run, "killed")          # a rank killed by a signal (issue 10)
    assert f["node"] == victim and f["signal"] == "SIGKILL", f
    assert st["attempt"] == 2
    rh.check_steps(run)
    timeline(run)
    rh.check_clean(run)


@pytest.mark.parametrize("where", ["worker_node", "rendezvous_host"])
def test_kill_everything_of_the_job_on_a_node(job, rtb, where):
    run = job(steps=80)
    run.launch()
    run.wait_step(25)
    first = run.status()
    victim = rh.rdzv_host(run) if where == "rendezvous_host" else rh.other_host(run)
    assert rtb.kill(victim, pattern=rh.JOB_PATTERN)
    st = finish(run)
    f = failure_of(run, "rendezvous_lost" if where == "rendezvous_host" else "node_lost")
    assert f["node"] == victim
    assert st["attempt"] == 2 and victim not in [n["node"] for n in st["nodes"]]
    if where == "rendezvous_host":
        assert st["rendezvous_host"] != first["rendezvous_host"]
    rh.check_steps(run)
    timeline(run)
    rh.check_clean(run)


def test_partition_a_node_until_the_run_ends(job, rtb):
    """The supervisor cannot clean up a node it cannot reach: it records `cleanup_pending` and the job's
    container on the partitioned node keeps running (hung in gloo). Once the link heals, `clusterctl stop JOB`
    removes it; that is the documented way (the supervisor has exited by then)."""
    run = job(steps=80)
    run.launch()
    run.wait_step(25)
    victim = rh.other_host(run)
    rtb.partition(victim)
    try:
        st = finish(run)
        f = failure_of(run, "node_lost")
        assert f["node"] == victim and "unreachable" in f["message"]
        assert victim not in [n["node"] for n in st["nodes"]]
        kinds = timeline(run)
        assert "cleanup_pending" in kinds
    finally:
        rtb.heal(victim)
    rh.check_steps(run)
    run.cli("stop", run.name, "--grace", "0", timeout=120)
    rh.check_clean(run)


def test_stop_sshd_and_kill_the_job_on_a_node(job, rtb):
    run = job(steps=80)
    run.launch()
    run.wait_step(25)
    victim = rh.other_host(run)
    rtb.stop_sshd(victim)
    try:
        rtb.kill(victim, pattern=r"^sshd: ")     # the open sessions too (not the job: its paths say "sshd")
        assert rtb.kill(victim, pattern=rh.JOB_PATTERN)
        st = finish(run)
        f = failure_of(run, "node_lost")
        assert f["node"] == victim
        assert victim not in [n["node"] for n in st["nodes"]]
        timeline(run)
    finally:
        rtb.start_sshd(victim)
    rh.check_steps(run)
    # The victim was unreachable when the job ended, so its dead container is a recorded `cleanup_pending`;
    # `clusterctl stop` on the finished job is the documented way to clear it once the node answers again.
    assert any(e["kind"] == "cleanup_pending" for e in json.loads(run.cli("events", run.name, "--output", "json").stdout))
    run.cli("stop", run.name, "--grace", "0", timeout=120)
    rh.check_clean(run)


def freeze_between_checkpoints(rtb, ckdir: Path, tries: int = 20) -> None:
    """SIGSTOP every training process at a moment when no checkpoint is being written.

    A save caught half-way (a ``.tmp-step-*`` directory) would be renamed into place after SIGCONT and become
    the newest valid checkpoint, so the damaged one would no longer be the newest: thaw and try again.
    """
    for _ in range(tries):
        for h in rtb.hosts:
            rtb.kill(h.name, pattern=r"train\.py", signal=signal.SIGSTOP)
        time.sleep(0.3)
        if not any(p.name.startswith(".tmp-") for p in ckdir.iterdir()):
            return
        for h in rtb.hosts:
            rtb.kill(h.name, pattern=r"train\.py", signal=signal.SIGCONT)
        time.sleep(0.2)
    raise AssertionError(f"could not freeze the job between two checkpoints in {ckdir}")


def test_truncated_newest_checkpoint_resumes_from_the_previous_one(job, rtb):
    run = job(steps=80)
    run.launch()
    run.wait_step(33)
    ckdir = Path(run.job.read_text().split("dir: ")[1].split()[0])
    # stop progress first so no newer checkpoint replaces the one we damage: freeze the job's processes
    freeze_between_checkpoints(rtb, ckdir)
    ckpts = sorted(p for p in ckdir.iterdir() if p.name.startswith("step-") and p.is_dir())
    newest, previous = ckpts[-1], ckpts[-2]
    biggest = max((p for p in newest.rglob("*") if p.is_file()), key=lambda p: p.stat().st_size)
    with open(biggest, "r+b") as fh:
        fh.truncate(biggest.stat().st_size // 2)
    victim = rh.other_host(run)
    rtb.kill(victim, pattern=rh.JOB_PATTERN)
    for h in rtb.hosts:
        rtb.kill(h.name, pattern=r"train\.py", signal=signal.SIGCONT)
    st = finish(run)
    prev_step = int(previous.name.split("-")[1])
    starts = [e for e in run.events() if e["kind"] == "start" and e["attempt"] == 2]
    assert starts and starts[0]["checkpoint_step"] == prev_step, (prev_step, starts, run.events_text())
    steps = rh.check_steps(run)
    assert prev_step in steps["attempts"].values(), steps
    assert st["state"] == "SUCCEEDED"
    rh.check_clean(run)


def test_supervisor_killed_then_resume_reattaches(job, rtb):
    run = job(steps=120)
    run.launch()
    run.wait_step(20)
    pid = run.supervisor_pid()
    os.kill(pid, signal.SIGKILL)
    time.sleep(1)
    out = run.cli("resume", run.name, "--detach", "-o", "json", timeout=120)
    assert "re-attached" in out.stdout, out.stdout
    again = run.cli("resume", run.name, "--detach", "-o", "json", timeout=60)       # idempotent
    assert "already supervised" in again.stdout, again.stdout
    st = finish(run)
    assert st["attempt"] == 1 and not st["failures"]
    kinds = [e["kind"] for e in run.events()]
    assert "adopt" in kinds and kinds.count("start") == 1
    rh.check_steps(run, resumed_steps=[0])
    rh.check_clean(run)


def test_supervisor_and_job_killed_then_resume_relaunches(job, rtb):
    run = job(steps=80)
    run.launch()
    run.wait_step(25)
    os.kill(run.supervisor_pid(), signal.SIGKILL)
    for h in rtb.hosts:
        rtb.kill(h.name, pattern=rh.JOB_PATTERN)
    time.sleep(1)
    last = max(int(p.name.split("-")[1]) for p in (run.record.parent / "ckpt").iterdir()
               if p.name.startswith("step-"))
    out = run.cli("resume", run.name, "--detach", "-o", "json", timeout=180)
    assert "relaunching" in out.stdout, out.stdout
    st = finish(run)
    assert st["attempt"] == 2
    starts = [e for e in run.events() if e["kind"] == "start" and e["attempt"] == 2]
    assert starts[0]["checkpoint_step"] == last, (last, run.events_text())
    rh.check_steps(run)
    rh.check_clean(run)


@pytest.mark.parametrize("runtime", ["docker"])      # podman: the one-fault tests above, test_longrun's series
def test_docker_meets_every_fault_in_one_run(job, rtb, runtime):
    """Every fault of this module's podman tests, one after the other in one launch (CI time): a worker node's job
    killed, a worker node partitioned (healed once given up), the rendezvous host's job killed, a worker node
    partitioned with its job killed, the rendezvous host partitioned with its job killed. Each classified, each
    followed by training from the newest checkpoint (fault_series: the next fault waits for a new checkpoint), the
    healed nodes re-admitted and their dead containers removed, the steps consecutive, nothing left."""
    run = job(runtime=runtime, steps=200, nodes="2:3", nproc=1)   # the series ends near step 90
    run.launch()
    faults = ("kill_node", "partition_heal", "kill_rdzv_host", "partition_kill", "partition_kill_rdzv")
    results = fs.run_series(run, faults)
    st = finish(run)
    assert [r["klass"] for r in results] == ["node_lost", "node_lost", "rendezvous_lost", "node_lost",
                                             "rendezvous_lost"], results
    assert st["attempt"] == len(faults) + 1, st
    slow = fs.slow_recoveries(run, results)                  # test_longrun's bound
    assert not slow, f"training resumed later than the bound after: {slow} (first start " \
                     f"{fs.first_start(run):.1f}s)\n{results}"
    rh.check_steps(run)
    timeline(run)
    rh.check_clean(run, timeout=60)


def test_script_that_always_fails_stops_after_max_failures(job, rtb):
    # a script that exits 1 at once (the quickstart's --fail-always imports torch first: 9 ranks x 3 s of CPU)
    run = job(steps=80, script=JOBS / "fail.py", restarts={"max_failures": 2, "backoff_s": 0.2})
    run.launch()
    st = run.wait_end(480)
    assert st["state"] == "FAILED", st
    assert "restarts.max_failures" in st["reason"] and "exited with code 1" in st["reason"], st["reason"]
    assert st["restarts"]["failures_used"] == 3 and st["attempt"] == 3
    assert all(f["class"] == "user_error" and f["exit_code"] == 1 for f in st["failures"]), st["failures"]
    rh.check_clean(run)
