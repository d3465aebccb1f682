"""The chunked gated delta rule's host planning (kgen.families.gated_delta_rule: its schedule and its plan's tables)
against a pure-Python model of it."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kgen import registry
from kgen.families.gated_delta_rule.axes import spec_axes
from kgen.families.gated_delta_rule.chunk import KKT_CHUNK_TIME, kkt_chunks_per_block
from kgen.families.gated_delta_rule.contract import GDN_SEGMENT_FIELDS
from kgen.families.gated_delta_rule.recipe import ChunkRecipe, plan_from_recipe
from kgen.families.gated_delta_rule.schedule import RecurrenceCosts, choose_segment_chunks, plan_chunks
from kgen.ops import plan_chunk_gated_delta_rule
from kgen.runtime.dispatch import DTYPE_NAMES

lengths = st.lists(st.integers(0, 3000) | st.sampled_from([1, 63, 64, 65, 127, 128, 129]), max_size=12)


def model_chunks(seqlens, chunk):
    return [(s, c) for s, n in enumerate(seqlens) for c in range(-(-n // chunk))]


def model_time(counts, length, parallel, summary_blocks, costs, cut_short):
    """The planner's cost model, restated one sequence at a time; ``cut_short``: each summary runs one chunk."""
    def phase(blocks, work, longest, per_sm):
        if blocks <= costs.num_sms:
            return longest
        slots = costs.num_sms * per_sm
        return (costs.shared if per_sm > 1 else 1) * max(longest * math.ceil(blocks / slots), work / slots)
    pieces = [math.ceil(c / length) for c in counts]
    blocks, longest = sum(pieces) * parallel, min(length, max(counts))
    if costs.wide_slices > 1 and blocks > costs.num_sms * costs.blocks_per_sm:  # wide blocks, one an SM
        forward = costs.wide_chunk * phase(math.ceil(blocks / costs.wide_slices), sum(counts) * parallel / costs.wide_slices,
                                           longest, 1)
    else:
        forward = phase(blocks, sum(counts) * parallel, longest, costs.blocks_per_sm)
    forward += costs.fixed * (sum(counts) * parallel)
    if all(n <= 1 for n in pieces):
        return forward
    summary_blocks_total = sum(n - 1 for n in pieces if n > 1) * summary_blocks
    summary_chunks = 1 if cut_short else length
    return (costs.split_overhead + costs.summary * phase(summary_blocks_total, summary_blocks_total * summary_chunks,
                                                         summary_chunks, costs.summary_blocks_per_sm)
            + costs.chain_step * max(n - 1 for n in pieces) + forward)


@settings(max_examples=200, deadline=None)
@given(seqlens=lengths, chunk=st.sampled_from([16, 64]), parallel=st.integers(1, 64), sms=st.integers(1, 200),
       split=st.booleans(), min_chunks=st.integers(1, 16), wide_slices=st.sampled_from([1, 2]),
       blocks_per_sm=st.sampled_from([1, 2]), shortcut=st.booleans())
