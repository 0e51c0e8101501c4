import threading
import time

from clusterctl.errors import DeadlineExceeded
from clusterctl.transport.fanout import fan_out


def test_results_in_order_errors_are_values():
    def fn(h):
        if h == 2:
            raise ValueError("boom")
        return h * 10
    rs = fan_out([0, 1, 2, 3], fn, max_workers=2)
    assert [r.host for r in rs] == [0, 1, 2, 3]
    assert [r.value for r in rs] == [0, 10, None, 30]
    assert isinstance(rs[2].error, ValueError) and not rs[2].ok


def test_no_hosts_no_thread():
    before = threading.active_count()
    assert fan_out([], lambda h: 1 / 0, host_timeout=1) == []
    assert threading.active_count() == before


def test_bounded_pool():
    live, peak, lock = [0], [0], threading.Lock()

    def fn(h):
        with lock:
            live[0] += 1
            peak[0] = max(peak[0], live[0])
        time.sleep(0.02)
        with lock:
            live[0] -= 1
    fan_out(list(range(40)), fn, max_workers=5)
    assert peak[0] == 5


def test_stuck_host_costs_only_its_timeout_and_is_replaced_in_the_pool():
    gate = threading.Event()

    def fn(h):
        if h == 0:
            gate.wait(30)
        time.sleep(0.05)
        return h
    t = time.monotonic()
    rs = fan_out(list(range(6)), fn, max_workers=2, host_timeout=0.5)
    took = time.monotonic() - t
    gate.set()
    assert isinstance(rs[0].error, DeadlineExceeded)
    assert [r.value for r in rs[1:]] == [1, 2, 3, 4, 5]
    assert took < 1.5


def test_overall_deadline():
    rs = fan_out([1, 2], lambda h: time.sleep(5), deadline=0.3)
    assert all(isinstance(r.error, DeadlineExceeded) for r in rs)


def test_on_result_called_once_per_host():
    seen = []
    fan_out(list(range(7)), lambda h: h, on_result=lambda r: seen.append(r.host))
    assert sorted(seen) == list(range(7))
