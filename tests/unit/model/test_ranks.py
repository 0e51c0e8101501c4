"""The rank view's judge (issue 37): every kind of hang named by its rank, busy never stuck, stragglers, rates.
Scripted views: three nodes x two ranks, as bench/hang.py runs them."""
import json

import pytest

from clusterctl.model.ranks import (ArrivalLog, Collective, Rates, RankView, Stragglers, judge, slowdowns,
                                    stuck_culprit)

AR = {"pg": "0", "seq": 12, "op": "all_reduce"}


def view(rank, **kw):
    """A rank of a 3 x 2 job, as the node side writes it; node n<rank//2 + 1>."""
    d = {"v": 1, "n": 7, "rank": rank, "local_rank": rank % 2, "pid": 100 + rank, "step": 40, "step_age_s": 0.4,
         "colls": 80, "coll_age_s": 0.2, "in": None, "cpu_s": 12.0, "io": 1000, "rss": 2 << 30,
         "where": "train.py:40 step", "stack": "deadbeef", "state": "training",
         "peers": {str(100 + (rank ^ 1)): "S"}}
    answered = kw.pop("answered_age_s", 0.0)
    d.update(kw)
    return RankView.from_json(json.loads(json.dumps(d)), node=f"n{rank // 2 + 1}", answered_age_s=answered)


def views(*vs):
    out = {}
    for v in vs:
        out.setdefault(v.node, {})[v.rank] = v
    return out


def waiting(rank, for_s=21.0, coll=AR, **kw):
    return view(rank, state="waiting", step_age_s=for_s + 0.3, coll_age_s=for_s, where="torch/distributed/c10d.py:1 wait",
                **{"in": dict(coll, for_s=for_s)}, **kw)


def by_rank(states):
    return {s.rank: s for s in states}


def test_from_json_reads_the_node_sides_line_and_tolerates_junk():
    v = RankView.from_json({"rank": "3", "step": None, "in": {"pg": "0", "seq": 5, "op": "broadcast", "for_s": 2.5},
                            "arrivals": [[1, 10], ["x"], [2, 20]], "peers": {"7": "T", "x": "S"}, "state": "odd",
                            "cpu_s": "nan", "extra": 1}, node="a", answered_age_s=1.5)
    assert (v.rank, v.node, v.step, v.hint, v.cpu_s) == (3, "a", None, "starting", None)
    assert v.in_coll == Collective("0", 5, "broadcast", 2.5)
    assert v.arrivals == ((1, 10), (2, 20)) and v.peers == ((7, "T"),)
    with pytest.raises(ValueError):
        RankView.from_json({"step": 1})


def test_a_healthy_job_is_training_and_nobody_is_stuck():
    states = judge(views(*(view(r) for r in range(6))))
    assert [s.state for s in states] == ["training"] * 6
    assert stuck_culprit(states, stuck_timeout_s=20) is None


def test_a_sleeping_rank_is_stuck_while_its_peers_wait_in_all_reduce():
    sleeper = view(1, state="still", step_age_s=22.0, coll_age_s=22.0, where="train.py:55 <module> time.sleep")
    states = by_rank(judge(views(waiting(0), sleeper, *(waiting(r) for r in range(2, 6)))))
    s = states[1]
    assert (s.state, s.node, s.rank) == ("stuck", "n1", 1)
    assert s.peers_in == Collective("0", 12, "all_reduce", 21.0) and s.peers_for_s == 21.0
    assert "node n1 rank 1 stuck in train.py:55" in s.message() and "all_reduce #12 for 21s" in s.message()
    assert [states[r].state for r in (0, 2, 3, 4, 5)] == ["waiting"] * 5
    culprit = stuck_culprit(list(states.values()), stuck_timeout_s=20)
    assert (culprit.node, culprit.rank) == ("n1", 1)
    assert stuck_culprit(list(states.values()), stuck_timeout_s=30) is None      # not yet 30 s without progress
    assert stuck_culprit(list(states.values()), stuck_timeout_s=0) is None       # 0: off


def test_a_rank_blocked_reading_a_fifo_is_stuck():
    fifo = view(3, state="still", step_age_s=9.0, coll_age_s=9.0, where="train.py:61 <module> read")
    s = by_rank(judge(views(*(waiting(r, 8.0) for r in (0, 1, 2, 4, 5)), fifo)))[3]
    assert (s.state, s.node) == ("stuck", "n2") and "no CPU, no I/O" in s.why


