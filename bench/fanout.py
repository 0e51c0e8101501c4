#!/usr/bin/env python3
"""Fan-out benchmark: clusterctl's SSH transport vs N parallel OpenSSH clients, on a real testbed.

    python bench/fanout.py [--sizes 8,32,64] [--reps 3] [--no-write] [--profile]

Brings up its own testbed (prefix ``bfa``, subnet 10.231.0.0/24, no container image), then for each size N,
side by side in the same run and alternating the order per repetition:

  clusterctl   ``fan_out(hosts, lambda h: connect(h, opts).run(argv) ...)``, connect and close included
  openssh      N ``ssh -o BatchMode=yes -o StrictHostKeyChecking=yes ... user@addr CMD`` started in parallel

for two commands: ``true`` and a preflight-like probe (``nproc; uname -r; df; ss -Hltn; ip -o addr show``).
Measures wall time and client CPU per host (clusterctl: getrusage(RUSAGE_SELF) delta of this process;
OpenSSH: getrusage(RUSAGE_CHILDREN) delta, plus this process's own fork/exec/wait cost). Prints a markdown
table and writes it into docs/benchmarks.md under ``## fan-out`` (other sections are left alone).
``--profile`` adds a cProfile of connect+run+close for the largest size (sequential, so one thread's profile
covers every host) and prints the top functions. The testbed is torn down at the end, even on error.
"""
from __future__ import annotations

import cProfile
import dataclasses
import datetime
import io
import pstats
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: E402  (puts the repository root on sys.path)
from common import ROOT, cpu_s, exit_on_signals, machine, parallel, ssh_argv  # noqa: E402

from clusterctl.config import inventory  # noqa: E402
from clusterctl.transport import ConnectOptions, connect, fan_out  # noqa: E402
from tests.testbed import Testbed, profile  # noqa: E402

PROBE = "nproc; uname -r; df -P -B1 /; ss -Hltn; ip -o addr show"
COMMANDS = {"true": ["true"], "probe": ["sh", "-c", PROBE]}

SECTION = "## fan-out"
GOAL_CPU_MS = 15.0
METHODS = ("clusterctl", "clusterctl-kh1000", "clusterctl-exec", "openssh", "openssh-c25519")
KH_PAD = 1000  # unrelated entries in the user known_hosts for clusterctl-kh1000


NOTES = """\
Notes:

- The OpenSSH default row is dominated by the client's post-quantum key exchange (sntrup761 key generation,
  ~0.11 s CPU per connection on this CPU); with the same key exchange as paramiko (curve25519) OpenSSH costs
  ~15 ms client CPU per host and is 1.2-1.4x slower than clusterctl in wall time at 32-64 hosts.
- clusterctl's wall time at 64 hosts is mostly the 64 sshds' side of the handshake on the same 2 cores
  (client CPU is ~0.5 s of the ~1.2 s).
- Fixed while measuring (commit 57bd0fc): `known_keys` parsed every key in every known_hosts file, twice per
  connection; with a 1000-line user known_hosts a 64-host fan-out took 51-90 ms client CPU per host and
  3.8-5.8 s (slower than OpenSSH). It now matches host names first: 10-11 ms per host and ~1.3 s. The
  `clusterctl-kh1000` rows guard this.
"""


def run_clusterctl(hosts, argv, opts) -> tuple[float, float, int]:
    """-> (wall s, client CPU s, hosts ok)."""
    def one(h):
        t = connect(h, opts)
        try:
            return t.run(argv)
        finally:
            t.close()

    c0, t0 = cpu_s(resource.RUSAGE_SELF), time.perf_counter()
    rs = fan_out(hosts, one, max_workers=64, host_timeout=120)
    wall, cpu = time.perf_counter() - t0, cpu_s(resource.RUSAGE_SELF) - c0
    return wall, cpu, sum(1 for r in rs if r.ok and r.value.exit_code == 0 and (argv == ["true"] or r.value.stdout))


def run_exec_cli(inv_path: Path, hosts, argv) -> tuple[float, float, int]:
    """``clusterctl exec`` as a user runs it: a new Python process (start-up included), -o json."""
    cmd = [sys.executable, "-m", "clusterctl.cli", "exec", "-i", str(inv_path), "--limit",
           ",".join(h.name for h in hosts), "-o", "json", "--", *argv]
    s0, c0, t0 = cpu_s(resource.RUSAGE_SELF), cpu_s(resource.RUSAGE_CHILDREN), time.perf_counter()
    p = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=300, cwd=str(ROOT))
    wall = time.perf_counter() - t0
    cpu = (cpu_s(resource.RUSAGE_CHILDREN) - c0) + (cpu_s(resource.RUSAGE_SELF) - s0)
    import json

    try:
        res = json.loads(p.stdout)
    except ValueError:
        res = []
    return wall, cpu, sum(1 for r in res if r["exit_code"] == 0 and (argv == ["true"] or r["stdout"]))


def run_openssh(tb, known_hosts, hosts, argv, kex: str | None = None) -> tuple[float, float, int]:
    wall, cpu, res = parallel([ssh_argv(tb, h.address, argv, known_hosts=known_hosts, kex=kex) for h in hosts])
    return wall, cpu, sum(1 for rc, o in res if rc == 0 and (argv == ["true"] or o))


