"""The per-node watch: its node-side script (real sh) and how ``ClusterOps.observe`` uses it."""
from __future__ import annotations

import json
import subprocess
import threading
import time

from clusterctl import runtimes
from clusterctl.inventory import Host
from clusterctl.launcher import ClusterOps, LogSink
from clusterctl.plan import build_plan
from clusterctl.spec import loads_job
from clusterctl.transport.base import CommandResult


class _PidOf:
    """A runtime whose pid command prints a fixed pid."""

    def __init__(self, pid: int):
        self.pid = pid

    def pid_argv(self, node) -> list[str]:
        return ["echo", str(self.pid)]


def _lines(proc: subprocess.Popen, n: int) -> list[str]:
    return [proc.stdout.readline().strip() for _ in range(n)]


def test_watch_prints_1_while_the_process_lives_and_0_once_it_is_gone():
    target = subprocess.Popen(["sleep", "30"])
    watch = subprocess.Popen(runtimes.watch_argv(_PidOf(target.pid), None), stdout=subprocess.PIPE, text=True)
    try:
        assert _lines(watch, 2) == ["1", "1"]
        target.kill()
        target.wait()
        seen = _lines(watch, 3)
        assert seen[-1] == "0" and set(seen) <= {"0", "1"}
    finally:
        watch.kill()
        target.kill()


def test_watch_counts_a_zombie_as_gone():
    """An exited process nobody has reaped yet still has /proc/PID (a container init whose conmon was killed)."""
    child = subprocess.Popen(["true"])
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        with open(f"/proc/{child.pid}/status") as f:
            if any(line.split()[:2] == ["State:", "Z"] for line in f):
                break
        time.sleep(0.02)
    watch = subprocess.Popen(runtimes.watch_argv(_PidOf(child.pid), None), stdout=subprocess.PIPE, text=True)
    try:
        assert _lines(watch, 2) == ["0", "0"]
    finally:
        watch.kill()
        child.wait()


def test_watch_prints_0_when_there_is_no_pid():
    watch = subprocess.Popen(["sh", "-c", runtimes.WATCH, "w", "", "true"], stdout=subprocess.PIPE, text=True)
    try:
        assert _lines(watch, 2) == ["0", "0"]
    finally:
        watch.kill()


def test_watch_reports_the_newest_complete_looking_checkpoint_step(tmp_path):
    """A step directory counts once its MANIFEST.json (or DCP .metadata) exists; temp dirs never do."""
    root = tmp_path / "ckpt"
    (root / "step-000000010").mkdir(parents=True)
    (root / "step-000000010" / "MANIFEST.json").write_text("{}")
    (root / "step-000000020").mkdir()                                   # being written: no manifest yet
    (root / ".tmp-step-000000030-x").mkdir()
    (root / ".tmp-step-000000030-x" / "MANIFEST.json").write_text("{}")
    target = subprocess.Popen(["sleep", "30"])
    watch = subprocess.Popen(runtimes.watch_argv(_PidOf(target.pid), None, str(root)), stdout=subprocess.PIPE,
                             text=True)
    try:
        assert _lines(watch, 1) == ["1 10"]
        (root / "step-000000020" / ".metadata").write_text("x")
        deadline = time.monotonic() + 5
        while _lines(watch, 1) != ["1 20"]:
            assert time.monotonic() < deadline
    finally:
        watch.kill()
        target.kill()


def test_bare_pid_argv_reads_the_runner_pid_until_it_has_exited(tmp_path):
    class Node:
        container_name, node_dir, log_path = "x", str(tmp_path), None

    (tmp_path / "pid").write_text("4242\n")
    argv = runtimes.get("bare").pid_argv(Node())
    assert subprocess.run(argv, capture_output=True, text=True).stdout.strip() == "4242"
    (tmp_path / "exit").write_text("0\n")
    assert subprocess.run(argv, capture_output=True, text=True).stdout.strip() == ""


