"""Host-side planning for varlen GQA attention prefill: which key tiles each query tile visits, and in what order.

A batch of sequences is packed along the token dimension and described by
``cu_seqlens`` (cumulative lengths, starting at 0). The kernel splits every
sequence's queries into tiles of ``tile_m`` rows and walks its keys in tiles of
``tile_n``. The mask (causal and/or a sliding window, bottom-right aligned as
FlashAttention does when a sequence has more keys than queries) leaves each
query tile a contiguous run of key tiles, possibly none. The planner computes
those runs and orders the work by sequence, so that the key tiles a sequence's
query tiles share stay in L2, the costliest sequences and tiles first, which keeps
the last wave of a skewed batch short (:func:`plan_tiles`).
A self-attention batch may instead be cut into tiles of ``tile_m`` consecutive tokens whatever the
sequences, each row attending its own sequence's keys (:func:`plan_packed_tiles`): a sequence one token
past a whole tile then shares its last tile with the next sequence instead of running a tile for one row.
Where the spec offers several tile shapes (and packing), :func:`choose_schedule` picks one per
batch from the scores each would compute.

Plans are built from host data only: reading ``cu_seqlens`` from the GPU would
force a device-to-host synchronisation on every call.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kgen.runtime.checks import INT32_LIMIT, check_int, check_seqlens


@dataclass(frozen=True, eq=False)
class TileSchedule:
    """The work of one varlen prefill launch.

    ``work[i]`` is the work item of a query tile, int32 ``[n, 6]``: its sequence, its index in the sequence,
    and the sequence's bounds ``q_start, q_end, k_start, k_end`` in the packed tokens (the fields
    :data:`~kgen.families.attention_prefill.contract.ATTENTION_WORK_FIELDS` names); with ``packed``, its first
    and last sequence, its tokens ``t0, t1`` and the keys ``k0, k1`` its rows attend (:func:`plan_packed_tiles`).
    ``num_key_tiles[i]``
    is how many key tiles that query tile visits (int64 ``[n]``; 0 when the mask hides
    every key: its rows are written as zeros with ``lse = -inf``). Arrays, so that a
    batch of thousands of sequences plans with no Python loop per tile (bench/NOTES.md, prefill planner cost).
    """

    work: np.ndarray
    num_key_tiles: np.ndarray
    max_seqlen_q: int
    max_seqlen_k: int
    total_q: int
    total_k: int
    #: Some sequence ends inside a query or key tile, so the kernel needs its bounds-checked variant.
    has_incomplete_tile: bool
    tile_m: int
    tile_n: int
    #: Tiles of consecutive tokens, rows of several sequences (see :func:`plan_packed_tiles`).
    packed: bool = False


def validate_window(causal: bool, window: tuple[int, int]) -> tuple[int, int]:
    """The sliding window ``(left, right)`` with causality folded in: ``right = 0`` when ``causal``.

    Each entry is how many keys before (left) or after (right) the query's
    diagonal it may attend; -1 means unbounded on that side.
    """
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__} {causal!r}")
    if not isinstance(window, (tuple, list)) or len(window) != 2:
        raise TypeError(f"window: expected a pair of ints (left, right), got {window!r}")
    unbounded = " (-1 = unbounded)"
    left = check_int("window[0]", window[0], minimum=-1, maximum=INT32_LIMIT, what=unbounded)
    right = check_int("window[1]", window[1], minimum=-1, maximum=INT32_LIMIT, what=unbounded)
    return left, 0 if causal else right


def key_tile_range(lq: int, lk: int, q_tile: int, *, tile_m: int, tile_n: int,
                   window: tuple[int, int]) -> tuple[int, int]:
    """The key tiles ``[n_begin, n_end)`` that hold an allowed key for some row of query tile ``q_tile``.

    ``window`` is already merged with causality (see :func:`validate_window`).
    Row ``r`` may attend key ``j`` iff ``r + d - left <= j <= r + d + right``
    with ``d = lk - lq`` (a side of -1 drops its bound) and ``0 <= j < lk``.
    An empty range is ``(0, 0)``.
    """
    first_row = q_tile * tile_m
    if not 0 <= first_row < lq:
        raise ValueError(f"q_tile: tile {q_tile} of {tile_m} rows is outside a sequence of {lq} queries")
    n_begin, n_end = _key_tile_bounds(first_row, lq, lk, tile_m=tile_m, tile_n=tile_n, window=window)
    return int(n_begin), int(n_end)


def _key_tile_bounds(first_row, lq, lk, *, tile_m: int, tile_n: int, window: tuple[int, int]):
    """:func:`key_tile_range` elementwise, over ints or int64 arrays alike."""
    last_row = np.minimum(first_row + tile_m, lq) - 1
    left, right = window
    diagonal = lk - lq
    # Both bounds grow by at most one key per row, so the rows' allowed keys
    # overlap or touch, and rows that see no key can only sit at the start
    # (bound above by key 0) or at the end (bound below by key lk): the union
    # over the tile is the first row's lower bound to the last row's upper bound.
    first_key = np.maximum(first_row + diagonal - left, 0) if left >= 0 else np.zeros_like(first_row)
    last_key = np.minimum(last_row + diagonal + right, lk - 1) if right >= 0 else lk - 1
    visible = first_key <= last_key
    return np.where(visible, first_key // tile_n, 0), np.where(visible, last_key // tile_n + 1, 0)


@dataclass(frozen=True, eq=False)
class CheckedBatch:
    """A batch's query and key lengths (int64 arrays), checked once by :func:`check_batch` for planning it in
    several tile shapes: checking a list of 4,096 lengths took most of a plan's host time when each shape's
    schedule checked it again."""

    lq: np.ndarray
    lk: np.ndarray

    @property
    def self_attention(self) -> bool:
        """As many keys as queries in every sequence: what packed tiles need."""
        return bool(np.array_equal(self.lq, self.lk))


def check_batch(seqlens_q: Sequence[int], seqlens_k: Sequence[int]) -> CheckedBatch:
    """The lengths as arrays, each a non-negative int, as many keys as queries per sequence, each sequence's query
    and key positions within the kernels' 32 bits; an error names the argument at fault."""
    lq = check_seqlens("seqlens_q", seqlens_q)
    lk = check_seqlens("seqlens_k", seqlens_k)
    if len(lk) != len(lq):
        raise ValueError(f"seqlens_k: expected one length per sequence of seqlens_q ({len(lq)}), got {len(lk)}")
    longest_pair = int((lq + lk).max(initial=0))
    if longest_pair > INT32_LIMIT:  # the kernel adds a sequence's query and key positions in 32 bits
        raise ValueError(f"seqlens_q, seqlens_k: a sequence has {longest_pair} query and key tokens together; "
                         f"the kernels take at most {INT32_LIMIT}")
    return CheckedBatch(lq, lk)


