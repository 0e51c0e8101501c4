"""clusterctl.sampler: the resumable DistributedSampler, over any position and any change of world size."""
from __future__ import annotations

import io
from collections import Counter

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.utils.data import DataLoader, Dataset
from torch.utils.data.distributed import DistributedSampler

from clusterctl.sampler import ResumableDistributedSampler, epoch_order, rest_of_epoch, shard


class Ids(Dataset):
    def __init__(self, n: int):
        self.n = n

    def __len__(self) -> int:
        return self.n

    def __getitem__(self, i: int) -> int:
        return i


def samplers(n, world, **kw):
    ds = Ids(n)
    return [ResumableDistributedSampler(ds, num_replicas=world, rank=r, **kw) for r in range(world)]


def save_load(state):
    """Through torch.save / torch.load(weights_only=True), as a checkpoint does."""
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=True)


def run_phases(n, phases, epoch=3, seed=7, drop_last=False):
    """Train an epoch in phases [(world, k), ...]: every rank of a phase takes k indices (None: the rest), then
    the job stops, and the next phase resumes from rank 0's state at another world size. Returns the ledger."""
    ledger: list[int] = []
    state = None
    for world, k in phases:
        ss = samplers(n, world, seed=seed, drop_last=drop_last)
        for s in ss:
            if state is not None:
                s.load_state_dict(save_load(state))
            s.set_epoch(epoch)
        took = []
        for s in ss:
            mine = list(s)
            took.append(len(mine) if k is None else min(k, len(mine)))
            ledger += mine[: took[-1]]
        assert len(set(took)) == 1, f"ranks got shards of different lengths: {took}"
        states = [s.state_dict(yielded=took[0]) for s in ss]
        assert all(x == states[0] for x in states), "the state differs between ranks"
        state = states[0]
    return ledger, state


worlds = st.integers(min_value=1, max_value=9)


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 200), world=worlds, epoch=st.integers(0, 5), seed=st.integers(0, 2**31),
       shuffle=st.booleans(), drop_last=st.booleans())
def test_a_fresh_epoch_is_exactly_what_DistributedSampler_yields(n, world, epoch, seed, shuffle, drop_last):
    for rank in range(world):
        kw = dict(num_replicas=world, rank=rank, shuffle=shuffle, seed=seed, drop_last=drop_last)
        ours, theirs = ResumableDistributedSampler(Ids(n), **kw), DistributedSampler(Ids(n), **kw)
        ours.set_epoch(epoch)
        theirs.set_epoch(epoch)
        assert list(ours) == list(theirs)
        assert len(ours) == len(theirs)


@settings(max_examples=200, deadline=None)
@given(data=st.data(), n=st.integers(1, 200), world=worlds, drop_last=st.booleans())
def test_same_world_size_resumes_exactly_where_it_stopped(data, n, world, drop_last):
    ss = samplers(n, world, seed=11, drop_last=drop_last)
    full = [list(s) for s in ss]
    k = data.draw(st.integers(0, len(full[0])), label="per-rank samples consumed")
    state = ss[0].state_dict(yielded=k)
    for rank in range(world):
        again = ResumableDistributedSampler(Ids(n), num_replicas=world, rank=rank, seed=999, drop_last=drop_last)
        again.load_state_dict(save_load(state))
        again.set_epoch(state["epoch"])
        assert list(again) == full[rank][k:]
        assert len(again) == len(full[rank]) - k


phase = st.tuples(worlds, st.integers(0, 60))


@settings(max_examples=300, deadline=None)
@given(n=st.integers(1, 240), phases=st.lists(phase, min_size=0, max_size=3), last=worlds)
def test_any_chain_of_world_sizes_consumes_every_sample(n, phases, last):
    """No sample lost; a sample is repeated only as padding (fewer repeats than the world sizes involved)."""
    ledger, state = run_phases(n, [*phases, (last, None)])
    counts = Counter(ledger)
    assert set(counts) == set(range(n)), "a sample was lost"
    assert state["consumed"] == n
    assert len(ledger) - n < sum(w for w, _ in phases) + last