def test_container_pid_argv():
    class Node:
        container_name, node_dir, log_path, job_id = "clusterctl-j-1_n1", "/x", None, "j-1"

    argv = runtimes.get("podman").pid_argv(Node())
    assert argv[:2] == ["sh", "-c"] and argv[3:] == ["podman", "j-1", "clusterctl-j-1_n1"]
    assert 'inspect --format="{{.State.Pid}}" "$cid"' in argv[2]


# ------------------------------------------------------------------------------------------- observe
JOB = """
name: j
nodes: 3
nproc_per_node: 1
script: train.py
container: {ulimits: {}}
"""


class FakeTransport:
    """``stream`` plays the node's watch: "alive" (1 every 20 ms), "dead" (0s), "silent" (one 1, then nothing)."""

    def __init__(self, host, mode: str, ps: list[dict]):
        self.host, self.mode, self.ps, self.runs = host, mode, ps, []

    def stream(self, argv, on_data, stop: threading.Event) -> None:
        assert argv[:2] == ["sh", "-c"] and "clusterctl-watch" in argv
        if self.mode == "silent":
            on_data(b"1\n")
            stop.wait()
            return
        while not stop.is_set():
            if self.mode != "silent-now":
                on_data(b"1\n" if self.mode == "alive" else b"0\n")
            stop.wait(0.02)

    def run(self, argv, *, timeout, stdin=None) -> CommandResult:
        self.runs.append(list(argv))
        return CommandResult(tuple(argv), 0, json.dumps(self.ps), "", 0.01)

    def close(self) -> None:
        pass


def _ps(job_id: str, attempt: int, state: str, code: int = 0) -> list[dict]:
    labels = {runtimes.LABEL_JOB_ID: job_id, runtimes.LABEL_ATTEMPT: str(attempt)}
    return [{"Names": ["c"], "State": state, "ExitCode": code, "Labels": labels}]


HOSTS = {f"n{i}": Host(name=f"n{i}", address=f"10.0.0.{i}", runtime="podman", gpus=0) for i in (1, 2, 3)}


def _ops(tmp_path, modes: dict[str, str], ps: dict[str, list[dict]], **kw) -> tuple[ClusterOps, dict]:
    """ClusterOps over FakeTransports (watch mode and `podman ps` listing per node), planned for attempt 1."""
    spec = loads_job(JOB, "job.yaml")
    transports = {n: FakeTransport(h, modes[n], ps.get(n, [])) for n, h in HOSTS.items()}
    ops = ClusterOps(spec=spec, hosts=HOSTS, job_id="j-1", store=None, sink=LogSink(tmp_path / "out.log"),
                     connect=lambda host, options: transports[host.name], **kw)
    ops.plan = build_plan(spec, list(HOSTS.values()), job_id="j-1", attempt=1)
    return ops, transports


def test_observe_answers_from_the_watch_and_probes_only_a_node_whose_process_ended(tmp_path):
    ops, transports = _ops(tmp_path, {"n1": "alive", "n2": "dead", "n3": "silent"},
                           {"n2": _ps("j-1", 1, "exited", 1)}, heartbeat_timeout_s=0.3)
    try:
        ops.observe(1, list(HOSTS))        # starts the watches
        time.sleep(0.1)
        for t in transports.values():
            t.runs.clear()
        obs = {o.node: o for o in ops.observe(1, list(HOSTS))}
        assert obs["n1"].state == "running" and not transports["n1"].runs        # no remote command
        assert obs["n2"].state == "exited" and obs["n2"].exit_code == 1 and transports["n2"].runs   # probed
        assert obs["n3"].state == "running" and not transports["n3"].runs        # silent, but not for long yet
        time.sleep(0.4)
        obs = {o.node: o for o in ops.observe(1, list(HOSTS))}
        assert obs["n3"].state == "unreachable" and "no heartbeat" in obs["n3"].error_tail
        assert not transports["n3"].runs     # a silent node is not probed (the probe would hang)
        assert obs["n1"].state == "running"
    finally:
        ops.close()


