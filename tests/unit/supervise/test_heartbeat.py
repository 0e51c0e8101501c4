"""The silence limit of a node's watch adapts to the node's own jitter (phi-accrual spirit), within bounds."""
import random

from clusterctl.supervise.heartbeat import CAP, MIN_SAMPLES, Arrivals


def feed(a: Arrivals, gaps, t=0.0) -> float:
    for g in gaps:
        t += g
        a.arrived(t)
    return t


def test_a_steady_watch_keeps_the_configured_limit():
    a = Arrivals(2.0)
    rng = random.Random(1)
    feed(a, [0.5 + rng.uniform(-0.03, 0.08) for _ in range(300)])
    assert a.limit() == 2.0


def test_a_steady_watch_at_a_line_a_second_keeps_the_configured_limit():
    """The watch's heartbeat (a line a second, runtimes.WATCH) with some jitter, and with a line sent at once on a
    change (a 0.5 s gap) every 20 s or so: judged by the configured 2 s, as at 2 lines a second (a sigma floor of
    0.2 s gave 2.15 s)."""
    a = Arrivals(2.0)
    rng = random.Random(1)
    feed(a, [(0.5 if rng.random() < 0.05 else 1.0) + rng.uniform(-0.03, 0.08) for _ in range(300)])
    assert a.limit() == 2.0
    b = Arrivals(2.0)
    feed(b, [1.0 + rng.uniform(-0.03, 0.08) for _ in range(300)])
    assert b.limit() == 2.0


def test_too_few_samples_keep_the_configured_limit():
    a = Arrivals(2.0)
    feed(a, [0.5] * (MIN_SAMPLES - 1) + [3.0])
    assert a.limit() == 2.0


def test_a_node_gets_a_limit_from_its_own_gaps_after_10_s_of_lines():
    """At a line a second the fit starts after 10 lines, 10 s as when the watch printed twice a second (20 lines):
    a node that stalled 2.5 s in its first seconds (64 agents importing torch on 2 cores) is not held to 2 s."""
    a = Arrivals(2.0)
    feed(a, [1.0] * 6 + [2.5] + [1.0] * 4)        # 11 lines: 10 gaps
    assert len(a.gaps) == MIN_SAMPLES == 10 and a.limit() >= 1.25 * 2.5


def test_a_stalling_watch_gets_a_limit_above_its_longest_stalls_but_capped():
    """SIGSTOP/SIGCONT of the node's sshd: stalls of 0.5-3 s between 1-3 s of regular lines (and the burst of
    buffered lines after each stall)."""
    a = Arrivals(2.0)
    rng = random.Random(16)
    gaps = []
    for _ in range(60):
        gaps += [0.5] * rng.randint(2, 6) + [rng.uniform(0.5, 3.0), 0.001, 0.001]
    feed(a, gaps)
    assert 1.25 * max(a.gaps) <= a.limit() <= CAP * 2.0
    b = Arrivals(2.0)
    feed(b, [0.5, 30.0] * 100)                     # wild: capped, a partitioned node is still found
    assert b.limit() == CAP * 2.0


def test_a_new_watch_does_not_count_the_wait_for_its_first_line():
    a = Arrivals(2.0)
    t = feed(a, [0.5] * 50)
    a.restart()
    a.arrived(t + 60)
    assert max(a.gaps) == 0.5 and a.limit() == 2.0
