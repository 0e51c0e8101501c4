"""On-call truth on a 3-host testbed: what `status`, `resume` and `logs` say when clusterctl's own supervisor is
gone, failures no retry can fix, ranks killed by a signal, the partitioned rendezvous host, and the job's own
restart budgets (issue: "On-call truth").

The quickstart job of recovery_harness (podman, `nodes: "2:3"`, 1 rank per node, a checkpoint every 10 steps)
unless a test says otherwise (2 nodes of 2 ranks where one rank is killed); `chatter.py` prints numbered lines per rank so the log copy can be checked line by
line.
"""
from __future__ import annotations

import contextlib
import glob
import json
import os
import re
import signal
import sqlite3
import string
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.integration import recovery_harness as rh

CHATTER = Path(__file__).resolve().parent / "chatter.py"
VENV_BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def otb(tmp_path_factory, testbed_slot):
    letter = string.ascii_lowercase[testbed_slot]
    tb = rh.cpu_testbed(3, tmp_path_factory.mktemp("oncall-tb"), f"tbo{letter}", range(220, 240), docker=True)
    yield tb
    tb.down()


@pytest.fixture
def job(otb, tmp_path, request):
    runs: list[rh.Run] = []

    def make(**kw) -> rh.Run:
        name = "oc" + "".join(c for c in request.node.name.replace("test_", "") if c.isalnum())[-28:].lower()
        run = rh.new_run(otb, tmp_path, name, **kw)
        runs.append(run)
        return run

    yield make
    for h in otb.hosts:
        if otb.partitioned(h.name):
            otb.heal(h.name)
    for run in runs:      # every supervisor this test started is gone before the testbed may go down
        rh.stop_unless_done(run)
        for line in run.log[-6:]:
            print(line)


def kill_supervisor(run: rh.Run) -> int:
    pid = run.supervisor_pid()
    os.kill(pid, signal.SIGKILL)
    end = time.monotonic() + 10
    while rh._alive(pid) and time.monotonic() < end:
        time.sleep(0.1)
    return pid


def rank_pids(tb, host: str) -> list[int]:
    """The ranks, not their DataLoader workers (same command line; the quickstart forks them early now)."""
    return rh.rank_pids(tb, host)


def edit_job(run: rh.Run, **changes) -> None:
    data = yaml.safe_load(run.job.read_text())
    data.update(changes)
    run.job.write_text(yaml.safe_dump(data, sort_keys=False))


# ------------------------------------------------------------------------------------ (a) partitioned rdzv host
def test_partitioned_rendezvous_host_whose_processes_died_recovers_within_15s(job, otb):
    run = job(steps=110)
    run.launch()
    run.wait_step(60)
    before = run.steps_log()[-1]["attempt"]
    victim = rh.rdzv_host(run)
    otb.partition(victim)
    otb.kill(victim, pattern=rh.JOB_PATTERN)
    t0 = time.time()
    try:
        st = run.wait_end(300)
    finally:
        otb.heal(victim)
    assert st["state"] == "SUCCEEDED", run.events_text()
    first = next(r for r in run.steps_log() if r["time"] > t0 and r["attempt"] != before)
    mttr = first["time"] - t0
    f = st["failures"][0]
    assert f["class"] == "rendezvous_lost" and f["node"] == victim, st["failures"]
    # clusterctl's part -- the fault to the relaunch -- may not wait on the dead node (the old lookup did: 60 s)
    starts = {e["attempt"]: e["time"] for e in run.events() if e["kind"] == "start"}
    relaunch = starts[int(before) + 1] - t0
    assert relaunch <= 6, f"relaunch {relaunch:.1f}s after the fault\n{run.events_text()}"
    # the rest is torch starting on the survivors. Goal 15 s (bench/recovery `partition_rdzv` measures it on a
    # quiet machine); on a loaded 2-core box the bound is what the first attempt's start took on this machine
    first_start = next(r["time"] for r in run.steps_log() if r["attempt"] == before) - starts[int(before)]
    bound = max(15.0, relaunch + first_start)
    assert mttr <= bound, f"MTTR {mttr:.1f}s > {bound:.1f}s\n{run.events_text()}"
    rh.check_steps(run)


