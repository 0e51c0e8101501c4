"""Fault injection on a 3-node testbed: the quickstart job (`nodes: "2:3"`, 1 rank per node, a checkpoint every 10
steps, 0.1 s per step, every trained step recorded by rank 0) must finish after each fault with the final step
reached, every step trained, each attempt training consecutive steps from the checkpoint it resumed, the
failure classified in `clusterctl status -o json`, the timeline in `clusterctl events`, and nothing of the job
left on any host.

Faults kill only the job's processes (`tb.kill(host, pattern=JOB_PATTERN)`): `tb.kill(host)` without a pattern
would also kill the host's sshd.

The testbed runs a dockerd per host too: docker meets every fault of this module's podman tests in one run
(`test_docker_meets_every_fault_in_one_run`, one launch instead of one per fault: CI time).

Elsewhere, so that no fault runs twice on podman (CI time): a worker node's job killed and a healed node re-admitted
are in test_longrun's series; one rank SIGKILLed (`killed`, SIGKILL), a supervisor killed then `resume`
re-attaching, and supervisor and job both dead then `resume` relaunching from the newest checkpoint are in
test_oncall.
"""
from __future__ import annotations

import signal
import string
import time
from pathlib import Path

import pytest

from tests.integration import fault_series as fs
from tests.integration import recovery_harness as rh

JOBS = Path(__file__).parent / "jobs"
from tests.testbed import Testbed as _Testbed  # aliased so pytest does not try to collect it
from tests.testbed import profile
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
        rh.stop_unless_done(run)
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

def test_kill_everything_of_the_job_on_the_rendezvous_host(job, rtb):
    """The rendezvous host's torchrun (the c10d store) dies with its ranks: the job comes back on the others with a
    new rendezvous host. (A worker node's job killed: test_longrun's series and the docker series.)"""
    run = job(steps=80)
    run.launch()
    run.wait_step(25)
    first = run.status()
    victim = rh.rdzv_host(run)
    assert rtb.kill(victim, pattern=rh.JOB_PATTERN)
    st = finish(run)
    f = failure_of(run, "rendezvous_lost")
    assert f["node"] == victim
    assert st["attempt"] == 2 and victim not in [n["node"] for n in st["nodes"]]
    assert st["rendezvous_host"] != first["rendezvous_host"]
    rh.check_steps(run)
    timeline(run)
    rh.check_clean(run)


def test_unreachable_nodes_until_the_run_ends_partitioned_then_sshd_stopped(job, rtb):
    """Two nodes become unreachable one after the other and stay so until the run ends (`nodes: "1:3"`): a worker
    node partitioned (its container keeps running, hung in gloo), then, once the job trains again on the other two,
    a worker node whose sshd is stopped, its open sessions and its job killed. Each is `node_lost` and dropped; the
    job finishes on the one node left. The supervisor cannot clean up a node it cannot reach: it records
    `cleanup_pending` for each. Once the nodes answer again, `clusterctl stop JOB` on the finished job removes
    what is left; that is the documented way (the supervisor has exited by then)."""
    run = job(steps=100, nodes="1:3")
    run.launch()
    run.wait_step(25)
    parted = rh.other_host(run)
    rtb.partition(parted)
    sshless = None
    try:
        end = time.monotonic() + 120
        while not any(r["attempt"] == "2" for r in run.steps_log()):   # training again on the other two
            assert time.monotonic() < end, "attempt 2 did not train\n" + run.events_text()
            time.sleep(0.3)
        sshless = rh.other_host(run)
        assert sshless != parted
        rtb.stop_sshd(sshless)
        rtb.kill(sshless, pattern=r"^sshd: ")     # the open sessions too (not the job: its paths say "sshd")
        assert rtb.kill(sshless, pattern=rh.JOB_PATTERN)
        st = finish(run)
        fails = [(f["class"], f["node"]) for f in st["failures"]]
        assert fails == [("node_lost", parted), ("node_lost", sshless)], fails
        assert "unreachable" in st["failures"][0]["message"]
        assert st["attempt"] == 3 and [n["node"] for n in st["nodes"]] == [rh.rdzv_host(run)], st["nodes"]
        timeline(run)
        pending = [e["node"] for e in run.events() if e["kind"] == "cleanup_pending"]
        assert parted in pending and sshless in pending, run.events_text()
    finally:
        rtb.heal(parted)
        if sshless is not None:
            rtb.start_sshd(sshless)
    rh.check_steps(run)
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


