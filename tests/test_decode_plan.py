"""Decode attention's planning (kgen.families.attention_decode.splits, kgen.ops.plan_attention_decode) on the
CPU, against a pure-Python model of the keys each block's warps visit."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kgen import registry
from kgen.ops import plan_attention_decode
from kgen.families.attention_decode.splits import max_request_tiles, plan_splits, request_tiles


def visited_keys(seqlen, q_len, window_left, slice_keys, warps, plan, split):
    """The keys the blocks of split ``split`` load, walking the kernel's loops as written in its template."""
    first = 0 if window_left < 0 else max(0, seqlen - q_len - window_left)
    slice_begin = first // slice_keys
    slice_end = math.ceil(seqlen / slice_keys) if seqlen > 0 else slice_begin
    tiles = math.ceil((slice_end - slice_begin) / warps)
    splits = max(1, min(plan.max_splits, math.ceil(tiles / plan.tiles_per_split)))
    if split >= splits:
        return []
    tile_last = tiles if split == splits - 1 else (split + 1) * plan.tiles_per_split
    s0 = slice_begin + split * plan.tiles_per_split * warps
    s1 = min(slice_end, slice_begin + tile_last * warps)
    keys = []
    for warp in range(warps):
        for s in range(s0 + warp, s1, warps):
            keys += [k for k in range(s * slice_keys, (s + 1) * slice_keys) if k < seqlen]
    return keys


@settings(max_examples=300, deadline=None)
@given(seqlens=st.lists(st.integers(0, 70000) | st.sampled_from([0, 1, 15, 16, 17, 63, 64, 65]), min_size=1, max_size=8),
       q_len=st.integers(1, 8), window=st.sampled_from([-1, -1, 0, 1, 100, 5000]), slice_keys=st.sampled_from([16, 32]),
       warps=st.sampled_from([2, 4, 8]), items=st.integers(1, 600), sms=st.sampled_from([1, 8, 132]),
       extra=st.integers(0, 5000), cap=st.integers(1, 64))
def test_every_needed_key_is_loaded_once(seqlens, q_len, window, slice_keys, warps, items, sms, extra, cap):
    bound = max(seqlens) + extra
    tiles = request_tiles(np.array(seqlens), q_len=q_len, window_left=window, slice_keys=slice_keys, warps=warps)
    most = max_request_tiles(bound, q_len=q_len, window_left=window, slice_keys=slice_keys, warps=warps)
    assert most >= int(tiles.max())  # the bound covers the lengths given
    plan = plan_splits(items, most, num_sms=sms, split_cap=cap)
    assert 1 <= plan.max_splits <= min(cap, most) and plan.tiles_per_split * plan.max_splits >= most
    assert items * plan.max_splits <= max(items, sms) or plan.max_splits == 1  # one wave, or one pass
    for n in seqlens + [bound, bound + 40000]:  # past the bound the last split grows: still every key
        keys = [k for z in range(plan.max_splits) for k in visited_keys(n, q_len, window, slice_keys, warps, plan, z)]
        first = 0 if window < 0 else max(0, n - q_len - window)
        # Every key a query may see (from the window's first to the last) is loaded exactly once.
        assert sorted(keys) == list(range(first - first % slice_keys, n)) or (n == 0 and not keys)
        assert len(keys) == len(set(keys))
    # The kernel's and the planner's split counts agree.
    counted = [max(1, min(plan.max_splits, math.ceil(t / plan.tiles_per_split))) for t in tiles]
    assert list(plan.splits(tiles)) == counted


def test_the_issue_shapes():
    def plan(batch, length, **kw):
        return plan_attention_decode([length] * batch, num_heads_q=32, num_heads_kv=8, head_dim=128, num_sms=132, **kw)
    # Small batches split to one block per SM; large ones are one pass.
    assert plan(1, 32768).splits.max_splits == 16 and plan(1, 131072).splits.max_splits == 16
    assert plan(8, 8192).splits.max_splits == 2
    assert plan(64, 2048).splits.single_pass and plan(256, 1024).splits.single_pass
    # Whole slices take the full-tiles variant, unless a bound is reserved for new lengths.
    assert not plan(1, 32768).has_incomplete_tile
    assert plan(1, 32768, max_seqlen_k=40000).has_incomplete_tile
    assert plan(1, 32769).has_incomplete_tile
    # A reserved bound keeps the grid: the splits are those of the bound.
    bounded = plan(1, 100, max_seqlen_k=32768)
    assert bounded.grid == (16, 8, 1) and list(bounded.splits.splits(np.array([1, 512]))) == [1, 16]


@pytest.mark.parametrize("page_size,load", [(None, "tma"), (16, "tma"), (64, "tma"), (256, "tma"), (1, "cp_async"),
                                            (24, "cp_async"), (100, "cp_async")])
