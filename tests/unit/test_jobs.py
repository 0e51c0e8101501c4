"""The job use cases (clusterctl/usecases/: lifecycle, views, context) over a temporary store, fake transports and a fake spawn: what is
checked before anything starts, what is recorded, what is started, and what each outcome says."""
from __future__ import annotations

import threading
import time

import pytest

from clusterctl.errors import ClusterctlError, ConnectError, HostKeyError, InputError, UserError  # noqa: E402
from clusterctl.model import record
from clusterctl.store.state import JobActive, JobState, Store  # noqa: E402
from clusterctl.transport import ConnectOptions  # noqa: E402
from clusterctl.usecases import base, context, lifecycle
from clusterctl.usecases import views as uviews
from tests.fakes.checks import FakeHost, FakeTransport, sections_for  # noqa: E402

INVENTORY = """\
all:
  vars: {clusterctl_runtime: podman, clusterctl_gpus: 0}
  hosts:
    n1: {ansible_host: 10.77.0.11}
    n2: {ansible_host: 10.77.0.12}
    n3: {ansible_host: 10.77.0.13}
"""
JOB = """\
name: j
nodes: "2:2"
nproc_per_node: 1
script: train.py
"""


class World:
    """Three fake hosts, each answering the probe script from healthy canned sections; records every connect."""

    def __init__(self):
        self.fakes = {f"n{i}": FakeHost(sections_for(f"10.77.0.1{i}", f"n{i}", runtime="podman", gpus=0))
                      for i in (1, 2, 3)}
        self.connects: list[str] = []
        self.options: list[ConnectOptions] = []
        self.lock = threading.Lock()
        self.shared = {"nonce": "x", "peers": 1}

    def connect(self, host, options):
        with self.lock:
            self.connects.append(host.name)
            self.options.append(options)
        f = self.fakes[host.name]
        if f.connect_error is not None:
            raise f.connect_error
        return FakeTransport(host, f, self.shared, time.time)


class Spawn:
    def __init__(self):
        self.calls: list[tuple] = []

    def __call__(self, root, job_id, *, accept_new, adopt=False):
        self.calls.append((job_id, accept_new, adopt))
        return 4242


@pytest.fixture
def env(tmp_path):
    (tmp_path / "inventory.yaml").write_text(INVENTORY)
    (tmp_path / "job.yaml").write_text(JOB)
    (tmp_path / "train.py").write_text("print('hi')\n")
    ws = base.Workspace(tmp_path, Store(tmp_path / "state.db"))
    return ws, World(), Spawn()


def request(ws, **kw):
    return lifecycle.LaunchRequest(str(ws.root / "job.yaml"), str(ws.root / "inventory.yaml"), **kw)


def launch(ws, world, spawn, **kw):
    return lifecycle.launch(ws, request(ws, **kw), connect=world.connect, spawn=spawn)


def test_an_allocation_makes_every_host_the_jobs_and_those_beyond_max_spares(env, monkeypatch):
    """-i slurm: the allocation is the job's (its extra nodes are the spares a relaunch uses); an inventory file's
    hosts beyond nodes' MAX are not the job's unless the job names them (``hosts:``)."""
    import dataclasses

    from clusterctl.config import inventory

    ws, _, _ = env
    job, inv = str(ws.root / "job.yaml"), str(ws.root / "inventory.yaml")
    assert [h.name for h in context.load_context(job, inv).hosts] == ["n1", "n2"]
    real = inventory.load
    monkeypatch.setattr(inventory, "load", lambda path, **kw: dataclasses.replace(real(path, **kw), allocation=True))
    ctx = context.load_context(job, inv)
    assert [h.name for h in ctx.hosts] == ["n1", "n2", "n3"] and ctx.spec.max_nodes == 2


