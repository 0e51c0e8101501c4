"""The detached supervisor never runs in accept-new mode (issue 11 item 1): its reconnects, for the life of the
job, must refuse a host key that was not recorded before it started."""
from __future__ import annotations

from clusterctl.config.spec import loads_job
from clusterctl.supervise import controller


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
        assert argv[1:3] == ["-m", "clusterctl.supervise"] and "job-1" in argv
        assert not any("accept-new" in a for a in argv), argv


def test_supervisor_log_lines_are_redacted(tmp_path, monkeypatch):
    """What the supervisor echoes goes to supervisor.log: secret values are masked there as in the DB."""
    from clusterctl.store import paths
    from clusterctl.store.state import JobState, Store
    from clusterctl.transport import ConnectOptions

    root = paths.ensure_state_dir(tmp_path / "state")
    store = Store(paths.db_path(root))
    job_id = store.create_job("j", "{}", None, "/j.yaml")

    class Ops:
        secrets = {"TOKEN": "s3cr3t-value"}
        sink = None
        spec = loads_job("name: j\nnodes: 1\nnproc_per_node: 1\nscript: t.py\n")   # no notify targets

        def wait_for_change(self, timeout):
            pass

        def sleep_unless_stopped(self, seconds):
            pass

        def close(self):
            pass

    class Sup:
        def __init__(self, job_id, store, ops, policy, nodes, wait, sleep, on_event, job_dir=None):
            self.on_event = on_event

        def run(self, adopt_attempt=None, adopt_note=""):
            self.on_event("node n1 failed: Traceback ... token=s3cr3t-value")
            return JobState.SUCCEEDED

    monkeypatch.setattr(controller, "build_ops", lambda root, store, job_id, options: (Ops(), None, ["n1"]))
    monkeypatch.setattr(controller, "Supervisor", Sup)
    lines = []
    assert controller.supervise(root, job_id, ConnectOptions(), echo=lines.append) == JobState.SUCCEEDED
    assert lines == ["clusterctl: node n1 failed: Traceback ... token=***"]


def test_a_reused_supervisor_pid_does_not_block_a_new_supervisor(tmp_path):
    """After a controller reboot the recorded supervisor pid may belong to any process (here: this test's own,
    alive but not a supervisor): the new supervisor's claim must win, as `resume` already believes."""
    import os

    from clusterctl.store.state import Store

    store = Store(tmp_path / "state.db")
    job_id = store.create_job("demo", "{}", None, None)
    assert store.claim_supervisor(job_id, os.getpid())                 # the old supervisor's pid, now reused
    assert not controller.is_live_supervisor(os.getpid(), job_id)      # alive, but not a supervisor of the job
    assert store.claim_supervisor(job_id, 999_999_001,
                                  is_live=lambda pid: controller.is_live_supervisor(pid, job_id))
    assert store.get_job(job_id).supervisor_pid == 999_999_001
    store.close()
