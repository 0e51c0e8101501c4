"""Warm recovery on a 3-node podman testbed (the quickstart job, `nodes: "2:3"`, 1 rank per node, `recovery`
left at its default, warm): a fault -> the survivors' relaunch is forked from their zygotes (`relaunch` events
with class `warm`), training resumes from the newest checkpoint, every step is trained, each attempt trains
consecutive steps, nothing of the job (zygotes included) is left; a survivor whose zygote is gone is relaunched
cold (the event says why) and the job still finishes.
"""
from __future__ import annotations

import json
import os
import shutil
import signal
import string
import subprocess
import tempfile
import time
from pathlib import Path

import pytest
import yaml

from clusterctl.launch import runtimes
from tests.integration import recovery_harness as rh
from tests.testbed import Testbed as _Testbed  # aliased so pytest does not try to collect it
from tests.testbed import profile
from tests.testbed.system import claim_octet

JOBS = Path(__file__).parent / "jobs"


@pytest.fixture(scope="module")
def wtb(tmp_path_factory, testbed_slot):
    letter = string.ascii_lowercase[testbed_slot]
    tb = _Testbed(3, tmp_path_factory.mktemp("warm-tb"), [profile(gpus=0)] * 3, prefix=f"tbw{letter}",
                  subnet_octet=claim_octet(range(230 + testbed_slot, 240)))
    # the hosts' TMPDIR (sshd SetEnv): their warm root is this testbed's own, so that a test may hand it to another
    # user without touching the warm jobs of other tests on this machine; short, as a warm root must be
    tmpdir = tempfile.mkdtemp(prefix=f"ccw{letter}-")
    os.chmod(tmpdir, 0o755)
    for h in tb.hosts:
        h.env["TMPDIR"] = tmpdir
    try:
        tb.up()
    except Exception as e:  # noqa: BLE001 - a failure with the reason, never a skip
        pytest.fail(f"testbed could not be built: {type(e).__name__}: {e}", pytrace=False)
    yield tb
    tb.down()
    shutil.rmtree(tmpdir, ignore_errors=True)


def warm_root(tb) -> str:
    return runtimes.warm_root(tmpdir=tb.hosts[0].env["TMPDIR"])


@pytest.fixture
def job(wtb, tmp_path, request):
    runs: list[rh.Run] = []

    def make(name: str = "", **kw) -> rh.Run:
        name = name or "warm" + "".join(c for c in request.node.name.replace("test_", "") if c.isalnum())[-24:]
        run = rh.new_run(wtb, tmp_path, name, **kw)
        runs.append(run)
        return run

    yield make
    for h in wtb.hosts:
        if wtb.partitioned(h.name):
            wtb.heal(h.name)
    for run in runs:
        rh.stop_unless_done(run)
        for line in run.log[-6:]:
            print(line)


def relaunches(run: rh.Run, attempt: int) -> dict[str, str]:
    """node -> warm | cold of ``attempt``'s relaunch events."""
    return {e["node"]: e["class"] for e in run.events() if e["kind"] == "relaunch" and e["attempt"] == attempt}


def first_step_after(run: rh.Run, attempt: int) -> float | None:
    recs = [r for r in run.steps_log() if str(r["attempt"]) == str(attempt) and "time" in r]   # a string there
    return recs[0]["time"] if recs else None


def no_zygote_left(run: rh.Run) -> None:
    if run.runtime == "bare":       # no container: check_clean found no zygote process of the job
        return
    for h in run.tb.hosts:
        assert not run.tb.container_names(h, run.runtime, "label=clusterctl.warm"), h.name


def finish(run: rh.Run) -> dict:
    st = run.wait_end(480)
    assert st["state"] == "SUCCEEDED", f"{st['state']}: {st['reason']}\n{run.events_text()}"
    rh.check_steps(run)
    rh.check_clean(run)
    no_zygote_left(run)
    return st


def long_aliases(run: rh.Run) -> dict[str, str]:
    """The run's inventory with every host under a 32-character alias (an FQDN-like name); alias -> testbed host."""
    inv = yaml.safe_load(run.inventory.read_text())
    hosts = inv["all"]["hosts"]
    alias = {f"{name}.long-alias.example.test.io"[:32]: name for name in hosts}
    assert all(len(a) == 32 for a in alias)
    inv["all"]["hosts"] = {a: hosts[name] for a, name in alias.items()}
    run.inventory.write_text(yaml.safe_dump(inv, sort_keys=False))
    return alias