# ------------------------------------------------------------------------------------ (b) unsupervised rank kill
def test_rank_killed_while_unsupervised_status_names_it_and_resume_relaunches(job, otb):
    """The supervisor is SIGKILLed, then a rank: `status` names the node, rank and signal within 10 s and says the
    job is unsupervised; `resume` relaunches from the newest checkpoint (the job is dead everywhere by then: its
    other ranks failed with it) and the run finishes with every step trained."""
    run = job(steps=70, nodes="2", nproc=2)     # 2 nodes: a rank, not a node, is the victim (CI time)
    run.launch()
    run.wait_step(35)
    kill_supervisor(run)
    victim = rh.other_host(run)
    os.kill(rank_pids(otb, victim)[0], signal.SIGKILL)
    t0 = time.monotonic()
    while True:      # within 10 s: unsupervised, and the node, rank and signal
        r = run.cli("status", run.name, timeout=30)
        text = r.stdout + r.stderr
        # the node's agent may not have seen its rank die at the first look: wait for the signal to be named
        if "SIGKILL" in text and ("UNSUPERVISED" in text or "FAILED" in text):
            break
        assert time.monotonic() - t0 < 10, text
        time.sleep(0.5)
    st = run.status()
    assert time.monotonic() - t0 <= 10 + 5
    assert st["supervised"] is False and st["supervisor"]["alive"] is False and st["supervisor_pid"]
    f = next(f for f in st["failures"] if f["found_by"] == "status")
    assert (f["class"], f["node"], f["signal"]) == ("killed", victim, "SIGKILL"), st["failures"]
    assert f["rank"] is not None and f["rank"] >= 0
    assert st["state"] == "FAILED" and "clusterctl resume" in st["reason"]
    text = run.cli("status", run.name, timeout=30).stdout
    assert f"node {victim} rank {f['rank']}" in text and "SIGKILL" in text
    last = max(int(p.name.split("-")[1]) for p in (run.record.parent / "ckpt").iterdir()
               if p.name.startswith("step-"))
    out = run.cli("resume", run.name, "--detach", "-o", "json", timeout=180)
    assert json.loads(out.stdout)["outcome"] == "relaunched", out.stdout
    st = run.wait_end(400)
    assert st["state"] == "SUCCEEDED", run.events_text()
    start2 = [e for e in run.events() if e["kind"] == "start" and e["attempt"] == 2]
    assert start2 and start2[0]["checkpoint_step"] == last, (last, run.events_text())
    rh.check_steps(run)


# ------------------------------------------------------------------------------------ (c) finished unsupervised
def test_finished_while_unsupervised_is_succeeded_and_resume_relaunches_nothing(job, otb):
    run = job(steps=40)
    run.launch()
    run.wait_step(10)
    kill_supervisor(run)
    end = time.monotonic() + 300
    while run.max_step() < 40 or any("train.py" in c for h in otb.hosts for _, c in otb.processes(h.name)):
        assert time.monotonic() < end, "training did not finish"
        time.sleep(1)
    st = run.status()
    assert st["state"] == "SUCCEEDED", st
    assert any(e["kind"] == "reconciled" and e["class"] == "success" for e in run.events())
    # issue 39 item 4: the checkpoint shown is the newest on disk (the dead supervisor saw step 10 at most), an
    # event says the supervisor was lost and since when; the look that ended the job removed its leftovers
    on_disk = max(int(p.name.split("-")[1]) for p in (run.record.parent / "ckpt").iterdir()
                  if p.name.startswith("step-"))
    assert st["checkpoint"] and st["checkpoint"]["step"] == on_disk, (st["checkpoint"], on_disk)
    assert [e["kind"] for e in run.events()].count("supervisor_lost") == 1, run.events_text()
    rh.check_clean(run)
    out = run.cli("resume", run.name, "--detach", "-o", "json", timeout=120)
    res = json.loads(out.stdout)
    assert res["outcome"] == "succeeded" and res["supervisor_pid"] is None, res
    assert [e["kind"] for e in run.events()].count("start") == 1          # nothing relaunched
    r = run.cli("resume", run.name, timeout=60)                          # attached: says so, exit 0
    assert "SUCCEEDED" in r.stderr and "nothing relaunched" in r.stderr
    logs = run.cli("logs", run.name, "--rank", "0", timeout=60).stdout
    assert "done: step 40" in logs          # the end that no supervisor copied is in the controller's log
    # (g) a selection that names nothing of the job is a usage error (exit 2) naming what exists
    r = run.cli("logs", run.name, "--node", "nope", check=False)
    assert r.returncode == 2 and "node1" in r.stderr
    r = run.cli("logs", run.name, "--rank", "3", check=False)
    assert r.returncode == 2 and "0-2" in r.stderr
    assert run.cli("logs", run.name, "--tail", "-2", check=False).returncode == 2
    assert run.cli("logs", run.name, "--tail", "0").stdout == ""
    assert len(run.cli("logs", run.name, "--tail", "2").stdout.splitlines()) == 2
    assert all(n["state"] in ("exited", "stopped") for n in run.status()["nodes"])