def test_wait_for_change_wakes_when_a_watched_process_ends(tmp_path):
    ops, transports = _ops(tmp_path, dict.fromkeys(HOSTS, "alive"), {})
    try:
        ops.observe(1, list(HOSTS))
        time.sleep(0.1)
        t = time.monotonic()
        ops.wait_for_change(0.2)
        assert time.monotonic() - t >= 0.19                     # nothing ended: the full interval
        threading.Timer(0.1, lambda: setattr(transports["n2"], "mode", "dead")).start()
        t = time.monotonic()
        ops.wait_for_change(5)
        assert time.monotonic() - t < 1                         # woken by n2's process ending
    finally:
        ops.close()


def test_a_container_listed_running_after_its_init_was_seen_gone_is_missing(tmp_path):
    """podman keeps listing a container as running when its conmon was SIGKILLed with it; the watch saw the init
    go, so after GONE_CONFIRM_S the listing is not believed (and no extra inspect is needed)."""
    from clusterctl import observe

    ops, transports = _ops(tmp_path, dict.fromkeys(HOSTS, "alive"), dict.fromkeys(HOSTS, _ps("j-1", 1, "running")))
    try:
        ops.observe(1, list(HOSTS))
        time.sleep(0.1)
        transports["n2"].mode = "dead"
        ops.wait_for_change(5)
        time.sleep(observe.GONE_CONFIRM_S + 0.1)
        transports["n2"].runs.clear()
        obs = {o.node: o for o in ops.observe(1, list(HOSTS))}
        assert obs["n2"].state == "missing" and "still lists it as running" in obs["n2"].error_tail
        assert [a[:2] for a in transports["n2"].runs] == [["podman", "ps"]]      # the listing only
        assert obs["n1"].state == obs["n3"].state == "running"
    finally:
        ops.close()


class StallingTransport(FakeTransport):
    """A watch whose lines come every 20 ms but stall for ``stall`` s every 5 lines (a slowed sshd)."""

    stall = 0.45

    def stream(self, argv, on_data, stop: threading.Event) -> None:
        n = 0
        while not stop.is_set():
            on_data(b"1\n")
            n += 1
            stop.wait(self.stall if n % 5 == 0 else 0.02)


def test_a_node_whose_watch_stalls_often_gets_a_longer_silence_limit_a_steady_one_does_not(tmp_path):
    """Silence limit 0.3 s: a node that keeps stalling 0.45 s and coming back is not a failed probe once its
    jitter is known (heartbeat.Arrivals), while a steady node that goes silent still is after 0.3 s."""
    from clusterctl import heartbeat

    spec = loads_job(JOB, "job.yaml")
    transports = {"n1": StallingTransport(HOSTS["n1"], "alive", []), "n2": FakeTransport(HOSTS["n2"], "alive", []),
                  "n3": FakeTransport(HOSTS["n3"], "alive", [])}
    ops = ClusterOps(spec=spec, hosts=HOSTS, job_id="j-1", store=None, sink=LogSink(tmp_path / "out.log"),
                     connect=lambda host, options: transports[host.name], heartbeat_timeout_s=0.3)
    ops.plan = build_plan(spec, list(HOSTS.values()), job_id="j-1", attempt=1)
    try:
        ops.observe(1, list(HOSTS))
        deadline = time.monotonic() + 10
        while len(ops._arrivals["n1"].gaps) < heartbeat.MIN_SAMPLES + 10:
            assert time.monotonic() < deadline
            time.sleep(0.05)
        assert 0.45 * heartbeat.MARGIN <= ops._arrivals["n1"].limit() <= heartbeat.CAP * 0.3
        # the steady node's limit stays below the stalling one's (exactly 0.3 s on an idle machine; a loaded one
        # gives n2's 20 ms cadence some jitter of its own)
        assert ops._arrivals["n2"].limit() < ops._arrivals["n1"].limit()
        transports["n2"].mode = "silent-now"                      # n2 stops printing
        end = time.monotonic() + 3
        states = {"n1": set(), "n2": set()}
        while time.monotonic() < end:
            for o in ops.observe(1, ["n1", "n2"]):
                states[o.node].add(o.state)
            time.sleep(0.05)
        assert states["n1"] == {"running"}                          # every stall of n1 was within its limit
        assert "unreachable" in states["n2"]
    finally:
        ops.close()