def test_a_sigstopped_rank_is_stuck_by_its_proc_state_or_its_silence():
    # its node's other rank sees it in state T at once; its own file is stale (still says training)
    stopped = view(1, step_age_s=0.5, coll_age_s=0.5, answered_age_s=1.0)
    sibling = waiting(0, peers={"101": "T"})
    s = by_rank(judge(views(sibling, stopped, *(waiting(r) for r in range(2, 6)))))[1]
    assert s.state == "stuck" and "SIGSTOP" in s.why
    assert s.progress_age_s == 1.5       # the file's age plus the time it has not answered
    # alone on its node: not answering for 3 s is enough
    lone = view(1, step_age_s=0.5, coll_age_s=0.5, answered_age_s=4.0, peers={})
    assert by_rank(judge(views(waiting(0, peers={}), lone, *(waiting(r) for r in range(2, 6)))))[1].state == "stuck"
    # not answering for 2 s: not yet
    slow = view(1, answered_age_s=2.0, peers={})
    assert by_rank(judge(views(waiting(0, peers={}), slow, *(waiting(r) for r in range(2, 6)))))[1].state == "training"


def test_a_rank_in_a_different_collective_is_named_with_both():
    other = waiting(5, coll={"pg": "0", "seq": 12, "op": "broadcast"}, for_s=15.0)
    states = by_rank(judge(views(*(waiting(r) for r in range(5)), other)))
    s = states[5]
    assert s.state == "stuck" and s.mismatch and s.in_coll.op == "broadcast" and s.peers_in.op == "all_reduce"
    assert "mismatched" in s.message() and "broadcast #12" in s.message()
    assert all(states[r].state == "waiting" for r in range(5))
    assert stuck_culprit(list(states.values()), stuck_timeout_s=20) is None   # its last progress: 15 s ago
    assert stuck_culprit(list(states.values()), stuck_timeout_s=15).rank == 5


def test_a_rank_that_skipped_a_collective_waits_at_another_sequence_number():
    ahead = waiting(2, coll={"pg": "0", "seq": 13, "op": "all_reduce"}, for_s=21.0)
    s = by_rank(judge(views(*(waiting(r) for r in (0, 1, 3, 4, 5)), ahead)))[2]
    assert s.state == "stuck" and s.mismatch and s.in_coll.seq == 13 and s.peers_in.seq == 12
    assert (s.node, s.rank) == ("n2", 2)


def test_a_slow_rank_still_computing_its_backward_pass_trails_its_peers_without_a_mismatch():
    """DDP enqueues a step's buckets as the backward pass goes: a slow rank's newest all_reduce trails its peers'
    for seconds while it computes (a big model's long backward). Not stuck; the same without CPU is."""
    trailing = waiting(2, coll={"pg": "0", "seq": 11, "op": "all_reduce"}, for_s=4.0)
    vs = views(*(waiting(r, 4.0) for r in (0, 1, 3, 4, 5)), trailing)
    assert by_rank(judge(vs, computing={("n2", 2)}))[2].state == "waiting"
    assert by_rank(judge(vs))[2].state == "stuck"
    # most ranks slow, one fast: the fast one leads, waiting for them
    leading = waiting(2, coll={"pg": "0", "seq": 13, "op": "all_reduce"}, for_s=4.0)
    vs = views(*(waiting(r, 4.0) for r in (0, 1, 3, 4, 5)), leading)
    slow = {(v.node, v.rank) for nv in vs.values() for v in nv.values() if v.rank != 2}
    assert {s.state for s in judge(vs, computing=slow)} == {"waiting"}


def test_ranks_passing_through_different_collectives_for_a_moment_are_not_a_mismatch():
    ahead = waiting(2, coll={"pg": "0", "seq": 13, "op": "all_reduce"}, for_s=0.5)
    assert by_rank(judge(views(*(waiting(r, 0.6) for r in (0, 1, 3, 4, 5)), ahead)))[2].state == "waiting"


def test_a_rank_computing_silently_is_busy_never_stuck():
    busy = view(0, state="busy", step_age_s=200.0, coll_age_s=200.0, cpu_s=400.0, where="train.py:70 evaluate")
    states = by_rank(judge(views(busy, *(waiting(r, 199.0) for r in range(1, 6)))))
    assert states[0].state == "busy"
    assert stuck_culprit(list(states.values()), stuck_timeout_s=20) is None


