"""The varlen attention tile schedule (kgen.families.attention_prefill.plan) against a brute-force model of the mask.

The model builds each sequence's full [Lq, Lk] boolean mask from the rule
"row r may attend key j iff r + (Lk - Lq) - left <= j <= r + (Lk - Lq) + right"
and reads off which key tiles each query tile touches; it shares no interval
reasoning with the planner. Nothing here needs a GPU.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kgen.families.attention_prefill.contract import ATTENTION_WORK_FIELDS
from kgen.families.attention_prefill.plan import (
    WORK_TOLERANCE, TileSchedule, check_batch, choose_schedule, key_tile_range, packable, plan_packed_tiles, plan_tiles,
    schedule_packed_tiles, validate_window,
)
from kgen.runtime.checks import seqlens_from_cu

TILES = (16, 32, 64, 128)


# --- the brute-force model ---------------------------------------------------------------------------------------

def allowed_mask(lq: int, lk: int, causal: bool, window: tuple[int, int]) -> torch.Tensor:
    """[lq, lk]: may row r attend key j."""
    left, right = window
    if causal:
        right = 0
    r = torch.arange(lq).unsqueeze(1)
    j = torch.arange(lk).unsqueeze(0)
    mask = torch.ones(lq, lk, dtype=torch.bool)
    if left >= 0:
        mask &= j >= r + (lk - lq) - left
    if right >= 0:
        mask &= j <= r + (lk - lq) + right
    return mask


def brute_force_ranges(lq: int, lk: int, tile_m: int, tile_n: int, causal: bool,
                       window: tuple[int, int]) -> list[tuple[int, int]]:
    """Per query tile, the smallest [n_begin, n_end) covering every key tile with an allowed key; (0, 0) if none."""
    mask = allowed_mask(lq, lk, causal, window)
    ranges = []
    for first_row in range(0, lq, tile_m):
        keys = mask[first_row:first_row + tile_m].any(dim=0).nonzero().flatten()
        key_tiles = sorted({int(k) // tile_n for k in keys})
        ranges.append((key_tiles[0], key_tiles[-1] + 1) if key_tiles else (0, 0))
    return ranges


def brute_force_incomplete(seqlens_q: list[int], seqlens_k: list[int], tile_m: int, tile_n: int) -> bool:
    """Does some query or key tile hold fewer rows than the tile size?"""
    def short_tile(length: int, tile: int) -> bool:
        return any(len(range(start, min(start + tile, length))) < tile for start in range(0, length, tile))
    return any(short_tile(lq, tile_m) or short_tile(lk, tile_n) for lq, lk in zip(seqlens_q, seqlens_k))


def work_items(plan: TileSchedule) -> list[tuple[int, int]]:
    """(sequence, query tile) of each work item."""
    return [tuple(item[:2]) for item in plan.work.tolist()]


def check_against_model(seqlens_q: list[int], seqlens_k: list[int], tile_m: int, tile_n: int, causal: bool,
                        window: tuple[int, int]) -> TileSchedule:
    plan = plan_tiles(seqlens_q, seqlens_k, tile_m=tile_m, tile_n=tile_n, causal=causal, window=window)
    merged = validate_window(causal, window)
    expected_cost = {}
    for seq, (lq, lk) in enumerate(zip(seqlens_q, seqlens_k)):
        for tile, expected in enumerate(brute_force_ranges(lq, lk, tile_m, tile_n, causal, window)):
            got = key_tile_range(lq, lk, tile, tile_m=tile_m, tile_n=tile_n, window=merged)
            assert got == expected, f"seq {seq} (Lq={lq}, Lk={lk}) tile {tile}"
            expected_cost[seq, tile] = expected[1] - expected[0]

    # Every query tile exactly once, each with its own cost.
    items, costs = work_items(plan), plan.num_key_tiles.tolist()
    assert plan.work.shape == (len(expected_cost), len(ATTENTION_WORK_FIELDS)) and len(costs) == len(expected_cost)
    assert sorted(items) == sorted(expected_cost)
    # ... with its sequence's bounds, which the kernel addresses by.
    starts_q, starts_k = np.cumsum([0] + seqlens_q), np.cumsum([0] + seqlens_k)
    assert [tuple(item[2:]) for item in plan.work.tolist()] == [
        (starts_q[seq], starts_q[seq + 1], starts_k[seq], starts_k[seq + 1]) for seq, _ in items]
    assert [expected_cost[item] for item in items] == costs
    # A sequence's tiles one after another, the costliest first; the sequences by their costliest, then by index.
    costliest = {}
    for (seq, _), cost in zip(items, costs):
        costliest[seq] = max(costliest.get(seq, 0), cost)
    sequences = [seq for i, (seq, _) in enumerate(items) if i == 0 or items[i - 1][0] != seq]
    assert len(sequences) == len(set(sequences))
    assert sequences == sorted(sequences, key=lambda seq: (-costliest[seq], seq))
    assert all((a[0], -ca, a[1]) < (b[0], -cb, b[1])
               for a, b, ca, cb in zip(items, items[1:], costs, costs[1:]) if a[0] == b[0])

    assert plan.total_q == sum(seqlens_q) and plan.total_k == sum(seqlens_k)
    assert plan.max_seqlen_q == max(seqlens_q, default=0)
    assert plan.max_seqlen_k == max(seqlens_k, default=0)
    assert plan.has_incomplete_tile is brute_force_incomplete(seqlens_q, seqlens_k, tile_m, tile_n)
    assert (plan.tile_m, plan.tile_n) == (tile_m, tile_n)
    return plan


# --- random batches ----------------------------------------------------------------------------------------------

# Plain draws, the short edge cases, whole tiles of every size (so batches with no partial tile, or partial
# tiles on one side only, come up often), and every residue modulo the largest tile (hence modulo each tile).
lengths = st.one_of(
    st.integers(0, 600),
    st.sampled_from([0, 1, 2]),
    st.integers(0, 4).map(lambda whole: 128 * whole),
    st.builds(lambda whole, rest: 128 * whole + rest, st.integers(0, 3), st.integers(0, 127)),
)


@st.composite
def sequence(draw) -> tuple[int, int]:
    lq = draw(lengths)
    # Self-attention (Lk == Lq) and a cached prefix (Lk > Lq) are the common shapes; Lk < Lq is legal too.
    lk = draw(st.one_of(st.just(lq), st.builds(lambda extra: min(lq + extra, 600), st.integers(0, 200)), lengths))
    return lq, lk


window_side = st.one_of(st.just(-1), st.integers(0, 8), st.integers(0, 700))


@settings(max_examples=250, deadline=None)
@given(batch=st.lists(sequence(), max_size=12), tile_m=st.sampled_from(TILES), tile_n=st.sampled_from(TILES),
       causal=st.booleans(), window=st.tuples(window_side, window_side))
def test_plan_matches_brute_force(batch, tile_m, tile_n, causal, window):
    check_against_model([q for q, _ in batch], [k for _, k in batch], tile_m, tile_n, causal, window)


@pytest.mark.parametrize("causal, window", [(False, (-1, -1)), (True, (-1, -1)), (True, (100, -1)),
                                            (False, (37, 5)), (False, (0, 0))])
@pytest.mark.parametrize("tile_m, tile_n", [(16, 128), (64, 64), (128, 32)])
def test_every_residue_against_brute_force(tile_m, tile_n, causal, window):
    # Lq = 0..259 covers each residue modulo 128 at least twice; Lk strays both sides of Lq.
    seqlens_q = list(range(260))
    seqlens_k = [max(lq + (lq * 37) % 91 - 45, 0) for lq in seqlens_q]
    check_against_model(seqlens_q, seqlens_k, tile_m, tile_n, causal, window)


# --- tile shape choice --------------------------------------------------------------------------------------------

def model_scores(seqlens_q: list[int], seqlens_k: list[int], tile_m: int, tile_n: int, causal: bool,
                 window: tuple[int, int]) -> int:
    """Scores computed in full tiles, counted from the brute-force key ranges."""
    return sum((end - begin) * tile_m * tile_n
               for lq, lk in zip(seqlens_q, seqlens_k)
               for begin, end in brute_force_ranges(lq, lk, tile_m, tile_n, causal, window))


@settings(max_examples=150, deadline=None)
@given(batch=st.lists(sequence(), max_size=6), shapes=st.lists(st.tuples(st.sampled_from(TILES), st.sampled_from(TILES),
                                                                       st.sampled_from([1.0, 1.25, 3.0])),
                                                             min_size=1, max_size=3),
       causal=st.booleans(), window=st.tuples(window_side, window_side))
def test_tile_shape_choice_is_the_first_within_the_work_tolerance(batch, shapes, causal, window):
    seqlens_q, seqlens_k = [q for q, _ in batch], [k for _, k in batch]
    chosen = choose_schedule([plan_tiles(seqlens_q, seqlens_k, tile_m=m, tile_n=n, causal=causal, window=window)
                              for m, n, _ in shapes], [cost for _, _, cost in shapes])
    work = [model_scores(seqlens_q, seqlens_k, m, n, causal, window) * cost for m, n, cost in shapes]
    assert work[chosen] <= min(work) * (1 + WORK_TOLERANCE)
    assert all(w > min(work) * (1 + WORK_TOLERANCE) for w in work[:chosen])


def chosen_shape(seqlens: list[int], causal: bool, shapes=((128, 128), (64, 64))) -> tuple[int, int]:
    schedules = [plan_tiles(seqlens, seqlens, tile_m=m, tile_n=n, causal=causal, window=(-1, -1)) for m, n in shapes]
    return shapes[choose_schedule(schedules)]


def test_tile_shape_choice_by_hand():
    assert chosen_shape([8192, 8192], causal=False) == (128, 128)  # the same scores either way
    assert chosen_shape([8192, 8192], causal=True) == (128, 128)  # diagonal waste: 1% more
    assert chosen_shape([2048], causal=True) == (128, 128)  # 136 x 128^2 vs 528 x 64^2: 3% more
    assert chosen_shape([256] * 8, causal=True) == (64, 64)  # 3 x 128^2 vs 10 x 64^2: 20% more
    assert chosen_shape([63] * 100, causal=False) == (64, 64)  # 4x the scores in 128x128 tiles
    assert chosen_shape([65], causal=False) == (128, 128)  # one 128x128 tile or four 64x64 ones
    assert chosen_shape([], causal=True) == (128, 128)
    with pytest.raises(ValueError, match="at least one"):
        choose_schedule([])


def test_tile_shape_choice_weighs_scores_by_their_cost():
    # wgmma 128x128 first, then mma_sync 64x64 at the built-in spec's 1.45 per score (bench/NOTES.md):
    # mma_sync computes 0.25x the scores at L = 64, 0.5x at 129, 0.75x at 65 and 128, 0.83x at 256.
    def chosen(length):
        schedules = [plan_tiles([length] * 4, [length] * 4, tile_m=m, tile_n=m, causal=True, window=(-1, -1))
                     for m in (128, 64)]
        return (128, 64)[choose_schedule(schedules, [1.0, 1.45])]
    assert [chosen(n) for n in (64, 65, 128, 129, 256, 512, 1024)] == [64, 128, 128, 64, 128, 128, 128]
    schedule = plan_tiles([64], [64], tile_m=64, tile_n=64, causal=True, window=(-1, -1))
    for bad in ([1.0, 1.0], [0.0], [-1.0]):
        with pytest.raises(ValueError, match="score_costs"):
            choose_schedule([schedule], bad)


# --- hand-checked cases: pin the mask rule itself, independently of the model above -----------------------------

def key_ranges(lq, lk, window):
    """Per query row (tile_m = tile_n = 1), the allowed keys as [first, last + 1)."""
    return [key_tile_range(lq, lk, r, tile_m=1, tile_n=1, window=window) for r in range(lq)]


def test_causal_is_bottom_right_aligned():
    # FlashAttention's examples: with 2 queries and 5 keys row 0 sees keys 0..3, row 1 sees 0..4;
    # with 5 queries and 2 keys the first three rows see nothing.
    assert key_ranges(2, 5, (-1, 0)) == [(0, 4), (0, 5)]
    assert key_ranges(5, 2, (-1, 0)) == [(0, 0), (0, 0), (0, 0), (0, 1), (0, 2)]


def test_sliding_window_bounds_both_sides():
    ranges = key_ranges(10, 10, (2, 1))
    assert ranges[0] == (0, 2) and ranges[5] == (3, 7) and ranges[9] == (7, 10)
    assert key_ranges(3, 3, (0, 0)) == [(0, 1), (1, 2), (2, 3)]


def test_causal_plan_runs_the_costliest_sequence_first():
    plan = plan_tiles([100, 256], [100, 256], tile_m=64, tile_n=64, causal=True, window=(-1, -1))
    # The longer sequence first, its tiles costliest first, then the shorter one's.
    assert work_items(plan) == [(1, 3), (1, 2), (1, 1), (1, 0), (0, 1), (0, 0)]
    assert plan.num_key_tiles.tolist() == [4, 3, 2, 1, 2, 1]
    assert (plan.max_seqlen_q, plan.max_seqlen_k, plan.total_q, plan.total_k) == (256, 256, 356, 356)
    assert plan.has_incomplete_tile  # 100 is not a multiple of 64


def test_a_sequences_tiles_run_together_so_their_keys_stay_in_l2():
    # Seed 000's L = 128 and 192 in 64-row tiles: each sequence's tiles one after another, all reading its first
    # key tile, before the next sequence's.
    plan = plan_tiles([128] * 3, [128] * 3, tile_m=64, tile_n=64, causal=True, window=(-1, -1))
    assert work_items(plan) == [(0, 1), (0, 0), (1, 1), (1, 0), (2, 1), (2, 0)]
    plan = plan_tiles([192] * 2, [192] * 2, tile_m=64, tile_n=64, causal=True, window=(-1, -1))
    assert work_items(plan) == [(0, 2), (0, 1), (0, 0), (1, 2), (1, 1), (1, 0)]


def test_a_partial_key_tile_alone_needs_the_incomplete_tile_variant():
    plan = plan_tiles([128, 64], [128, 100], tile_m=64, tile_n=64, causal=False, window=(-1, -1))
    assert plan.has_incomplete_tile  # every query tile is full, but keys 64..99 fill only part of a tile
    assert not plan_tiles([128, 64], [128, 128], tile_m=64, tile_n=64, causal=False, window=(-1, -1)).has_incomplete_tile


def test_queries_without_keys_are_scheduled_with_no_key_tiles():
    plan = plan_tiles([128], [0], tile_m=64, tile_n=64, causal=False, window=(-1, -1))
    assert work_items(plan) == [(0, 0), (0, 1)] and plan.num_key_tiles.tolist() == [0, 0]
    assert not plan.has_incomplete_tile  # 128 queries fill two tiles; no keys is no partial key tile


def test_empty_sequences_are_complete_and_unscheduled():
    plan = plan_tiles([0, 64, 0], [64, 0, 0], tile_m=64, tile_n=64, causal=True, window=(-1, -1))
    assert work_items(plan) == [(1, 0)] and plan.num_key_tiles.tolist() == [0]
    assert not plan.has_incomplete_tile
    empty = plan_tiles([], [], tile_m=16, tile_n=16, causal=False, window=(-1, -1))
    assert empty.work.shape == (0, len(ATTENTION_WORK_FIELDS)) and empty.work.dtype == np.int32 and empty.num_key_tiles.shape == (0,)
    assert (empty.max_seqlen_q, empty.max_seqlen_k, empty.total_q, empty.total_k) == (0, 0, 0, 0)
    assert not empty.has_incomplete_tile and (empty.tile_m, empty.tile_n) == (16, 16)


@settings(max_examples=200, deadline=None)
@given(lengths=st.lists(st.one_of(st.integers(0, 300), st.sampled_from([1, 63, 64, 65, 129])), min_size=1, max_size=12),
       tile_m=st.sampled_from(TILES), tile_n=st.sampled_from(TILES + (80, 96)), causal=st.booleans())
def test_packed_tiles_against_each_token(lengths, tile_m, tile_n, causal):
    """Each token in exactly one item, with its sequence between the item's first and last, and the item's keys
    exactly those some row attends (its own sequence's up to itself under the causal mask), in reverse token order."""
    schedule = plan_packed_tiles(lengths, tile_m=tile_m, tile_n=tile_n, causal=causal)
    cu = np.concatenate([[0], np.cumsum(lengths)]).astype(int)
    total = int(cu[-1])
    assert schedule.packed and schedule.has_incomplete_tile and schedule.total_q == schedule.total_k == total
    covered = np.zeros(total, dtype=int)
    for (first, last, t0, t1, k0, k1), cost in zip(schedule.work.tolist(), schedule.num_key_tiles.tolist()):
        assert t0 % tile_m == 0 and 0 < t1 - t0 <= tile_m and (t1 - t0 == tile_m or t1 == total)
        covered[t0:t1] += 1
        owners = [int(np.searchsorted(cu, t, side="right")) - 1 for t in range(t0, t1)]
        assert (first, last) == (owners[0], owners[-1]) and all(lengths[o] > 0 for o in owners)
        keys = set()
        for t, o in zip(range(t0, t1), owners):
            keys |= set(range(cu[o], t + 1 if causal else cu[o + 1]))
        assert (k0, k1) == (min(keys), max(keys) + 1) and cost == -(-(k1 - k0) // tile_n)
    assert (covered == 1).all()
    starts = schedule.work[:, 2]
    assert (np.diff(starts) < 0).all()


def test_packing_is_for_self_attention_under_no_window_but_the_causal_mask():
    same = check_batch([3, 65], [3, 65])
    assert packable(same, (-1, 0)) and packable(same, (-1, -1))
    assert not packable(check_batch([3, 65], [3, 66]), (-1, 0))
    assert not packable(same, (10, 0)) and not packable(same, (-1, 5))
    with pytest.raises(ValueError, match="seqlens_k: packed tiles need self-attention"):
        schedule_packed_tiles(check_batch([3, 65], [3, 66]), tile_m=64, tile_n=64, causal=True)


def test_plan_tiles_refuses_bad_arguments_by_name():
    ok = dict(tile_m=64, tile_n=64, causal=False, window=(-1, -1))
    with pytest.raises(ValueError, match=r"seqlens_k: expected one length per sequence of seqlens_q \(2\), got 1"):
        plan_tiles([1, 2], [1], **ok)
    with pytest.raises(ValueError, match=r"seqlens_q\[1\]: expected an int in \[0, 2147483647\], got -3"):
        plan_tiles([1, -3], [1, 1], **ok)
    with pytest.raises(ValueError, match=r"tile_n: expected an int in \[1, 2147483647\], got 0"):
        plan_tiles([1], [1], **dict(ok, tile_n=0))
    with pytest.raises(ValueError, match=r"window\[1\]"):
        plan_tiles([1], [1], **dict(ok, window=(-1, -7)))


def test_key_tile_range_refuses_a_tile_past_the_sequence():
    with pytest.raises(ValueError, match="q_tile: tile 2 of 64 rows is outside a sequence of 128 queries"):
        key_tile_range(128, 128, 2, tile_m=64, tile_n=64, window=(-1, -1))


# --- cu_seqlens --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("cu", [[0, 3, 3, 10], (0, 3, 3, 10), torch.tensor([0, 3, 3, 10], dtype=torch.int32),
                                torch.tensor([0, 3, 3, 10], dtype=torch.int64)], ids=["list", "tuple", "int32", "int64"])
