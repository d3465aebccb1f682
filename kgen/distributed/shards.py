"""What both context-parallel schemes share: cutting sequences into even pieces, the zigzag shard of a rank, and
the checks that a plan fits its ranks and its process group.

Zigzag (load-balanced for causal attention): each sequence is cut into 2W chunks of as equal a size as its
length allows (W ranks); rank r holds chunk r (its "front") and chunk 2W-1-r (its "back"). A rank's local
tokens are the fronts of all sequences, then the backs, each part packed like the global batch.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kgen.runtime.checks import check_int
from kgen.runtime.recipes import cumulative

#: Regions of a rank's local tokens: the fronts (chunk r of every sequence) and the backs (chunk 2W-1-r),
#: each packed per sequence (so a region is a varlen batch of its own).
FRONT, BACK = "front", "back"


def even_bounds(seqlen: int, pieces: int) -> np.ndarray:
    """The ``pieces + 1`` boundaries of a sequence cut in ``pieces``: piece c is tokens [b[c], b[c+1]), sizes
    within one of each other."""
    return np.array([c * seqlen // pieces for c in range(pieces + 1)], dtype=np.int64)


def zigzag_bounds(seqlen: int, world_size: int) -> np.ndarray:
    """The 2W + 1 boundaries of a sequence's zigzag chunks: chunk c is tokens [b[c], b[c+1])."""
    return even_bounds(seqlen, 2 * world_size)


def rows_of(ranges) -> np.ndarray:
    """The global packed rows of (start, end) ranges, in order: for sharding a global tensor and gathering it
    back."""
    pieces = [np.arange(a, b) for a, b in ranges]
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class Shard:
    """One rank's tokens: per sequence, the global (start, end) of its front and back chunk."""

    front: np.ndarray  # int64 [N, 2]
    back: np.ndarray  # int64 [N, 2]

    def lengths(self, region: str) -> np.ndarray:
        part = self.front if region == FRONT else self.back
        return part[:, 1] - part[:, 0]

    @property
    def tokens(self) -> int:
        return int(self.lengths(FRONT).sum() + self.lengths(BACK).sum())

    def rows(self, region: str) -> tuple[int, int]:
        """The region's rows in the local tensors: fronts first, then backs."""
        fronts = int(self.lengths(FRONT).sum())
        return (0, fronts) if region == FRONT else (fronts, self.tokens)

    def global_rows(self) -> np.ndarray:
        """The global packed row of each local row."""
        return rows_of([*self.front, *self.back])


def shard_of(seqlens: Sequence[int], world_size: int, rank: int) -> Shard:
    front, back = [], []
    for start, n in zip(cumulative(seqlens), seqlens):
        b = zigzag_bounds(int(n), world_size) + start
        front.append((b[rank], b[rank + 1]))
        back.append((b[2 * world_size - 1 - rank], b[2 * world_size - rank]))
    shape = (len(seqlens), 2)
    return Shard(np.array(front, dtype=np.int64).reshape(shape), np.array(back, dtype=np.int64).reshape(shape))


def check_rank(world_size: int, rank: int) -> None:
    check_int("world_size", world_size, minimum=1)
    check_int("rank", rank, minimum=0, maximum=world_size - 1)


def check_group(group, plan) -> None:
    """Refuses a ``plan`` (with ``world_size`` and ``rank``) made for another place in ``group`` than this rank's."""
    import torch.distributed as dist

    if dist.get_world_size(group) != plan.world_size or dist.get_rank(group) != plan.rank:
        raise ValueError(f"plan: made for rank {plan.rank} of {plan.world_size}; this group has rank "
                         f"{dist.get_rank(group)} of {dist.get_world_size(group)}")
