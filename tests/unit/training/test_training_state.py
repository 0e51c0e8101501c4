"""checkpoint.capture / restore: the whole training state round-trips through save/load and the next steps are
bit-identical to the steps of a run that was never interrupted (dropout and data order included)."""
from __future__ import annotations

import os
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, TensorDataset

from clusterctl import checkpoint
from clusterctl.sampler import ResumableDistributedSampler

N = 96


def setup(rank=0, world=1, seed=0):
    torch.manual_seed(seed)
    g = torch.Generator().manual_seed(1)
    ds = TensorDataset(torch.randn(N, 8, generator=g), torch.randn(N, 1, generator=g))
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.3), torch.nn.Linear(16, 1))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    scaler = torch.amp.GradScaler("cpu", enabled=False)
    sampler = ResumableDistributedSampler(ds, num_replicas=world, rank=rank, seed=5)
    # its own generator: iter(DataLoader) draws a base seed, which would otherwise come from (and shift) the global
    # torch stream that dropout uses: one more iter() in the resumed run than in the uninterrupted one
    loader = DataLoader(ds, batch_size=8, sampler=sampler, num_workers=0, generator=torch.Generator())
    torch.manual_seed(seed + 100 + rank)     # per-rank streams (dropout)
    return model, opt, sched, scaler, sampler, loader


def train(objs, steps, epoch, start_seen=0, on_step=None):
    model, opt, sched, _, sampler, loader = objs
    sampler.set_epoch(epoch)
    loader.generator.manual_seed(epoch)
    seen, done = start_seen, 0
    for x, y in loader:
        noise = random.random() + float(np.random.rand())        # python and numpy streams matter too
        loss = ((model(x) - y) ** 2).mean() * (1 + 0 * noise)
        opt.zero_grad()
        loss.backward()
        opt.step()
        sched.step()
        seen += len(x)
        done += 1
        if on_step:
            on_step(done, seen)
        if done == steps:
            break
    return seen


def params(model):
    return [p.detach().clone() for p in model.parameters()]


def test_capture_save_load_restore_continues_bit_identically(tmp_path):
    random.seed(3)
    np.random.seed(3)
    ref = setup()
    train(ref, 9, epoch=1)
    want = params(ref[0])
    want_rng = (random.random(), float(np.random.rand()), float(torch.rand(1)))

    random.seed(3)
    np.random.seed(3)
    run = setup()
    seen = train(run, 4, epoch=1)
    model, opt, sched, scaler, sampler, _ = run
    state = checkpoint.capture(4, epoch=1, model=model, optimizer=opt, scheduler=sched, scaler=scaler,
                               data=sampler.state_dict(yielded=seen), extra={"note": "x"})
    checkpoint.save(state, 4, root=str(tmp_path))
    random.seed(99)
    np.random.seed(99)                              # the restart starts its streams over
    fresh = setup(seed=42)
    loaded = checkpoint.load(root=str(tmp_path))    # weights_only=True: the state is plain data and tensors
    info = checkpoint.restore(loaded, model=fresh[0], optimizer=fresh[1], scheduler=fresh[2], scaler=fresh[3],
                              data=fresh[4])
    assert info == {"step": 4, "epoch": 1, "world_size": 1, "rng_restored": True, "extra": {"note": "x"}}
    train(fresh, 5, epoch=info["epoch"])
    got = params(fresh[0])
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == want_rng


def test_restore_refuses_a_plain_dict():
    with pytest.raises(checkpoint.CheckpointError, match="capture"):
        checkpoint.restore({"model": {}})


def test_rng_state_round_trips():
    st = checkpoint.rng_state()
    a = (random.random(), float(np.random.rand()), float(torch.rand(1)))
    checkpoint.set_rng_state(st)
    assert (random.random(), float(np.random.rand()), float(torch.rand(1))) == a


def _worker(rank, world, store_path, out):
    store = dist.FileStore(store_path, world)
    dist.init_process_group("gloo", rank=rank, world_size=world, store=store)
    torch.manual_seed(1000 + rank)
    state = checkpoint.capture(7, epoch=2)
    if rank == 0:
        torch.save(state, out)
    dist.barrier()
    mine = checkpoint.rng_state()
    torch.rand(5)                                   # move on; restore must bring this rank's own stream back
    info = checkpoint.restore(torch.load(out, weights_only=True) if rank else state)
    assert info["rng_restored"]
    assert torch.equal(torch.get_rng_state(), mine["torch"])
    dist.barrier()
    dist.destroy_process_group()


def test_capture_gathers_every_ranks_rng_and_each_rank_gets_its_own_back(tmp_path):
    out = str(tmp_path / "state.pt")
    mp.start_processes(_worker, args=(3, str(tmp_path / "store"), out), nprocs=3, start_method="fork")
    state = torch.load(out, weights_only=True)
    assert state["world_size"] == 3 and len(state["rng"]) == 3
    assert len({bytes(r["torch"].tolist()) for r in state["rng"]}) == 3     # three different streams
    assert state["step"] == 7 and state["epoch"] == 2


def test_restore_at_another_world_size_leaves_the_rng_alone(tmp_path):
    state = checkpoint.capture(1)
    state["rng"] = state["rng"] * 2
    state["world_size"] = 2
    before = torch.get_rng_state()
    info = checkpoint.restore(state)
    assert not info["rng_restored"] and torch.equal(torch.get_rng_state(), before)
    os.environ.pop("WORLD_SIZE", None)


def test_async_save_holds_the_state_of_its_call_while_training_changes_it(tmp_path, monkeypatch):
    """Staging into kept buffers: each checkpoint holds the values at its async_save call, though the tensors
    change right after the call and the buffers are reused by the next checkpoint."""
    monkeypatch.delenv("RANK", raising=False)
    state = {"w": torch.zeros(1 << 16), "opt": {"m": torch.ones(8)}, "step": 0}
    handles = []
    for step in (1, 2, 3):
        state["w"].fill_(float(step))
        state["opt"]["m"].fill_(-float(step))
        state["step"] = step
        handles.append(checkpoint.async_save(state, step, root=str(tmp_path)))
        state["w"].fill_(99.0)                          # training goes on at once
        handles[-1].result(timeout=60)
    for step, h in zip((1, 2, 3), handles):
        target = {"w": torch.empty(1 << 16), "opt": {"m": torch.empty(8)}, "step": 0}
        checkpoint.load(h.path, state_dict=target)
        assert torch.all(target["w"] == step) and torch.all(target["opt"]["m"] == -step) and target["step"] == step
