"""Warm recovery on a 3-node podman testbed (the quickstart job, `nodes: "2:3"`, 1 rank per node, `recovery`
left at its default, warm): a fault -> the survivors' relaunch is forked from their zygotes (`relaunch` events
with class `warm`), training resumes from the newest checkpoint, every step is trained, each attempt trains
consecutive steps, nothing of the job (zygotes included) is left; a survivor whose zygote is gone is relaunched
cold (the event says why) and the job still finishes.
"""
from __future__ import annotations

import string
import time

import pytest

from tests.integration import recovery_harness as rh
from tests.testbed import Testbed as _Testbed  # aliased so pytest does not try to collect it
from tests.testbed import profile
from tests.testbed.system import claim_octet


@pytest.fixture(scope="module")
def wtb(tmp_path_factory, testbed_slot):
    letter = string.ascii_lowercase[testbed_slot]
    tb = _Testbed(3, tmp_path_factory.mktemp("warm-tb"), [profile(gpus=0)] * 3, prefix=f"tbw{letter}",
                  subnet_octet=claim_octet(range(230 + testbed_slot, 240)))
    try:
        tb.up()
    except Exception as e:  # noqa: BLE001 - a failure with the reason, never a skip
        pytest.fail(f"testbed could not be built: {type(e).__name__}: {e}", pytrace=False)
    yield tb
    tb.down()


@pytest.fixture
def job(wtb, tmp_path, request):
    runs: list[rh.Run] = []

    def make(**kw) -> rh.Run:
        name = "warm" + "".join(c for c in request.node.name.replace("test_", "") if c.isalnum())[-24:]
        run = rh.new_run(wtb, tmp_path, name, **kw)
        runs.append(run)
        return run

    yield make
    for h in wtb.hosts:
        if wtb.partitioned(h.name):
            wtb.heal(h.name)
    for run in runs:
        rh.stop_unless_done(run)
        for line in run.log[-6:]:
            print(line)


def relaunches(run: rh.Run, attempt: int) -> dict[str, str]:
    """node -> warm | cold of ``attempt``'s relaunch events."""
    return {e["node"]: e["class"] for e in run.events() if e["kind"] == "relaunch" and e["attempt"] == attempt}


def first_step_after(run: rh.Run, attempt: int) -> float | None:
    recs = [r for r in run.steps_log() if str(r["attempt"]) == str(attempt) and "time" in r]   # a string there
    return recs[0]["time"] if recs else None


def no_zygote_left(run: rh.Run) -> None:
    if run.runtime == "bare":       # no container: check_clean found no zygote process of the job
        return
    for h in run.tb.hosts:
        assert not run.tb.container_names(h, run.runtime, "label=clusterctl.warm"), h.name


def finish(run: rh.Run) -> dict:
    st = run.wait_end(480)
    assert st["state"] == "SUCCEEDED", f"{st['state']}: {st['reason']}\n{run.events_text()}"
    rh.check_steps(run)
    rh.check_clean(run)
    no_zygote_left(run)
    return st


@pytest.mark.parametrize("runtime", ["podman", "bare"])
def test_worker_node_killed_survivors_relaunch_warm(job, wtb, runtime):
    run = job(steps=80, runtime=runtime)
    run.launch()
    run.wait_step(25)
    rh.wait_zygotes(run)
    victim = rh.other_host(run)
    survivors = [n for n in run.current_attempt().nodes if n != victim]
    t = time.time()
    assert wtb.kill(victim, pattern=rh.JOB_PATTERN)
    st = finish(run)
    assert relaunches(run, 2) == {n: "warm" for n in survivors}, run.events_text()
    assert any(r["recovery"] == "warm" for r in run.status()["relaunches"])
    first = first_step_after(run, 2)
    print(f"worker kill -> first step of attempt 2: {first - t:.2f}s" if first else "no step time recorded")
    assert st["attempt"] == 2


