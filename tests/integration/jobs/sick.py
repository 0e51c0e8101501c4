"""A DDP job that gets sick, not dead (issue 37): at step ``--at`` of attempt ``--attempt``, rank ``--rank`` does
``--fault`` while every other rank goes on into DDP's all-reduce (comma-separated faults and steps: one after the
other, as ``--fault busy,sleep --at 5,10``; a fault ``A:KIND`` is attempt A's, as ``--fault 1:sigstop,2:other``;
``KIND@R`` is rank R's, not ``--rank``'s, as ``--fault 1:gilbusy@0,1:sleep@1``):

    sleep     blocks forever in its own code (time.sleep)
    fifo      blocks reading a FIFO nobody writes (open() of ``--fifo``)
    sigstop   stops itself (SIGSTOP): it answers nothing
    other     waits in another collective (an all_reduce of a second process group)
    skip      skips the step's collectives (DDP no_sync + no loss all_reduce), then waits in the next one: one
              sequence number ahead of its peers... which never come
    busy      computes silently for ``--busy-s`` seconds (CPU advancing, no output), then trains on: no hang
    gilbusy   the same in C calls that hold the GIL (``sum(range(N))``, ~10 s each): its monitor thread cannot
              write its view; the node reads its CPU from outside (runtimes.RANK_OS): no hang either
    slow      runs every step ``--slow`` times slower from then on (a straggler), to the end

Every rank prints ``step N`` and rank 0 appends {"step", "attempt", "time"} to ``--record``. Later attempts run
clean (the fault was the attempt's), from the start (no checkpoint: the model is tiny).
"""
import argparse
import datetime
import json
import os
import signal
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--step-time", type=float, default=0.1)
    p.add_argument("--fault", default="none")
    p.add_argument("--rank", type=int, default=1)
    p.add_argument("--at", default="10", help="the step of the fault (comma-separated: one per fault)")
    p.add_argument("--attempt", type=int, default=1)
    p.add_argument("--busy-s", type=float, default=30.0)
    p.add_argument("--slow", type=float, default=2.0)
    p.add_argument("--fifo", default="/tmp/clusterctl-sick.fifo")
    p.add_argument("--record", default=None)
    p.add_argument("--mark", default=None, help="the faulty rank writes {node, rank, time} here at the fault "
                                                "(default: sick.json beside --record)")
    a, _ = p.parse_known_args()     # the harness's quickstart flags (--checkpoint-every, --log-every) are ignored
    if a.mark is None and a.record:
        a.mark = os.path.join(os.path.dirname(a.record), "sick.json")
    dist.init_process_group("gloo", timeout=datetime.timedelta(hours=2))
    other = dist.new_group(backend="gloo")
    rank = dist.get_rank()
    attempt = int(os.environ.get("CLUSTERCTL_ATTEMPT", "1"))
    start = 0
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(64, 64))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x = torch.randn(16, 64)
    slow = 1.0
    faults = {}
    for at, f in zip((int(x) for x in a.at.split(",")), a.fault.split(",")):
        when, _, kind = f.rpartition(":")
        kind, _, who = kind.partition("@")
        if int(when or a.attempt) == attempt and int(who or a.rank) == rank:
            faults[at] = kind
    for step in range(start + 1, a.steps + 1):
        fault = faults.get(step)
        if fault:
            print(f"rank {rank}: {fault} at step {step}", flush=True)
            if a.mark:          # the last fault's, and each attempt's (MARK.<attempt>)
                seen = {"node": os.environ.get("CLUSTERCTL_NODE"), "rank": rank, "time": time.time(),
                        "attempt": attempt, "fault": fault}
                for path in (a.mark, f"{a.mark}.{attempt}"):
                    with open(path, "w") as f:
                        json.dump(seen, f)
            if fault == "sleep":
                time.sleep(10 ** 6)
            elif fault == "fifo":
                if not os.path.exists(a.fifo):
                    os.mkfifo(a.fifo)
                with open(a.fifo) as f:
                    f.read()
            elif fault == "sigstop":
                os.kill(os.getpid(), signal.SIGSTOP)
            elif fault == "other":
                dist.all_reduce(torch.ones(1), group=other)
            elif fault == "skip":
                with model.no_sync():
                    model(x).sum().backward()
                opt.step()
                continue
            elif fault == "busy":
                end = time.monotonic() + a.busy_s
                m = torch.randn(256, 256)
                while time.monotonic() < end:
                    m = torch.tanh(m @ m)
            elif fault == "gilbusy":
                t = time.monotonic()
                sum(range(1_000_000))
                rate = 1_000_000 / max(1e-3, time.monotonic() - t)
                end = time.monotonic() + a.busy_s
                while (left := end - time.monotonic()) > 0.5:
                    sum(range(int(rate * min(10.0, left))))      # one C call holding the GIL
            elif fault == "slow":
                slow = a.slow
        t0 = time.monotonic()
        opt.zero_grad()
        loss = model(x).pow(2).mean()
        loss.backward()                 # DDP's all-reduce of the gradients
        opt.step()
        avg = loss.detach().clone()
        dist.all_reduce(avg)
        time.sleep(a.step_time * slow + (time.monotonic() - t0) * (slow - 1))
        print(f"step {step} loss {avg.item() / dist.get_world_size():.4f}", flush=True)
        if rank == 0 and a.record:
            with open(a.record, "a") as f:
                f.write(json.dumps({"step": step, "attempt": attempt, "time": time.time()}) + "\n")
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
