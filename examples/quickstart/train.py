"""Quickstart: the usual DDP training script (Dataset, DistributedSampler + set_epoch, DataLoader with workers,
DDP), written so that a restart continues exactly the run that would have happened.

    torchrun --standalone --nproc-per-node 2 examples/quickstart/train.py --steps 200

An MLP (with dropout) learns a fixed random "teacher" MLP from a Dataset of 3072 synthetic samples, read by a
DataLoader with 2 worker processes through clusterctl's ResumableDistributedSampler; Adam with a step LR schedule.
Every checkpoint holds the whole training state (``checkpoint.capture``): model, optimizer, scheduler, grad scaler,
step and epoch, every rank's RNG states (python, numpy, torch, CUDA) and the sampler's position in the epoch.
Resumed at the same world size the run is bit-identical to an uninterrupted one; resumed at another world size
(an elastic relaunch on fewer nodes) the sampler re-shards the rest of the epoch: no sample lost or repeated.

Checkpoints are written every --checkpoint-every steps when CLUSTERCTL_CHECKPOINT_DIR is set (clusterctl sets
it); at start the script resumes from the latest valid checkpoint. See docs/checkpoints.md, "Exact resume".
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import json
import os
import random
import signal
import socket
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset

try:
    import numpy as np
except ImportError:   # optional: its RNG state is saved when present
    np = None

checkpoint = sampler_mod = None   # clusterctl.checkpoint / clusterctl.sampler, see _imports()


def _imports() -> None:
    global checkpoint, sampler_mod
    checkpoint = _import_node_module("checkpoint")
    sampler_mod = _import_node_module("sampler")


def _import_node_module(name: str):
    """``clusterctl.<name>`` (the launcher puts it on PYTHONPATH); else a copy in $CLUSTERCTL_HOME or next to
    this script."""
    import importlib

    try:
        return importlib.import_module(f"clusterctl.{name}")
    except ImportError:
        import importlib.util

        home = os.environ.get("CLUSTERCTL_HOME", "")
        for cand in (
            os.path.join(home, f"{name}.py") if home else "",
            os.path.join(home, "clusterctl", f"{name}.py") if home else "",
            os.path.join(os.path.dirname(os.path.abspath(__file__)), f"{name}.py"),
        ):
            if cand and os.path.isfile(cand):
                spec = importlib.util.spec_from_file_location(f"clusterctl_{name}", cand)
                mod = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
                spec.loader.exec_module(mod)
                return mod
        raise


IN_DIM, HIDDEN, OUT_DIM = 32, 64, 1
DATASET = 3072        # a multiple of 12: epochs split evenly over 1, 2, 3, 4 or 6 ranks (no padding, see the docs)
SEED = 1234


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="total training steps (default 200)")
    p.add_argument("--checkpoint-every", type=int, default=20, help="save every K steps (default 20)")
    p.add_argument("--batch-size", type=int, default=32, help="samples per rank per step (default 32)")
    p.add_argument("--workers", type=int, default=2, help="DataLoader worker processes per rank (default 2)")
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds to sleep per step (default 0)")
    p.add_argument("--record", default=None, help="rank 0 appends one JSON line per trained step to FILE")
    p.add_argument("--phases", default=None, metavar="FILE",
                   help="each rank appends when it started, had torch, joined the process group, loaded the "
                        "checkpoint and made its first step (wall time, CPU seconds) to FILE, one JSON line each")
    p.add_argument("--ledger", default=None, metavar="PREFIX",
                   help="each rank appends the sample ids of every step to PREFIX-a<attempt>-r<rank>.jsonl")
    p.add_argument("--kill-rank-at", type=int, default=0, metavar="STEP",
                   help="the last rank SIGKILLs itself at STEP unless the run resumed from a checkpoint (demo)")
    p.add_argument("--dump-env", default=None, metavar="FILE_PREFIX", help="each rank writes <prefix>-rank<R>.json")
    p.add_argument("--fail-always", action="store_true", help="exit 1 before joining the job (for tests)")
    p.add_argument("--log-every", type=int, default=10, help="progress line every N steps (default 10)")
    p.add_argument("--lr", type=float, default=3e-3)
    return p.parse_args(argv)


def process_start_time() -> float:
    """Wall time this process started (a rank forked by a warm zygote: its fork), from /proc (10 ms ticks): its
    start in ticks since boot, against the boot-time clock now (``btime`` in /proc/stat is whole seconds: up to
    1 s off)."""
    try:
        ticks = int(open("/proc/self/stat").read().rsplit(")", 1)[1].split()[19])
        age = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
        return time.time() - age
    except (OSError, ValueError, IndexError, AttributeError):
        return float("nan")


class Phases:
    """``--phases FILE``: one JSON line per phase of this rank's start (rank, attempt, phase, wall time, CPU
    seconds of this process so far); phases: started, torch, process_group, checkpoint, first_step."""

    def __init__(self, path: str | None):
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if path else None
        self.rank = int(os.environ.get("RANK", "0"))
        self.attempt = os.environ.get("CLUSTERCTL_ATTEMPT", "")

    def mark(self, phase: str, at: float | None = None, **extra) -> None:
        if self.fd is not None:
            append_line(self.fd, {"phase": phase, "rank": self.rank, "attempt": self.attempt,
                                  "time": time.time() if at is None else at, "cpu": time.process_time(), **extra})

    def last(self, phase: str) -> None:
        """The final phase: marked once, then the file is closed (later calls do nothing). Local rank 0 adds
        ``agent_cpu``: the CPU seconds of this attempt's torchrun agent on this node so far."""
        if self.fd is not None:
            self.mark(phase, **({"agent_cpu": agent_cpu(self.attempt)} if os.environ.get("LOCAL_RANK") == "0"
                                else {}))
            os.close(self.fd)
            self.fd = None


