"""The detached supervisor never runs in accept-new mode (issue 11 item 1): its reconnects, for the life of the
job, must refuse a host key that was not recorded before it started."""
from __future__ import annotations

from clusterctl import controller


class _Proc:
    pid = 424242


def test_supervisor_never_gets_accept_new(tmp_path, monkeypatch):
    seen = []
    monkeypatch.setattr(controller.subprocess, "Popen", lambda argv, **kw: seen.append(argv) or _Proc())
    for accept_new in (False, True):
        for adopt in (False, True):
            controller.spawn_supervisor(tmp_path, "job-1", accept_new=accept_new, adopt=adopt)
    assert len(seen) == 4
    for argv in seen:
        assert "_supervise" in argv and "job-1" in argv
        assert not any("accept-new" in a for a in argv), argv
