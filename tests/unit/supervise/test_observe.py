"""observe.heard / observe.interpret: a probe round's meaning from plain values (no transport, no sleep)."""
from __future__ import annotations

from dataclasses import dataclass

import pytest

from clusterctl.launch import runtimes
from clusterctl.launch.runtimes import LABEL_ATTEMPT, Instance
from clusterctl.model.verdicts import Observation
from clusterctl.supervise import observe
from clusterctl.supervise.observe import Confirm, Explain, heard, interpret

JOB_ID = "j-20261201-000000-beef"


@dataclass
class Watch:
    attempt: int = 1
    last: float | None = 100.0
    alive: bool = True
    gone_at: float | None = None


def inst(state: str, attempt: int = 1, exit_code: int | None = None, name: str = "c1") -> Instance:
    return Instance(name=name, state=state, exit_code=exit_code, labels={LABEL_ATTEMPT: str(attempt)})


def run(instances, *, runtime="podman", watch=None, now=200.0, progress=False, attempt=1):
    return interpret("n1", instances, attempt, runtime=runtimes.get(runtime), job_id=JOB_ID, watch=watch, now=now,
                     progress=progress)


# ------------------------------------------------------------------------------------------------ the watch
def test_nothing_heard_yet_means_probe():
    assert heard("n1", Watch(last=None), limit=2.0, now=100.0) is None


def test_a_silent_watch_is_unreachable():
    o = heard("n1", Watch(last=100.0), limit=2.0, now=102.5)
    assert o == Observation("n1", "unreachable", error_tail="no heartbeat for 2.5s (limit 2.0s)")


def test_a_fresh_alive_watch_is_running_and_a_fresh_gone_one_is_probed():
    assert heard("n1", Watch(last=100.0, alive=True), limit=2.0, now=101.0) == Observation("n1", "running")
    assert heard("n1", Watch(last=100.0, alive=False), limit=2.0, now=101.0) is None
    assert heard("n1", Watch(last=100.0, alive=True), limit=2.0, now=102.0) == Observation("n1", "running")


# ------------------------------------------------------------------------------------------------ the listing
@pytest.mark.parametrize("runtime", ["podman", "docker", "bare"])
def test_no_instance_of_this_attempt_is_missing(runtime):
    assert run([], runtime=runtime) == Observation("n1", "missing")
    assert run([inst("running", attempt=2)], runtime=runtime, progress=True) == \
        Observation("n1", "missing", progress=True)


@pytest.mark.parametrize("state", ["created", "restarting", "paused"])
def test_not_yet_or_no_longer_running_states_count_as_running_without_a_second_look(state):
    assert run([inst(state)]) == Observation("n1", "running")


def test_bare_running_is_believed():
    assert run([inst("running")], runtime="bare", watch=Watch(alive=False, gone_at=100.0)) == \
        Observation("n1", "running")


@pytest.mark.parametrize("runtime", ["podman", "docker"])
def test_a_listed_running_container_is_confirmed_on_the_node(runtime):
    got = run([inst("running", name="clusterctl-x_n1")], runtime=runtime, watch=Watch(), progress=True)
    assert isinstance(got, Confirm)
    assert got.argv == runtimes.get(runtime).init_gone_argv(
        runtimes.Ref("clusterctl-x_n1", "", None, JOB_ID), observe.GONE_CONFIRM_S)
    assert got.running == Observation("n1", "running", progress=True)
    assert got.gone.state == "missing" and got.gone.progress
    assert got.gone.error_tail == ("the container's processes are gone (killed) although "
                                   f"{runtime} still lists it as running")


def test_a_container_the_watch_saw_go_long_enough_ago_is_gone_without_asking():
    w = Watch(alive=False, gone_at=200.0 - observe.GONE_CONFIRM_S)
    got = run([inst("running")], watch=w)
    assert isinstance(got, Observation) and got.state == "missing" and "still lists it" in got.error_tail
    # too recent, or seen for another attempt: ask
    assert isinstance(run([inst("running")], watch=Watch(alive=False, gone_at=199.8)), Confirm)
    assert isinstance(run([inst("running")], watch=Watch(attempt=2, alive=False, gone_at=100.0)), Confirm)


def test_dead_is_missing():
    assert run([inst("dead")]) == Observation("n1", "missing")


@pytest.mark.parametrize("state,code", [("exited", 0), ("exited", None), ("removing", None), ("unknown", None)])
def test_a_clean_or_unknown_exit_needs_no_log(state, code):
    assert run([inst(state, exit_code=code)], progress=True) == \
        Observation("n1", "exited", exit_code=code, signal=None, progress=True)


@pytest.mark.parametrize("code", [1, 137, -9])
def test_a_failure_is_explained_from_the_node(code):
    i = inst("exited", exit_code=code)
    assert run([i]) == Explain(i)


def test_the_first_instance_of_the_attempt_decides():
    assert run([inst("exited", attempt=0, exit_code=1), inst("exited", exit_code=0), inst("exited", exit_code=1)]) \
        == Observation("n1", "exited", exit_code=0)
