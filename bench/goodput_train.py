"""The training script of bench/goodput.py: a small DDP job that records its own ground truth, and takes the
bench's faults from files on the shared storage.

    torchrun ... bench/goodput_train.py --steps N --checkpoint-every K --step-time S --record STEPS.jsonl
                                        --resumes RESUMES.jsonl --control DIR [--log-every 1]

Ground truth (rank 0, appended, one JSON line each, on the shared storage):

- ``--record``: every step it trained: ``{"attempt", "step", "start", "time"}`` (wall times: the step's start,
  before its batch is made, and its end, after the optimizer step, the loss all-reduce and ``--step-time``);
- ``--resumes``: once per attempt, the checkpoint step it resumed from: ``{"attempt", "resumed_from", "time"}``
  (0: from scratch). A step of an attempt is *kept* when the next attempt that resumed had resumed from a
  checkpoint holding it (its step <= that ``resumed_from``).

Faults and the end, from ``--control DIR`` (looked at before each step):

- ``hang``: the job's last rank takes the file (a rename: one taker) and sleeps forever; its peers wait in the
  next all-reduce and nobody prints: the supervisor's hang detection (``supervisor.hang_timeout_s``) finds it;
- ``fail``: the last rank takes it and raises (exit code 1 through torchrun): a user error;
- ``finish``: every rank agrees (a flag in the step's all-reduce) to stop after this step; a final checkpoint,
  then exit 0 (the job SUCCEEDS).

It prints ``step N loss X`` every ``--log-every`` steps (rank 0): the supervisor's step signal.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

try:
    from clusterctl import checkpoint
except ImportError:         # not on PYTHONPATH: the repository this file lives in
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    from clusterctl import checkpoint


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=10**9)
    p.add_argument("--checkpoint-every", type=int, default=20)
    p.add_argument("--step-time", type=float, default=0.2, help="seconds slept in each step (after the all-reduce)")
    p.add_argument("--record", required=True)
    p.add_argument("--resumes", required=True)
    p.add_argument("--control", required=True)
    p.add_argument("--log-every", type=int, default=1)
    return p.parse_args(argv)


def append(path: str, obj: dict) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    try:
        os.write(fd, (json.dumps(obj) + "\n").encode())
    finally:
        os.close(fd)


def take(path: str, rank: int) -> bool:
    """The control file ``path`` for this rank alone (an atomic rename: exactly one taker)."""
    try:
        os.rename(path, f"{path}.taken-{rank}-{os.getpid()}")
        return True
    except OSError:
        return False


def main(argv=None) -> int:
    args = parse_args(argv)
    timeout = datetime.timedelta(seconds=float(os.environ.get("CLUSTERCTL_COLLECTIVE_TIMEOUT_S", "600")))
    dist.init_process_group("gloo", timeout=timeout)
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = os.environ.get("CLUSTERCTL_ATTEMPT", "0")
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 1))
    opt = torch.optim.SGD(model.parameters(), lr=1e-2)
    step = 0
    # rank 0 picks the newest valid checkpoint; every rank loads the same one
    path, at = checkpoint.resume_info() if rank == 0 else ("", 0)
    chosen = torch.tensor([at if path else -1])
    dist.broadcast(chosen, src=0)
    if int(chosen) >= 0:
        state = checkpoint.load(os.path.join(checkpoint.default_root(), checkpoint.step_dirname(int(chosen))))
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
    if rank == 0:       # no line before the first step: the first step is the attempt's first progress
        append(args.resumes, {"attempt": attempt, "resumed_from": step, "time": time.time()})
    ddp = DDP(model)
    hang, fail, finish = (os.path.join(args.control, n) for n in ("hang", "fail", "finish"))
    last = rank == world - 1
    while step < args.steps:
        start = time.time()
        if last and os.path.exists(hang) and take(hang, rank):
            print(f"rank {rank}: hanging before step {step + 1} (bench fault)", flush=True)
            while True:
                time.sleep(3600)
        if last and os.path.exists(fail) and take(fail, rank):
            raise RuntimeError(f"rank {rank}: injected user error before step {step + 1} (bench fault)")
        g = torch.Generator().manual_seed(step * 1000 + rank)
        x = torch.randn(32, 16, generator=g)
        loss = (ddp(x) - x.sum(1, keepdim=True)).pow(2).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        flags = torch.tensor([loss.item(), 1.0 if os.path.exists(finish) else 0.0])
        dist.all_reduce(flags)
        time.sleep(args.step_time)
        step += 1
        if rank == 0:
            append(args.record, {"attempt": attempt, "step": step, "start": start, "time": time.time()})
            if step % args.log_every == 0:
                print(f"step {step} loss {float(flags[0]) / world:.4f}", flush=True)
        done = flags[1] > 0
        if done or step % args.checkpoint_every == 0:
            checkpoint.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict()}, step)
        if done:
            break
    if rank == 0:
        print(f"done: step {step}", flush=True)
    dist.barrier()
    sys.stdout.flush()
    os._exit(0)       # as the quickstart: no process-group teardown (gloo's races with peers closing)


if __name__ == "__main__":
    sys.exit(main())
