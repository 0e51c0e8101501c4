"""Long runs on a 4-host testbed (issue 16): many faults in one run recover as fast as the first, and a healed
node is re-admitted at the next relaunch (the series' third fault: fewer than MIN nodes are left, and the healed
node of the second fault is taken back).

The quickstart job (`nodes: "2:4"`, 1 rank per node, a checkpoint every 10 steps, 0.1 s per step,
every trained step recorded by rank 0) runs through the real `clusterctl` CLI; faults hit only the job's processes
or the node's link (see tests/integration/fault_series.py).
"""
from __future__ import annotations

import string

import pytest

from tests.integration import fault_series as fs
from tests.integration import recovery_harness as rh

# The goal is 15 s (bench/recovery --series measures it on a quiet box); what these tests enforce on a
# loaded 2-core CI box is fault_series.slow_recoveries' bound.


@pytest.fixture(scope="module")
def ltb(tmp_path_factory, testbed_slot):
    """4 CPU hosts of our own (faults touch nobody else). Subnets 10.220-229 are outside the other fixtures'."""
    letter = string.ascii_lowercase[testbed_slot]
    tb = rh.cpu_testbed(4, tmp_path_factory.mktemp("longrun-tb"), f"tbl{letter}",
                        [220 + (testbed_slot + k) % 10 for k in range(10)])
    yield tb
    tb.down()


@pytest.fixture
def job(ltb, tmp_path, request):
    runs: list[rh.Run] = []

    def make(**kw) -> rh.Run:
        name = "lr" + "".join(c for c in request.node.name.replace("test_", "") if c.isalnum())[-28:]
        run = rh.new_run(ltb, tmp_path, name, **kw)
        runs.append(run)
        return run

    yield make
    for h in ltb.hosts:            # undo faults, whatever happened
        if ltb.partitioned(h.name):
            ltb.heal(h.name)
    for run in runs:               # every supervisor stopped before the testbed goes down
        rh.stop_unless_done(run)
        for line in run.log[-6:]:
            print(line)


def test_five_faults_in_a_row_each_followed_by_training_within_15s(job):
    """The issue's series on `nodes: "2:4"`: a node killed, a node partitioned and healed, the rendezvous host
    killed (below MIN: the supervisor waits for nodes and the job comes back on every node that answers, the
    healed one re-admitted), a node partitioned with its job killed, a node killed. Every attempt made progress
    before the next fault, so no relaunch backs off. `status` names each failure's class and node, in order."""
    run = job(steps=160, nodes="2:4", nproc=1)    # the series ends near step 100
    run.launch()
    results = fs.run_series(run, fs.FIVE)
    st = run.wait_end(300)
    assert st["state"] == "SUCCEEDED", f"{st['state']}: {st['reason']}\n{run.events_text()}"
    assert [r["klass"] for r in results] == ["node_lost", "node_lost", "rendezvous_lost", "node_lost",
                                             "node_lost"], results
    assert all(not r["backoff"] for r in results), results       # each attempt made progress: relaunch at once
    assert st["attempt"] == 6
    ev = run.events()
    assert sum(e["kind"] == "progress" for e in ev) == 5, run.events_text()
    assert st["restarts"]["node_failures_used"] == 5 and st["restarts"]["max_node_failures"] == 10
    assert st["restarts"]["window"] == "24h"
    assert [(f["class"], f["node"]) for f in st["failures"]] == [(r["klass"], r["victim"]) for r in results], \
        st["failures"]
    assert all(f["message"] for f in st["failures"])
    assert results[0]["victim"] not in results[0]["nodes"] and results[1]["victim"] not in results[1]["nodes"]
    healed = results[1]["victim"]                                 # partitioned, given up, healed
    assert "waiting" in [e["kind"] for e in ev], run.events_text()
    assert healed in results[2]["nodes"], results[2]              # re-admitted at the next relaunch
    rh.check_steps(run)
    rh.check_clean(run, timeout=60)
    slow = fs.slow_recoveries(run, results)
    assert not slow, f"training resumed later than the bound after: {slow} (first attempt's start " \
                     f"{fs.first_start(run):.1f}s)\n{results}"
