#!/usr/bin/env python3
"""Scale benchmark: what supervising N nodes costs the controller, and whether detection stays fast.

    python bench/scale.py --simulate [--sizes 256,1024,4096] [--log-rate 5] [--no-write]
    python bench/scale.py --testbed [--sizes 16,32,64] [--no-write]        (see bench/scaletb.py)

``--simulate``: the real ``Supervisor`` + ``ClusterOps`` (watch streams, log followers, ``LogSink``, probes,
SQLite ``Store``) over simulated nodes (bench/scalesim.py: a forked node server plays every node's watch and
log through real sockets; commands are answered at once). Per N, in one process:

  steady     after every node is seen running: the controller's CPU (% of one core) and CPU per probe round
             over ``--window`` s, RSS per node (RSS growth from before ``ClusterOps`` / N), threads
  kill       node N's process is killed (its watch prints 0): detection = kill -> the supervisor's verdict;
             recovery = kill -> attempt 2 started on the others (no torchrun here: that is the testbed's part)
  partition  node N-1 goes silent (no watch line): detection = silence -> verdict
  logs       every node prints ``--log-rate`` lines/s; the controller's copy is checked: no line lost or
             reordered within a node's section, and CPU is reported per 1,000 lines (steady CPU / lines)

Writes ``### simulation`` of ``## scale`` in docs/benchmarks.md unless ``--no-write``.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import resource
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path

import common  # noqa: E402  (puts the repository root on sys.path)
from common import exit_on_signals  # noqa: E402
from scalesim import NodeServer, SimState, SimTransport  # noqa: E402

JOB = """
name: scale
nodes: "1:{n}"
nproc_per_node: 1
script: train.py
workdir: /tmp
"""


def rss_kb() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def copied_lines(sink) -> int:
    """Lines the controller's log copy holds (all nodes' current sections)."""
    return sum(sink.lines(node) for node in list(sink.copied))


def wait_until(pred, timeout: float, step: float = 0.05) -> float | None:
    """Seconds until ``pred()`` held (None: timed out)."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return time.monotonic() - t0
        time.sleep(step)
    return None


def check_log(path: Path) -> dict:
    """Every node's sections must hold seq 0, 1, 2, ... without a gap or a swap."""
    expect: dict[str, int] = {}
    bad, lines = 0, 0
    rx = re.compile(r"^\[([^/]+)/(\S+)\] (.*)$")
    with open(path) as f:
        for line in f:
            m = rx.match(line.rstrip("\n"))
            if not m:
                bad += 1
                continue
            node, _rank, text = m.groups()
            if text.startswith("=== attempt "):
                expect[node] = 0
                continue
            if text.startswith("seq "):
                lines += 1
                k = int(text[4:])
                if k != expect.get(node, 0):
                    bad += 1
                expect[node] = k + 1
    return {"lines": lines, "bad": bad}