# ------------------------------------------------------------------------------------------- launch
def test_launch_checks_records_and_spawns_once(env):
    ws, world, spawn = env
    progress = []
    out = lifecycle.launch(ws, request(ws), connect=world.connect, spawn=spawn,
                      on_progress=lambda *a: progress.append(a))
    assert isinstance(out, lifecycle.Launched), getattr(out, "report", None) and out.report.failures()
    assert (out.name, out.supervisor_pid, out.nodes, out.spares, out.excluded) == ("j", 4242, ("n1", "n2"), (), ())
    assert spawn.calls == [(out.job_id, False, False)]
    assert sorted(world.connects) == ["n1", "n2"]            # the quick preflight: one connection per host
    assert progress and progress[-1][0] == progress[-1][1]
    job = ws.store.get_job(out.job_id)
    assert job.state == JobState.PENDING
    rec = record.from_job(job)
    assert rec.host_names == ["n1", "n2"] and rec.source == str(ws.root / "job.yaml")
    assert rec.interfaces == {"n1": "eth0", "n2": "eth0"}    # what preflight found, for the supervisor


def test_launch_and_dry_run_read_the_job_file_once_and_check_key_files_once(env, monkeypatch):
    """Issue 25: the launch path read the job YAML twice (the schema, then the secret variables' lines) and the
    key files are checked once per command."""
    from clusterctl.config import yamlfile
    from clusterctl.transport import ssh

    ws, world, spawn = env
    reads, checks = [], []
    real_read, real_check = yamlfile.load_yaml_with_lines, ssh.check_key_files
    monkeypatch.setattr(yamlfile, "load_yaml_with_lines", lambda path: reads.append(path) or real_read(path))
    monkeypatch.setattr(ssh, "check_key_files", lambda hosts: checks.append(len(hosts)) or real_check(hosts))
    assert isinstance(launch(ws, world, spawn), lifecycle.Launched)
    assert reads == [str(ws.root / "job.yaml")] and checks == [2]
    reads.clear()
    lifecycle.dry_run(ws, request(ws, overrides={"name": "k"}))
    assert reads == [str(ws.root / "job.yaml")]


def test_launch_records_how_each_gpu_hosts_containers_get_gpus(env):
    ws, world, spawn = env
    (ws.root / "inventory.yaml").write_text(INVENTORY.replace("clusterctl_gpus: 0", "clusterctl_gpus: 8"))
    for i in (1, 2, 3):
        world.fakes[f"n{i}"] = FakeHost(sections_for(f"10.77.0.1{i}", f"n{i}", runtime="podman", gpus=8))
    out = launch(ws, world, spawn)
    assert isinstance(out, lifecycle.Launched), getattr(out, "report", None) and out.report.failures()
    rec = record.from_job(ws.store.get_job(out.job_id))
    assert rec.gpu_flags == {"n1": "cdi", "n2": "cdi"}      # preflight's nvidia_toolkit choice, for the plan


def test_a_failed_preflight_records_and_starts_nothing(env):
    ws, world, spawn = env
    world.fakes["n2"].sections["ss"] = ("LISTEN 0 128 0.0.0.0:29400 0.0.0.0:*", 0)   # the rendezvous port is taken
    out = launch(ws, world, spawn)
    assert isinstance(out, lifecycle.PreflightFailed)
    assert [(where, c.id) for where, c in out.report.failures()] == [("n2", "ports")]
    assert ws.store.list_jobs() == [] and spawn.calls == []


def test_an_active_job_of_that_name_stops_the_launch_before_any_connection(env):
    ws, world, spawn = env
    first = launch(ws, world, spawn)
    world.connects.clear()
    with pytest.raises(JobActive, match=first.job_id):
        launch(ws, world, spawn)
    assert world.connects == [] and len(spawn.calls) == 1
    ws.store.set_state(first.job_id, JobState.STOPPED, "stopped by user")
    assert isinstance(launch(ws, world, spawn), lifecycle.Launched)   # a finished one does not


