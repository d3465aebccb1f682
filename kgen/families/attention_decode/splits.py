"""Split-KV planning of decode attention: how many blocks share a request's keys, and which keys each reads.

Decode has B x Hkv independent (request, KV head) items, too few to fill the GPU for small
batches. A request's keys, from the first one its window lets a query see to its last, are cut
into CTA tiles of ``warps x slice`` keys (the kernel's slices start at multiples of ``slice``):

    first = 0 if window_left < 0 else max(0, seqlen - q_len - window_left)
    slices = [first // slice, ceil(seqlen / slice));  tiles = ceil(len(slices) / warps)

and the tiles into splits of ``tiles_per_split`` that run as separate blocks, emitting partial
outputs with their LSE that the last block to finish merges. The grid is fixed by the plan:
``max_splits`` blocks per item, so a CUDA graph captured with the plan survives new lengths. A
block works out its own split on the device,

    splits = max(1, min(max_splits, ceil(tiles / tiles_per_split)))

and split z (< splits) covers tiles [z * tiles_per_split, (z + 1) * tiles_per_split), the last one
every tile from its start to the end; blocks z >= splits exit at once. A length past the plan's
bound is therefore still computed exactly (the last split grows), only more slowly. When the
items already fill the SMs the plan has one split: a single pass that writes the output directly.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kgen.runtime.checks import check_int


def request_tiles(seqlens: np.ndarray, *, q_len: int, window_left: int, slice_keys: int, warps: int) -> np.ndarray:
    """The CTA tiles of each request, as the kernel counts them (the module docstring's formula)."""
    seqlens = np.asarray(seqlens, dtype=np.int64)
    first = np.zeros_like(seqlens) if window_left < 0 else np.maximum(0, seqlens - q_len - window_left)
    begin = first // slice_keys
    end = np.where(seqlens > 0, -(-seqlens // slice_keys), begin)
    return -(-(end - begin) // warps)


def max_request_tiles(max_seqlen_k: int, *, q_len: int, window_left: int, slice_keys: int, warps: int) -> int:
    """The most CTA tiles any request of at most ``max_seqlen_k`` keys has (at least 1)."""
    # With a window: its span plus a slice of misalignment, unless the request is shorter.
    span = max_seqlen_k if window_left < 0 else min(max_seqlen_k, q_len + window_left + slice_keys - 1)
    return max(1, int(request_tiles(np.array([span]), q_len=q_len, window_left=-1, slice_keys=slice_keys,
                                    warps=warps)[0]))


@dataclass(frozen=True)
class SplitPlan:
    tiles_per_split: int
    #: Blocks per (request, KV head) in the grid; 1: a single pass, no merge.
    max_splits: int

    @property
    def single_pass(self) -> bool:
        return self.max_splits == 1

    def splits(self, tiles: np.ndarray) -> np.ndarray:
        """The splits the blocks of requests of ``tiles`` CTA tiles work out on the device."""
        tiles = np.asarray(tiles, dtype=np.int64)
        return np.maximum(1, np.minimum(self.max_splits, -(-tiles // self.tiles_per_split)))

    def split_tiles(self, tiles: int, split: int) -> range:
        """The CTA tiles split ``split`` of a request of ``tiles`` tiles covers (empty past its splits)."""
        splits = int(self.splits(np.array([tiles]))[0])
        if split >= splits:
            return range(0)
        end = tiles if split == splits - 1 else (split + 1) * self.tiles_per_split
        return range(split * self.tiles_per_split, end)


def plan_splits(num_items: int, max_tiles: int, *, num_sms: int, blocks_per_sm: int = 1, split_cap: int = 32
                ) -> SplitPlan:
    """The split plan for ``num_items`` (request, KV head, row group) items of at most ``max_tiles`` CTA tiles:
    as many splits as fit the grid in one wave of ``blocks_per_sm`` blocks per SM, no more than ``split_cap``
    or the tiles, and one when the items already fill it."""
    check_int("num_items", num_items, minimum=0)
    check_int("max_tiles", max_tiles, minimum=1)
    check_int("num_sms", num_sms, minimum=1)
    check_int("blocks_per_sm", blocks_per_sm, minimum=1)
    check_int("split_cap", split_cap, minimum=1)
    target = num_sms * blocks_per_sm
    # At most one wave: blocks of a second, partial wave run with too few loads in flight to keep HBM busy.
    wanted = max(1, target // num_items) if num_items else 1
    splits = max(1, min(wanted, split_cap, max_tiles))
    tiles_per_split = -(-max_tiles // splits)
    # Fewer splits may cover the bound with that many tiles each.
    return SplitPlan(tiles_per_split=tiles_per_split, max_splits=-(-max_tiles // tiles_per_split))
