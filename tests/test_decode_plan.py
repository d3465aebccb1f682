"""The split-KV decode planner (kgen.ops.decode_plan) against a model of what it promises."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kgen.ops.decode_plan import plan_splits


@settings(max_examples=300, deadline=None)
@given(seqlens=st.lists(st.integers(0, 70000) | st.sampled_from([0, 1, 63, 64, 65, 128, 129]), min_size=1, max_size=40),
       heads=st.integers(1, 16), tile=st.sampled_from([32, 64, 128, 176]), sms=st.sampled_from([1, 8, 132]),
       extra=st.integers(0, 5000), cap=st.integers(1, 64))
def test_every_tile_once_and_the_grid_fills_what_it_can(seqlens, heads, tile, sms, extra, cap):
    bound = max(seqlens) + extra
    plan = plan_splits(seqlens, num_kv_heads=heads, kv_tile=tile, num_sms=sms, max_seqlen_k=bound, split_cap=cap)
    target, items, max_tiles = 2 * sms, len(seqlens) * heads, max(1, math.ceil(bound / tile))
    assert 1 <= plan.max_splits <= max(1, min(cap, max_tiles))
    if items >= target:
        assert plan.single_pass
    else:  # as many splits as fill the grid, as far as the cap and the tiles allow
        assert plan.max_splits >= min(math.ceil(target / items), cap, max_tiles) or \
            plan.tiles_per_split * plan.max_splits >= max_tiles
    # Every length up to the bound is covered by at most max_splits splits of tiles_per_split tiles ...
    assert plan.tiles_per_split * plan.max_splits >= max_tiles
    # ... and every request's tiles are covered exactly once, in order, each split non-empty.
    for n in seqlens + [bound, bound + 3 * tile * plan.tiles_per_split]:  # past the bound: the last split grows
        tiles = math.ceil(n / tile)
        covered = [t for z in range(plan.max_splits) for t in plan.split_tiles(n, z)]
        assert covered == list(range(tiles))
        splits = int(plan.splits(np.array([n]))[0])
        assert all(len(plan.split_tiles(n, z)) > 0 for z in range(splits)) or tiles == 0
        assert all(len(plan.split_tiles(n, z)) == 0 for z in range(splits, plan.max_splits))


def test_the_issue_shapes():
    # GQA 32/8 hd128 with 128-key tiles, 132 SMs: B1 L32k splits to fill 264 blocks; B256 L1k is one pass.
    one = plan_splits([32768], num_kv_heads=8, kv_tile=128, num_sms=132)
    assert one.max_splits == 32 and one.tiles_per_split == 8  # 8 heads x 32 splits = 256 blocks
    assert plan_splits([1024] * 256, num_kv_heads=8, kv_tile=128, num_sms=132).single_pass
    # A bound reserved for graph capture keeps the grid when lengths change.
    bound = plan_splits([100], num_kv_heads=8, kv_tile=128, num_sms=132, max_seqlen_k=8192)
    assert bound.max_splits == 32 and list(bound.splits(np.array([100, 8192]))) == [1, 32]


@pytest.mark.parametrize("bad,error", [
    (dict(seqlens_k=[-1]), ValueError), (dict(seqlens_k=[1], num_kv_heads=0), ValueError),
    (dict(seqlens_k=[1], kv_tile=0), ValueError), (dict(seqlens_k=[10], max_seqlen_k=5), ValueError),
    (dict(seqlens_k=[1], split_cap=True), TypeError),
])
def test_bad_input_names_the_argument(bad, error):
    args = dict(num_kv_heads=8, kv_tile=128, num_sms=132) | bad
    name = next(k for k in bad if k != "seqlens_k") if len(bad) > 1 else "seqlens_k"
    with pytest.raises(error, match=name):
        plan_splits(**args)