def test_seqlens_from_cu_accepts_host_data(cu):
    assert seqlens_from_cu(cu, "cu_seqlens_q") == [3, 0, 7]


def test_a_lone_zero_is_an_empty_batch():
    assert seqlens_from_cu([0], "cu_seqlens_q") == []


@pytest.mark.parametrize("cu", [[0, 4, 9, 5], torch.tensor([0, 4, 9, 5])], ids=["list", "tensor"])
def test_decreasing_cu_seqlens_are_refused_at_the_first_drop(cu):
    with pytest.raises(ValueError) as info:
        seqlens_from_cu(cu, "cu_seqlens_q")
    assert str(info.value) == "cu_seqlens_q: must be non-decreasing, but cu_seqlens_q[3]=5 < cu_seqlens_q[2]=9"


@pytest.mark.parametrize("cu, error, message", [
    ([], ValueError, r"cu_seqlens_k: expected at least one entry"),
    ([0, -3], ValueError, r"cu_seqlens_k: must be non-decreasing, but cu_seqlens_k\[1\]=-3 < cu_seqlens_k\[0\]=0"),
    ([-1, 4], ValueError, r"cu_seqlens_k: must start at 0, got cu_seqlens_k\[0\]=-1"),
    (torch.tensor([2, 4]), ValueError, r"cu_seqlens_k: must start at 0, got cu_seqlens_k\[0\]=2"),
    ([0, 1.5], TypeError, r"cu_seqlens_k\[1\]: expected an int, got float"),
    ([0, True], TypeError, r"cu_seqlens_k\[1\]: expected an int, got bool"),
    (torch.tensor([0.0, 4.0]), TypeError, r"cu_seqlens_k: expected dtype in \['torch.int32', 'torch.int64'\], "
                                          r"got torch.float32"),
    (torch.tensor([[0, 4]]), ValueError, r"cu_seqlens_k: expected a 1-D tensor, got shape \(1, 2\)"),
    (torch.empty(3, dtype=torch.int32, device="meta"), ValueError, r"cu_seqlens_k: expected a CPU tensor"),
    ("0,4", TypeError, r"cu_seqlens_k: expected a list or tuple of ints or a CPU int32/int64 1-D tensor, got str"),
], ids=["empty", "negative-length", "negative-start", "nonzero-start", "float-entry", "bool-entry", "float-dtype",
        "2-D", "meta", "string"])