def simulate_one(n: int, log_rate: float, window: float) -> dict:
    from clusterctl.config.inventory import Host
    from clusterctl.config.spec import loads_job
    from clusterctl.store.logcopy import LogSink
    from clusterctl.store.state import JobState, Store
    from clusterctl.supervise.cluster_ops import ClusterOps
    from clusterctl.supervise.supervisor import Policy, Supervisor

    tmp = Path(tempfile.mkdtemp(prefix="cc-scale-"))
    server = NodeServer(tmp / "nodes.sock", n, log_rate)      # forked before any thread of this process
    try:
        spec = loads_job(JOB.format(n=n), str(tmp / "job.yaml"))
        hosts = {f"n{i}": Host(name=f"n{i}", address=f"10.0.{i // 250}.{i % 250 + 1}", runtime="bare", gpus=0)
                 for i in range(1, n + 1)}
        store = Store(tmp / "state.db")
        job_id = store.create_job("scale", "{}", None, None)
        state = SimState()
        transports = {name: SimTransport(h, i, server, state, job_id)
                      for i, (name, h) in enumerate(hosts.items(), 1)}
        base_rss, base_threads = rss_kb(), os_threads()
        ops = ClusterOps(spec=spec, hosts=hosts, job_id=job_id, store=store, sink=LogSink(tmp / "output.log"),
                         connect=lambda host, options: transports[host.name], probe_timeout_s=3.0,
                         heartbeat_timeout_s=2.0)
        rounds = [0]
        marks: dict[str, float] = {}
        counted = Counted(ops, rounds, marks)

        def on_event(msg: str) -> None:
            if " lost: " in msg:
                marks.setdefault(f"verdict{len([k for k in marks if k.startswith('verdict')]) + 1}",
                                 time.monotonic())

        policy = Policy(min_nodes=1, max_nodes=n, probe_interval_s=1.0, probe_failures=2, backoff_s=0.0,
                        hang_timeout_s=3600, cordon_after=0)
        sup = Supervisor(job_id, store, counted, policy, list(hosts), wait=ops.wait_for_change, on_event=on_event)
        result: dict = {}
        th = threading.Thread(target=lambda: result.setdefault("state", sup.run()), name="supervisor", daemon=True)
        th.start()
        ready = wait_until(lambda: "started1" in marks and all(
            w.last is not None for w in ops.watches.snapshot().values()) and len(ops.watches.snapshot()) == n, 120)
        out = {"n": n, "ready_s": ready}
        time.sleep(3)                                            # settle
        c0, r0, t0, l0 = time.process_time(), rounds[0], time.monotonic(), copied_lines(ops.sink)
        s0 = server.cpu_s()
        time.sleep(window)
        c1, r1, t1 = time.process_time(), rounds[0], time.monotonic()
        l1 = copied_lines(ops.sink)
        out.update(cpu_pct=100 * (c1 - c0) / (t1 - t0), rounds=r1 - r0,
                   cpu_ms_per_round=1000 * (c1 - c0) / max(1, r1 - r0),
                   rss_kb_per_node=(rss_kb() - base_rss) / n, rss_mb=rss_kb() / 1024,
                   threads=os_threads(), threads_added=os_threads() - base_threads,
                   lines_per_s=(l1 - l0) / (t1 - t0),
                   cpu_ms_per_1000_lines=1000 * (c1 - c0) / max(1, l1 - l0) * 1000,
                   nodesim_cpu_pct=100 * (server.cpu_s() - s0) / (t1 - t0))
        # a killed process: the watch prints 0
        t_kill = time.monotonic()
        server.tell("kill", n)
        state.killed.add(f"n{n}")
        wait_until(lambda: "started2" in marks, 60)
        out["kill_detect_s"] = marks["verdict1"] - t_kill if "verdict1" in marks else None
        out["kill_recover_s"] = marks["started2"] - t_kill if "started2" in marks else None
        wait_until(lambda: all(w.last is not None and w.attempt == 2 for w in ops.watches.snapshot().values()), 60)
        time.sleep(2)
        # a partition: the watch goes silent
        t_cut = time.monotonic()
        server.tell("cut", n - 1)
        wait_until(lambda: "verdict2" in marks, 60)
        out["cut_detect_s"] = marks["verdict2"] - t_cut if "verdict2" in marks else None
        wait_until(lambda: "started3" in marks, 60)
        store.set_state(job_id, JobState.STOPPED, "bench done")
        th.join(120)
        out["supervisor_ended"] = not th.is_alive()
        out["launch_to_all_watched_s"] = ready
        out.update(check_log(tmp / "output.log"))
        out["maxrss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        ops.close()
        return out
    finally:
        server.close()
        shutil.rmtree(tmp, ignore_errors=True)


class Counted:
    """The supervisor's ``NodeOps``: ``ops`` (``ClusterOps``), counting probe rounds and timing each start."""

    def __init__(self, ops, rounds: list[int], marks: dict[str, float]):
        self.ops, self.rounds, self.marks = ops, rounds, marks

    def observe(self, *a, **kw):
        self.rounds[0] += 1
        return self.ops.observe(*a, **kw)

    def start(self, attempt, *a, **kw):
        r = self.ops.start(attempt, *a, **kw)
        self.marks[f"started{attempt}"] = time.monotonic()
        return r

    def __getattr__(self, name):         # stop, reachable, latest_checkpoint, checkpoint_hint, stacks, ...
        return getattr(self.ops, name)


def fmt(v, spec="{:.2f}") -> str:
    return "-" if v is None else spec.format(v)


def sim_table(rows: list[dict]) -> str:
    head = ("| nodes | CPU % of a core | CPU ms / round | RSS KB / node | threads | log lines/s | CPU ms / 1,000 "
            "lines | kill → verdict s | kill → attempt 2 s | silence → verdict s | lines lost/reordered |\n"
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    body = "".join(
        f"| {r['n']} | {fmt(r['cpu_pct'], '{:.1f}')} | {fmt(r['cpu_ms_per_round'], '{:.1f}')} | "
        f"{fmt(r['rss_kb_per_node'], '{:.0f}')} | {r['threads']} | {fmt(r['lines_per_s'], '{:.0f}')} | "
        f"{fmt(r['cpu_ms_per_1000_lines'], '{:.1f}')} | {fmt(r['kill_detect_s'])} | {fmt(r['kill_recover_s'])} | "
        f"{fmt(r['cut_detect_s'])} | {r['bad']} of {r['lines']} |\n" for r in rows)
    return head + body


def main(argv: list[str] | None = None) -> int:
    ap = common.parser(__doc__.split("\n\n")[0], prefix="bsc", subnet=226, prog="bench/scale.py")
    mode = ap.add_mutually_exclusive_group(required=True)
    mode.add_argument("--simulate", action="store_true")
    mode.add_argument("--testbed", action="store_true")
    ap.add_argument("--sizes", default=None)
    ap.add_argument("--log-rate", type=float, default=None, help="lines/s per rank (simulate 5, testbed 50)")
    ap.add_argument("--window", type=float, default=None, help="steady-state window, s (simulate 10, testbed 20)")
    ap.add_argument("--json", default=None, help="also write the raw results here")
    ap.add_argument("--steady-only", default="", help="testbed: sizes measured without the launch comparison")
    ap.add_argument("--label", default="", help="simulate: a label for the printed table (e.g. before/after)")
    ap.add_argument("--light", action="store_true", help="testbed: a worker without torch (bench/scale_train.py "
                    "--light), so 64 nodes fit in memory")
    ap.add_argument("--baseline", default=None, help="testbed: a checkout of other code (e.g. git archive main) "
                    "measured first, per size, on the same testbed (steady state, kill, logs)")
    ap.add_argument("--probe-failures", type=int, default=2, help="testbed: the job's supervisor.probe_failures "
                    "(default 2, the job default). 64 testbed nodes share 2 cores: while 64 agents import torch "
                    "(load ~100) watch lines come seconds late; a kill is reported by the watch, not by silence")
    args = ap.parse_args(argv)
    exit_on_signals()   # so the finally blocks tear the node server / the testbed down
    if args.testbed:
        import scaletb

        args.log_rate, args.window = (50.0 if args.log_rate is None else args.log_rate), args.window or 20.0
        return scaletb.main(args)
    args.log_rate, args.window = (5.0 if args.log_rate is None else args.log_rate), args.window or 10.0
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sizes = [int(s) for s in (args.sizes or "256,1024,4096").split(",")]
    rows = []
    for n in sizes:
        r = simulate_one(n, args.log_rate, args.window)
        print(json.dumps(r), flush=True)
        rows.append(r)
    table = sim_table(rows)
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    if not args.no_write:
        write_sim_section(table, args)
    return 0


def write_sim_section(table: str, args) -> None:
    from docsection import write_subsection

    write_subsection("## scale", "### simulation", (
        f"### simulation\n\n`python bench/scale.py --simulate --sizes {args.sizes or '256,1024,4096'} "
        f"--log-rate {args.log_rate:g}` ({datetime.date.today()}, {platform.node()}, {os.cpu_count()} cores, "
        f"Python {platform.python_version()}).\n\n{table}"))


if __name__ == "__main__":
    sys.exit(main())