def plan_tiles(seqlens_q: Sequence[int], seqlens_k: Sequence[int], *, tile_m: int, tile_n: int, causal: bool,
               window: tuple[int, int]) -> TileSchedule:
    """:func:`schedule_tiles` of the batch these lengths make."""
    return schedule_tiles(check_batch(seqlens_q, seqlens_k), tile_m=tile_m, tile_n=tile_n, causal=causal,
                          window=window)


def schedule_tiles(batch: CheckedBatch, *, tile_m: int, tile_n: int, causal: bool,
                   window: tuple[int, int]) -> TileSchedule:
    """Every query tile of every sequence with queries, a sequence's tiles one after another (costliest first,
    ties by tile), the sequences ordered by their costliest tile (ties by sequence).

    A sequence's query tiles read the same K/V tiles, so running them together serves every read after the first
    from L2: ordered costliest first across sequences, a 128-token sequence's one-key-tile item ran long after its
    two-key-tile item and read the first K/V tile from DRAM again (ncu: 2.00 GB moved where 1.61 GB suffice), and
    grouping cut 0.52 to 0.42 ms at seed 000's L = 128, 0.70 to 0.51 ms at L = 256 in 64x64 tiles (bench/NOTES.md,
    twenty-fifth session). The order is still longest first where it decides the last wave: the sequences go
    costliest first, so the last tiles to start are the cheap ones of the shortest sequence."""
    lq, lk = batch.lq, batch.lk
    check_int("tile_m", tile_m, minimum=1)
    check_int("tile_n", tile_n, minimum=1)
    merged = validate_window(causal, window)

    # One entry per query tile: its sequence, its index in the sequence, its key tiles.
    tiles = -(-lq // tile_m)
    seq = np.repeat(np.arange(len(lq)), tiles)
    q_tile = np.arange(seq.size) - np.repeat(np.cumsum(tiles) - tiles, tiles)
    n_begin, n_end = _key_tile_bounds(q_tile * tile_m, lq[seq], lk[seq], tile_m=tile_m, tile_n=tile_n, window=merged)
    cost = n_end - n_begin
    costliest = np.zeros(len(lq), dtype=cost.dtype)
    np.maximum.at(costliest, seq, cost)
    order = np.lexsort((q_tile, -cost, seq, -costliest[seq]))
    # The bounds the plan is made for: the kernel addresses by them, and checks the call's cu_seqlens against them.
    starts_q, starts_k = np.cumsum(lq) - lq, np.cumsum(lk) - lk
    bounds = np.stack([starts_q, starts_q + lq, starts_k, starts_k + lk], axis=1)[seq[order]]
    # A length of 0 is a multiple of any tile, so empty sequences never need the has_incomplete_tile variant.
    incomplete = bool(np.any(lq % tile_m) or np.any(lk % tile_n))
    return TileSchedule(
        work=np.concatenate([np.stack([seq[order], q_tile[order]], axis=1), bounds.reshape(-1, 4)],
                            axis=1).astype(np.int32),
        num_key_tiles=cost[order],
        max_seqlen_q=int(lq.max(initial=0)),
        max_seqlen_k=int(lk.max(initial=0)),
        total_q=int(lq.sum()),
        total_k=int(lk.sum()),
        has_incomplete_tile=incomplete,
        tile_m=tile_m,
        tile_n=tile_n,
    )


def packable(batch: CheckedBatch, window: tuple[int, int]) -> bool:
    """Whether :func:`schedule_packed_tiles` can cut this batch: self-attention (as many queries as keys in every
    sequence) with no window but the causal mask (``window`` with causal folded in)."""
    return tuple(window) in ((-1, 0), (-1, -1)) and batch.self_attention


def plan_packed_tiles(seqlens: Sequence[int], *, tile_m: int, tile_n: int, causal: bool) -> TileSchedule:
    """:func:`schedule_packed_tiles` of the self-attention batch these lengths make."""
    return schedule_packed_tiles(check_batch(seqlens, seqlens), tile_m=tile_m, tile_n=tile_n, causal=causal)


def schedule_packed_tiles(batch: CheckedBatch, *, tile_m: int, tile_n: int, causal: bool) -> TileSchedule:
    """Tiles of ``tile_m`` consecutive tokens over a self-attention batch, whatever its sequences (rows=packed).

    Item i covers tokens ``[t0, t1) = [i tile_m, min((i + 1) tile_m, total))``, of sequences ``first`` to ``last``,
    and the keys ``[k0, k1)`` one of its rows attends: from the first sequence's start to ``t1`` under the causal
    mask, else to the last sequence's end. The kernel walks them in key tiles ending at ``k1`` (so a causal
    diagonal is one tile, as in :func:`plan_tiles`) and masks each row to its own sequence's keys. At seed 000's
    L = 65 this makes 2016 sequences 2048 items of at most two key tiles, where per-sequence tiles make 4032 of one
    or two (docs/prefill_short_sequences.md, step 3).

    The items run in reverse token order: neighbours share key tiles (they run together, so those come from L2)
    and a long causal sequence's costliest tiles go first."""
    if not batch.self_attention:
        raise ValueError("seqlens_k: packed tiles need self-attention, as many keys as queries in every sequence")
    lengths = batch.lq
    check_int("tile_m", tile_m, minimum=1)
    check_int("tile_n", tile_n, minimum=1)
    if not isinstance(causal, bool):
        raise TypeError(f"causal: expected a bool, got {type(causal).__name__} {causal!r}")
    total = int(lengths.sum())  # at most INT32_LIMIT (checked): the kernel's positions stay in 32 bits
    cu = np.concatenate([[0], np.cumsum(lengths)])
    t0 = np.arange(0, total, tile_m, dtype=np.int64)[::-1]
    t1 = np.minimum(t0 + tile_m, total)
    # A token's sequence: the last one starting at or before it (an empty sequence starts where the next does).
    first = np.searchsorted(cu, t0, side="right") - 1
    last = np.searchsorted(cu, t1 - 1, side="right") - 1
    k0 = cu[first]
    k1 = t1 if causal else cu[last + 1]
    cost = -(-(k1 - k0) // tile_n)
    return TileSchedule(
        work=np.stack([first, last, t0, t1, k0, k1], axis=1).astype(np.int32).reshape(-1, 6),
        num_key_tiles=cost.astype(np.int64),
        max_seqlen_q=int(lengths.max(initial=0)),
        max_seqlen_k=int(lengths.max(initial=0)),
        total_q=total,
        total_k=total,
        has_incomplete_tile=True,
        tile_m=tile_m,
        tile_n=tile_n,
        packed=True,
    )


#: A tile shape listed earlier in the spec (a faster one per score computed) is kept
#: unless it computes more than this fraction more scores than the shape that computes fewest.
WORK_TOLERANCE = 1 / 16


def computed_scores(schedule: TileSchedule) -> int:
    """Query-key scores the kernel computes for a schedule: every visited tile in full, masked or not."""
    return int(schedule.num_key_tiles.sum()) * schedule.tile_m * schedule.tile_n


def choose_schedule(schedules: Sequence[TileSchedule], score_costs: Sequence[float] | None = None) -> int:
    """Index into ``schedules`` (one per tile shape, in the spec's order of preference) of the one to run.

    The work of a schedule is its computed scores times its kernel's cost per score
    (``score_costs``, one per schedule, from the spec's ``score_cost``; 1 each by
    default). The first wins unless its work exceeds the least by over
    :data:`WORK_TOLERANCE`: large tiles waste rows past a short sequence's end and,
    under a causal mask, half of every diagonal tile, so short sequences (a
    64-token causal prompt in 128x128 tiles) take smaller tiles, while long ones keep
    the faster large tiles.
    """
    if not schedules:
        raise ValueError("schedules: expected at least one tile schedule")
    costs = [1.0] * len(schedules) if score_costs is None else list(score_costs)
    if len(costs) != len(schedules) or not all(c > 0 for c in costs):
        raise ValueError(f"score_costs: expected {len(schedules)} positive costs, got {score_costs!r}")
    scores = [computed_scores(s) * c for s, c in zip(schedules, costs)]
    limit = min(scores) * (1 + WORK_TOLERANCE)
    return next(i for i, n in enumerate(scores) if n <= limit)