def test_a_missing_secret_is_an_input_error_before_any_connection(env):
    ws, world, spawn = env
    (ws.root / "job.yaml").write_text(JOB + "secret_env: [WANDB_API_KEY]\n")
    with pytest.raises(InputError, match="WANDB_API_KEY is not set") as e:
        launch(ws, world, spawn)
    assert e.value.exit_code == 2 and e.value.line == 5
    assert world.connects == [] and ws.store.list_jobs() == []
    assert isinstance(launch(ws, world, spawn, environ={"WANDB_API_KEY": "s3cret"}), lifecycle.Launched)


def test_skip_preflight_still_refuses_an_unknown_host_key_but_not_an_unreachable_host(env):
    ws, world, spawn = env
    world.fakes["n2"].connect_error = HostKeyError("n2", "unknown host key for 10.77.0.12")
    with pytest.raises(ClusterctlError, match="cannot connect safely"):
        launch(ws, world, spawn, skip_preflight=True)
    assert ws.store.list_jobs() == [] and spawn.calls == []
    world.fakes["n2"].connect_error = ConnectError("n2", "connection refused")   # may come back: the supervisor waits
    world.options.clear()
    out = launch(ws, world, spawn, skip_preflight=True, options=ConnectOptions(accept_new_host_keys=True))
    assert isinstance(out, lifecycle.Launched) and record.from_job(ws.store.get_job(out.job_id)).interfaces == {}
    assert spawn.calls == [(out.job_id, True, False)]
    assert world.options and all(o.accept_new_host_keys for o in world.options)


def test_cordoned_hosts_are_left_out_and_too_few_is_a_user_error(env):
    ws, world, spawn = env
    (ws.root / "job.yaml").write_text(JOB.replace('"2:2"', '"2:3"'))
    ws.store.cordon("n1", "ECC errors")
    out = launch(ws, world, spawn)
    assert (out.nodes, out.excluded) == (("n2", "n3"), (("n1", "ECC errors"),))
    assert record.from_job(ws.store.get_job(out.job_id)).host_names == ["n1", "n2", "n3"]
    ws.store.set_state(out.job_id, JobState.STOPPED)
    ws.store.cordon("n2", "disk")
    with pytest.raises(UserError, match=r"at least 2 node\(s\) but only 1 remain"):
        launch(ws, world, spawn)


def test_dry_run_connects_to_nothing_and_needs_no_secret(env):
    ws, world, spawn = env
    (ws.root / "job.yaml").write_text(JOB + "secret_env: [WANDB_API_KEY]\n")
    dry = lifecycle.dry_run(ws, request(ws))
    plan = dry.plan
    assert plan.job_id == "j-DRYRUN" and [n.host for n in plan.nodes] == ["n1", "n2"]
    assert world.connects == [] and ws.store.list_jobs() == []
    assert [p.key for p in dry.problems] == ["secret_env[0]"] and "WANDB_API_KEY" in str(dry.problems[0])


# ------------------------------------------------------------------------------------------- stop / status
def test_stop_of_a_job_that_never_started_marks_it_stopped(env):
    ws, world, spawn = env
    out = launch(ws, world, spawn)
    stopped = lifecycle.stop(ws, "j", ConnectOptions(), grace_s=0, connect=world.connect)
    assert (stopped.job_id, stopped.state, dict(stopped.errors)) == (out.job_id, JobState.STOPPED, {})
    assert [e.kind for e in ws.store.events(out.job_id)][-1] == "stop"


def test_status_of_a_finished_job_asks_no_node(env):
    ws, world, spawn = env
    out = launch(ws, world, spawn)
    ws.store.set_state(out.job_id, JobState.STOPPED, "stopped by user")
    world.connects.clear()
    view = uviews.status(ws, "j", ConnectOptions(), connect=world.connect)
    assert (view["job_id"], view["state"], view["reason"]) == (out.job_id, "STOPPED", "stopped by user")
    assert view["restarts"]["max_failures"] == 3 and world.connects == []