# ------------------------------------------------------------------------------------ (d) + (f): classes
def test_misspelt_script_fails_after_one_attempt_as_config_error(job, otb):
    run = job(steps=20, restarts={"max_failures": 3, "backoff_s": 0.2})
    edit_job(run, script=str(rh.TRAIN).replace("train.py", "tran.py"))
    run.launch()
    st = run.wait_end(300)
    assert st["state"] == "FAILED" and st["attempt"] == 1, st
    assert [f["class"] for f in st["failures"]] == ["config_error"], st["failures"]
    assert "tran.py" in st["reason"] and "script:" in st["reason"]
    assert st["restarts"]["failures_used"] == 0


def test_kill_9_of_a_rank_is_class_killed_with_sigkill(job, otb):
    """One rank of two on a worker node SIGKILLed (its sibling is taken down with it): class `killed` with the
    signal, charged to the job's own budget, relaunched once from the newest checkpoint, every step trained,
    nothing left."""
    run = job(steps=80, nodes="2", nproc=2, restarts={"max_failures": 7})     # 2 nodes: see (b)
    run.launch()
    run.wait_step(25)
    assert run.status()["restarts"]["max_failures"] == 7            # (h) the job's own budget
    victim = rh.other_host(run)
    os.kill(rank_pids(otb, victim)[0], signal.SIGKILL)
    st = run.wait_end(400)
    assert st["state"] == "SUCCEEDED", run.events_text()
    f = st["failures"][0]
    assert (f["class"], f["node"], f["signal"]) == ("killed", victim, "SIGKILL"), st["failures"]
    assert f["error_tail"] and all(line.strip() for line in f["error_tail"].splitlines())
    assert {k: st["restarts"][k] for k in ("failures_used", "max_failures", "node_failures_used",
                                           "max_node_failures")} == {"failures_used": 1, "max_failures": 7,
                                                                     "node_failures_used": 0, "max_node_failures": 10}
    text = run.cli("status", run.name, timeout=30).stdout
    assert "user errors 1/7" in text
    assert st["attempt"] == 2
    kinds = [e["kind"] for e in run.events()]
    assert all(k in kinds for k in ("start", "verdict", "gang_stop", "end")), run.events_text()
    rh.check_steps(run)
    rh.check_clean(run)


# ------------------------------------------------------------------------------------ (e) torchrun missing
def test_bare_runtime_without_torchrun_on_path_fails_preflight_check_torchrun(otb, tmp_path):
    inv = otb.inventory(tmp_path / "inv.yaml", runtime="bare")
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump({"name": "octorchrun", "nodes": 2, "nproc_per_node": 1,
                                   "script": str(rh.TRAIN)}))
    r = rh.Run(otb, tmp_path / "state", inv, job, "octorchrun", 1, tmp_path / "x").cli(
        "preflight", "-i", str(inv), str(job), "-o", "json", check=False, timeout=120)
    assert r.returncode == 1, r.stdout + r.stderr
    for h in json.loads(r.stdout)["hosts"]:
        c = next(c for c in h["checks"] if c["id"] == "torchrun")
        assert c["status"] == "fail" and "torchrun" in c["detail"] and "`torchrun:`" in c["hint"], c
        assert next(c for c in h["checks"] if c["id"] == "script")["status"] == "pass"
    # the launch's quick preflight stops at the same check
    r2 = rh.Run(otb, tmp_path / "state", inv, job, "octorchrun", 1, tmp_path / "x").cli(
        "launch", str(job), "-i", str(inv), "--detach", check=False, timeout=120)
    assert r2.returncode == 1 and "torchrun" in r2.stderr, r2.stderr