def wait_rank_view(run: rh.Run, attempt: int, nodes: list[str], timeout: float = 60) -> list[dict]:
    """Until the supervisor's ranks.json (what it heard of every rank over the nodes' watches, issue 37) has every
    rank of ``attempt`` on ``nodes`` (one per node: nproc 1); its rows then. A warm container attempt's ranks run
    in the zygote's container and write their view in the warm dir (its ``s`` mounted at the host path there),
    which the node dir's ``view`` links to."""
    path = run.state_dir / "jobs" / run.job_row().job_id / "ranks.json"
    end = time.monotonic() + timeout
    doc: dict = {}
    while time.monotonic() < end:
        try:
            doc = json.loads(path.read_text())
        except (OSError, ValueError):
            doc = {}
        rows = doc.get("ranks") or []
        if doc.get("attempt") == attempt and sorted(r["node"] for r in rows) == sorted(nodes) and \
                all(r["state"] != "gone" for r in rows):
            return rows
        row = run.job_row()
        assert not row.terminal, f"the job ended before its ranks' view was heard: {doc}"
        time.sleep(0.2)
    raise AssertionError(f"ranks.json: {doc}\n{run.events_text()}")


@pytest.mark.parametrize("runtime", ["podman", "bare"])
def test_worker_node_killed_survivors_relaunch_warm(job, wtb, runtime):
    """Also with a 40-character job name and 32-character node names (issue 34 item 8: the socket path passed 107
    bytes, and warm never worked)."""
    run = job(steps=80, runtime=runtime, name=("wl" + runtime + "x" * 40)[:40])
    host_of = long_aliases(run)
    run.launch()
    run.wait_step(25)
    rh.wait_zygotes(run)
    victim = rh.other_host(run)
    survivors = [n for n in run.current_attempt().nodes if n != victim]
    t = time.time()
    assert wtb.kill(host_of[victim], pattern=rh.JOB_PATTERN)
    rows = wait_rank_view(run, 2, survivors)           # the warm ranks' views reach the supervisor
    assert sorted(r["rank"] for r in rows) == list(range(len(survivors))), rows
    st = finish(run)
    assert relaunches(run, 2) == {n: "warm" for n in survivors}, run.events_text()
    assert any(r["recovery"] == "warm" for r in run.status()["relaunches"])
    first = first_step_after(run, 2)
    print(f"worker kill -> first step of attempt 2: {first - t:.2f}s" if first else "no step time recorded")
    assert st["attempt"] == 2


@pytest.mark.parametrize("runtime", ["podman", "bare"])
def test_rendezvous_host_killed_survivors_relaunch_warm(job, wtb, runtime):
    run = job(steps=80, runtime=runtime)
    run.launch()
    run.wait_step(25)
    rh.wait_zygotes(run)
    victim = rh.rdzv_host(run)
    survivors = [n for n in run.current_attempt().nodes if n != victim]
    assert wtb.kill(victim, pattern=rh.JOB_PATTERN)
    st = finish(run)
    assert relaunches(run, 2) == {n: "warm" for n in survivors}, run.events_text()
    assert st["rendezvous_host"] != victim


@pytest.mark.parametrize("runtime,which", [("podman", "worker"), ("podman", "rdzv"), ("bare", "worker")])
def test_partitioned_node_survivors_relaunch_warm(job, wtb, runtime, which):
    """A node cut off the network (its processes keep running, hung in gloo): found by its silence, `node_lost`
    (`rendezvous_lost` for the rendezvous host), and the two survivors relaunch warm; once it is healed, what it still ran (its container or runner, and its
    zygote) is removed when the job ends."""
    run = job(steps=80, runtime=runtime)
    run.launch()
    run.wait_step(25)
    rh.wait_zygotes(run)
    victim = rh.rdzv_host(run) if which == "rdzv" else rh.other_host(run)
    survivors = [n for n in run.current_attempt().nodes if n != victim]
    wtb.partition(victim)
    try:
        end = time.monotonic() + 120
        while first_step_after(run, 2) is None:          # training again on the survivors
            assert time.monotonic() < end, "attempt 2 did not train\n" + run.events_text()
            time.sleep(0.3)
    finally:
        wtb.heal(victim)
    st = finish(run)
    assert relaunches(run, 2) == {n: "warm" for n in survivors}, run.events_text()
    lost = "rendezvous_lost" if which == "rdzv" else "node_lost"
    assert [(f["class"], f["node"]) for f in st["failures"]] == [(lost, victim)], st["failures"]