@settings(max_examples=300, deadline=None)
@given(data=st.data(), n=st.integers(1, 240), old=worlds, new=worlds)
def test_elastic_change_without_padding_consumes_every_sample_exactly_once(data, n, old, new):
    """When the world sizes divide what is left (as in the quickstart: 3072 samples, 6 -> 4 ranks, even
    batches), the ledger of an epoch interrupted at any point and re-sharded holds every sample exactly once."""
    n = n * old                                            # the first world size divides the epoch
    k = data.draw(st.integers(0, n // old), label="per-rank samples consumed before the change")
    # the latest position at or before k where the rest divides by `new` (k = 0 always works when new | n)
    k = next((j for j in range(k, -1, -1) if (n - j * old) % new == 0), None)
    if k is None:
        n, k = n * new, 0
    ledger, _ = run_phases(n, [(old, k), (new, None)])
    assert sorted(ledger) == list(range(n))


@settings(max_examples=200, deadline=None)
@given(n=st.integers(1, 240), phases=st.lists(phase, min_size=0, max_size=3), last=worlds)
def test_drop_last_never_repeats_and_drops_less_than_one_round(n, phases, last):
    ledger, _ = run_phases(n, [*phases, (last, None)], drop_last=True)
    assert len(ledger) == len(set(ledger)), "a sample was repeated"
    assert n - len(ledger) < last


@settings(max_examples=200, deadline=None)
@given(n=st.integers(0, 100), consumed=st.integers(0, 120), world=worlds, drop_last=st.booleans())
def test_rest_of_epoch_is_a_multiple_of_the_world_and_starts_after_the_consumed_prefix(n, consumed, world, drop_last):
    order = epoch_order(n, 1, 5)
    rest = rest_of_epoch(order, consumed, world, drop_last)
    assert len(rest) % world == 0
    c = min(consumed, n)
    assert rest[: n - c] == order[c:][: len(rest)]
    shards = [shard(rest, world, r) for r in range(world)]
    assert len({len(s) for s in shards}) == 1
    assert sorted(sum(shards, [])) == sorted(rest)


def test_consumption_is_a_prefix_of_the_epoch_order():
    ss = samplers(100, 4, seed=3)
    order = epoch_order(100, 0, 3)
    firsts = [list(s)[:5] for s in ss]
    assert sorted(sum(firsts, [])) == sorted(order[:20])
    assert ss[0].state_dict(yielded=5)["consumed"] == 20


def test_set_epoch_keeps_a_loaded_position_and_a_new_epoch_starts_over():
    s = ResumableDistributedSampler(Ids(40), num_replicas=2, rank=0, seed=1)
    s.load_state_dict({**s.state_dict(), "epoch": 2, "consumed": 10})
    s.set_epoch(2)
    assert len(list(s)) == 15
    s.set_epoch(3)
    assert len(list(s)) == 20 and s.state_dict()["consumed"] == 40


def test_load_refuses_a_state_of_another_dataset_or_a_foreign_dict():
    s = ResumableDistributedSampler(Ids(10), num_replicas=2, rank=0)
    with pytest.raises(ValueError, match="dataset of 12"):
        s.load_state_dict({**s.state_dict(), "dataset_len": 12})
    with pytest.raises(ValueError, match="not a clusterctl-sampler"):
        s.load_state_dict({"yielded": 3})
    with pytest.raises(ValueError, match="outside"):
        s.load_state_dict({**s.state_dict(), "consumed": 11})


def _batches(loader, limit=None):
    out = []
    for i, b in enumerate(loader):
        if limit is not None and i == limit:
            break
        out.append(b.tolist())
    return out


def test_a_dataloader_with_workers_resumes_exactly_when_told_what_the_loop_consumed():
    """Workers prefetch: the sampler has handed out more than the loop took, so the loop passes its count."""
    ds = Ids(96)

    def loader():
        s = ResumableDistributedSampler(ds, num_replicas=3, rank=1, seed=4)
        s.set_epoch(1)
        return s, DataLoader(ds, batch_size=4, sampler=s, num_workers=2)

    _, full_loader = loader()
    full = _batches(full_loader)
    s, dl = loader()
    head = _batches(dl, limit=3)
    assert s.yielded > 12, "the workers did not prefetch: this test would prove nothing"
    state = s.state_dict(yielded=sum(len(b) for b in head))
    s2, dl2 = loader()
    s2.load_state_dict(save_load(state))
    s2.set_epoch(1)
    assert head + _batches(dl2) == full


def test_torchdata_stateful_dataloader_snapshots_the_sampler_at_the_consumed_batch():
    """StatefulDataLoader (2 workers, prefetch) asks the sampler for its state as of the batch it hands out."""
    from torchdata.stateful_dataloader import StatefulDataLoader

    ds = Ids(96)

    def loader():
        s = ResumableDistributedSampler(ds, num_replicas=2, rank=0, seed=9)
        s.set_epoch(2)
        return StatefulDataLoader(ds, batch_size=4, sampler=s, num_workers=2)

    full = _batches(loader())
    dl = loader()
    it = iter(dl)
    head = [next(it).tolist() for _ in range(5)]
    state = save_load(dl.state_dict())
    dl2 = loader()
    dl2.load_state_dict(state)
    assert head + _batches(dl2) == full
