"""Fork-from-warm vs fresh import, on this machine: a tiny "rank" (import torch, one Linear + Adam step: the first
optimizer call imports torch._dynamo) started N times each way, interleaved; wall time from start to its first
step, and the CPU the started process tree spent. Prints one line per run and a summary.

    .venv/bin/python bench/zygote.py [--runs 5]
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ZYGOTE = Path(__file__).resolve().parent.parent / "clusterctl" / "launch" / "zygote.py"
RANK = '''import os, time
t0 = float(os.environ["T0"])
import torch, torch.distributed
m = torch.nn.Linear(8, 8); opt = torch.optim.Adam(m.parameters())
m(torch.ones(2, 8)).sum().backward(); opt.step()
print(f"{time.time() - t0:.3f}", flush=True)
'''


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=5)
    a = ap.parse_args()
    d = tempfile.mkdtemp(prefix="zyg-bench.")
    script, sock = Path(d, "rank.py"), str(Path(d, "z.sock"))
    script.write_text(RANK)
    t = time.time()
    zyg = subprocess.Popen([sys.executable, str(ZYGOTE), "serve", sock], stdout=subprocess.PIPE, text=True)
    assert zyg.stdout.readline().strip() == "clusterctl-zygote ready"
    print(f"zygote ready in {time.time() - t:.2f}s (preloads torch, torch.distributed, torch._dynamo, ...)")
    res: dict[str, list[tuple[float, float]]] = {"cold": [], "warm": []}
    try:
        for i in range(a.runs):
            for kind in ("cold", "warm"):
                argv = ([sys.executable, str(script)] if kind == "cold"
                        else [sys.executable, "-S", str(ZYGOTE), "client", sock, "rank", str(script)])
                c0 = _cpu()
                env = dict(os.environ, T0=repr(time.time()))
                out = subprocess.run(argv, env=env, capture_output=True, text=True, check=True).stdout
                cpu = _cpu() - c0      # warm: the client's CPU only (the forked child is the zygote's)
                res[kind].append((float(out.strip().splitlines()[-1]), cpu))
                print(f"run {i} {kind}: first step after {res[kind][-1][0]:.3f}s, client-side CPU {cpu:.3f}s")
    finally:
        zyg.terminate()
        zyg.wait(10)
    for kind, rows in res.items():
        print(f"{kind}: median first step {statistics.median(r[0] for r in rows):.3f}s "
              f"(min {min(r[0] for r in rows):.3f}, max {max(r[0] for r in rows):.3f}) over {len(rows)} runs")
    return 0


if __name__ == "__main__":
    sys.exit(main())