def test_a_survivor_without_its_zygote_relaunches_cold_and_the_job_finishes(job, wtb):
    run = job(steps=80)
    run.launch()
    run.wait_step(25)
    rh.wait_zygotes(run)
    victim = rh.other_host(run)
    cold = rh.rdzv_host(run)
    assert wtb.kill(cold, pattern=r"zygote\.py serve")      # attempt 1 is cold: only the zygote matches
    assert wtb.kill(victim, pattern=rh.JOB_PATTERN)
    finish(run)
    got = relaunches(run, 2)
    assert got[cold] == "cold" and all(v == "warm" for n, v in got.items() if n != cold), run.events_text()
    why = next(e["message"] for e in run.events() if e["kind"] == "relaunch" and e["node"] == cold)
    assert "zygote" in why, why


def test_a_stop_during_the_warm_relaunch_leaves_nothing(job, wtb):
    """`clusterctl stop` as the survivors' warm relaunch starts (right after attempt 2's start event): the job ends
    STOPPED with no attempt after 2, and nothing is left on any host: attempt containers, zygote containers, forked
    agents and ranks, warm dirs."""
    import glob

    run = job(steps=400)
    run.launch()
    run.wait_step(25)
    rh.wait_zygotes(run)
    job_id = run.job_row().job_id
    assert wtb.kill(rh.other_host(run), pattern=rh.JOB_PATTERN)

    def started_2() -> bool:
        with run.store() as store:
            return any(e.kind == "start" and (e.attempt or 0) >= 2 for e in store.events(job_id))

    end = time.monotonic() + 60
    while not started_2():
        assert time.monotonic() < end, "attempt 2 did not start\n" + run.events_text()
        time.sleep(0.05)
    run.cli("stop", run.name, "--grace", "0", timeout=120)
    st = run.wait_end(120)
    assert st["state"] == "STOPPED", f"{st['state']}: {st['reason']}\n{run.events_text()}"
    with run.store() as store:
        assert [a.attempt for a in store.attempts(job_id)] == [1, 2], run.events_text()
    rh.check_clean(run)
    no_zygote_left(run)
    assert not glob.glob(f"{warm_root(wtb)}/{runtimes.warm_job_key(job_id)}-*"), "warm dirs left"


@pytest.mark.parametrize("runtime", ["podman", "bare"])
def test_a_sigkilled_warm_rank_is_class_killed_with_sigkill(job, wtb, runtime):
    """Issue 39 item 1: a rank of a warm attempt SIGKILLed (the OOM killer's signal) is judged as a cold one: class
    `killed`, signal SIGKILL, its tail no traceback of the zygote's client (which exited 1 instead of dying of it)."""
    run = job(steps=120, runtime=runtime)
    run.launch()
    run.wait_step(20)
    rh.wait_zygotes(run)
    assert wtb.kill(rh.other_host(run), pattern=rh.JOB_PATTERN)
    run.wait_attempt(2)
    step = run.max_step()
    end = time.monotonic() + 120
    while run.max_step() < step + 5:                     # attempt 2 (warm) trains
        assert time.monotonic() < end, run.events_text()
        time.sleep(0.3)
    assert set(relaunches(run, 2).values()) == {"warm"}, run.events_text()
    victim = rh.other_host(run)
    # the warm rank: forked by the zygote, its title names the zygote's path; its marker names its attempt and rank
    ranks = Path(warm_root(wtb), runtimes.warm_key(run.job_row().job_id, victim), "s", "ranks")
    pids = [p for p, c in wtb.processes(victim) if "/py/zygote.py serve" in c and
            (ranks / _ns_pid(p)).is_file() and (ranks / _ns_pid(p)).read_text().split()[0] == "2"]
    assert len(pids) == 1, (pids, list(ranks.iterdir()) if ranks.exists() else "no ranks dir")
    os.kill(pids[0], signal.SIGKILL)
    st = run.wait_end(400)
    assert st["state"] == "SUCCEEDED", run.events_text()
    f = next(f for f in st["failures"] if f["attempt"] == 2)
    assert (f["class"], f["node"], f["signal"]) == ("killed", victim, "SIGKILL"), st["failures"]
    assert "zygote.py" not in (f["error_tail"] or ""), f["error_tail"]