def test_bad_cu_seqlens_are_refused_by_name(cu, error, message):
    with pytest.raises(error, match=message):
        seqlens_from_cu(cu, "cu_seqlens_k")


CUDA_REFUSAL = r"cu_seqlens_q: plans are built from host data.*device->host sync.*CPU tensor or a list"


class _ClaimsCuda(torch.Tensor):
    """A CPU tensor that reports is_cuda, the attribute the planner checks, so the refusal runs without a GPU."""

    @property
    def is_cuda(self) -> bool:
        return True


def test_a_tensor_reporting_cuda_is_refused_before_it_is_read():
    cu = torch.tensor([0, 4, 8], dtype=torch.int32).as_subclass(_ClaimsCuda)
    with pytest.raises(ValueError, match=CUDA_REFUSAL):
        seqlens_from_cu(cu, "cu_seqlens_q")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_cuda_tensor_is_refused():
    with pytest.raises(ValueError, match=CUDA_REFUSAL):
        seqlens_from_cu(torch.tensor([0, 4, 8], dtype=torch.int32, device="cuda"), "cu_seqlens_q")


# --- window ------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("causal, window, merged", [
    (False, (-1, -1), (-1, -1)), (False, (4, 0), (4, 0)), (False, (-1, 3), (-1, 3)),
    (True, (-1, -1), (-1, 0)), (True, (5, 7), (5, 0)), (True, (0, 0), (0, 0)),
])
def test_validate_window_folds_causal_into_the_right_side(causal, window, merged):
    assert validate_window(causal, window) == merged


