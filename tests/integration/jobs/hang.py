"""A job that hangs the way real jobs do: the last rank blocks forever in its own code before a collective while
every other rank waits in that collective (tests/integration/test_toolkit_a.py)."""
import datetime
import time

import torch
import torch.distributed as dist


def stuck_in_own_code():
    while True:
        time.sleep(0.5)


def wait_in_collective(t):
    dist.all_reduce(t)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=2))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(1)
    for step in range(3):
        dist.all_reduce(t)
        print(f"step {step} sum {t.item():g}", flush=True)
    print("entering the hang", flush=True)
    if rank == world - 1:
        stuck_in_own_code()
    wait_in_collective(t)
    print("never printed", flush=True)


if __name__ == "__main__":
    main()