def test_chunks_and_segments_match_the_model(seqlens, chunk, parallel, sms, split, min_chunks, wide_slices, blocks_per_sm,
                                             shortcut):
    costs = (RecurrenceCosts(num_sms=sms, wide_slices=wide_slices, blocks_per_sm=blocks_per_sm, shortcut=shortcut)
             if split else None)
    plan = plan_chunks(seqlens, chunk=chunk, parallel_per_segment=parallel, costs=costs,
                       min_segment_chunks=min_chunks)
    assert [tuple(x) for x in plan.chunk_indices.tolist()] == model_chunks(seqlens, chunk)
    counts = [-(-n // chunk) for n in seqlens]
    assert plan.chunk_offsets.tolist() == [0, *np.cumsum(counts).tolist()]
    assert plan.has_incomplete_tile is any(n % chunk for n in seqlens)
    assert (plan.total_tokens, plan.max_seqlen) == (sum(seqlens), max(seqlens, default=0))

    # Segments: each sequence's chunks exactly once, in consecutive runs of at most segment_chunks,
    # all but the last of a sequence full; the costliest first.
    seg = plan.segment_chunks
    covered = {}
    for s, first, n in plan.segments.tolist():
        assert 0 < n <= seg and first % seg == 0
        covered.setdefault(s, []).append((first, n))
    for s, count in enumerate(counts):
        runs = sorted(covered.get(s, []))
        assert [f for f, _ in runs] == list(range(0, count, seg))
        assert sum(n for _, n in runs) == count
    sizes = plan.segments[:, 2].tolist()
    assert sizes == sorted(sizes, reverse=True)

    # The segment length: among the even splits of the longest sequence, the nearest the model's fastest with
    # summaries in full and (with the shortcut) with summaries cut short: the smallest worse ratio.
    longest = max(counts, default=0)
    if costs is None or longest <= min_chunks:
        assert seg == max(longest, 1)
    else:
        candidates = sorted({math.ceil(longest / k) for k in range(1, longest // min_chunks + 1)}, reverse=True)
        full = [model_time(counts, n, parallel, 2 * parallel, costs, False) for n in candidates]
        cut = [model_time(counts, n, parallel, 2 * parallel, costs, shortcut) for n in candidates]
        regret = [max(f / min(full), c / min(cut)) for f, c in zip(full, cut)]
        assert seg == next(n for n, r in zip(candidates, regret) if r == min(regret))
    # The forward's kernel: wide blocks where one-slice blocks would share SMs or wait for one.
    blocks = sum(math.ceil(c / seg) for c in counts) * parallel
    assert plan.wide is (split and wide_slices > 1 and blocks > sms * costs.blocks_per_sm)


def test_splits_only_where_the_model_says_it_pays():
    costs = RecurrenceCosts()
    # 1 x 32k tokens at 8 v-heads (16 blocks a segment): a long serial chain on a few SMs; split.
    plan = plan_chunks([32768], chunk=64, parallel_per_segment=16, costs=costs)
    assert len(plan.segments) > 4 and plan.segments[:, 2].sum() == 512
    # 4 x 8k at 32 v-heads already fills two blocks per SM: a split only adds the summaries.
    assert len(plan_chunks([8192] * 4, chunk=64, parallel_per_segment=64, costs=costs).segments) == 4
    assert choose_segment_chunks(np.array([512]), parallel_per_segment=32, summary_per_segment=64, costs=None,
                                 min_segment_chunks=8) == 512


@pytest.mark.parametrize("bad,error", [
    (dict(seqlens=[1, -1]), ValueError), (dict(seqlens=[True]), TypeError), (dict(seqlens=(1.5,)), TypeError),
    (dict(seqlens=[8], chunk=0), ValueError), (dict(seqlens=[8], summary_per_segment=0), ValueError),
    (dict(seqlens=[8], parallel_per_segment=0), ValueError), (dict(seqlens=[2**31]), ValueError),
    (dict(seqlens=[8], segment_chunks=0), ValueError),
])
def test_bad_plans_are_refused_with_the_argument_named(bad, error):
    name = next(k for k in bad if k != "seqlens") if len(bad) > 1 else "seqlens"
    with pytest.raises(error, match=name):
        plan_chunks(**{"chunk": 64, **bad})


@settings(max_examples=100, deadline=None)
@given(seqlens=lengths, heads_v=st.sampled_from([1, 2, 8, 32]), sms=st.sampled_from([1, 132, 4096]))
def test_op_tables_match_the_model(seqlens, heads_v, sms):
    """plan_chunk_gated_delta_rule's tables (what the kernels read) against a model built sequence by sequence."""
    cu = [0, *np.cumsum(seqlens).tolist()]
    plan = plan_chunk_gated_delta_rule(cu, num_heads_v=heads_v, head_dim=128, num_sms=sms)
    schedule, chunk = plan.schedule, plan.schedule.chunk
    assert plan.cu_seqlens == tuple(cu) and plan.num_seqs == len(seqlens)
    assert plan.chunks.tolist() == [[cu[s] + chunk * c, min(chunk, seqlens[s] - chunk * c)]
                                    for s, c in model_chunks(seqlens, chunk)]
    rows, chains, base = [], [], 0
    for s, n in enumerate(seqlens):
        mine = sorted((first, count) for seq, first, count in schedule.segments.tolist() if seq == s)
        if n == 0:
            rows.append([s, cu[s], cu[s], 0, 0, -1, -1, 1, cu[s]])
            continue
        for j, (first, count) in enumerate(mine):
            last = j == len(mine) - 1
            rows.append([s, cu[s] + chunk * first, cu[s + 1], int(schedule.chunk_offsets[s]) + first, count,
                         -1 if last else base + j, base + j - 1 if j else -1, int(last), cu[s]])
        if len(mine) > 1:
            chains.append([s, base, len(mine) - 1])
            base += len(mine) - 1
    got = plan.segments.tolist()
    assert sorted(got) == sorted(rows)
    assert [r[4] for r in got] == sorted((r[4] for r in got), reverse=True)  # the longest first
    assert plan.summary_segments.tolist() == [r for r in got if r[5] >= 0]
    assert plan.chains.tolist() == chains and plan.num_summaries == base


@settings(max_examples=50, deadline=None)
@given(seqlens=lengths, segment_chunks=st.sampled_from([1, 2, 3]))
def test_the_backward_walks_the_same_slots_back(seqlens, segment_chunks):
    """The backward's split (reverse.cuh, the chain with reverse_order) on the forward's slots, as its kernels index
    them: each segment but a sequence's first writes its summary to its start slot; the chain walks a sequence's
    slots from the last down, from d_final_state, writing each result to the slot it read; each segment but the
    last reads its end dS' from its summary slot. Summaries here are the segments' names, so the state a segment
    reads must be its later segments' names in the order they were applied."""
    cu = [0, *np.cumsum(seqlens).tolist()]
    plan = plan_chunk_gated_delta_rule(cu, num_heads_v=1, head_dim=128, segment_chunks=segment_chunks)
    fields = {name: i for i, name in enumerate(GDN_SEGMENT_FIELDS)}
    summaries = {}
    for row in plan.segments.tolist():  # reverse_summary: every segment with a start slot
        if row[fields["start_slot"]] >= 0:
            assert row[fields["start_slot"]] not in summaries
            summaries[row[fields["start_slot"]]] = (row[fields["sequence"]], row[fields["first_chunk"]])
    ends = {}
    for sequence, first_slot, count in plan.chains.tolist():  # the chain, reverse_order=1
        state = ()
        for j in range(count):
            slot = first_slot + count - 1 - j
            assert summaries[slot][0] == sequence
            state = state + (summaries[slot],)
            ends[slot] = state
    for row in plan.segments.tolist():  # the reverse: each segment from its end
        sequence, first_chunk = row[fields["sequence"]], row[fields["first_chunk"]]
        later = sorted(((s, c) for s, c in summaries.values() if s == sequence and c > first_chunk), reverse=True)
        if row[fields["writes_final"]]:
            assert later == [] and row[fields["summary_slot"]] == -1
        else:
            assert list(ends[row[fields["summary_slot"]]]) == later


def test_splits_stay_within_the_grid():
    # 64000 one-token sequences and one long one: splitting the long one as the cost model likes would
    # pass the kernels' 65535 segments; the planner stays within its cap.
    lengths = [1] * 64000 + [2 * 1024 * 1024]
    plan = plan_chunks(lengths, chunk=64, parallel_per_segment=1, costs=RecurrenceCosts(), max_segments=65535)
    assert len(plan.segments) <= 65535 and plan.segment_chunks < 32768  # split, within the cap


def test_op_plan_counts_empty_sequences_against_the_grid():
    # 65000 empty sequences (a segment row each) leave the long one at most 535 segments.
    plan = plan_chunk_gated_delta_rule([0] * 65001 + [2 * 1024 * 1024], num_heads_v=1, head_dim=128)
    assert len(plan.segments) <= 65535 and plan.schedule.segments.shape[0] > 1


def test_a_plan_made_again_from_its_recipe_is_the_same_and_keeps_the_given_tables():
    plan = plan_chunk_gated_delta_rule([0, 32768, 32800], num_heads_v=8)
    assert len(plan.segments) > 2  # split: the recipe must carry the planner's choice
    recipe = ChunkRecipe.of(plan)
    assert ChunkRecipe.from_ints(recipe.ints()) == recipe and recipe.num_seqs == 2
    tables = [torch.from_numpy(np.ascontiguousarray(t))
              for t in (plan.chunks, plan.segments, plan.summary_segments, plan.chains)]
    again = plan_from_recipe(tuple(recipe.ints()), tables)
    for name in ("chunks", "segments", "summary_segments", "chains"):
        assert np.array_equal(getattr(again, name), getattr(plan, name)), name
    assert again.tables.on(torch.device("cpu"))[1] is tables[1]
    assert plan_from_recipe(tuple(recipe.ints()), tables) is again  # made once per recipe and device


@pytest.mark.parametrize("family", ["gated_delta_rule_chunk", "gated_delta_rule_step"])
def test_the_ops_accept_the_state_layouts_and_dtypes_their_spec_offers(family):
    spec = registry.current().family(family)
    axes = spec_axes(family)
    assert list(axes.state_layouts) == spec.supported("state_layout")
    assert sorted(DTYPE_NAMES[d] for d in axes.dtypes) == spec.supported("dtype")


def test_exact_split_is_a_plan_choice_that_its_recipe_keeps():
    exact = plan_chunk_gated_delta_rule([0, 4096], num_heads_v=4, head_dim=128, segment_chunks=4, exact_split=True)
    assert exact.exact_split and "exact_split=True" in repr(exact)
    assert ChunkRecipe.of(exact).plan().exact_split
    assert not plan_chunk_gated_delta_rule([0, 4096], num_heads_v=4, head_dim=128).exact_split
    with pytest.raises(TypeError, match="exact_split: expected a bool, got 1"):
        plan_chunk_gated_delta_rule([0, 4096], num_heads_v=4, exact_split=1)


@settings(max_examples=100, deadline=None)
@given(num_chunks=st.integers(1, 100_000), heads=st.integers(1, 64), blocks_per_sm=st.integers(1, 8),
       sms=st.integers(1, 200))
def test_kkt_blocks_take_the_chunks_fastest_by_whole_waves(num_chunks, heads, blocks_per_sm, sms):
    chosen = kkt_chunks_per_block(num_chunks, heads, blocks_per_sm, sms)
    def waves_time(per_block):
        return math.ceil(math.ceil(num_chunks / per_block) * heads / (sms * blocks_per_sm)) * per_block * KKT_CHUNK_TIME[per_block]
    assert chosen in KKT_CHUNK_TIME
    assert waves_time(chosen) == min(waves_time(n) for n in KKT_CHUNK_TIME)
    assert all(waves_time(n) > waves_time(chosen) for n in KKT_CHUNK_TIME if n < chosen)  # the fewest on a tie
