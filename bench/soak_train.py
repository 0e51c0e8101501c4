"""The soak's job (bench/soak.py): a small DDP model (gloo) trained for ``--duration`` seconds, during which single
ranks are sick but never dead, one phase after another (``PHASES``; times from the start of training, all
scaled by ``--scale``). The sick rank's peers go on into DDP's all-reduce and wait for it there:

    compute   computes silently (torch matmuls, no output) for the phase's length, then trains on
    pyloop    computes silently in a pure Python loop (holds the GIL, lets it go every switch interval)
    gilcall   computes silently in long C calls that hold the GIL (``sum(range(N))``, ~10 s each): its monitor
              thread cannot write its view; only what the node reads of it from outside says it computes
    ckpt      writes a checkpoint slowly (1 MiB then a 0.5 s pause, ``fsync`` each: a slow NFS), then trains on
    slow      runs every step at half speed (a straggler at 0.5x) for the phase's length

The sick rank appends ``{"phase", "rank", "node", "start", "end"}`` (wall times) to ``--phases``; rank 0 appends
``{"step", "attempt", "time"}`` to ``--record`` every step. Every rank prints ``step N`` every 10 steps (a
silent phase is silent for the whole job; ``hang_timeout_s``, 300 s without output, still applies, as it should).
"""
import argparse
import datetime
import json
import os
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

# (start s, kind, rank, length s): 3 nodes x 2 ranks, so rank R is on node R // 2 + 1
PHASES = ((60, "compute", 1, 200), (320, "gilcall", 2, 200), (580, "ckpt", 0, 90), (730, "slow", 5, 240),
          (1100, "pyloop", 4, 200), (1400, "ckpt", 3, 100))


def gil_rate() -> float:
    """Additions per second of ``sum(range(N))`` here (one short measured call)."""
    t = time.monotonic()
    sum(range(3_000_000))
    return 3_000_000 / max(1e-3, time.monotonic() - t)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--duration", type=float, default=1620.0)
    p.add_argument("--scale", type=float, default=1.0)
    p.add_argument("--step-time", type=float, default=0.2)
    p.add_argument("--record", required=True)
    p.add_argument("--phases", required=True)
    p.add_argument("--ckpt-dir", required=True)
    a, _ = p.parse_known_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=2))
    rank = dist.get_rank()
    attempt = int(os.environ.get("CLUSTERCTL_ATTEMPT", "1"))
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 64)
    t0 = torch.tensor([time.time()], dtype=torch.float64)
    dist.broadcast(t0, 0)                      # every rank's phases from rank 0's start
    t0 = float(t0.item())
    mine = [(t0 + s * a.scale, kind, length * a.scale) for s, kind, r, length in PHASES if r == rank]
    slow_until = 0.0
    step = 0
    while True:
        step += 1
        if mine and time.time() >= mine[0][0]:
            _, kind, length = mine.pop(0)
            start = time.time()
            end = time.monotonic() + length
            if kind == "compute":
                m = torch.randn(256, 256)
                while time.monotonic() < end:
                    m = torch.tanh(m @ m)
            elif kind == "pyloop":
                n = 0
                while time.monotonic() < end:
                    for i in range(100_000):
                        n += i * i
            elif kind == "gilcall":
                rate = gil_rate()
                while (left := end - time.monotonic()) > 1:
                    n, t = int(rate * min(10.0, left - 0.5)), time.monotonic()
                    sum(range(n))                                 # one C call holding the GIL (~10 s)
                    rate = n / max(1e-3, time.monotonic() - t)    # as fast as the node lets it now
            elif kind == "ckpt":
                os.makedirs(a.ckpt_dir, exist_ok=True)
                with open(os.path.join(a.ckpt_dir, f"slow-{rank}.pt"), "wb") as f:
                    block = os.urandom(1 << 20)
                    while time.monotonic() < end:
                        f.write(block)
                        f.flush()
                        os.fsync(f.fileno())
                        time.sleep(0.5)
            elif kind == "slow":
                slow_until = time.monotonic() + length
            with open(a.phases, "a") as f:
                f.write(json.dumps({"phase": kind, "rank": rank, "node": os.environ.get("CLUSTERCTL_NODE"),
                                    "start": start, "end": time.time() if kind != "slow" else start + length,
                                    "attempt": attempt}) + "\n")
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()                        # DDP's all-reduce of the gradients
        opt.step()
        time.sleep(a.step_time)
        if time.monotonic() < slow_until:      # a slow device computes its step twice as long (never sleeps)
            end = time.monotonic() + a.step_time
            m = torch.randn(64, 64)
            while time.monotonic() < end:
                m = torch.tanh(m @ m)
        done = torch.tensor([float(time.time() - t0 >= a.duration * a.scale)])
        dist.all_reduce(done, op=dist.ReduceOp.MAX)      # every rank stops at the same step
        if step % 10 == 0:
            print(f"step {step}", flush=True)
        if rank == 0:
            with open(a.record, "a") as f:
                f.write(json.dumps({"step": step, "attempt": attempt, "time": time.time()}) + "\n")
        if done.item():
            break
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