@pytest.mark.parametrize("causal, window, error, message", [
    (False, (-2, 0), ValueError, r"window\[0\]: expected an int in \[-1, 2147483647\] \(-1 = unbounded\), got -2"),
    (True, (0, -5), ValueError, r"window\[1\]: expected an int in \[-1, 2147483647\]"),
    (False, (1.5, 0), TypeError, r"window\[0\]: expected an int \(-1 = unbounded\), got float 1.5"),
    (False, (0, True), TypeError, r"window\[1\]: expected an int"),
    (False, (1, 2, 3), TypeError, r"window: expected a pair of ints"),
    (False, 4, TypeError, r"window: expected a pair of ints"),
    ("yes", (-1, -1), TypeError, r"causal: expected a bool, got str"),
])
def test_bad_windows_are_refused_by_name(causal, window, error, message):
    with pytest.raises(error, match=message):
        validate_window(causal, window)


def test_blocks_take_heads_fastest_under_gqa_or_for_short_sequences():
    from kgen.families.attention_prefill.op import HEADS_FASTEST_MAX_KEYS, heads_fastest
    assert heads_fastest(1 << 20, 4) and heads_fastest(HEADS_FASTEST_MAX_KEYS, 1)
    assert not heads_fastest(HEADS_FASTEST_MAX_KEYS + 1, 1)