def test_a_rank_the_oom_killer_ends_is_reported_as_oom_cold_and_warm(job, wtb):
    """Issue 34 item 9: the OOM killer of a container's memory cgroup (`--memory`) ends a rank: class `killed`,
    SIGKILL, `oom: true`, "by the OOM killer (out of memory)", cold (a rank under torchrun in the attempt's
    container: podman sets OOMKilled only when the container's main process was killed, so the kernel's oom-kill
    line naming the container is read too) and warm (a rank forked by the zygote lives in the zygote's container:
    the zygote's cgroup count and its client's note). Before: no `oom` either way."""
    run = job(script=JOBS / "warm_oom.py")
    victim = wtb.hosts[1].name
    spec = yaml.safe_load(run.job.read_text())
    spec["env"] = {"OOM_NODE": victim, "OOM_GO": str(run.record.parent / "oom-go")}
    spec["container"]["extra_args"] = ["--memory=1g", "--memory-swap=1g"]    # the zygote's container too
    run.job.write_text(yaml.safe_dump(spec, sort_keys=False))
    run.launch()
    run.wait_attempt(1)
    rh.wait_zygotes(run)
    (run.record.parent / "oom-go").touch()
    st = run.wait_end(300)
    assert st["state"] == "SUCCEEDED", run.events_text()
    assert relaunches(run, 2).get(victim) == "warm", run.events_text()
    got = [(f["attempt"], f["class"], f["node"], f["signal"], f["oom"]) for f in st["failures"]]
    assert got == [(1, "killed", victim, "SIGKILL", True), (2, "killed", victim, "SIGKILL", True)], st["failures"]
    assert all("by the OOM killer (out of memory)" in f["message"] for f in st["failures"]), st["failures"]
    rh.check_clean(run)
    no_zygote_left(run)


def _ns_pid(pid: int) -> str:
    """The pid of ``pid`` in its innermost PID namespace (the zygote's container: its marker's name)."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return line.split()[-1]
    return str(pid)


ATTACKER = r"""
import os, socket, sys, time
root, keys, stop = sys.argv[1], sys.argv[2].split(","), sys.argv[3]
plant = "import os\nopen(os.path.join(%r, 'RAN-%%d' %% os.getpid()), 'w').write(repr(os.environ.get('SECRET')))\n" % root
socks = []
def own(d):          # a dir of mine where the job's would be: a zygote.py and a json.py that report when they run
    os.makedirs(d + "/py", exist_ok=True)
    os.makedirs(d + "/s", exist_ok=True)
    for f in ("zygote.py", "json.py"):
        with open(d + "/py/" + f, "w") as fh:
            fh.write(plant)
    s = socket.socket(socket.AF_UNIX)
    try:
        os.unlink(d + "/s/z.sock")
    except OSError:
        pass
    s.bind(d + "/s/z.sock")
    os.chmod(d + "/s/z.sock", 0o777)
    s.listen(8)
    s.setblocking(False)
    socks.append(s)
for k in keys:
    own(os.path.join(root, k))
n = 0
while not os.path.exists(stop):
    for e in os.listdir(root):             # anything of another user in my root: swapped for mine
        p = os.path.join(root, e)
        if not e.startswith(("RAN-", "old-")) and os.lstat(p).st_uid != os.getuid():
            n += 1
            os.rename(p, os.path.join(root, "old-%d" % n))
            own(p)
    for s in socks:                        # a fake zygote: whoever connects is reported
        try:
            c, _ = s.accept()
            open(os.path.join(root, "RAN-connect-%d" % time.time_ns()), "w").write("connected")
            c.sendall(b"X 0\n")
            c.close()
        except BlockingIOError:
            pass
    time.sleep(0.05)