@pytest.mark.parametrize("runtime", ["docker"])      # podman: the one-fault tests above, test_longrun's series
def test_docker_meets_every_fault_in_one_run(job, rtb, runtime):
    """Every fault of this module's podman tests, one after the other in one launch (CI time): a worker node's job
    killed, a worker node partitioned (healed once given up), the rendezvous host's job killed, a worker node
    partitioned with its job killed, the rendezvous host partitioned with its job killed. Each classified, each
    followed by training from the newest checkpoint (fault_series: the next fault waits for a new checkpoint), the
    healed nodes re-admitted and their dead containers removed, the steps consecutive, nothing left."""
    run = job(runtime=runtime, steps=160, nodes="2:3", nproc=1)   # the series ends near step 90
    run.launch()
    rh.wait_zygotes(run)
    faults = ("kill_node", "partition_heal", "kill_rdzv_host", "partition_kill", "partition_kill_rdzv")
    results = fs.run_series(run, faults)
    st = finish(run)
    # recovery's default, warm, on docker: at the first relaunch every node but the victim is forked from its zygote
    first = {e["node"]: e["class"] for e in run.events() if e["kind"] == "relaunch" and e["attempt"] == 2}
    assert first and all(c == "warm" for n, c in first.items() if n != results[0]["victim"]), \
        (first, run.events_text())
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
    # a script that exits 1 at once (the quickstart's --fail-always imports torch first: 9 ranks x 3 s of CPU), on
    # one node: the budget is the job's, not a node's
    run = job(steps=80, nodes="1", script=JOBS / "fail.py", restarts={"max_failures": 2, "backoff_s": 0.2})
    run.launch()
    st = run.wait_end(480)
    assert st["state"] == "FAILED", st
    assert "restarts.max_failures" in st["reason"] and "exited with code 1" in st["reason"], st["reason"]
    assert st["restarts"]["failures_used"] == 3 and st["attempt"] == 3
    assert all(f["class"] == "user_error" and f["exit_code"] == 1 for f in st["failures"]), st["failures"]
    rh.check_clean(run)


def test_a_node_whose_gpu_failed_is_left_out_and_the_job_finishes(job, rtb):
    """Issue 35: the ranks of one node die of torch's "CUDA error: uncorrectable ECC error encountered": class
    gpu_error (the node budget), the node and the evidence named, the relaunch without that node finishes."""
    import yaml

    run = job(nodes="2:3", script=JOBS / "gpu_error.py")
    victim = rtb.hosts[2].name
    spec = yaml.safe_load(run.job.read_text())
    spec["env"] = {"GPU_ERROR_NODE": victim}
    run.job.write_text(yaml.safe_dump(spec, sort_keys=False))
    run.launch()
    st = finish(run, timeout=300)
    f = failure_of(run, "gpu_error")
    assert f["node"] == victim and "uncorrectable ECC error encountered" in f["message"], f
    assert st["restarts"]["node_failures_used"] == 1 and st["restarts"]["failures_used"] == 0, st["restarts"]
    assert st["attempt"] == 2 and victim not in [n["node"] for n in st["nodes"]], st["nodes"]
    assert f"{victim} rank" in run.events_text() or f"node {victim}" in run.events_text()
    rh.check_clean(run, timeout=60)


