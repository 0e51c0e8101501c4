"""Training stall per checkpoint: clusterctl.checkpoint.async_save vs save, side by side in one run.

    python bench/checkpoint.py [--size-mb 1024] [--reps 3] [--train-s 12] [--dir DIR] [--no-write]

A ~1 GB state (float32 tensors, like a model + optimizer state on CPU) is checkpointed `--reps` times with each
method, alternating (save, async_save, save, ...), with `--train-s` seconds of "training" (small matmuls that
update the state in place) between checkpoints. The stall is the time the training loop is blocked by the
checkpoint: for `save`, the call (torch.save, fsync, manifest with sha256, rename); for `async_save`, the call
(staging a copy of the state in memory, planning) plus the wait in `result()` before the next checkpoint (0 when
the background write and finalize have finished). Also reported: the time until the checkpoint is complete on
disk, and the training steps per second while a background write runs vs. without one.

Every async checkpoint is loaded back and compared with the state as it was when async_save was called (the
training loop kept changing it): a checkpoint that caught a later state would fail the run.
Results replace `## checkpoint` in docs/benchmarks.md (unless --no-write). Run it alone on the machine (under
the integration lock on a shared one): other load shows in the numbers.
"""
from __future__ import annotations

import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import common  # noqa: E402  (puts the repository root on sys.path)
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
from common import exit_on_signals  # noqa: E402

from clusterctl import checkpoint  # noqa: E402

CHUNK_MB = 64