def test_tma_where_pages_hold_whole_slices(page_size, load):
    plan = plan_attention_decode([300], num_heads_q=8, num_heads_kv=2, head_dim=128, page_size=page_size, num_sms=132)
    assert plan.variant.param_dict["kv_load"] == load
    assert plan.variant.param_dict["kv_layout"] == ("contiguous" if page_size is None else "paged")


def test_row_groups_cover_tokens_times_heads():
    plan = plan_attention_decode([100, 200], num_heads_q=64, num_heads_kv=4, head_dim=64, q_len=3, num_sms=132)
    assert plan.row_groups == math.ceil(3 * 16 / 16) and plan.grid[0] == plan.splits.max_splits * plan.row_groups


@pytest.mark.parametrize("bad,error,name", [
    (dict(seqlens_k=[-1]), ValueError, "seqlens_k"), (dict(num_heads_kv=0), ValueError, "num_heads_kv"),
    (dict(num_heads_q=12, num_heads_kv=8), ValueError, "num_heads_q"), (dict(q_len=9), ValueError, "q_len"),
    (dict(q_len=0), ValueError, "q_len"), (dict(max_seqlen_k=5), ValueError, "max_seqlen_k"),
    (dict(window_left=-2), ValueError, "window_left"), (dict(page_size=0), ValueError, "page_size"),
    (dict(page_size=24, kv_load="tma"), ValueError, "kv_load"), (dict(dtype=torch.float32), TypeError, "dtype"),
    (dict(head_dim=96), Exception, "head_dim"), (dict(block_table=[[0]]), ValueError, "block_table"),
    (dict(page_size=16, block_table=[[0], [1]], num_pages=4), ValueError, "block_table"),
    (dict(page_size=16, block_table=[[0, 1, 2], [3, 9, 0]], num_pages=4), ValueError, "block_table"),
])
def test_bad_input_names_the_argument(bad, error, name):
    args = dict(seqlens_k=[40, 20], num_heads_q=8, num_heads_kv=8, head_dim=128, num_sms=132) | bad
    with pytest.raises(error, match=name):
        plan_attention_decode(**args)


def _spec_with_configs(folder, configs: str):
    """A copy of the built-in decode spec whose configs are ``configs`` (YAML flow mappings, one per line)."""
    from kgen import config
    text = (config.BUILTIN_SPEC_DIR / "attention_decode.yaml").read_text()
    head, rest = text.split("configs:\n", 1)
    after = rest[rest.index("exclude:"):]
    (folder / "attention_decode.yaml").write_text(head + "configs:\n" + configs + after)
    return registry.Registry([folder])


def test_a_split_grid_takes_the_single_pass_slices_and_warps(tmp_path, monkeypatch):
    # Splits are counted in the single-pass variant's CTA tiles: the split variant must share its tile_n and
    # num_warps, whatever configs come first in the spec.
    reg = _spec_with_configs(tmp_path, "  - {head_dim: 128, tile_n: 16, num_warps: 2, stages: 3, min_blocks_per_sm: 4}\n"
                                       "  - {head_dim: 128, tile_n: 16, num_warps: 4, stages: 5, min_blocks_per_sm: 1}\n"
                                       "  - {head_dim: 128, tile_n: 16, num_warps: 2, stages: 8, min_blocks_per_sm: 1}\n")
    monkeypatch.setattr(registry, "current", lambda: reg)
    split = plan_attention_decode([32768], num_heads_q=32, num_heads_kv=8, head_dim=128, num_sms=132)
    assert not split.splits.single_pass
    assert {k: split.variant.param_dict[k] for k in ("num_warps", "stages", "min_blocks_per_sm")} == \
        {"num_warps": 2, "stages": 8, "min_blocks_per_sm": 1}


def test_a_spec_without_a_matching_split_config_is_refused_by_name(tmp_path, monkeypatch):
    reg = _spec_with_configs(tmp_path, "  - {head_dim: 128, tile_n: 16, num_warps: 2, stages: 3, min_blocks_per_sm: 4}\n"
                                       "  - {head_dim: 128, tile_n: 16, num_warps: 4, stages: 5, min_blocks_per_sm: 1}\n")
    monkeypatch.setattr(registry, "current", lambda: reg)
    assert plan_attention_decode([2048] * 64, num_heads_q=32, num_heads_kv=8, head_dim=128, num_sms=132).splits.single_pass
    with pytest.raises(registry.UnsupportedVariantError, match="split grid needs a config of min_blocks_per_sm 1"):
        plan_attention_decode([32768], num_heads_q=32, num_heads_kv=8, head_dim=128, num_sms=132)