def agent_cpu(attempt: str) -> float | None:
    """CPU seconds (user + system) of this attempt's torchrun agent(s) on this node: processes in this process's
    network namespace (a node) that torch named ``pt_elastic`` (the elastic agent, started cold or forked by a
    warm zygote), whose environment says ``CLUSTERCTL_ATTEMPT=<attempt>`` or no attempt at all (a forked agent's
    /proc environ is its zygote's; the zygote kills other attempts' agents before it forks one). None when /proc
    cannot tell."""
    try:
        tick, mine = os.sysconf("SC_CLK_TCK"), os.readlink("/proc/self/ns/net")
        total, found = 0.0, False
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                if open(f"/proc/{pid}/comm").read().strip() != "pt_elastic" or \
                        os.readlink(f"/proc/{pid}/ns/net") != mine:
                    continue
                said = [v for v in open(f"/proc/{pid}/environ", "rb").read().split(b"\0")
                        if v.startswith(b"CLUSTERCTL_ATTEMPT=")]
                if said and said != [f"CLUSTERCTL_ATTEMPT={attempt}".encode()]:
                    continue
                fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
                total += (int(fields[11]) + int(fields[12])) / tick          # utime + stime
                found = True
            except OSError:
                continue
        return round(total, 2) if found else None
    except (OSError, ValueError):
        return None


def dump_env(prefix: str) -> None:
    keys = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_RUN_ID")
    env = {k: os.environ[k] for k in keys if k in os.environ}
    env.update({k: v for k, v in os.environ.items() if k.startswith("CLUSTERCTL_")})
    rank = os.environ.get("RANK", "0")
    path = f"{prefix}-rank{rank}.json"
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    data = {"env": env, "argv": sys.argv, "hostname": socket.gethostname(), "pid": os.getpid()}
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, sort_keys=True)
    os.replace(tmp, path)


def init_distributed():
    """Init from torchrun env; without it, run as a single process (handy for debugging)."""
    if "RANK" not in os.environ:
        os.environ.update(RANK="0", WORLD_SIZE="1", LOCAL_RANK="0", MASTER_ADDR="127.0.0.1")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])
    if torch.cuda.is_available():
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
        backend = "cpu:gloo,cuda:nccl"  # gloo for the small CPU collectives, nccl for gradients
    else:
        device = torch.device("cpu")
        backend = "gloo"
    # the collective timeout clusterctl passes (supervisor.collective_timeout_s): a peer that is gone fails the
    # collective in minutes, not after gloo's 30 (NCCL's watchdog then aborts with its message and flight record)
    timeout = datetime.timedelta(seconds=float(os.environ.get("CLUSTERCTL_COLLECTIVE_TIMEOUT_S", "600")))
    dist.init_process_group(backend=backend, timeout=timeout)
    return device


class TeacherData(Dataset):
    """A map-style Dataset: sample i is (i, x_i, teacher(x_i)). Deterministic per index, so it does not matter
    which worker process reads it. (A Dataset with random augmentation should seed it per sample, from
    (seed, epoch, index), for the same reason.)"""

    def __init__(self, n: int = DATASET):
        g = torch.Generator().manual_seed(SEED)
        self.x = torch.randn(n, IN_DIM, generator=g)
        w1 = torch.randn(IN_DIM, HIDDEN, generator=g) / IN_DIM ** 0.5
        w2 = torch.randn(HIDDEN, OUT_DIM, generator=g) / HIDDEN ** 0.5
        self.y = torch.tanh(self.x @ w1) @ w2

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        return i, self.x[i], self.y[i]