"""


def test_a_warm_root_another_user_made_first_runs_nothing_of_it_and_the_job_finishes(job, wtb):
    """Issue 34 items 1-2: uid 65534 made the warm root first (sticky and world-writable, as /tmp/clusterctl-warm
    was), planted a zygote.py and a json.py and a fake zygote socket where the job's warm dirs go, and swaps any dir
    another user makes there, while a node is killed. Nothing of that user runs or is connected to, warm is off on
    every node with the reason in the events, and the job finishes, cold."""
    root = warm_root(wtb)
    shutil.rmtree(root, ignore_errors=True)
    os.mkdir(root)
    os.chown(root, 65534, 65534)
    os.chmod(root, 0o1777)
    stop = Path(root, "stop")
    run = job(steps=60)
    script = Path(wtb.hosts[0].env["TMPDIR"], "attacker.py")
    script.write_text(ATTACKER)
    script.chmod(0o644)
    attacker = None
    try:
        run.launch()
        job_id = run.job_row().job_id
        keys = ",".join(runtimes.warm_key(job_id, h.name) for h in wtb.hosts)
        attacker = subprocess.Popen(["/usr/bin/python3", str(script), root, keys, str(stop)], user=65534, cwd="/")
        run.wait_step(15)
        victim = rh.other_host(run)
        assert wtb.kill(victim, pattern=rh.JOB_PATTERN)
        st = finish(run)
        assert st["attempt"] == 2
        got = relaunches(run, 2)
        assert got and set(got.values()) == {"cold"}, run.events_text()
        for e in run.events():
            if e["kind"] == "relaunch" and e["attempt"] == 2:
                assert f"warm disabled: {root} is not a private directory of uid 0 (owner uid 65534" in e["message"], e
        assert attacker.poll() is None, "the attacker's process ended early"
    finally:
        stop.touch()
        if attacker is not None:
            attacker.wait(10)
        ran = sorted(p.name for p in Path(root).iterdir() if p.name.startswith("RAN-"))
        shutil.rmtree(root, ignore_errors=True)
    assert ran == [], ran


def test_bare_a_stopped_rank_then_a_busy_one_and_one_in_another_collective_cold_and_warm(job, wtb):
    """Issue 37 on the bare runtime, a cold attempt and a warm one (the ranks forked by the zygotes): attempt 1's
    rank 3 (node 2) stops itself (SIGSTOP); in attempt 2 rank 4 (node 3) first computes silently for 10 s (busy,
    never stuck, while its peers wait in DDP's all-reduce), then rank 5 waits in another collective than its peers'
    all-reduce. Each stuck rank is a hang within 30 s of the last step naming that rank and its node, then attempt
    3 finishes. (podman: sleep, fifo, skip and a lone rank holding the GIL, test_recovery.)"""
    import json

    run = job(runtime="bare", script=JOBS / "sick.py", nodes="3", nproc=2, steps=20, step_time=0.1,
              extra_args=["--fault", "1:sigstop@3,2:busy@4,2:other@5", "--at", "8,4,10", "--busy-s", "10"])
    run.launch()
    st = run.wait_end(480)
    assert st["state"] == "SUCCEEDED", f"{st['state']}: {st['reason']}\n{run.events_text()}"
    assert st["attempt"] == 3 and [f["class"] for f in st["failures"]] == ["hang", "hang"], st["failures"]
    assert set(relaunches(run, 2).values()) == {"warm"}, run.events_text()
    for f, attempt, rank, what in zip(st["failures"], (1, 2), (3, 5), ("stopped (SIGSTOP)", "mismatched collectives")):
        truth = json.loads(Path(f"{run.record.parent / 'sick.json'}.{attempt}").read_text())
        assert (f["attempt"], f["node"], f["rank"]) == (attempt, truth["node"], rank), f
        assert what in f["message"], f["message"]
        last = max(r["time"] for r in run.steps_log() if str(r["attempt"]) == str(attempt))
        assert f["time"] - last <= 30, f"attempt {attempt}: hang declared {f['time'] - last:.1f}s after the last step"
    stuck = [(e["attempt"], e["rank"]) for e in run.events() if e["kind"] == "stuck" and e["class"] == "stuck"]
    assert (2, 4) not in stuck, stuck            # the busy rank never
    rh.check_clean(run)