# ------------------------------------------------------------------------------------ (g) logs exactly once
@pytest.mark.parametrize("runtime", ["podman", "bare", "docker"])
def test_logs_hold_every_line_once_in_order_after_a_supervisor_kill_and_resume(job, otb, tmp_path, runtime):
    """docker: also its resume after a controller crash (the supervisor re-attaches to running containers)."""
    run = job(steps=1, nproc=2)
    lines, period = 200, 0.15                         # 30 s: still running when resume re-attaches under load
    inv = otb.inventory(tmp_path / f"inv-{runtime}.yaml", runtime=runtime)
    run.inventory, run.runtime = inv, runtime
    edit_job(run, script=str(CHATTER), args=[str(lines), str(period)], nodes=3,
             **({"torchrun": str(VENV_BIN / "torchrun")} if runtime == "bare" else {}),
             **({"mounts": otb.job_mounts(runtime)} if runtime == "docker" else {}))
    run.launch()
    deadline = time.monotonic() + 120
    while "tick 20" not in "".join(p.read_text(errors="replace") for p in run.state_dir.rglob("output.log")):
        assert time.monotonic() < deadline     # the controller's copy, read directly (not a CLI process per look)
        time.sleep(0.5)
    kill_supervisor(run)
    time.sleep(3)                                     # lines the dead supervisor never copied
    out = run.cli("resume", run.name, "--detach", "-o", "json", timeout=120)
    assert json.loads(out.stdout)["outcome"] == "reattached", out.stdout
    again = run.cli("resume", run.name, "--detach", "-o", "json", timeout=60)       # idempotent
    assert "already supervised" in again.stdout, again.stdout
    st = run.wait_end(300)
    assert st["state"] == "SUCCEEDED", run.events_text()
    assert st["attempt"] == 1 and not st["failures"], st                # re-attached: nothing restarted
    kinds = [e["kind"] for e in run.events()]
    assert "adopt" in kinds and kinds.count("start") == 1, run.events_text()
    text = run.cli("logs", run.name, timeout=60).stdout
    assert text.count("=== attempt 1 ===") == 3, text[:2000]          # one section per node
    ticks: dict[str, list[int]] = {}
    for line in text.splitlines():
        m = re.match(r"^\[(\w+)/(\d+)\] tick (\d+)$", line)
        if m:
            ticks.setdefault(f"{m.group(1)}/{m.group(2)}", []).append(int(m.group(3)))
    assert len(ticks) == 6, sorted(ticks)
    for who, seq in ticks.items():
        assert seq == list(range(1, lines + 1)), (who, seq[:5], len(seq))
    if runtime != "bare":
        rh.check_clean(run)


# ------------------------------------------------------------------------------------ supervisor elsewhere / gone
@contextlib.contextmanager
def supervised_elsewhere(run: rh.Run):
    """The job's supervisor recorded on another host (a shared state dir): its pid is not in this machine's
    /proc (999999999), its heartbeat fresh (``beat()`` before each look). The real claim is put back after."""
    job = run.job_row()
    db = run.state_dir / "state.db"

    def write(pid, host, boot) -> None:
        c = sqlite3.connect(db, timeout=30)
        c.execute("UPDATE jobs SET supervisor_pid = ?, supervisor_host = ?, supervisor_boot = ?,"
                  " supervisor_seen_at = ? WHERE job_id = ?", (pid, host, boot, time.time(), job.job_id))
        c.commit()
        c.close()

    beat = lambda: write(999_999_999, "login-elsewhere", "a-boot-of-login-elsewhere")   # noqa: E731
    beat()
    try:
        yield beat
    finally:
        write(job.supervisor_pid, job.supervisor_host, job.supervisor_boot)


