"""The scale bench's job: a tiny model, one gloo all-reduce of its gradients per step (1 step/s), and
``--lines-per-s`` numbered log lines (``seq K``) per rank in between, so the controller's copy can be checked for
lost or reordered lines. Prints ``step N`` after each step."""
import argparse
import time

import torch
import torch.distributed as dist

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--lines-per-s", type=float, default=50.0)
args = ap.parse_args()
dist.init_process_group("gloo")
model = torch.nn.Linear(16, 1)
x = torch.randn(8, 16)
seq = 0
for step in range(args.steps):
    model(x).sum().backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad = None
    print(f"step {step}", flush=True)
    end = time.monotonic() + 1.0
    nxt = time.monotonic()
    while time.monotonic() < end:
        print(f"seq {seq}", flush=True)
        seq += 1
        nxt += 1.0 / args.lines_per_s
        time.sleep(max(0.0, nxt - time.monotonic()))
dist.destroy_process_group()
