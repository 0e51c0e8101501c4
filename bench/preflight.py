#!/usr/bin/env python3
"""Preflight benchmark: a full ``run_preflight`` vs the same probe scripts through parallel OpenSSH clients.

    python bench/preflight.py [--sizes 8,32,64] [--reps 1] [--no-write] [--prefix bpf --subnet 232]

Brings up its own testbed (prefix ``bpf``, subnet 10.232.0.0/24, 2 stub GPUs per host, podman, no image), a job
with ``checkpoint.dir`` on the testbed's shared storage (so phase 2 runs: rendezvous listener + shared-storage
nonce), then for each size N, side by side in the same run (order rotated per repetition):

  clusterctl    ``run_preflight(hosts, connect=..., job=...)``: every host and cluster check, in-process
  transport     clusterctl's SSH transport only: ``fan_out`` of connect + ``sh -c PROBE`` + close, i.e. the
                probes' own cost (SSH + remote commands) without preflight's parsing, judging and phase 2
  openssh       N ``ssh ... user@addr sh -c PROBE`` Popen'ed at once, PROBE = ``build_probe_script`` per host

and, at the largest size, clusterctl again with one host (not the rendezvous host) partitioned.

Measures wall time and controller CPU (clusterctl/transport: ``getrusage(RUSAGE_SELF)`` delta; openssh:
``RUSAGE_CHILDREN`` delta + this process's own cost), counts SSH connections and remote commands per host
for clusterctl (by wrapping ``connect``), and writes a table into docs/benchmarks.md under ``## preflight``.
The testbed is torn down at the end, even on error or SIGTERM.
"""
from __future__ import annotations

import datetime
import resource
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import common  # noqa: E402  (puts the repository root on sys.path)
from common import cpu_s, exit_on_signals, parallel, ssh_argv  # noqa: E402

from clusterctl.checks import PreflightJob, PreflightOptions, run_preflight  # noqa: E402
from clusterctl.checks.probe import build_probe_script  # noqa: E402
from clusterctl.config import inventory  # noqa: E402
from clusterctl.transport import ConnectOptions, connect, fan_out  # noqa: E402
from tests.testbed import Testbed, profile  # noqa: E402

SECTION = "## preflight"
GOAL_CPU_MS = 5.0
CONNECT_TIMEOUT_S = 5.0


class Counting:
    """Wraps ``connect``: counts transports (SSH connections) and ``run`` calls (remote commands) per host."""

    def __init__(self, opts: ConnectOptions):
        self.opts = opts
        self.lock = threading.Lock()
        self.conns: dict[str, int] = {}
        self.cmds: dict[str, int] = {}

    def __call__(self, host):
        tr = connect(host, self.opts)
        with self.lock:
            self.conns[host.name] = self.conns.get(host.name, 0) + 1
        run, counter = tr.run, self

        def counted(argv, **kw):
            with counter.lock:
                counter.cmds[host.name] = counter.cmds.get(host.name, 0) + 1
            return run(argv, **kw)

        tr.run = counted
        return tr


def run_clusterctl(hosts, opts, job) -> dict:
    c = Counting(opts)
    c0, t0 = cpu_s(resource.RUSAGE_SELF), time.perf_counter()
    report = run_preflight(hosts, connect=c, job=job, options=PreflightOptions())
    wall, cpu = time.perf_counter() - t0, cpu_s(resource.RUSAGE_SELF) - c0
    ssh_ok = sum(1 for h in report.hosts if h.get("ssh").status == "pass")
    for h in report.hosts:
        if h.get("ssh").status != "pass":
            print(f"  {h.host}: ssh {h.get('ssh').status}: {h.get('ssh').detail}", file=sys.stderr)
    cl = {x.id: x.status for x in report.cluster}
    return {"wall": wall, "cpu": cpu, "ok": ssh_ok, "conns": max(c.conns.values()),
            "cmds": max(c.cmds.values()), "cluster": cl}


def probe_scripts(hosts, job) -> list[str]:
    return [build_probe_script(h, job, PreflightOptions()) for h in hosts]


