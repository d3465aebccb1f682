"""Host-side planning of split-KV decode attention (kgen.ops.attention_decode, issue 10; not yet an op).

Decode has B x Hkv independent (request, KV head) items, too few to fill the GPU for small
batches. Each item's keys are cut into splits of ``tiles_per_split`` KV tiles that run as separate
blocks and emit partial outputs with their LSE, merged afterwards. The grid is fixed by the plan:
``max_splits`` blocks per item, so that a CUDA graph captured with the plan survives new lengths.
A block works out its own split from the request's length on the device,

    tiles = ceil(seqlen / kv_tile);  splits = max(1, min(max_splits, ceil(tiles / tiles_per_split)))

and split z (< splits) covers tiles [z * tiles_per_split, (z + 1) * tiles_per_split), the last one
every tile from its start to the end; blocks z >= splits exit at once. A length past the plan's
bound is therefore still computed exactly (the last split grows), only more slowly. When B x Hkv
already fills the SMs the plan has one split: a single pass that writes the output directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kgen.ops._checks import check_int, check_seqlens


@dataclass(frozen=True)
class SplitPlan:
    kv_tile: int
    tiles_per_split: int
    #: Blocks per (request, KV head) in the grid; 1: a single pass, no merge.
    max_splits: int

    @property
    def single_pass(self) -> bool:
        return self.max_splits == 1

    def splits(self, seqlens: np.ndarray) -> np.ndarray:
        """The splits each request's blocks work out on the device (the formula in the module docstring)."""
        tiles = -(-np.asarray(seqlens, dtype=np.int64) // self.kv_tile)
        return np.maximum(1, np.minimum(self.max_splits, -(-tiles // self.tiles_per_split)))

    def split_tiles(self, seqlen: int, split: int) -> range:
        """The KV tiles split ``split`` of a request of ``seqlen`` keys covers (empty past its splits)."""
        tiles = -(-seqlen // self.kv_tile)
        splits = int(self.splits(np.array([seqlen]))[0])
        if split >= splits:
            return range(0)
        end = tiles if split == splits - 1 else (split + 1) * self.tiles_per_split
        return range(split * self.tiles_per_split, end)


def plan_splits(seqlens_k: Sequence[int], *, num_kv_heads: int, kv_tile: int, num_sms: int, blocks_per_sm: int = 2,
                max_seqlen_k: int | None = None, split_cap: int = 32) -> SplitPlan:
    """The split plan for requests of ``seqlens_k`` keys (host data), planned for lengths up to ``max_seqlen_k``
    (default: the longest given): enough splits that the grid fills ``blocks_per_sm`` blocks per SM, no more
    than ``split_cap`` or the longest request's tiles, and one when B x Hkv blocks already fill it."""
    lengths = check_seqlens("seqlens_k", seqlens_k)
    check_int("num_kv_heads", num_kv_heads, minimum=1)
    check_int("kv_tile", kv_tile, minimum=1)
    check_int("num_sms", num_sms, minimum=1)
    check_int("blocks_per_sm", blocks_per_sm, minimum=1)
    check_int("split_cap", split_cap, minimum=1)
    longest = int(lengths.max(initial=0))
    if max_seqlen_k is None:
        max_seqlen_k = longest
    check_int("max_seqlen_k", max_seqlen_k, minimum=0)
    if max_seqlen_k < longest:
        raise ValueError(f"max_seqlen_k: {max_seqlen_k} is below the longest request's {longest} keys")
    items = len(lengths) * num_kv_heads
    target = num_sms * blocks_per_sm
    max_tiles = max(1, -(-max_seqlen_k // kv_tile))
    wanted = 1 if items >= target or items == 0 else -(-target // items)
    splits = max(1, min(wanted, split_cap, max_tiles))
    tiles_per_split = -(-max_tiles // splits)
    # Fewer splits may cover the bound with that many tiles each.
    return SplitPlan(kv_tile=kv_tile, tiles_per_split=tiles_per_split, max_splits=-(-max_tiles // tiles_per_split))