def test_watch_status_shows_each_view_until_the_job_ends(env):
    """`status JOB --watch`: the use case loops (cli only renders); it ends with the job, whatever the view."""
    ws, world, spawn = env
    out = launch(ws, world, spawn)
    ws.store.set_state(out.job_id, JobState.STARTING)
    ws.store.set_state(out.job_id, JobState.RUNNING)
    seen, naps = [], []

    def sleep(s):                     # the job ends while the watcher waits
        naps.append(s)
        if len(naps) == 2:
            ws.store.set_state(out.job_id, JobState.FAILED, "boom")

    last = uviews.watch_status(ws, "j", ConnectOptions(), lambda v: seen.append(v["state"]), interval_s=0.5,
                             sleep=sleep)
    assert seen == ["RUNNING", "RUNNING", "FAILED"] and naps == [0.5, 0.5] and last["reason"] == "boom"


# ------------------------------------------------------------------------------------------- resume
def test_resume_of_a_succeeded_job_relaunches_nothing(env):
    ws, world, spawn = env
    out = launch(ws, world, spawn)
    for s in (JobState.STARTING, JobState.RUNNING, JobState.SUCCEEDED):
        ws.store.set_state(out.job_id, s)
    r = lifecycle.resume(ws, lifecycle.ResumeRequest("j"), connect=world.connect, spawn=spawn)
    assert (r.action, r.job_id, r.name, r.pid) == ("succeeded", out.job_id, "j", None)
    assert len(spawn.calls) == 1


def test_resume_refuses_an_unknown_exclude_and_too_few_uncordoned_hosts(env):
    ws, world, spawn = env
    out = launch(ws, world, spawn)
    ws.store.set_state(out.job_id, JobState.STOPPED)
    with pytest.raises(UserError, match="--exclude: n9 not among the job's hosts n1, n2"):
        lifecycle.resume(ws, lifecycle.ResumeRequest("j", exclude=("n9",)), connect=world.connect, spawn=spawn)
    ws.store.cordon("n2", "flaky NIC")
    with pytest.raises(UserError, match=r"cordoned host\(s\) n2 \(flaky NIC\)"):
        lifecycle.resume(ws, lifecycle.ResumeRequest("j"), connect=world.connect, spawn=spawn)
    assert len(spawn.calls) == 1


def test_resume_of_a_stopped_job_relaunches_from_the_start(env):
    ws, world, spawn = env
    out = launch(ws, world, spawn)
    ws.store.set_state(out.job_id, JobState.STOPPED, "stopped by user")
    waits = []
    r = lifecycle.resume(ws, lifecycle.ResumeRequest("j", checkpoint="/ckpt/step-10"), connect=world.connect, spawn=spawn,
                    wait=waits.append)
    assert r.action == "relaunched" and r.pid == 4242 and waits == []
    assert "from checkpoint /ckpt/step-10" in r.message
    assert spawn.calls[-1] == (out.job_id, False, False)
    job = ws.store.get_job(out.job_id)
    assert job.state == JobState.RECOVERING
    assert record.from_job(job).checkpoint_override == "/ckpt/step-10"
    assert ws.store.events(out.job_id)[-1].kind == "resume"


# ------------------------------------------------------------------------------------------- supervised elsewhere
def _supervised_on(ws, job_id, host=("login2", "boot-of-login2"), pid=4242):
    """The job claimed and beating by a supervisor on another host sharing this state dir."""
    other = Store(ws.store.path, host=host)
    assert other.claim_supervisor(job_id, pid)
    assert other.heartbeat(job_id, pid)
    other.close()


