"""``bench/scale.py --testbed``: clusterctl on the testbed at N = 3, 16, 32, 64 hosts (bare runtime, 1 process per
node, bench/scale_train.py: a tiny model, an all-reduce per second, ``--lines-per-s`` numbered lines per rank).

Per N, side by side in one run:
  launch     ``clusterctl launch`` (attached) vs the same torchrun argv/env (from ``--dry-run``) started by hand
             over N parallel OpenSSH clients: command start -> rank 0's first ``step`` line (3-step job)
  steady     a long job, detached: the supervisor process's CPU (% of a core), RSS and threads over ``--window``
             s from /proc (every rank printing ``--lines-per-s`` lines/s meanwhile): CPU per 1,000 lines copied
  kill       SIGKILL of the last node's torchrun + worker: detection = kill -> the ``verdict`` event; MTTR =
             kill -> the first ``step`` line of the next attempt in the controller's log copy
  logs       the log copy: within every node's section of every attempt, ``seq`` lines without a gap or a swap

``--baseline DIR`` (a checkout of other code, e.g. ``git archive main | tar -x -C DIR``): per N, steady/kill/logs
run first with DIR's clusterctl (the CLI and its detached supervisor run with cwd and PYTHONPATH = DIR; the node
commands are the ones that code sends), then with this checkout's, on the same testbed one after the other: the
ratios of one run (this machine is shared and noisy).

Own testbed (``--prefix``/``--subnet``: ``bsc``, 10.226.0.0/24); every supervisor is stopped before it goes down.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import shlex
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from common import ROOT  # noqa: E402  (bench/scale.py runs this; common put the repository root on sys.path)

TRAIN = ROOT / "bench" / "scale_train.py"
VENV_BIN = Path(sys.prefix) / "bin"
TIMEOUT = 900.0


def code_env(code: Path | None) -> tuple[dict, str | None]:
    """(environment, cwd) that make ``python -m clusterctl.cli`` (and the supervisor it spawns) import the
    clusterctl of ``code`` (None: this checkout, as installed)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTERCTL_INVENTORY", "CLUSTERCTL_STATE_DIR")}
    if code is None:
        return env, None
    env["PYTHONPATH"] = str(code)        # before the editable install's finder; cwd too (-m puts it first)
    return env, str(code)


def cli(state: Path, *args: str, timeout: float = 300, code: Path | None = None) -> subprocess.CompletedProcess:
    env, cwd = code_env(code)
    return subprocess.run([sys.executable, "-m", "clusterctl.cli", "--state-dir", str(state), *args],
                          capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL, env=env,
                          cwd=cwd)


def write_job(path: Path, name: str, n: int, steps: int, rate: float, port: int, light: bool = False,
              probe_failures: int = 2) -> Path:
    import yaml

    job = {"name": name, "nodes": n, "nproc_per_node": 1, "script": str(TRAIN),
           "args": ["--steps", str(steps), "--lines-per-s", f"{rate:g}", *(["--light"] if light else [])],
           "torchrun": str(VENV_BIN / "torchrun"),
           "rendezvous": {"port": port, "join_timeout": 600, "last_call_timeout": 1},
           "restarts": {"max_restarts": 0, "max_failures": 0, "max_node_failures": 3, "backoff_s": 0},
           "supervisor": {"probe_interval_s": 1, "probe_failures": probe_failures}}
    path.write_text(yaml.safe_dump(job, sort_keys=False))
    return path


def _first(stream, pattern: re.Pattern, stamp: list, sink: list) -> None:
    for line in iter(stream.readline, ""):
        sink.append(line)
        if not stamp and pattern.search(line):
            stamp.append(time.monotonic())