def test_a_rank_holding_the_gil_is_busy_when_its_node_sees_it_running():
    hog = view(1, answered_age_s=30.0, step_age_s=1.0, coll_age_s=1.0)
    states = by_rank(judge(views(waiting(0, peers={"101": "R"}), hog, *(waiting(r) for r in range(2, 6)))))
    assert states[1].state == "busy" and stuck_culprit(list(states.values()), stuck_timeout_s=20) is None


def test_a_rank_writing_a_slow_checkpoint_is_busy():
    writer = view(4, state="busy", step_age_s=90.0, coll_age_s=90.0, io=10 << 30, where="torch/serialization.py:1 save")
    states = by_rank(judge(views(*(waiting(r, 89.0) for r in (0, 1, 2, 3, 5)), writer)))
    assert states[4].state == "busy" and stuck_culprit(list(states.values()), stuck_timeout_s=20) is None


def test_a_rank_waiting_for_its_dataloader_is_busy_on_the_data_pipeline():
    loader = view(1, state="still", step_age_s=30.0, coll_age_s=30.0,
                  where="/usr/lib/python3/dist-packages/torch/utils/data/dataloader.py:1 _try_get_data")
    s = by_rank(judge(views(waiting(0, 29.0), loader, *(waiting(r, 29.0) for r in range(2, 6)))))[1]
    assert s.state == "busy" and s.data_wait


def test_still_ranks_nobody_waits_for_are_waiting_not_stuck():
    states = judge(views(*(view(r, state="still", step_age_s=50.0, coll_age_s=50.0) for r in range(6))))
    assert {s.state for s in states} == {"waiting"}


def test_gone_ranks_from_the_node_its_peers_or_a_missing_file():
    dead = view(3, step_age_s=5.0)
    sibling = view(2, peers={"103": "Z"})
    states = by_rank(judge(views(view(0), view(1), sibling, dead, view(4), view(5)), gone_nodes={"n3"}, world=7))
    assert states[3].state == "gone" and states[4].state == "gone" and states[5].state == "gone"
    assert states[6].state == "gone" and states[6].why == "no view of it"
    assert states[0].state == "training"


def test_starting_ranks():
    s = judge(views(view(0, state="starting", step=None)))[0]
    assert s.state == "starting" and s.step is None


def arrivals(rank, late_s, period_s=0.2, n=32, start=10 ** 12):
    return [[seq, start + int((seq * period_s + late_s) * 1e9)] for seq in range(n)]


def test_slowdowns_name_a_rank_at_half_speed():
    # the slow rank computes 0.2 s where the others take 0.1 s: every collective waits 0.1 s for it
    vs = views(*(view(r, arrivals=arrivals(r, 0.1 if r == 3 else 0.0)) for r in range(6)))
    s = slowdowns(vs)
    assert s[("n2", 3)] == pytest.approx(2.0, rel=0.01)
    assert all(s[(v.node, v.rank)] == pytest.approx(1.0) for nv in vs.values() for v in nv.values() if v.rank != 3)


def test_slowdowns_over_looks_whose_windows_do_not_overlap():
    """Each rank refreshes its last 32 arrivals on its own clock: two ranks' lists may share no collective. The
    log of earlier looks finds the collectives they share."""
    def shifted(r, lo):
        return [a for a in arrivals(r, 0.1 if r == 3 else 0.0, n=200) if lo <= a[0] < lo + 32]

    log = ArrivalLog()
    first = views(*(view(r, arrivals=shifted(r, 0 if r % 2 else 40)) for r in range(6)))
    assert slowdowns(first) == {} and slowdowns(first, log) == {}
    second = views(*(view(r, arrivals=shifted(r, 40 if r % 2 else 0)) for r in range(6)))
    s = slowdowns(second, log)
    assert s[("n2", 3)] == pytest.approx(2.0, rel=0.01) and s[("n1", 0)] == pytest.approx(1.0)


def test_slowdowns_need_enough_common_collectives():
    assert slowdowns(views(*(view(r, arrivals=arrivals(r, 0.0, n=10)) for r in range(6)))) == {}
    assert slowdowns(views(view(0, arrivals=arrivals(0, 0.0)))) == {}