def make_state(size_mb: int) -> dict:
    n = max(1, size_mb // CHUNK_MB)
    g = torch.Generator().manual_seed(0)
    return {f"layer{i:02d}": torch.randn(CHUNK_MB * 2**20 // 4, generator=g) for i in range(n)}


class Trainer:
    """Stands in for training: small matmuls (one thread), and every step nudges one state tensor in place."""

    def __init__(self, state: dict):
        self.state = state
        self.names = sorted(state)
        self.a = torch.randn(256, 256)
        self.steps = 0

    def step(self) -> None:
        for _ in range(4):
            self.a = torch.tanh(self.a @ self.a) * 0.5
        t = self.state[self.names[self.steps % len(self.names)]]
        t[: 2**16].add_(1.0)                      # the state changes while a background write may read it
        self.steps += 1

    def run(self, seconds: float) -> float:
        """Train for ``seconds``; returns steps per second."""
        end = time.perf_counter() + seconds
        n0, t0 = self.steps, time.perf_counter()
        while time.perf_counter() < end:
            self.step()
        return (self.steps - n0) / (time.perf_counter() - t0)


def sums(state: dict) -> dict:
    return {k: float(v.double().sum()) for k, v in state.items()}


def bench(size_mb: int, reps: int, train_s: float, root: Path) -> dict:
    state = make_state(size_mb)
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    trainer = Trainer(state)
    methods = ("save", "async_save", "async_fresh")
    res: dict = {m: [] for m in methods}
    res.update(complete_s={m: [] for m in methods}, first={}, rate_idle=[], rate_bg=[], bytes=nbytes,
               tensors=len(state))
    trainer.run(1.0)                               # warm up
    step = 0
    checks = []
    for rep in range(reps + 1):                    # rep 0: each method's first call (one-time setup), not counted
        for method in methods:
            step += 1
            if method == "save":
                t0 = time.perf_counter()
                checkpoint.save(state, step, root=str(root))
                stall = time.perf_counter() - t0
                rate = trainer.run(train_s)
                if rep == 0:
                    res["first"][method] = stall
                    continue
                res["complete_s"]["save"].append(stall)
                res["save"].append(stall)
                res["rate_idle"].append(rate)
                continue
            expect = sums(state)
            t0 = time.perf_counter()
            handle = checkpoint.async_save(state, step, root=str(root), reuse_buffers=method == "async_save")
            stall = time.perf_counter() - t0
            # train while the write runs; measure the rate only while it is still running
            n0, t1 = trainer.steps, time.perf_counter()
            end = t1 + train_s
            while time.perf_counter() < end and not handle.done():
                trainer.step()
            if trainer.steps > n0 and rep > 0:        # steps taken while the write was in flight
                res["rate_bg"].append((trainer.steps - n0) / (time.perf_counter() - t1))
            done_at = time.perf_counter() if handle.done() else None
            trainer.run(max(0.0, end - time.perf_counter()))
            t2 = time.perf_counter()
            path = handle.result(timeout=600)      # before the next checkpoint: blocks only if not finished
            stall += time.perf_counter() - t2
            checks.append((path, expect))
            if rep == 0:
                res["first"][method] = stall
            else:
                res[method].append(stall)
                res["complete_s"][method].append(((done_at or time.perf_counter()) - t0))
            for old in root.iterdir():             # disk space, outside the timed parts
                if old.name != Path(path).name:
                    shutil.rmtree(old, ignore_errors=True)
    for path, expect in checks[-1:]:               # the last one is still on disk
        target = {k: torch.empty_like(v) for k, v in state.items()}
        checkpoint.load(path, state_dict=target)
        got = sums(target)
        bad = [k for k in expect if got[k] != expect[k]]
        if bad:
            raise SystemExit(f"async checkpoint {path} does not hold the state of its save time: {bad}")
    return res


def fmt(xs: list[float]) -> str:
    return f"{statistics.median(xs):.3f} ({min(xs):.3f}-{max(xs):.3f})"


def section(res: dict, args) -> str:
    sync, asyn, fresh = (statistics.median(res[m]) for m in ("save", "async_save", "async_fresh"))
    gb = res["bytes"] / 2**30
    rate_bg = fmt(res["rate_bg"]) if res["rate_bg"] else "n/a (every write finished before a step)"
    first = ", ".join(f"`{m}` {v:.2f} s" for m, v in res["first"].items())
    return f"""## checkpoint

Measured {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())} on this machine ({os.cpu_count()} cores,
torch {torch.__version__}, one process with a gloo group of 1, under the integration lock), state {gb:.2f} GiB
({res['tensors']} float32 tensors of {CHUNK_MB} MiB), checkpoint root on {args.dir_kind}; {args.reps}
checkpoints per method, the methods alternating, {args.train_s:g} s of training (matmuls that also change the
state in place) between checkpoints. Rerun: `flock /tmp/cc-integration.lock .venv/bin/python bench/checkpoint.py`.

| method | training stall per checkpoint, s: median (min-max) | until complete on disk, s |
|---|---|---|
| `checkpoint.save` (torch.save, fsync, manifest with sha256, rename) | {fmt(res['save'])} | {fmt(res['complete_s']['save'])} |
| `checkpoint.async_save` + `result()` (kept staging buffers, the default) | {fmt(res['async_save'])} | {fmt(res['complete_s']['async_save'])} |
| `checkpoint.async_save(reuse_buffers=False)` + `result()` (DCP's default stager) | {fmt(res['async_fresh'])} | {fmt(res['complete_s']['async_fresh'])} |

- **async stall / sync stall: {asyn / sync:.1%}** (goal <= 10 %: {"met" if asyn <= 0.1 * sync else "NOT met"}); with
  DCP's default stager {fresh / sync:.1%}. The anchor, PyTorch DCP's async checkpointing, works the same way:
  block only for the copy of the state to CPU memory, write in the background.
- The async stall is that copy. DCP's default stager allocates a fresh copy at every checkpoint, and on CPU the
  page faults of the allocation cost about as much as the copy; `async_save` therefore stages into buffers kept
  between checkpoints (one extra copy of the state stays allocated). The write, the manifest (sha256 of every
  file) and the rename run in background threads: `result()` before the next checkpoint did not block in any rep
  where the write had finished.
- First call of each method (one-time setup, not in the table: imports, DCP's thread pool, buffer allocation):
  {first}.
- Training steps per second: {fmt(res['rate_idle'])} with no checkpoint in flight, {rate_bg} while a
  background write and finalize run (they share the {os.cpu_count()} cores with training).
- The last async checkpoint was loaded back and holds the state of its `async_save` call, although training
  changed the tensors in place right after the call.
"""


def main(argv=None) -> int:
    p = common.options(__doc__.splitlines()[0], reps=3)
    p.add_argument("--size-mb", type=int, default=1024)
    p.add_argument("--train-s", type=float, default=12.0)
    p.add_argument("--dir", default=None, help="checkpoint root's parent (default: a temp dir under /var/tmp)")
    args = p.parse_args(argv)
    exit_on_signals()   # so the finally below removes the checkpoints
    torch.set_num_threads(1)
    base = Path(tempfile.mkdtemp(prefix="cc-bench-ckpt-", dir=args.dir or "/var/tmp"))
    args.dir_kind = f"`{base.parent}` (local disk)" if args.dir is None else f"`{base.parent}`"
    store = dist.FileStore(str(base / "store"), 1)
    dist.init_process_group("gloo", rank=0, world_size=1, store=store)
    try:
        res = bench(args.size_mb, args.reps, args.train_s, base / "ckpt")
    finally:
        dist.destroy_process_group()
        shutil.rmtree(base, ignore_errors=True)
    common.publish("## checkpoint", section(res, args), write=not args.no_write)
    return 0


if __name__ == "__main__":
    sys.exit(main())