@pytest.mark.parametrize("runtime", ["podman", "bare"])
def test_rendezvous_host_killed_survivors_relaunch_warm(job, wtb, runtime):
    run = job(steps=80, runtime=runtime)
    run.launch()
    run.wait_step(25)
    rh.wait_zygotes(run)
    victim = rh.rdzv_host(run)
    survivors = [n for n in run.current_attempt().nodes if n != victim]
    assert wtb.kill(victim, pattern=rh.JOB_PATTERN)
    st = finish(run)
    assert relaunches(run, 2) == {n: "warm" for n in survivors}, run.events_text()
    assert st["rendezvous_host"] != victim


@pytest.mark.parametrize("runtime,which", [("podman", "worker"), ("podman", "rdzv"), ("bare", "worker")])
def test_partitioned_node_survivors_relaunch_warm(job, wtb, runtime, which):
    """A node cut off the network (its processes keep running, hung in gloo): found by its silence, `node_lost`
    (`rendezvous_lost` for the rendezvous host), and the two survivors relaunch warm; once it is healed, what it still ran (its container or runner, and its
    zygote) is removed when the job ends."""
    run = job(steps=80, runtime=runtime)
    run.launch()
    run.wait_step(25)
    rh.wait_zygotes(run)
    victim = rh.rdzv_host(run) if which == "rdzv" else rh.other_host(run)
    survivors = [n for n in run.current_attempt().nodes if n != victim]
    wtb.partition(victim)
    try:
        end = time.monotonic() + 120
        while first_step_after(run, 2) is None:          # training again on the survivors
            assert time.monotonic() < end, "attempt 2 did not train\n" + run.events_text()
            time.sleep(0.3)
    finally:
        wtb.heal(victim)
    st = finish(run)
    assert relaunches(run, 2) == {n: "warm" for n in survivors}, run.events_text()
    lost = "rendezvous_lost" if which == "rdzv" else "node_lost"
    assert [(f["class"], f["node"]) for f in st["failures"]] == [(lost, victim)], st["failures"]


def test_a_survivor_without_its_zygote_relaunches_cold_and_the_job_finishes(job, wtb):
    run = job(steps=80)
    run.launch()
    run.wait_step(25)
    rh.wait_zygotes(run)
    victim = rh.other_host(run)
    cold = rh.rdzv_host(run)
    assert wtb.kill(cold, pattern=r"zygote\.py serve")      # attempt 1 is cold: only the zygote matches
    assert wtb.kill(victim, pattern=rh.JOB_PATTERN)
    finish(run)
    got = relaunches(run, 2)
    assert got[cold] == "cold" and all(v == "warm" for n, v in got.items() if n != cold), run.events_text()
    why = next(e["message"] for e in run.events() if e["kind"] == "relaunch" and e["node"] == cold)
    assert "zygote" in why, why


def test_a_stop_during_the_warm_relaunch_leaves_nothing(job, wtb):
    """`clusterctl stop` as the survivors' warm relaunch starts (right after attempt 2's start event): the job ends
    STOPPED with no attempt after 2, and nothing is left on any host: attempt containers, zygote containers, forked
    agents and ranks, warm dirs."""
    import glob

    from clusterctl.launch.runtimes import WARM_ROOT

    run = job(steps=400)
    run.launch()
    run.wait_step(25)
    rh.wait_zygotes(run)
    job_id = run.job_row().job_id
    assert wtb.kill(rh.other_host(run), pattern=rh.JOB_PATTERN)

    def started_2() -> bool:
        with run.store() as store:
            return any(e.kind == "start" and (e.attempt or 0) >= 2 for e in store.events(job_id))

    end = time.monotonic() + 60
    while not started_2():
        assert time.monotonic() < end, "attempt 2 did not start\n" + run.events_text()
        time.sleep(0.05)
    run.cli("stop", run.name, "--grace", "0", timeout=120)
    st = run.wait_end(120)
    assert st["state"] == "STOPPED", f"{st['state']}: {st['reason']}\n{run.events_text()}"
    with run.store() as store:
        assert [a.attempt for a in store.attempts(job_id)] == [1, 2], run.events_text()
    rh.check_clean(run)
    no_zygote_left(run)
    assert not glob.glob(f"{WARM_ROOT}/{job_id}_*"), "warm dirs left"