def test_a_straggler_is_named_after_60_s_and_cleared_after_60_s_recovered():
    t = Stragglers()
    key = ("n2", 3)
    assert t.update({key: 2.0, ("n1", 0): 1.0}, 0.0) == ([], [])
    assert t.update({key: 1.9}, 59.0) == ([], [])
    named, _ = t.update({key: 2.1}, 60.0)
    assert [(s.node, s.rank, s.slowdown) for s in named] == [("n2", 3, 2.1)]
    assert t.update({key: 2.0}, 61.0) == ([], [])           # named once
    assert t.listed()[0].as_json() == {"node": "n2", "rank": 3, "slowdown": 2.0}
    assert t.update({key: 1.3}, 62.0) == ([], [])           # between the thresholds: still a straggler
    assert t.update({key: 1.1}, 70.0) == ([], [])
    assert t.update({key: 1.1}, 129.0) == ([], [])
    _, recovered = t.update({key: 1.0}, 130.0)
    assert [s.rank for s in recovered] == [3] and t.listed() == []


def test_a_short_slow_spell_is_no_straggler():
    t = Stragglers()
    t.update({("n1", 0): 2.0}, 0.0)
    t.update({("n1", 0): 1.0}, 30.0)
    assert t.update({("n1", 0): 2.0}, 61.0) == ([], [])     # the clock started over at 61 s
    assert t.listed() == []


def test_rates_step_time_and_cpu_percent():
    r = Rates()
    r.update(views(view(0, step=10, cpu_s=5.0)), 100.0)
    r.update(views(view(0, step=10, cpu_s=5.5)), 101.0)
    r.update(views(view(0, step=14, cpu_s=6.5)), 102.0)
    assert r.step_time[("n1", 0)] == pytest.approx(0.5) and r.cpu_pct[("n1", 0)] == pytest.approx(100.0)
    r.update({}, 103.0)
    assert r.step_time == {} and r.cpu_pct == {}


def test_a_lone_rank_holding_the_gil_is_busy_by_what_its_node_reads_of_it_from_outside():
    """One rank per node: no local peer sees its /proc state. Its monitor cannot write (the main thread holds the
    GIL in one long C call), but the watch reads its state and CPU from outside ("os"): running, or its CPU time
    advancing between looks -> busy, never stuck (it was stuck -> a hang after 20 s before)."""
    peers = [waiting(r, 30.0, peers={}) for r in (1, 2)]
    r = Rates()
    for t, ticks in ((0, 100), (1, 190), (2, 285)):
        hog = view(0, answered_age_s=30.0 + t, step_age_s=1.0, coll_age_s=1.0, peers={}, os=f"S {ticks}", hz=100)
        r.update(views(hog, *peers), 100.0 + t)
    assert r.cpu_pct[("n1", 0)] == pytest.approx(95.0)
    computing = {k for k, pct in r.cpu_pct.items() if pct >= 50}
    states = by_rank(judge(views(hog, *peers), computing=computing))
    assert states[0].state == "busy" and stuck_culprit(list(states.values()), stuck_timeout_s=20) is None
    running = view(0, answered_age_s=30.0, step_age_s=1.0, coll_age_s=1.0, peers={}, os="R 100", hz=100)
    assert by_rank(judge(views(running, *peers)))[0].state == "busy"


def test_a_lone_rank_silent_with_no_cpu_or_stopped_is_stuck_by_what_its_node_reads_of_it():
    peers = [waiting(r, 30.0, peers={}) for r in (1, 2)]
    r = Rates()
    for t in range(3):       # its CPU does not move: blocked holding the GIL (or a C call that waits)
        blocked = view(0, answered_age_s=30.0 + t, step_age_s=1.0, coll_age_s=1.0, peers={}, os="S 100", hz=100)
        r.update(views(blocked, *peers), 100.0 + t)
    computing = {k for k, pct in r.cpu_pct.items() if pct >= 50}
    s = by_rank(judge(views(blocked, *peers), computing=computing))[0]
    assert s.state == "stuck" and "not answering" in s.why
    stopped = view(0, answered_age_s=30.0, step_age_s=1.0, coll_age_s=1.0, peers={}, os="T 100", hz=100)
    s = by_rank(judge(views(stopped, *peers)))[0]
    assert s.state == "stuck" and s.why == "stopped (SIGSTOP)"


def test_the_nodes_look_at_a_process_reads_state_and_cpu_seconds_and_tolerates_junk():
    assert (view(0, os="R 250", hz=100).os_state, view(0, os="R 250", hz=100).os_cpu_s) == ("R", 2.5)
    assert view(0, os="R 250").os_cpu_s == 2.5           # no hz: Linux's USER_HZ, 100
    for junk in ("R", "RR 1", "R x", 5, None, "R 1 2"):
        assert (view(0, os=junk).os_state, view(0, os=junk).os_cpu_s) == (None, None)
