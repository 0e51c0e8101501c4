"""The scale bench's job: a tiny model, one all-reduce of its gradients per step (1 step/s), and ``--lines-per-s``
numbered log lines (``seq K``) per rank in between, so the controller's copy can be checked for lost or reordered
lines. Prints ``step N`` after each step.

``--light``: the same without torch in the worker (torchrun's agent still imports it): a 16-weight linear model in
plain Python whose gradients are averaged over TCP through rank 0 (port MASTER_PORT + 1 on MASTER_ADDR). 64 testbed
nodes of agent + torch worker (~300 MB each) do not fit in this machine's memory; agent + light worker do.
"""
import argparse
import os
import random
import socket
import time

ap = argparse.ArgumentParser()
ap.add_argument("--steps", type=int, default=3)
ap.add_argument("--lines-per-s", type=float, default=50.0)
ap.add_argument("--light", action="store_true")
args = ap.parse_args()
seq = 0


def print_lines() -> None:
    global seq
    end = time.monotonic() + 1.0
    nxt = time.monotonic()
    while time.monotonic() < end:
        print(f"seq {seq}", flush=True)
        seq += 1
        nxt += 1.0 / args.lines_per_s
        time.sleep(max(0.0, nxt - time.monotonic()))


class StarAllReduce:
    """Mean of a list of floats over every rank: each rank sends its line to rank 0, which answers the mean."""

    def __init__(self) -> None:
        self.rank, self.world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
        addr = (os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]) + 1)
        if self.rank == 0:
            srv = socket.create_server(("", addr[1]), backlog=self.world)
            self.peers = [srv.accept()[0].makefile("rw") for _ in range(self.world - 1)]
            srv.close()
        else:
            end = time.monotonic() + 600
            while True:
                try:
                    self.up = socket.create_connection(addr, timeout=600).makefile("rw")
                    break
                except OSError:
                    if time.monotonic() > end:
                        raise
                    time.sleep(0.2)

    def __call__(self, xs: list[float]) -> list[float]:
        if self.rank != 0:
            self.up.write(" ".join(map(repr, xs)) + "\n")
            self.up.flush()
            return [float(v) for v in self.up.readline().split()]
        total = list(xs)
        for p in self.peers:
            total = [a + float(b) for a, b in zip(total, p.readline().split())]
        mean = [v / self.world for v in total]
        for p in self.peers:
            p.write(" ".join(map(repr, mean)) + "\n")
            p.flush()
        return mean


if args.light:
    reduce = StarAllReduce()
    rng = random.Random(int(os.environ["RANK"]))
    w = [0.0] * 16
    for step in range(args.steps):
        x = [rng.gauss(0, 1) for _ in w]
        err = sum(a * b for a, b in zip(w, x)) - 1.0
        w = [a - 0.01 * g for a, g in zip(w, reduce([err * v for v in x]))]
        print(f"step {step}", flush=True)
        print_lines()
else:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo")
    model = torch.nn.Linear(16, 1)
    x = torch.randn(8, 16)
    for step in range(args.steps):
        model(x).sum().backward()
        for p in model.parameters():
            dist.all_reduce(p.grad)
            p.grad = None
        print(f"step {step}", flush=True)
        print_lines()
    dist.destroy_process_group()