def run_transport(hosts, opts, scripts) -> dict:
    by = {h.name: s for h, s in zip(hosts, scripts)}

    def one(h):
        t = connect(h, opts)
        try:
            return t.run(["sh", "-c", by[h.name]], timeout=60)
        finally:
            t.close()

    c0, t0 = cpu_s(resource.RUSAGE_SELF), time.perf_counter()
    rs = fan_out(hosts, one, max_workers=64, host_timeout=120)
    wall, cpu = time.perf_counter() - t0, cpu_s(resource.RUSAGE_SELF) - c0
    return {"wall": wall, "cpu": cpu, "ok": sum(1 for r in rs if r.ok and "@@cc>clock1" in r.value.stdout),
            "conns": 1, "cmds": 1}


def run_openssh(tb, hosts, scripts) -> dict:
    wall, cpu, res = parallel([ssh_argv(tb, h.address, ["sh", "-c", s], connect_timeout=CONNECT_TIMEOUT_S)
                               for h, s in zip(hosts, scripts)])
    return {"wall": wall, "cpu": cpu, "ok": sum(1 for _, o in res if b"@@cc>clock1" in o), "conns": 1, "cmds": 1}


def main(argv=None) -> int:
    ap = common.parser(__doc__.split("\n\n")[0], prefix="bpf", subnet=232, sizes="8,32,64", reps=1)
    args = ap.parse_args(argv)
    sizes = common.sizes_of(args)
    n_max = max(sizes)
    exit_on_signals()

    base = Path(tempfile.mkdtemp(prefix="clusterctl-bench-preflight-"))
    tb = Testbed(n_max, base, [profile(gpus=2, image=False)] * n_max, prefix=args.prefix,
                 subnet_octet=args.subnet)
    samples: dict[tuple[int, str], list[dict]] = {}
    where = common.machine("sshd, podman, the stub tools and the clients", load=True)
    try:
        t0 = time.monotonic()
        tb.up()
        print(f"testbed {args.prefix}: {n_max} hosts up in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        all_hosts = list(inventory.load(str(tb.inventory(base / "inventory.yaml", runtime="podman"))).hosts)
        (tb.shared / "ckpt").mkdir(parents=True, exist_ok=True)
        job = PreflightJob(image="localhost/pytorch-cuda:v2.7-ssh", nproc_per_node=2,
                           checkpoint_dir=str(tb.shared / "ckpt"))
        user_kh = base / "user_known_hosts"
        user_kh.write_text("")
        opts = ConnectOptions(connect_timeout=CONNECT_TIMEOUT_S, known_hosts=str(user_kh),
                              ssh_config=str(base / "no_ssh_config"))
        run_clusterctl(all_hosts[:min(4, n_max)], opts, job)       # warm-up (imports, page cache), not measured
        for rep in range(args.reps):
            for n in sizes:
                hosts = all_hosts[:n]
                scripts = probe_scripts(hosts, job)
                methods = {"clusterctl": lambda: run_clusterctl(hosts, opts, job),
                           "transport": lambda: run_transport(hosts, opts, scripts),
                           "openssh": lambda: run_openssh(tb, hosts, scripts)}
                k = (rep + sizes.index(n)) % len(methods)
                for name in list(methods)[k:] + list(methods)[:k]:
                    r = methods[name]()
                    samples.setdefault((n, name), []).append(r)
                    print(f"rep {rep + 1} n={n:3d} {name:10s} wall {r['wall']:6.2f}s "
                          f"cpu {r['cpu'] * 1000 / n:6.1f} ms/host ok {r['ok']}/{n} conns/host {r['conns']} "
                          f"cmds/host {r['cmds']} {r.get('cluster', '')}", file=sys.stderr)
        # one dead host (partitioned, not the rendezvous host) at the largest size
        dead = all_hosts[n_max // 2]
        tb.partition(dead.name)
        for rep in range(args.reps):
            r = run_clusterctl(all_hosts, opts, job)
            samples.setdefault((n_max, "clusterctl-dead"), []).append(r)
            print(f"rep {rep + 1} n={n_max:3d} dead host  wall {r['wall']:6.2f}s ok {r['ok']}/{n_max} "
                  f"{r['cluster']}", file=sys.stderr)
        tb.heal(dead.name)
    finally:
        t0 = time.monotonic()
        tb.down()
        print(f"testbed {args.prefix}: down in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        subprocess.run(["rm", "-rf", str(base)], check=False)

    def med(n, name, key):
        return statistics.median(s[key] for s in samples[(n, name)])

    rows = ["| hosts | method | wall s (median) | controller CPU ms/host | SSH connections/host | "
            "remote commands/host | hosts ok |", "|---:|---|---:|---:|---:|---:|---|"]
    goals = []
    for n in sizes:
        for name in ("clusterctl", "transport", "openssh"):
            s = samples[(n, name)]
            rows.append(f"| {n} | {name} | {med(n, name, 'wall'):.2f} | {med(n, name, 'cpu') * 1000 / n:.1f} | "
                        f"{max(x['conns'] for x in s)} | {max(x['cmds'] for x in s)} | "
                        f"{min(x['ok'] for x in s)}/{n} |")
        cw, ow = med(n, "clusterctl", "wall"), med(n, "openssh", "wall")
        extra = (med(n, "clusterctl", "cpu") - med(n, "transport", "cpu")) * 1000 / n
        s = samples[(n, "clusterctl")]
        goals.append(f"- {n} hosts: wall {cw:.2f}s vs OpenSSH {ow:.2f}s -> "
                     f"{'<= baseline: met' if cw <= ow else 'SLOWER than baseline: not met'}"
                     f"{' (goal is for 64 hosts)' if n != 64 else ''}; controller CPU beyond the probes' own "
                     f"cost {extra:+.1f} ms/host -> {'<= 5 ms: met' if extra <= GOAL_CPU_MS else '> 5 ms: NOT met'}"
                     f"; connections/host {max(x['conns'] for x in s)}, remote commands/host "
                     f"{max(x['cmds'] for x in s)} -> "
                     f"{'met' if max(x['conns'] for x in s) == 1 and max(x['cmds'] for x in s) <= 2 else 'NOT met'}")
    if (n_max, "clusterctl-dead") in samples:
        d = med(n_max, "clusterctl-dead", "wall")
        rows.append(f"| {n_max} | clusterctl, 1 host partitioned | {d:.2f} | "
                    f"{med(n_max, 'clusterctl-dead', 'cpu') * 1000 / n_max:.1f} | "
                    f"{max(x['conns'] for x in samples[(n_max, 'clusterctl-dead')])} | "
                    f"{max(x['cmds'] for x in samples[(n_max, 'clusterctl-dead')])} | "
                    f"{min(x['ok'] for x in samples[(n_max, 'clusterctl-dead')])}/{n_max} |")
        added = d - med(n_max, "clusterctl", "wall")
        goals.append(f"- one dead host at {n_max} hosts adds {added:+.2f}s (connect timeout {CONNECT_TIMEOUT_S:g}s)"
                     f" -> {'met' if added <= CONNECT_TIMEOUT_S else 'NOT met'}")
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    section = "\n".join([
        SECTION, "",
        f"Measured {when} on {where}. {args.reps} repetition(s) per cell, order rotated; medians. Rerun: "
        f"`python bench/preflight.py --sizes {args.sizes} --reps {args.reps}` (as root; it builds and removes its "
        f"own testbed, prefix `{args.prefix}`, 10.{args.subnet}.0.0/24).", "",
        "- Hosts: 2 stub GPUs each, podman (real `podman info`, `podman image inspect`), no image; the job has "
        "`checkpoint.dir` on the testbed's shared storage, so every full run includes phase 2 (rendezvous "
        "listener + shared-storage nonce).",
        "- **clusterctl**: `run_preflight` with every host and cluster check, in-process; connections and remote "
        "commands counted by wrapping `connect`. CPU = `getrusage(RUSAGE_SELF)` delta.",
        "- **transport**: the same per-host probe scripts (`build_probe_script`) through clusterctl's SSH "
        "transport, one connect + `sh -c SCRIPT` + close per host: the probes' own cost. clusterctl minus "
        "transport = what preflight itself adds (parsing, judging, phase 2).",
        "- **openssh**: the same scripts through N `ssh -F /dev/null -o BatchMode=yes ... user@addr 'sh -c SCRIPT'` "
        "started at once. CPU = `getrusage(RUSAGE_CHILDREN)` delta + this process's own cost.",
        "- Everything (64 sshd, podman, stub tools, clients) shares this machine's cores, so wall time is mostly the "
        "remote side's CPU; other load on the machine shows up as noise.", "",
        *rows, "", "Goals (from the issue):", "", *goals, ""])
    common.publish(SECTION, section, write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