def launch_clusterctl(state: Path, job: Path, inv: Path, node1: str) -> float:
    env = {k: v for k, v in os.environ.items() if k not in ("CLUSTERCTL_INVENTORY", "CLUSTERCTL_STATE_DIR")}
    t0 = time.monotonic()
    p = subprocess.Popen([sys.executable, "-m", "clusterctl.cli", "--state-dir", str(state), "launch", str(job),
                          "-i", str(inv)], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                         stdin=subprocess.DEVNULL, env=env)
    stamp, out = [], []
    th = threading.Thread(target=_first, args=(p.stdout, re.compile(rf"^\[{node1}/0\] step \d"), stamp, out),
                          daemon=True)
    th.start()
    try:
        p.wait(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        p.kill()
        p.wait()
    th.join(10)
    if not stamp:        # the first failure (what made it relaunch) and the last
        text = "".join(out)
        raise RuntimeError("clusterctl launch: no first step\n" + (text if len(text) <= 6000 else
                                                                    text[:3000] + "\n[...]\n" + text[-3000:]))
    return stamp[0] - t0


def launch_by_hand(plan: dict, rdzv_id: str, tb) -> float:
    def command(node: dict) -> list[str]:
        targv = [f"--rdzv-id={rdzv_id}" if a.startswith("--rdzv-id=") else a for a in node["torchrun_argv"]]
        remote = (f"cd {shlex.quote(str(TRAIN.parent))} && env "
                  + " ".join(shlex.quote(f"{k}={v}") for k, v in node["env"].items()) + " " + shlex.join(targv))
        return ["ssh", "-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
                "-o", f"UserKnownHostsFile={tb.known_hosts}", "-o", "IdentitiesOnly=yes", "-i", str(tb.key),
                f"{tb.user}@{node['address']}", remote]

    t0 = time.monotonic()
    procs = [subprocess.Popen(command(n), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              stdin=subprocess.DEVNULL) for n in plan["nodes"]]
    stamp, outs, threads = [], [[] for _ in procs], []
    for i, p in enumerate(procs):
        pat = re.compile(r"^\[0\]:step \d" if i == 0 else r"(?!)")
        t = threading.Thread(target=_first, args=(p.stdout, pat, stamp, outs[i]), daemon=True)
        t.start()
        threads.append(t)
    for p in procs:
        try:
            p.wait(timeout=TIMEOUT)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
    for t in threads:
        t.join(10)
    if not stamp:
        raise RuntimeError("by hand: no first step\n" + "".join(outs[0])[-3000:])
    return stamp[0] - t0


def proc_stat(pid: int) -> tuple[float, int, int]:
    """(CPU seconds, RSS KB, threads) of ``pid``. CPU in clock ticks (10 ms: 0.03 % of a core over a 30 s
    window, a third of a 3-node supervisor's budget); ``thread_cpu`` counts in ns."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    cpu = (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    status = Path(f"/proc/{pid}/status").read_text()
    rss = int(re.search(r"VmRSS:\s+(\d+)", status).group(1))
    threads = int(re.search(r"Threads:\s+(\d+)", status).group(1))
    return cpu, rss, threads


def thread_cpu(pid: int) -> dict[int, float]:
    """CPU seconds (ns resolution: schedstat's run time) of each live thread of ``pid``."""
    out = {}
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            out[int(tid)] = int(Path(f"/proc/{pid}/task/{tid}/schedstat").read_text().split()[0]) / 1e9
        except (OSError, ValueError, IndexError):
            pass
    return out


ROLES = (("MainThread", "loop"), ("heartbeat", "heartbeat"), ("streams", "streams"), ("Thread-", "paramiko"))


def thread_roles(pid: int) -> dict[int, str]:
    """tid -> what the thread is (``ROLES``: the supervisor loop, its heartbeat, the stream mux, paramiko's
    transport threads, else "other"), from ``py-spy dump`` (Python names no OS thread); {} without py-spy."""
    try:
        out = subprocess.run([str(VENV_BIN / "py-spy"), "dump", "--pid", str(pid)], capture_output=True, text=True,
                             timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        return {}
    return {int(tid): next((role for prefix, role in ROLES if name.startswith(prefix)), "other")
            for tid, name in re.findall(r'^Thread (\d+) \([^)]*\): "([^"]*)"', out, re.M)}


def cpu_by_role(before: dict[int, float], after: dict[int, float], roles: dict[int, str],
                seconds: float) -> dict[str, float]:
    """ms of CPU a second per thread role (``thread_roles``) between two ``thread_cpu``."""
    out: dict[str, float] = {}
    for tid, v in after.items():
        role = roles.get(tid, "other")
        out[role] = out.get(role, 0.0) + 1000 * (v - before.get(tid, 0.0)) / seconds
    return {k: round(v, 3) for k, v in sorted(out.items())}



def count_lines(path: Path) -> int:
    try:
        with open(path, "rb") as f:
            return sum(chunk.count(b"\n") for chunk in iter(lambda: f.read(1 << 20), b""))
    except OSError:
        return 0


def check_log(path: Path) -> dict:
    """Within every node's section of every attempt, ``seq`` numbers must run 0, 1, 2, ... (no gap, no swap)."""
    expect: dict[tuple[str, str], int] = {}
    section: dict[str, str] = {}
    bad = lines = torn = 0
    rx = re.compile(r"^\[([^/]+)/(\S+)\] (.*)$")
    with open(path, errors="replace") as f:
        for line in f:
            m = rx.match(line.rstrip("\n"))
            if not m:
                continue
            node, rank, text = m.groups()
            if rank == "-" and text.startswith("=== attempt "):
                section[node] = text
                continue
            split = re.fullmatch(r"seq (\d+)\[\d+\]:", text)
            if split:            # torchrun's --tee split a partial line ("[0]:seq 7[0]:\n" in the node's own log)
                text = f"seq {split.group(1)}"
                torn += 1
            if text.startswith("seq ") and text[4:].isdigit():
                lines += 1
                key = (node, section.get(node, ""))
                k = int(text[4:])
                if k != expect.get(key, 0):
                    bad += 1
                expect[key] = k + 1
    return {"seq_lines": lines, "seq_bad": bad, "torn_by_torchrun": torn}


def events(state: Path, name: str, code: Path | None = None) -> list[dict]:
    r = cli(state, "events", name, "--output", "json", code=code)
    return json.loads(r.stdout) if r.returncode == 0 else []


def steady_and_kill(tb, base: Path, n: int, inv: Path, rate: float, window: float, port: int,
                    code: Path | None = None, tag: str = "", light: bool = False, probe_failures: int = 2) -> dict:
    state = base / f"state-long-{n}{tag}"
    job = write_job(base / f"sl{n}{tag}.yaml", f"sl{n}", n, 100000, rate, port, light, probe_failures)
    r = cli(state, "launch", str(job), "-i", str(inv), "-d", "-o", "json", timeout=TIMEOUT, code=code)
    if r.returncode != 0:
        raise RuntimeError(f"launch -d failed: {r.stderr[-2000:]}")
    pid = json.loads(r.stdout)["supervisor_pid"]
    log = next(state.rglob("output.log"), None)
    out: dict = {"supervisor_pid": pid}
    try:
        end = time.monotonic() + TIMEOUT
        while time.monotonic() < end:          # every node's rank printing
            if not os.path.exists(f"/proc/{pid}"):
                st = cli(state, "status", f"sl{n}", "-o", "json", code=code).stdout
                raise RuntimeError(f"the job ended before every node printed a step: {st[-1500:]}")
            log = log or next(state.rglob("output.log"), None)
            if log and log.exists():
                text = log.read_text(errors="replace")
                if all(re.search(rf"^\[{h.name}/\d+\] step ", text, re.M) for h in tb.hosts[:n]):   # rank = node-1
                    break
            time.sleep(1)
        time.sleep(5)
        c0, _, _ = proc_stat(pid)
        n0 = thread_cpu(pid)
        l0, t0 = count_lines(log), time.monotonic()
        time.sleep(window)
        c1, rss, threads = proc_stat(pid)
        n1 = thread_cpu(pid)
        l1, t1 = count_lines(log), time.monotonic()
        by_thread = out["cpu_ms_per_s_by_thread"] = cpu_by_role(n0, n1, thread_roles(pid), t1 - t0)
        ended = len(set(n0) - set(n1))         # a thread that ended took its last stretch out of the ns sums
        cpu = sum(by_thread.values()) * (t1 - t0) / 1000 if not ended else c1 - c0
        out.update(cpu_pct=100 * cpu / (t1 - t0), cpu_pct_ticks=100 * (c1 - c0) / (t1 - t0), threads_ended=ended,
                   rss_mb=rss / 1024, threads=threads, lines_per_s=(l1 - l0) / (t1 - t0),
                   cpu_ms_per_1000_lines=1e6 * cpu / max(1, l1 - l0))
        out["cpu_pct_per_node"] = out["cpu_pct"] / n
        # kill the last node's torchrun agent and worker
        victim = tb.hosts[n - 1].name
        size0 = log.stat().st_size
        kill_wall = time.time()
        kill_t = time.monotonic()
        tb.kill(victim, pattern=r"torchrun|scale_train")
        step_at = None
        end = time.monotonic() + 600
        with open(log, errors="replace") as f:
            f.seek(size0)
            seen_attempt2 = False
            buf = ""
            while time.monotonic() < end and step_at is None:
                chunk = f.read()
                if not chunk:
                    time.sleep(0.1)
                    continue
                buf += chunk
                *lines, buf = buf.split("\n")
                for line in lines:
                    if "/-] === attempt 2 ===" in line:
                        seen_attempt2 = True
                    elif seen_attempt2 and re.match(r"^\[[^/]+/0\] step \d", line):
                        step_at = time.monotonic()
                        break
        evs = events(state, f"sl{n}", code)
        verdict = next((e for e in evs if e["kind"] == "verdict" and e.get("class") in
                        ("node_lost", "rendezvous_lost")), None)
        out["detect_s"] = verdict["time"] - kill_wall if verdict else None
        out["mttr_s"] = step_at - kill_t if step_at else None
        out["verdict"] = verdict["message"] if verdict else None
    finally:
        cli(state, "stop", f"sl{n}", "--grace", "2", timeout=300, code=code)
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and os.path.exists(f"/proc/{pid}"):
            time.sleep(0.5)
        if os.path.exists(f"/proc/{pid}"):
            os.kill(pid, signal.SIGKILL)
    if log:
        out.update(check_log(log))
    return out


def main(args) -> int:
    """``args``: bench/scale.py's options (it has set up the teardown on SIGTERM/SIGHUP)."""
    from tests.testbed import Testbed, profile
    from tests.testbed.system import address_in_use

    sizes = [int(s) for s in (args.sizes or "3,16,32,64").split(",")]
    steady_only = {int(s) for s in (args.steady_only or "").split(",") if s}
    n_max = max(sizes)
    baseline = Path(args.baseline).resolve() if getattr(args, "baseline", None) else None
    if baseline is not None and not (baseline / "clusterctl" / "__init__.py").is_file():
        raise SystemExit(f"--baseline {baseline}: no clusterctl package there")
    subnet = args.subnet
    if address_in_use(f"10.{subnet}.0.1"):
        raise RuntimeError(f"10.{subnet}.0.1 in use")
    base = Path(tempfile.mkdtemp(prefix="clusterctl-bench-scale-"))
    tb = Testbed(n_max, base / "tb", [profile(gpus=0, image=False)] * n_max, prefix=args.prefix,
                 subnet_octet=subnet)
    rows: list[dict] = []
    stopped_at = None
    try:
        tb.up()
        for n in sizes:
            row: dict = {"n": n, "load": os.getloadavg()[0], "mem_avail_gb": _mem_avail_gb()}
            try:
                inv = tb.inventory(base / f"inv-{n}.yaml", runtime="bare", hosts=[h.name for h in tb.hosts[:n]])
                if n not in steady_only:
                    job = write_job(base / f"sb{n}.yaml", f"sb{n}", n, 3, args.log_rate, 29480, args.light,
                                    args.probe_failures)
                    r = cli(base / "state-dry", "launch", str(job), "-i", str(inv), "--dry-run", "--output", "json")
                    if r.returncode != 0:
                        raise RuntimeError(f"dry run: {r.stderr[-1000:]}")
                    plan = json.loads(r.stdout)
                    row["hand_first_step_s"] = launch_by_hand(plan, f"sb{n}-hand", tb)
                    print(json.dumps(row), file=sys.stderr, flush=True)
                    row["cc_first_step_s"] = launch_clusterctl(base / f"state-{n}", job, inv, tb.hosts[0].name)
                    row["launch_ratio"] = row["cc_first_step_s"] / row["hand_first_step_s"]
                    print(json.dumps(row), file=sys.stderr, flush=True)
                if baseline is not None:        # the other code first, then this checkout's, same testbed
                    brow = {"n": n, "code": "baseline", "load": os.getloadavg()[0]}
                    try:
                        brow.update(steady_and_kill(tb, base, n, inv, args.log_rate, args.window, 29481,
                                                    code=baseline, tag="-baseline", light=args.light,
                                                    probe_failures=args.probe_failures))
                    except Exception as e:  # noqa: BLE001 - measure as far as it goes, say where it stopped
                        brow["error"] = f"{type(e).__name__}: {str(e)[-1500:]}"
                    print(json.dumps(brow), flush=True)
                    rows.append(brow)
                    row["code"], row["load"] = "this", os.getloadavg()[0]
                row.update(steady_and_kill(tb, base, n, inv, args.log_rate, args.window, 29481, light=args.light,
                                           probe_failures=args.probe_failures))
            except Exception as e:  # noqa: BLE001 - measure as far as it goes, say where it stopped
                row["error"] = f"{type(e).__name__}: {str(e)[-7000:]}"
                stopped_at = n
            row["mem_avail_gb_end"] = _mem_avail_gb()
            print(json.dumps(row), flush=True)
            rows.append(row)
            if stopped_at is not None:
                break
    finally:
        tb.down()
        subprocess.run(["rm", "-rf", str(base)], check=False)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1))
    print(table(rows))
    if not args.no_write:
        from docsection import write_subsection

        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        notes = [f"- {r['n']} nodes: stopped here: {r['error']}" for r in rows if r.get("error")]
        write_subsection("## scale", "### testbed", "\n".join([
            "### testbed", "",
            f"`python bench/scale.py --testbed --sizes {args.sizes or '3,16,32,64'} --log-rate {args.log_rate:g}"
            f"{' --light' if args.light else ''}` ({when}, {os.cpu_count()} cores, Linux {platform.release()}, bare "
            f"runtime, 1 process per node{' (torch-free worker)' if args.light else ''}, {args.log_rate:g} lines/s "
            f"per rank, steady window {args.window:g} s; one run per cell).", "", table(rows), "", *notes, ""]))
    return 0


def _mem_avail_gb() -> float:
    text = Path("/proc/meminfo").read_text()
    return int(re.search(r"MemAvailable:\s+(\d+)", text).group(1)) / 2**20


def _f(v, spec="{:.2f}"):
    return "-" if v is None else spec.format(v)


def table(rows: list[dict]) -> str:
    out = ["| nodes | code | first step: by hand s | clusterctl s | ratio | supervisor CPU % of a core | % per node | "
           "RSS MB | threads | lines/s copied | CPU ms / 1,000 lines | kill → verdict s | MTTR s | "
           "lines lost/reordered |", "|---:|---|" + "---:|" * 12]
    for r in rows:
        out.append(f"| {r['n']} | {r.get('code', '-')} | {_f(r.get('hand_first_step_s'), '{:.1f}')} | "
                   f"{_f(r.get('cc_first_step_s'), '{:.1f}')} | {_f(r.get('launch_ratio'))} | "
                   f"{_f(r.get('cpu_pct'), '{:.1f}')} | {_f(r.get('cpu_pct_per_node'), '{:.3f}')} | "
                   f"{_f(r.get('rss_mb'), '{:.0f}')} | {r.get('threads', '-')} | {_f(r.get('lines_per_s'), '{:.0f}')} | "
                   f"{_f(r.get('cpu_ms_per_1000_lines'), '{:.0f}')} | {_f(r.get('detect_s'))} | "
                   f"{_f(r.get('mttr_s'), '{:.1f}')} | "
                   + (f"{r['seq_bad']} of {r['seq_lines']} |" if "seq_lines" in r else "- |"))
    return "\n".join(out)
