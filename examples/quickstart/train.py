"""Quickstart: a small DDP training run that checkpoints and resumes with clusterctl.checkpoint.

    torchrun --standalone --nproc-per-node 2 examples/quickstart/train.py --steps 200

An MLP learns a fixed random "teacher" MLP on synthetic data. Everything is seeded, and the
batch of step s on rank r depends only on (s, r), so a resumed run follows the same trajectory
as an uninterrupted one (for the same world size).

Checkpoints are written every --checkpoint-every steps when CLUSTERCTL_CHECKPOINT_DIR is set
(clusterctl sets it); at start the script resumes from the latest valid checkpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

# torch and clusterctl.checkpoint are imported by _imports() so that --fail-always exits at once
torch = dist = nn = DDP = checkpoint = None


def _imports() -> None:
    global torch, dist, nn, DDP, checkpoint
    import torch
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    checkpoint = _import_checkpoint()


def _import_checkpoint():
    try:
        from clusterctl import checkpoint

        return checkpoint
    except ImportError:  # not on PYTHONPATH: a checkpoint.py in $CLUSTERCTL_HOME or next to this script
        import importlib.util

        home = os.environ.get("CLUSTERCTL_HOME", "")
        for cand in (
            os.path.join(home, "checkpoint.py") if home else "",
            os.path.join(home, "clusterctl", "checkpoint.py") if home else "",
            os.path.join(os.path.dirname(os.path.abspath(__file__)), "checkpoint.py"),
        ):
            if cand and os.path.isfile(cand):
                spec = importlib.util.spec_from_file_location("clusterctl_checkpoint", cand)
                mod = importlib.util.module_from_spec(spec)
                sys.modules[spec.name] = mod  # dataclasses look their module up while the class is built
                spec.loader.exec_module(mod)
                return mod
        raise


IN_DIM, HIDDEN, OUT_DIM = 32, 64, 1
DATASET = 4096
BATCH = 64
SEED = 1234


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=200, help="total training steps (default 200)")
    p.add_argument("--checkpoint-every", type=int, default=20, help="save every K steps (default 20)")
    p.add_argument("--step-time", type=float, default=0.0, help="extra seconds to sleep per step (default 0)")
    p.add_argument("--record", default=None, help="rank 0 appends one JSON line per trained step to FILE")
    p.add_argument("--dump-env", default=None, metavar="FILE_PREFIX", help="each rank writes <prefix>-rank<R>.json")
    p.add_argument("--fail-always", action="store_true", help="exit 1 immediately (for tests)")
    p.add_argument("--log-every", type=int, default=10, help="progress line every N steps (default 10)")
    p.add_argument("--lr", type=float, default=3e-3)
    return p.parse_args(argv)


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
    dist.init_process_group(backend=backend)
    return device


def make_data():
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(DATASET, IN_DIM, generator=g)
    w1 = torch.randn(IN_DIM, HIDDEN, generator=g) / IN_DIM ** 0.5
    w2 = torch.randn(HIDDEN, OUT_DIM, generator=g) / HIDDEN ** 0.5
    y = torch.tanh(x @ w1) @ w2
    return x, y


def batch_indices(step: int, rank: int, world: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(SEED + 1 + step * world + rank)
    return torch.randint(0, DATASET, (BATCH,), generator=g)


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


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dump_env:
        dump_env(args.dump_env)
    if args.fail_always:
        print("fail-always: exiting with status 1", file=sys.stderr, flush=True)
        return 1

    _imports()
    device = init_distributed()
    rank, world = dist.get_rank(), dist.get_world_size()
    attempt = os.environ.get("CLUSTERCTL_ATTEMPT", "")
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "")
    ckpt_enabled = bool(os.environ.get("CLUSTERCTL_CHECKPOINT_DIR"))

    torch.manual_seed(SEED)
    x_all, y_all = make_data()
    model = nn.Sequential(nn.Linear(IN_DIM, HIDDEN), nn.ReLU(), nn.Linear(HIDDEN, HIDDEN), nn.ReLU(),
                          nn.Linear(HIDDEN, OUT_DIM)).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    step = 0

    path = find_resume_path(rank) if ckpt_enabled or os.environ.get("CLUSTERCTL_RESUME_FROM") else None
    if path:
        state = checkpoint.load(path, map_location="cpu")
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        step = int(state["step"])
        if rank == 0:
            print(f"resumed from {path} at step {step} (saved with world size {state.get('world_size')})", flush=True)
    elif rank == 0:
        print("starting from scratch", flush=True)

    ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    loss_fn = nn.MSELoss()
    record_fd = os.open(args.record, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644) if args.record and rank == 0 else None
    loss_val = float("nan")
    try:
        while step < args.steps:
            idx = batch_indices(step, rank, world)
            xb, yb = x_all[idx].to(device), y_all[idx].to(device)
            opt.zero_grad(set_to_none=True)
            loss = loss_fn(ddp(xb), yb)
            loss.backward()
            opt.step()
            step += 1
            avg = loss.detach().clone()
            dist.all_reduce(avg)
            loss_val = float(avg.item()) / world
            if args.step_time > 0:
                time.sleep(args.step_time)
            if record_fd is not None:
                line = json.dumps({"step": step, "attempt": attempt, "restart": restart, "world_size": world,
                                   "loss": loss_val, "time": time.time()}) + "\n"
                os.write(record_fd, line.encode())
            if rank == 0 and (step % max(args.log_every, 1) == 0 or step == args.steps):
                print(f"step {step}/{args.steps} loss {loss_val:.4f}", flush=True)
            if ckpt_enabled and args.checkpoint_every > 0 and (step % args.checkpoint_every == 0 or step == args.steps):
                state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "step": step, "world_size": world}
                saved = checkpoint.save(state, step)
                if rank == 0:
                    print(f"checkpoint {saved}", flush=True)
    finally:
        if record_fd is not None:
            os.close(record_fd)
    if rank == 0:
        trained = loss_val == loss_val   # NaN: resumed at the final step, nothing left to train
        print(f"done: step {step}" + (f" loss {loss_val:.4f}" if trained else " (resumed there: nothing left to train)"),
              flush=True)
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