@pytest.mark.parametrize("host", [("login2", "boot-of-login2"), None])   # None: this hostname, another boot id
def test_a_supervisor_elsewhere_with_a_fresh_heartbeat_is_never_reconciled_or_relaunched(env, monkeypatch, host):
    """Issue 34 item 3: a shared state dir. A supervisor on another host (or boot) is not in this machine's /proc:
    while its heartbeat is fresh, `status` shows it supervised (where), reconciles nothing, and `resume` refuses
    (exit 2) without touching a node."""
    from clusterctl.supervise import controller
    from clusterctl.views import status as status_mod

    ws, world, spawn = env
    out = launch(ws, world, spawn)
    for s in (JobState.STARTING, JobState.RUNNING):
        ws.store.set_state(out.job_id, s)
    ws.store.start_attempt(out.job_id, 1, "n1", f"{out.job_id}-1", ["n1", "n2"])
    host = host or (ws.store.host[0], "another-boot")
    _supervised_on(ws, out.job_id, host)
    monkeypatch.setattr(controller, "reconcile_job", lambda *a, **k: pytest.fail("reconciled a supervised job"))
    world.connects.clear()
    view = uviews.status(ws, "j", ConnectOptions(), connect=world.connect)
    assert view["supervised"] is True and view["state"] == "RUNNING" and world.connects == []
    assert view["supervisor"] == {"pid": 4242, "alive": True, "last_seen": view["supervisor"]["last_seen"],
                                  "host": host[0], "elsewhere": True}
    assert f"supervisor pid 4242 on {host[0]} (supervised elsewhere" in "\n".join(status_mod.text(view))
    with pytest.raises(UserError, match=f"supervised elsewhere: supervisor pid 4242 on {host[0]}") as e:
        lifecycle.resume(ws, lifecycle.ResumeRequest("j"), connect=world.connect, spawn=spawn)
    assert e.value.exit_code == 2 and world.connects == [] and len(spawn.calls) == 1
    assert ws.store.get_job(out.job_id).state == JobState.RUNNING
    # its heartbeat gone stale: the supervisor is gone, wherever it ran: status reconciles again
    stale = ws.store.get_job(out.job_id).supervisor_seen_at + controller.STALE_S + 1
    assert controller.supervision(ws.root, ws.store.get_job(out.job_id), now=stale)["supervised"] is False
    assert controller.live_supervisor(ws.root, ws.store.get_job(out.job_id), now=stale) is None


def test_resume_refuses_a_checkpoint_the_nodes_do_not_have_and_excluding_every_host(env):
    """Issue 39 item 5: `resume --checkpoint` with a relative path, or one no node has, and `--exclude` of the
    job's hosts down below its minimum are usage errors (exit 2) before anything is stopped or relaunched."""
    from clusterctl.transport.base import CommandResult

    ws, world, spawn = env
    out = launch(ws, world, spawn)
    ws.store.set_state(out.job_id, JobState.STOPPED, "stopped by user")
    asked = []

    def connect(host, options):
        t = world.connect(host, options)
        run = t.run

        def test_e(argv, **kw):       # the nodes' shared storage holds /ckpt/step-10 only
            if argv[:2] == ["test", "-e"]:
                asked.append((host.name, argv[2]))
                return CommandResult(tuple(argv), 0 if argv[2] == "/ckpt/step-10" else 1, "", "", 0.01)
            return run(argv, **kw)
        t.run = test_e
        return t

    def resume(**kw):
        return lifecycle.resume(ws, lifecycle.ResumeRequest("j", **kw), connect=connect, spawn=spawn, wait=lambda s: None)

    events = len(ws.store.events(out.job_id))
    with pytest.raises(UserError, match=r"--checkpoint ckpt/step-10: not an absolute path") as e:
        resume(checkpoint="ckpt/step-10")
    assert e.value.exit_code == 2 and asked == []
    with pytest.raises(UserError, match=r"--checkpoint /nonexistent: no such file or directory on n1, n2") as e:
        resume(checkpoint="/nonexistent")
    assert e.value.exit_code == 2 and sorted(asked) == [("n1", "/nonexistent"), ("n2", "/nonexistent")]
    for exclude in (("n1",), ("n1", "n2")):          # nodes "2:2": one host fewer is already too few
        with pytest.raises(UserError, match=r"needs at least 2 node\(s\) but only \d of its hosts would remain") as e:
            resume(exclude=exclude)
        assert e.value.exit_code == 2
    assert len(spawn.calls) == 1 and ws.store.get_job(out.job_id).state == JobState.STOPPED
    assert len(ws.store.events(out.job_id)) == events           # nothing recorded, nothing stopped
    assert resume(checkpoint="/ckpt/step-10").action == "relaunched"
