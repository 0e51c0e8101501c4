"""The rank view's monitor in isolation: the CPU of one tick, and how much a rank's own (GIL-bound) work slows down
while its monitor thread runs, on one process with a gloo group and a full flight recorder (2,000 entries).

    python bench/rankview_cost.py [--seconds 20] [--no-write]

A single process (world size 1, gloo on 127.0.0.1) runs 2,500 all_reduces (the flight recorder full), then a pure
Python loop (GIL held, like a rank's Python between kernels) for ``--seconds`` in alternating 1 s slices, half with the
monitor thread ticking each second, half without; the loop's iterations per second with / without is the slowdown.
Then ``--ticks`` ticks are timed directly: a training tick (the flight recorder's status only) and a tick while
waiting in a collective (its entries read too) and one with the arrivals' look (every 10 s). Written to
``### the monitor alone`` of ``## sick, not dead``.
"""
from __future__ import annotations

import datetime
import os
import statistics
import sys
import tempfile
import threading
import time

import common  # noqa: F401  (puts the repository root on sys.path)
from common import DOC
from docsection import write_subsection

SICK = "## sick, not dead"
SUB = "### the monitor alone"


def main(argv=None) -> int:
    ap = common.options(__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=20.0)
    ap.add_argument("--ticks", type=int, default=200)
    args = ap.parse_args(argv)
    os.environ.setdefault("TORCH_FR_BUFFER_SIZE", "2000")
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(29000 + os.getpid() % 1000), RANK="0",
                      WORLD_SIZE="1", LOCAL_RANK="0")
    import torch
    import torch.distributed as dist

    from clusterctl import rankview

    dist.init_process_group("gloo")
    t = torch.ones(16)
    for _ in range(2500):
        dist.all_reduce(t)
    view = tempfile.mkdtemp(prefix="rankview-cost-")
    mon = rankview.Monitor(view, rank=0, local_rank=0, progress=rankview.Progress())
    mon.tick()

    # ticks timed alone (thread CPU)
    def cpu_of(fn, n):
        out = []
        for _ in range(n):
            c = time.thread_time()
            fn()
            out.append(time.thread_time() - c)
        return statistics.median(out) * 1e3

    mon.arrivals_at = time.monotonic()
    steady = cpu_of(mon.tick, args.ticks)                                  # status only
    def arrivals():
        mon.arrivals_at = None
        mon.tick()
    look = cpu_of(arrivals, max(10, args.ticks // 10))                    # + the whole dump, its last 32 entries

    # a GIL-bound loop with and without the monitor thread
    stop = threading.Event()
    running = threading.Event()

    def loop():
        while not stop.is_set():
            if running.is_set():
                mon.tick()
            stop.wait(rankview.TICK_S)

    th = threading.Thread(target=loop, daemon=True)
    th.start()
    rates = {True: [], False: []}
    end = time.monotonic() + args.seconds
    on = False
    while time.monotonic() < end:
        on = not on
        (running.set if on else running.clear)()
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < 1.0:
            x = 0
            for i in range(1000):
                x += i * i
            n += 1
        rates[on].append(n / (time.perf_counter() - t0))
    stop.set()
    th.join()
    dist.destroy_process_group()
    slow = 1 - statistics.median(rates[True]) / statistics.median(rates[False])
    when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    text = "\n".join([
        SUB, "",
        f"Measured {when} on {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f}; torch "
        f"{torch.__version__}, one process, gloo, the flight recorder full (2,000 entries). Rerun: `python "
        f"bench/rankview_cost.py`.", "",
        "| what | value |", "|---|---:|",
        f"| CPU of one tick, training (the recorder's status, /proc, the stack, the file) | {steady:.2f} ms |",
        f"| CPU of a tick with the arrivals' look (the whole recorder dumped, its last 32 entries parsed; every "
        f"10 s, and each tick while waiting in a collective) | {look:.2f} ms |",
        f"| monitor CPU per second of training (one arrivals' look per 10 ticks) | "
        f"{(9 * steady + look) / 10 / 10:.3f} % of a core |",
        f"| a GIL-bound loop's slowdown with the monitor ticking (median of {len(rates[True])} 1 s slices each) | "
        f"{100 * slow:.2f} % |", ""])
    print(text)
    if not args.no_write:
        write_subsection(SICK, SUB, text, DOC)
    return 0


if __name__ == "__main__":
    sys.exit(main())