def seed_everything(seed: int) -> None:
    random.seed(seed)
    torch.manual_seed(seed)
    if np is not None:
        np.random.seed(seed % 2**32)


def fingerprint(model) -> str:
    """sha256 of the parameters' bytes: equal only for bit-identical parameters."""
    h = hashlib.sha256()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(bytes(t.detach().cpu().contiguous().view(torch.uint8).flatten().tolist()))
    return h.hexdigest()


def settle(ddp, device) -> None:
    """One zero-gradient step right after DDP wraps the model, so that every real step runs on DDP's final
    gradient buckets. DDP rebuilds its buckets after the first backward; the first step on the initial buckets
    sums some gradient elements in another order (with more than 2 ranks the all-reduce result then differs in the
    last bits), and a resumed run would take that step where the uninterrupted run did not. Eval mode: no dropout
    (no RNG draw); no optimizer step."""
    ddp.module.eval()
    (ddp(torch.zeros(1, IN_DIM, device=device)).sum() * 0).backward()
    ddp.module.train()
    ddp.module.zero_grad(set_to_none=True)


def append_line(fd, obj) -> None:
    os.write(fd, (json.dumps(obj) + "\n").encode())


def find_resume_path(rank: int):
    """Rank 0 chooses (latest valid checkpoint, else the launcher's hint); all ranks agree on it."""
    chosen = ""
    if rank == 0:
        chosen = checkpoint.latest() or ""
        hint = os.environ.get("CLUSTERCTL_RESUME_FROM", "")
        if not chosen and hint and os.path.isdir(hint):
            chosen = hint
    # share the choice without object collectives (no numpy needed): length then bytes
    data = torch.tensor(list(chosen.encode()) or [0], dtype=torch.uint8)
    n = torch.tensor([len(chosen.encode())], dtype=torch.int64)
    dist.broadcast(n, src=0)
    buf = torch.zeros(max(int(n.item()), 1), dtype=torch.uint8)
    if rank == 0:
        buf.copy_(data)
    dist.broadcast(buf, src=0)
    return bytes(buf.tolist()[: int(n.item())]).decode() or None


