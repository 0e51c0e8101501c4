"""A resumable drop-in for ``torch.utils.data.DistributedSampler``.

Shipped to nodes next to ``checkpoint.py`` (``from clusterctl import sampler`` works wherever the launcher starts a
job); like it, it imports no other clusterctl module. Needs torch (it subclasses torch's sampler).

The epoch's order is the one ``DistributedSampler`` uses (``randperm(len(dataset))`` seeded with ``seed + epoch``,
padded or cut to a multiple of the world size), and rank ``r`` of ``W`` takes every ``W``-th index starting at
``r``. Because the shards are strided, after every rank has taken ``k`` indices the samples consumed by the whole
job are exactly the first ``k * W`` of the order: a prefix. The state is therefore small and world-size free:
``(epoch, consumed, seed)``. On resume the rest of the order, ``order[consumed:]``, is sharded the same way over
the new world size:

* same world size: every rank yields exactly what it would have yielded without the interruption;
* another world size (elastic 3 nodes -> 2): the rest of the epoch is re-sharded, so no sample is lost or
  repeated (when the rest is not a multiple of the new world size, it is padded with the epoch's first samples,
  or cut with ``drop_last``, exactly as ``DistributedSampler`` pads or cuts a whole epoch).

``state_dict(yielded=None)`` counts what this rank's training loop has consumed. With a plain ``DataLoader`` with
workers the sampler runs ahead of the loop (workers prefetch), so pass the number of samples the loop has taken
from the loader in this epoch; torchdata's ``StatefulDataLoader`` asks the sampler at the right moment itself.
"""

from __future__ import annotations

import math
from typing import Any, Dict, Iterator, List, Optional, Sequence

import torch
from torch.utils.data.distributed import DistributedSampler

FORMAT = "clusterctl-sampler/1"

__all__ = ["ResumableDistributedSampler", "epoch_order", "rest_of_epoch", "shard", "FORMAT"]


# --------------------------------------------------------------------------------------------
# pure index arithmetic (no torch): tested property-based in tests/unit/training/test_sampler.py
# --------------------------------------------------------------------------------------------


def rest_of_epoch(order: Sequence[int], consumed: int, world: int, drop_last: bool = False) -> List[int]:
    """The indices still to be consumed in an epoch whose first ``consumed`` indices (of ``order``) are done,
    made a multiple of ``world`` long: padded with the epoch's first indices (``drop_last=False``) or cut."""
    if world < 1:
        raise ValueError(f"world size must be >= 1, got {world}")
    consumed = min(max(int(consumed), 0), len(order))
    rest = list(order[consumed:])
    if drop_last:
        return rest[: len(rest) // world * world]
    pad = -len(rest) % world
    if pad and order:
        rest += (list(order) * math.ceil(pad / len(order)))[:pad]
    return rest


def shard(rest: Sequence[int], world: int, rank: int) -> List[int]:
    """Rank ``rank``'s share of ``rest`` (a multiple of ``world`` long): every ``world``-th index from ``rank``."""
    if not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in [0, {world})")
    return list(rest[rank::world])


def epoch_order(n: int, epoch: int, seed: int, shuffle: bool = True) -> List[int]:
    """The order of an epoch, as ``DistributedSampler`` draws it."""
    if not shuffle:
        return list(range(n))
    g = torch.Generator()
    g.manual_seed(int(seed) + int(epoch))
    return torch.randperm(n, generator=g).tolist()


# --------------------------------------------------------------------------------------------
# the sampler
# --------------------------------------------------------------------------------------------


class ResumableDistributedSampler(DistributedSampler):
    """``DistributedSampler`` with ``state_dict()`` / ``load_state_dict()``. Same constructor, same order.

    Use it as ``DistributedSampler`` (``set_epoch(epoch)`` before each epoch); save ``state_dict(yielded=n)``
    (``n``: samples this rank has taken from the loader in this epoch) in the checkpoint, and call
    ``load_state_dict`` before the first ``set_epoch``/iteration after a restart. After a load, iterations of the
    loaded epoch start at the saved position; ``set_epoch`` with another epoch starts that epoch from its
    beginning.
    """

    def __init__(self, dataset: Any, num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.start = 0      # consumed (global prefix of the epoch's order) when this epoch's iteration begins
        self.yielded = 0    # indices this rank has handed out since the last __iter__

    # ---- what DistributedSampler does, from a position
    def _order(self) -> List[int]:
        return epoch_order(len(self.dataset), self.epoch, self.seed, self.shuffle)

    def _rest(self) -> List[int]:
        return rest_of_epoch(self._order(), self.start, self.num_replicas, self.drop_last)

    def __iter__(self) -> Iterator[int]:
        mine = shard(self._rest(), self.num_replicas, self.rank)
        self.yielded = 0
        for idx in mine:
            self.yielded += 1
            yield idx

    def __len__(self) -> int:
        n = len(self.dataset) - min(self.start, len(self.dataset))
        return n // self.num_replicas if self.drop_last else math.ceil(n / self.num_replicas)

    def set_epoch(self, epoch: int) -> None:
        if int(epoch) != self.epoch:
            self.start = 0
            self.yielded = 0
        super().set_epoch(int(epoch))

    # ---- state
    def consumed(self, yielded: Optional[int] = None) -> int:
        """Samples of this epoch consumed by the whole job when every rank has taken ``yielded`` (default: what
        this sampler has handed out) indices since the iteration began."""
        k = self.yielded if yielded is None else int(yielded)
        if k < 0:
            raise ValueError(f"yielded must be >= 0, got {k}")
        n = len(self.dataset)
        return min(self.start + k * self.num_replicas, n)

    def state_dict(self, yielded: Optional[int] = None) -> Dict[str, Any]:
        """``{"format", "epoch", "consumed", "seed", "shuffle", "drop_last", "dataset_len", "world_size"}``: plain
        ints and bools (loads with ``torch.load(weights_only=True)``). Equal on every rank at the same step."""
        return {"format": FORMAT, "epoch": int(self.epoch), "consumed": self.consumed(yielded),
                "seed": int(self.seed), "shuffle": bool(self.shuffle), "drop_last": bool(self.drop_last),
                "dataset_len": len(self.dataset), "world_size": int(self.num_replicas)}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Resume at ``state``'s epoch and position. ``world_size`` may differ from the saved one."""
        if not isinstance(state, dict) or state.get("format") != FORMAT:
            raise ValueError(f"not a {FORMAT} state: {state!r:.200}")
        if int(state["dataset_len"]) != len(self.dataset):
            raise ValueError(f"the sampler state is for a dataset of {state['dataset_len']} samples, "
                             f"this one has {len(self.dataset)}")
        consumed = int(state["consumed"])
        if not 0 <= consumed <= len(self.dataset):
            raise ValueError(f"consumed {consumed} is outside [0, {len(self.dataset)}]")
        self.seed = int(state["seed"])
        self.shuffle = bool(state["shuffle"])
        self.drop_last = bool(state["drop_last"])
        self.epoch = int(state["epoch"])
        self.start = consumed
        self.yielded = 0