def test_followers_say_unsupervised_and_a_reconcile_ending_a_warm_job_leaves_nothing(job, otb):
    """Issue 34 items 3 and 5, issue 39 item 2, on a warm 2-node podman job printing a line every 0.2 s:
    * a supervisor elsewhere with a fresh heartbeat: `status` says where and reconciles nothing, `resume` refuses
      (exit 2) and starts no second supervisor;
    * `logs -f`, `status --watch` and `events -f` started, the supervisor SIGKILLed: each prints the UNSUPERVISED
      line within 15 s, and `logs -f` goes on printing the ranks' new lines (from the nodes' own logs);
    * a rank then SIGKILLed: the followers' look at the nodes ends the job (FAILED) and they exit; the zygotes,
      warm dirs and the survivor's container are gone, or a cleanup_pending event names the node."""
    from clusterctl.launch.runtimes import warm_job_key, warm_root

    run = job(steps=1, nproc=1)
    edit_job(run, script=str(CHATTER), args=["1500", "0.2"], nodes=2)
    run.launch()
    rh.wait_zygotes(run, timeout=240)               # torch's import in each zygote: slow on a loaded box
    job_id = run.job_row().job_id
    out_log = run.state_dir / "jobs" / job_id / "output.log"
    wait_for(lambda: "tick 5" in out_log.read_text(errors="replace"), 60, "the ranks' first lines")
    with supervised_elsewhere(run) as beat:
        st = run.status()
        assert st["supervised"] is True and st["state"] == "RUNNING", st
        assert st["supervisor"]["elsewhere"] is True and st["supervisor"]["host"] == "login-elsewhere", st
        beat()
        r = run.cli("resume", run.name, "--detach", check=False, timeout=60)
        assert r.returncode == 2 and "supervised elsewhere" in r.stderr and "login-elsewhere" in r.stderr, r.stderr
    kinds = [e["kind"] for e in run.events()]
    assert "reconciled" not in kinds and "adopt" not in kinds and kinds.count("start") == 1, kinds

    env = dict(os.environ, CLUSTERCTL_STATE_DIR=str(run.state_dir))
    outs = {name: run.state_dir.parent / f"{name}.out" for name in ("logs", "watch", "events")}
    argv = {"logs": ["logs", "-f", run.name], "watch": ["status", run.name, "--watch"],
            "events": ["events", "-f", run.name]}
    followers = {}
    try:
        for name, args in argv.items():
            followers[name] = subprocess.Popen([*rh.CLUSTERCTL, "--state-dir", str(run.state_dir), *args],
                                               stdout=outs[name].open("w"), stderr=subprocess.STDOUT, env=env,
                                               cwd=str(rh.REPO), stdin=subprocess.DEVNULL)
        time.sleep(3)                                   # the followers are following
        kill_supervisor(run)
        t0 = time.monotonic()
        said = {}
        while len(said) < len(outs):
            for name, path in outs.items():
                if name not in said and "UNSUPERVISED:" in path.read_text(errors="replace"):
                    said[name] = time.monotonic() - t0
            assert time.monotonic() - t0 < 15, {n: p.read_text()[-2000:] for n, p in outs.items() if n not in said}
            time.sleep(0.2)
        text = outs["logs"].read_text()
        assert "Run: clusterctl resume " + run.name in text
        at_kill = max(int(m) for m in re.findall(r"\] tick (\d+)", text))
        # the ranks go on (a line every 0.2 s): logs -f prints what the nodes printed since
        wait_for(lambda: max(int(m) for m in re.findall(r"\] tick (\d+)", outs["logs"].read_text())) >= at_kill + 25,
                 40, "logs -f printing the nodes' new lines")
        victim = rh.other_host(run)
        os.kill([p for p, c in otb.processes(victim) if "chatter.py" in c and "torchrun" not in c][0],
                signal.SIGKILL)
        for name, p in followers.items():           # the job ends by their look at the nodes: they end with it
            p.wait(timeout=90)
    finally:
        for p in followers.values():
            if p.poll() is None:
                p.kill()
                p.wait()
    st = run.status()
    assert st["state"] == "FAILED" and any(f["found_by"] == "status" for f in st["failures"]), st
    events = run.events()
    pending = {e["node"] for e in events if e["kind"] == "cleanup_pending"}
    cleaned = [e["message"] for e in events if e["kind"] == "cleanup"]
    assert cleaned or pending, [e["kind"] for e in events]
    if not pending:                                  # nothing left: no container, no zygote, no warm dir
        rh.check_clean(run)
        root = warm_root(tmpdir=otb.hosts[0].env.get("TMPDIR", "/tmp"))
        assert not glob.glob(f"{root}/{warm_job_key(job_id)}-*"), glob.glob(f"{root}/*")


def wait_for(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        try:
            if cond():
                return
        except (OSError, ValueError):
            pass
        time.sleep(0.3)
    raise AssertionError(f"{what}: not within {timeout}s")