@record   # an exception is written to torchrun's error file (TORCHELASTIC_ERROR_FILE): its root cause
def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dump_env:
        dump_env(args.dump_env)
    if args.fail_always:
        raise SystemExit("fail-always: exiting with status 1")

    phases = Phases(args.phases)
    phases.mark("started", process_start_time())
    _imports()
    phases.mark("torch")                                    # torch imported (module level, and _imports)
    # The DataLoader's worker processes are forked first, before the process group exists: this process has no
    # thread but its own yet. Forked after init_process_group, a worker is a copy of a process that runs gloo's
    # threads (three), taken at an instant one of them may hold a lock (POSIX allows such a child only
    # async-signal-safe calls); a first attempt now and then never trained: one rank waiting on its workers in
    # `select`, the others in DDP's first forward, until the hang verdict (issue 34 item 12).
    rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))
    data = TeacherData()
    sampler = sampler_mod.ResumableDistributedSampler(data, num_replicas=world, rank=rank, seed=SEED)
    # its own generator: iter(DataLoader) draws the workers' base seed from it, not from the global torch stream
    # (which dropout uses): a resumed run calls iter() once more than the uninterrupted one did
    loader = DataLoader(data, batch_size=args.batch_size, sampler=sampler,
                        num_workers=args.workers, persistent_workers=args.workers > 0,
                        generator=torch.Generator())
    if args.workers > 0:
        iter(loader)      # forks the (persistent) workers now; what they prefetch is dropped by the next iter()
    device = init_distributed()
    phases.mark("process_group")
    assert (dist.get_rank(), dist.get_world_size()) == (rank, world), "RANK/WORLD_SIZE differ from the group's"
    attempt = os.environ.get("CLUSTERCTL_ATTEMPT", "")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    ckpt_enabled = bool(os.environ.get("CLUSTERCTL_CHECKPOINT_DIR"))

    seed_everything(SEED)                                   # the same initial model on every rank
    model = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.ReLU(), nn.Dropout(0.1), nn.Linear(HIDDEN, HIDDEN),
                          nn.ReLU(), nn.Linear(HIDDEN, OUT_DIM)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=50, gamma=0.7)
    scaler = torch.amp.GradScaler(device.type, enabled=device.type == "cuda")   # (unused on CPU; saved anyway)
    seed_everything(SEED + 1 + rank)                        # each rank its own dropout stream
    step = epoch = 0

    path = find_resume_path(rank) if ckpt_enabled or os.environ.get("CLUSTERCTL_RESUME_FROM") else None
    if path:
        state = checkpoint.load(path, map_location="cpu")
        info = checkpoint.restore(state, model=model, optimizer=opt, scheduler=sched, scaler=scaler, data=sampler)
        step, epoch = info["step"], info["epoch"]
        if rank == 0:
            rng = "every rank's RNG restored" if info["rng_restored"] else "RNG re-seeded (world size changed)"
            print(f"resumed from {path} at step {step}: epoch {epoch}, sample {sampler.start}/{len(data)} of the "
                  f"epoch, world size {info['world_size']} -> {world}, {rng}", flush=True)
    elif rank == 0:
        print("starting from scratch", flush=True)
    phases.mark("checkpoint")

    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    settle(ddp, device)
    loss_fn = nn.MSELoss()
    record_fd = os.open(args.record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if args.record and rank == 0 else None
    ledger_fd = None
    if args.ledger:
        ledger_fd = os.open(f"{args.ledger}-a{attempt or 0}-r{rank}.jsonl", os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    loss_val = float("nan")
    try:
        while step < args.steps:
            sampler.set_epoch(epoch)
            loader.generator.manual_seed(SEED + epoch)
            seen = 0                                        # samples this rank took from the loader in this epoch
            batches = iter(loader)
            for ids, xb, yb in batches:
                xb, yb = xb.to(device), yb.to(device)
                opt.zero_grad(set_to_none=True)
                loss = loss_fn(ddp(xb), yb)
                loss.backward()
                opt.step()
                sched.step()
                step += 1
                seen += len(ids)
                avg = loss.detach().clone()
                dist.all_reduce(avg)
                loss_val = float(avg.item()) / world
                if args.step_time > 0:
                    time.sleep(args.step_time)
                phases.last("first_step")
                if record_fd is not None:
                    append_line(record_fd, {"step": step, "attempt": attempt, "restart": restart, "world_size": world,
                                            "epoch": epoch, "loss": loss_val, "time": time.time()})
                if ledger_fd is not None:
                    append_line(ledger_fd, {"step": step, "epoch": epoch, "rank": rank, "world_size": world,
                                            "ids": ids.tolist()})
                if rank == 0 and (step % max(args.log_every, 1) == 0 or step == args.steps):
                    print(f"step {step}/{args.steps} loss {loss_val:.4f}", flush=True)
                if args.kill_rank_at and step == args.kill_rank_at and rank == world - 1 and not path:
                    print(f"rank {rank}: SIGKILL to myself at step {step} (--kill-rank-at)", flush=True)
                    os.kill(os.getpid(), signal.SIGKILL)
                if ckpt_enabled and args.checkpoint_every > 0 and (step % args.checkpoint_every == 0 or step == args.steps):
                    state = checkpoint.capture(step, epoch=epoch, model=model, optimizer=opt, scheduler=sched,
                                               scaler=scaler, data=sampler.state_dict(yielded=seen))
                    saved = checkpoint.save(state, step)
                    if rank == 0:
                        print(f"checkpoint {saved}", flush=True)
                if step >= args.steps:
                    break
            else:
                epoch += 1                                  # the epoch is used up
        batches = loader = None                             # the last references: the worker processes stop now
                                                            # (never bound when resumed at the final step)
    finally:
        if record_fd is not None:
            os.close(record_fd)
        if ledger_fd is not None:
            os.close(ledger_fd)
    if rank == 0:
        trained = loss_val == loss_val   # NaN: resumed at the final step, nothing left to train
        print(f"done: step {step}" + (f" loss {loss_val:.4f}" if trained else " (resumed there: nothing left to train)"),
              flush=True)
        print(f"final parameters sha256 {fingerprint(model)}", flush=True)
    dist.barrier()
    # Leave without tearing the process group down. Gloo's teardown races with peers closing their sockets and
    # now and then aborts a finished rank ("terminate called without an active exception": a joinable gloo thread
    # destroyed; pytorch/pytorch#28126), which torchrun reports as a failed run. Everything is saved and flushed
    # at this point; the OS closes the sockets.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    sys.exit(main())