def profile_clusterctl(hosts, opts, top: int = 25) -> str:
    prof = cProfile.Profile()
    c0, t0 = cpu_s(resource.RUSAGE_SELF), time.perf_counter()
    prof.enable()
    for h in hosts:
        t = connect(h, opts)
        try:
            t.run(["true"])
        finally:
            t.close()
    prof.disable()
    wall, cpu = time.perf_counter() - t0, cpu_s(resource.RUSAGE_SELF) - c0
    buf = io.StringIO()
    buf.write(f"sequential connect+run(true)+close on {len(hosts)} hosts under cProfile: {wall:.2f}s wall, "
              f"{cpu * 1000 / len(hosts):.1f} ms CPU/host (profiler overhead included)\n")
    st = pstats.Stats(prof, stream=buf)
    st.sort_stats("tottime").print_stats(top)
    st.sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def fmt_table(rows) -> str:
    out = ["| hosts | command | method | wall s (median) | wall s (min-max) | client CPU ms/host (median) | ok |",
           "|---:|---|---|---:|---|---:|---|"]
    for r in rows:
        out.append(f"| {r['n']} | {r['cmd']} | {r['method']} | {r['wall']:.2f} | {r['wmin']:.2f}-{r['wmax']:.2f} "
                   f"| {r['cpu']:.1f} | {r['ok']} |")
    return "\n".join(out)


def verdict(rows, sizes) -> list[str]:
    lines = []
    get = {(r["n"], r["cmd"], r["method"]): r for r in rows}
    for cmd in COMMANDS:
        for n in sizes:
            a, b, c = (get.get((n, cmd, m)) for m in ("clusterctl", "openssh", "openssh-c25519"))
            if not a or not b or not c:
                continue
            faster = a["wall"] <= min(b["wall"], c["wall"])
            if (x := get.get((n, cmd, "clusterctl-exec"))):
                lines.append(f"- {cmd}, {n} hosts: `clusterctl exec` (CLI, start-up included) {x['wall']:.2f}s vs "
                             f"parallel OpenSSH {b['wall']:.2f}s (curve25519: {c['wall']:.2f}s) -> "
                             + ("no slower: met" if x["wall"] <= min(b["wall"], c["wall"]) else "SLOWER: not met"))
            lines.append(f"- {cmd}, {n} hosts: clusterctl {a['wall']:.2f}s vs OpenSSH {b['wall']:.2f}s "
                         f"(curve25519: {c['wall']:.2f}s) -> "
                         f"{'no slower: met' if faster else 'SLOWER: not met'}; client CPU {a['cpu']:.1f} vs "
                         f"{b['cpu']:.1f} ({c['cpu']:.1f}) ms/host -> "
                         f"{'< 15 ms: met' if a['cpu'] < GOAL_CPU_MS else '>= 15 ms: NOT met'}"
                         + (f" (with a {KH_PAD}-line known_hosts: {k['cpu']:.1f} ms/host, {k['wall']:.2f}s)"
                            if (k := get.get((n, cmd, "clusterctl-kh1000"))) else ""))
    return lines


