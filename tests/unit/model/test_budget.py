"""Restart budgets per window and the backoff reset: the pure functions of clusterctl.model.budget."""
import pytest

from clusterctl.model import budget
from clusterctl.model.budget import INFRA, USER, Charge


@pytest.mark.parametrize("text,seconds", [("24h", 86400), ("90m", 5400), ("30s", 30), ("7d", 604800),
                                          ("1.5h", 5400), ("45", 45), (3600, 3600), ("progress", None)])
def test_window_seconds(text, seconds):
    assert budget.window_seconds(text) == seconds


@pytest.mark.parametrize("bad", ["", "24x", "h", "-1h", "0", 0, True, "forever"])
def test_window_seconds_refuses(bad):
    with pytest.raises(ValueError):
        budget.window_seconds(bad)


def test_describe():
    assert budget.describe(86400) == "within 24h"
    assert budget.describe(7 * 86400) == "within 7d"
    assert budget.describe(3 * 3600) == "within 3h"
    assert budget.describe(90) == "within 90s"
    assert budget.describe(None) == "since the last progress"


def test_used_counts_only_failures_within_the_window():
    h = [Charge(0, INFRA), Charge(10, INFRA), Charge(20, USER), Charge(95, INFRA)]
    assert budget.used(h, INFRA, now=100, window_s=1000) == 3
    assert budget.used(h, INFRA, now=100, window_s=50) == 1          # 0 and 10 have aged out
    assert budget.used(h, USER, now=100, window_s=50) == 0
    assert budget.used(h, USER, now=100, window_s=81) == 1


def test_used_since_the_last_progress():
    h = [Charge(0, INFRA), Charge(1, INFRA), Charge(2, INFRA, progress=True), Charge(3, INFRA), Charge(4, USER)]
    assert budget.used(h, INFRA, now=5, window_s=None) == 2    # the one after progress and the next
    assert budget.used(h, USER, now=5, window_s=None) == 1


def test_streak_is_reset_by_progress_of_any_kind():
    h = [Charge(0, USER), Charge(1, USER), Charge(2, INFRA, progress=True), Charge(3, USER)]
    assert budget.streak(h, USER) == 1
    assert budget.streak(h[:2], USER) == 2


def test_backoff_first_infrastructure_failure_at_once_then_doubling():
    kw = dict(first_s=2, max_s=30)
    assert [budget.backoff(INFRA, n, **kw) for n in range(1, 7)] == [0, 2, 4, 8, 16, 30]
    assert [budget.backoff(USER, n, **kw) for n in range(1, 6)] == [2, 4, 8, 16, 30]


class _E:
    def __init__(self, kind, time=0.0, klass=None):
        self.kind, self.time, self.klass = kind, time, klass


def test_history_from_events_starts_after_the_last_resume():
    ev = [_E("budget", 1, USER), _E("resume", 2), _E("progress", 3), _E("budget", 3, INFRA),
          _E("verdict", 4, "node_lost"), _E("budget", 5, INFRA)]
    assert budget.history(ev) == [Charge(3, INFRA, True), Charge(5, INFRA, False)]


def test_one_duration_grammar_for_the_job_file_and_the_command_line():
    """Issue 25: `restarts.window: 1w` was refused while `status --since 1w` worked (two grammars)."""
    from clusterctl.views.history import parse_since

    for text, s in (("1w", 7 * 86400), ("1.5h", 5400), ("45s", 45), ("30", 30), ("7d", 7 * 86400)):
        assert budget.window_seconds(text) == s
        assert parse_since(text, now=1_000_000.0) == 1_000_000.0 - s