def test_each_kind_of_hang_is_named_cold_and_warm_and_a_lone_rank_holding_the_gil_is_busy(job):
    """Issue 37 on podman with the job's defaults (stuck_timeout_s 20), one rank per node (no local peer sees a
    rank's /proc state: only the node's watch does), each attempt sick in another way on another node:

    - attempt 1 (cold): rank 0 computes silently for 30 s in C calls holding the GIL (its monitor thread cannot
      write: busy by what the watch reads of it from outside, never stuck: before, a hang 23 s in) while its peers
      wait in DDP's all-reduce; then rank 1 sleeps forever in its own code: a hang;
    - attempt 2 (warm: the zygotes' ranks): rank 2 blocks reading a FIFO: a hang;
    - attempt 3 (warm): rank 0 skips a step's collectives (it waits one sequence number ahead): a hang;
    - attempt 4 finishes.

    Each hang is declared within 30 s of the attempt's last step and names the sick rank and its node (its first
    ``stuck`` event too); every rank's flight-recorder dump and stack are kept in the job's dir. (bare: sigstop,
    busy and another collective, test_warm.)"""
    import json

    run = job(script=JOBS / "sick.py", nodes="3", nproc=1, steps=24, step_time=0.1,
              extra_args=["--fault", "1:gilbusy@0,1:sleep@1,2:fifo@2,3:skip@0", "--at", "4,10,6,6",
                          "--busy-s", "30"])
    run.launch()
    st = finish(run, timeout=480)
    assert st["attempt"] == 4 and [f["class"] for f in st["failures"]] == ["hang"] * 3, st["failures"]
    ev = run.events()
    assert {e["class"] for e in ev if e["kind"] == "relaunch" and e["attempt"] in (2, 3)} == {"warm"}, \
        run.events_text()
    for f, attempt, rank, kind in zip(st["failures"], (1, 2, 3), (1, 2, 0), ("sleep", "fifo", "skip")):
        truth = json.loads(Path(f"{run.record.parent / 'sick.json'}.{attempt}").read_text())
        assert (truth["rank"], truth["fault"]) == (rank, kind), truth
        assert (f["attempt"], f["node"], f["rank"]) == (attempt, truth["node"], rank), f
        assert f"node {truth['node']} rank {rank} stuck in" in f["message"], f["message"]
        last = max(r["time"] for r in run.steps_log() if str(r["attempt"]) == str(attempt))
        assert f["time"] - last <= 30, f"attempt {attempt}: hang declared {f['time'] - last:.1f}s after the last step"
        stuck = [e for e in ev if e["kind"] == "stuck" and e["class"] == "stuck" and e["attempt"] == attempt]
        assert stuck and (stuck[0]["node"], stuck[0]["rank"]) == (truth["node"], rank), (attempt, stuck)
    # the GIL-holding rank 0 of attempt 1 was never stuck (its 30 s spell came before rank 1's sleep)
    assert not [e for e in ev if e["kind"] == "stuck" and e["attempt"] == 1 and e["rank"] == 0], run.events_text()
    dumps = sorted(p.name for p in (run.state_dir / "jobs" / run.job_row().job_id / "hang-1").iterdir())
    assert [d for d in dumps if d.startswith("fr-")] and [d for d in dumps if d.startswith("stack-")], dumps
    rh.check_clean(run)


def test_a_straggler_at_half_speed_is_named_within_two_minutes_and_nothing_is_done_by_default(job):
    """Issue 37 item 4 on podman, the job's defaults (`supervisor.stragglers: warn`): from step 10 rank 1 runs every
    step at half speed (2x its peers') while they wait for it in every collective. Within 2 minutes: a `straggler`
    event naming its node and rank and how much slower, and `status -o json`'s `stragglers` listing it alone; no
    `stuck`, no other rank named, no action (attempt 1 trains on). Then the job is stopped (its clearing after a
    recovery: unit tests and bench/soak.py)."""
    import json

    run = job(script=JOBS / "sick.py", nodes="3", nproc=1, steps=3000, step_time=0.1,
              extra_args=["--fault", "1:slow@1", "--at", "10", "--slow", "2"])
    run.launch()
    mark = run.record.parent / "sick.json"
    rh.wait_for(mark.exists, 180, "the fault", 2, run)
    truth = json.loads(mark.read_text())
    assert (truth["rank"], truth["fault"]) == (1, "slow"), truth
    st = rh.wait_for(lambda: (s := run.status()).get("stragglers") and s, 180, "a straggler in status -o json",
                     2, run)
    named = [e for e in run.events() if e["kind"] == "straggler" and e["class"] == "named"]
    assert [(e["node"], e["rank"]) for e in named] == [(truth["node"], 1)], run.events_text()
    assert named[0]["time"] - truth["time"] <= 120, f"named {named[0]['time'] - truth['time']:.0f}s after the fault"
    assert "slower than the fastest rank" in named[0]["message"], named[0]
    [s] = st["stragglers"]
    assert (s["node"], s["rank"]) == (truth["node"], 1) and s["slowdown"] >= 1.5, st["stragglers"]
    assert st["state"] == "RUNNING" and st["attempt"] == 1 and not st["failures"], st
    assert not [e for e in run.events() if e["kind"] == "stuck"], run.events_text()
    run.cli("stop", run.name, "--grace", "0", timeout=120)
    assert run.wait_end(120)["state"] == "STOPPED"
    rh.check_clean(run)