def main(argv=None) -> int:
    ap = common.parser(__doc__.split("\n\n")[0], prefix="bfa", subnet=231, sizes="8,32,64", reps=3)
    ap.add_argument("--profile", action="store_true", help="also cProfile clusterctl on the largest size")
    args = ap.parse_args(argv)
    sizes = common.sizes_of(args)
    n_max = max(sizes)

    exit_on_signals()   # so the finally below tears the testbed down

    base = Path(tempfile.mkdtemp(prefix="clusterctl-bench-fanout-"))
    tb = Testbed(n_max, base, [profile(gpus=0, image=False)] * n_max, prefix=args.prefix,
                 subnet_octet=args.subnet)
    samples: dict[tuple[int, str, str], list[tuple[float, float, int]]] = {}
    prof_text = ""
    try:
        t0 = time.monotonic()
        tb.up()
        print(f"testbed {args.prefix}: {n_max} hosts up in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        inv_path = tb.inventory(base / "inventory.yaml", runtime="bare")
        all_hosts = list(inventory.load(str(inv_path)).hosts)
        user_kh = base / "user_known_hosts"
        user_kh.write_text("")
        opts = ConnectOptions(connect_timeout=30, command_timeout=60, connect_retries=0,
                              known_hosts=str(user_kh), ssh_config=str(base / "no_ssh_config"))
        big_kh = base / "user_known_hosts_big"
        pub = tb.key.with_suffix(".pub").read_text().split()  # any valid key: these hosts never answer
        big_kh.write_text("".join(f"10.254.{i // 250}.{i % 250} {pub[0]} {pub[1]}\n" for i in range(KH_PAD)))
        opts_big = dataclasses.replace(opts, known_hosts=str(big_kh))
        methods = {
            "clusterctl": lambda hosts, argv: run_clusterctl(hosts, argv, opts),
            "clusterctl-kh1000": lambda hosts, argv: run_clusterctl(hosts, argv, opts_big),
            "clusterctl-exec": lambda hosts, argv: run_exec_cli(inv_path, hosts, argv),
            "openssh": lambda hosts, argv: run_openssh(tb, str(tb.known_hosts), hosts, argv),
            # the same key exchange as paramiko (OpenSSH 9.x defaults to sntrup761x25519, ~0.12 s client CPU)
            "openssh-c25519": lambda hosts, argv: run_openssh(tb, str(tb.known_hosts), hosts, argv,
                                                              kex="curve25519-sha256"),
        }
        # warm-up (page cache, sshd binaries, Python imports), not measured
        for m in methods.values():
            m(all_hosts[:min(8, n_max)], ["true"])
        for rep in range(args.reps):
            for n in sizes:
                hosts = all_hosts[:n]
                for cmd, cargv in COMMANDS.items():
                    k = (rep + sizes.index(n)) % len(methods)  # rotate: each method takes each position
                    order = list(methods)[k:] + list(methods)[:k]
                    for name in order:
                        wall, cpu, ok = methods[name](hosts, cargv)
                        samples.setdefault((n, cmd, name), []).append((wall, cpu, ok))
                        print(f"rep {rep + 1}/{args.reps} n={n:3d} {cmd:5s} {name:10s} wall {wall:6.2f}s "
                              f"cpu {cpu * 1000 / n:6.1f} ms/host ok {ok}/{n}", file=sys.stderr)
        if args.profile:
            prof_text = profile_clusterctl(all_hosts, opts)
    finally:
        t0 = time.monotonic()
        tb.down()
        print(f"testbed {args.prefix}: down in {time.monotonic() - t0:.1f}s", file=sys.stderr)
        subprocess.run(["rm", "-rf", str(base)], check=False)

    rows = []
    for n in sizes:
        for cmd in COMMANDS:
            for name in METHODS:
                s = samples[(n, cmd, name)]
                walls = [w for w, _, _ in s]
                rows.append({"n": n, "cmd": cmd, "method": name, "wall": statistics.median(walls),
                             "wmin": min(walls), "wmax": max(walls),
                             "cpu": statistics.median(c * 1000 / n for _, c, _ in s),
                             "ok": f"{min(o for _, _, o in s)}/{n}"})
    table = fmt_table(rows)
    checks = verdict(rows, sizes)
    when = datetime.datetime.now().astimezone().strftime("%Y-%m-%d %H:%M %Z")
    section = "\n".join([
        SECTION, "",
        f"Measured {when} on {machine('sshd and clients')}. {args.reps} repetitions per cell, order alternated per "
        "repetition; "
        f"medians. Rerun: `python bench/fanout.py --sizes {args.sizes} --reps {args.reps}` (as root; it builds "
        f"and removes its own testbed, prefix `{args.prefix}`, 10.{args.subnet}.0.0/24).", "",
        "- **clusterctl**: `fan_out(hosts, connect(h, opts).run(argv); close())`, 64 workers, fresh connection "
        "per host (TCP connect, SSH handshake, host-key check, publickey auth, one exec, close). Client CPU = "
        "`getrusage(RUSAGE_SELF)` delta of the benchmark process.",
        "- **clusterctl-exec**: the `clusterctl exec -i INV --limit HOSTS -o json -- CMD` command line in a new "
        "process, Python start-up and imports included (what an on-call engineer waits for). Client CPU = "
        "`getrusage(RUSAGE_CHILDREN)` delta.",
        f"- **clusterctl-kh1000**: the same with {KH_PAD} unrelated entries in the user known_hosts file (a "
        "long-lived login node's `~/.ssh/known_hosts`); guards against per-connection costs that grow with it.",
        "- **openssh**: N `ssh -F /dev/null -o BatchMode=yes -o StrictHostKeyChecking=yes -o UserKnownHostsFile=KH "
        "-o IdentitiesOnly=yes -i KEY user@addr CMD` started at once (Popen all, then wait). Client CPU = "
        "`getrusage(RUSAGE_CHILDREN)` delta (the ssh processes) + this process's own fork/exec/wait cost.",
        "- **openssh-c25519**: the same with `-o KexAlgorithms=curve25519-sha256`, the key exchange paramiko "
        "negotiates. OpenSSH 9.x defaults to the post-quantum hybrid `sntrup761x25519-sha512`, whose client "
        "key generation alone costs ~0.12 s CPU per connection here; this row separates that from the rest.",
        f"- **true** runs `true`; **probe** runs the preflight-like batch `sh -c '{PROBE}'`.",
        "- Every host runs its own sshd on the same 2 cores as the clients, so wall time includes the server "
        "side (key exchange, auth, fork of the session shell) for all N hosts; other work on the machine adds "
        "noise (see min-max).", "",
        table, "",
        "Goals (from the issue): clusterctl no slower than parallel OpenSSH at 32 and 64 hosts; < 15 ms client "
        "CPU per host.", "",
        *checks, "",
        NOTES,
    ])
    common.publish(SECTION, section, write=not args.no_write)
    if prof_text:
        print(prof_text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
