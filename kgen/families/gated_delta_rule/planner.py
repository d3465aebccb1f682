"""The chunked gated delta rule's plan: a batch layout's schedule (:mod:`.schedule`) as the tables its kernels read.

The plan is made on the host once per batch layout; with it the op never synchronises with the
device and can be captured in a CUDA graph. Its chunk and value slice are those of the spec's
recurrence kernel (read from its launch contract), so the tables and the kernels agree on them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from kgen import registry
from kgen.families.gated_delta_rule.contract import GDN_SEGMENT_FIELDS
from kgen.families.gated_delta_rule.schedule import ChunkSchedule, RecurrenceCosts, plan_chunks
from kgen.runtime.checks import INT32_LIMIT, check_bool, check_int, check_plan_device, seqlens_from_cu
from kgen.runtime.device import GRID_YZ_LIMIT, sm_count
from kgen.runtime.dispatch import SpecPathMemo, contract
from kgen.runtime.tables import DeviceTables

CHUNK_FAMILY = "gated_delta_rule_chunk"
#: A summed log-gate below which a transition (of norm at most e^sum, see exact_split) is below half an fp32
#: ulp of 1 (e^-17 = 4.1e-8 < 2^-24 = 6.0e-8): the summary of a segment passes no state from before it on.
NEGLIGIBLE_LOG_DECAY = -17.0
_SUMMARY_SLOT, _CHUNKS = GDN_SEGMENT_FIELDS.index("summary_slot"), GDN_SEGMENT_FIELDS.index("chunks")


@dataclass(frozen=True, eq=False)
class ChunkGatedDeltaRulePlan:
    """The chunk and segment tables of one batch layout, for :func:`chunk_gated_delta_rule`.

    Tables live on the host until first used on a device (or at once with ``device=``); plan
    with ``device=`` before capturing a CUDA graph, since the first use copies them. A captured
    graph reads the tables where they are: keep the plan alive as long as the graph. The op checks
    a plan against its tensors' sequence count and total tokens (the lengths themselves are on the
    device); the kernels address by the plan's bounds and check them against ``cu_seqlens`` on the
    device: a sequence whose bounds there differ from the plan's gets NaN outputs and final state.
    """

    def __repr__(self) -> str:
        # A summary: the chunk and segment tables have a row per chunk.
        return (f"ChunkGatedDeltaRulePlan({self.num_seqs} sequences, {len(self.chunks)} chunks, {len(self.segments)} "
                f"segments, num_heads_v={self.num_heads_v}, head_dim={self.head_dim}, value_slice={self.value_slice}, "
                f"wide={self.wide}"
                f"{', exact_split=True' if self.exact_split else ''})")


    schedule: ChunkSchedule
    num_heads_v: int
    head_dim: int
    #: The recurrence's value columns per state warpgroup (the spec's tile_n).
    value_slice: int
    #: The sequences' token offsets ``[0, n0, n0 + n1, ...]``, as Python ints.
    cu_seqlens: tuple[int, ...]
    #: int32 [chunks, 2]: first token, tokens (at most the chunk size) of every chunk.
    chunks: np.ndarray
    #: int32 [segments, len(GDN_SEGMENT_FIELDS)]: every segment (empty sequences as segments of 0
    #: chunks, so that their final state is written), the longest first.
    segments: np.ndarray
    #: The rows of ``segments`` whose summary a later segment needs.
    summary_segments: np.ndarray
    #: int32 [sequences split, 3]: sequence, first summary slot, summaries.
    chains: np.ndarray
    num_summaries: int
    #: Run every split exactly, without the decay-bounded shortcut (see :func:`plan_chunk_gated_delta_rule`).
    exact_split: bool
    #: (chunks, segments, summary segments, chains) on each device they ran on: ``tables.on(device)``.
    tables: DeviceTables = field(init=False, repr=False)

    def __post_init__(self) -> None:
        arrays = (self.chunks, self.segments, self.summary_segments, self.chains)
        # A function of the arrays, not of the plan: the plan then holds no reference circle, and its
        # device tables are freed with it.
        object.__setattr__(self, "tables", DeviceTables(functools.partial(_on_device, arrays), "tables"))

    @property
    def num_seqs(self) -> int:
        return len(self.cu_seqlens) - 1

    @property
    def has_incomplete_tile(self) -> bool:
        return self.schedule.has_incomplete_tile

    @property
    def wide(self) -> bool:
        """The forward runs in blocks of the whole head dim (gated_delta_rule_chunk), else of one value slice each
        (gated_delta_rule_chunk_slice)."""
        return self.schedule.wide


def _check_size(seqlens: Sequence[int], chunk: int, num_heads_v: int, segment_chunks: int | None) -> None:
    """Refuse what the kernels cannot index, from the lengths alone (time per sequence, nothing per token)."""
    num_chunks = sum(-(-n // chunk) for n in seqlens)
    if max(num_chunks, 1) * num_heads_v * chunk > INT32_LIMIT:
        raise ValueError(f"cu_seqlens: {num_chunks} chunks x {num_heads_v} v-heads exceed the kernels' 32-bit row "
                         f"indices")
    if segment_chunks is not None:
        segments = sum(max(1, -(-(-(-n // chunk)) // segment_chunks)) for n in seqlens)
        if segments > GRID_YZ_LIMIT:
            raise ValueError(f"segment_chunks: {segment_chunks} makes {segments} segments; the kernels take at most "
                             f"{GRID_YZ_LIMIT}")


def _on_device(arrays: Sequence[np.ndarray], device: torch.device) -> tuple[torch.Tensor, ...]:
    return tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device) for a in arrays)


@dataclass(frozen=True)
class _Recurrence:
    """What the plan takes from the spec's recurrence kernel at a head dim."""

    chunk: int
    value_slice: int
    #: One-slice forward blocks, and summary blocks, an SM holds.
    blocks_per_sm: int
    summary_blocks_per_sm: int
    #: The wide forward kernel's value columns per block.
    wide_value_width: int


def _recurrence(head_dim: int, tile_n: int | None) -> _Recurrence:
    """The recurrence's shape: the spec's first tile_n for the head dim, or ``tile_n``."""
    family = registry.current().family(CHUNK_FAMILY)
    slices = family.axis_values("tile_n", head_dim=head_dim)
    if not slices:
        raise ValueError(f"head_dim: {head_dim} is not one the spec offers; supported: {family.supported('head_dim')}")
    if tile_n is None:
        tile_n = slices[0]
    elif tile_n not in slices:
        raise ValueError(f"tile_n: the spec offers {sorted(slices)} at head_dim {head_dim}, got {tile_n!r}")
    variant = family.select(head_dim=head_dim, tile_n=tile_n)
    sizes = contract(variant).sizes
    return _Recurrence(sizes["chunk"], sizes["value_slice"], sizes["slice_blocks_per_sm"], variant.param_dict["min_blocks_per_sm"],
                       sizes["wide_value_width"])


def chunk_tokens(head_dim: int) -> int:
    """Tokens per chunk of the spec's recurrence at ``head_dim``."""
    return _recurrence(head_dim, None).chunk


def plan_chunk_gated_delta_rule(cu_seqlens, *, num_heads_v: int, head_dim: int = 128, num_sms: int | None = None,
                                tile_n: int | None = None, segment_chunks: int | None = None,
                                device: torch.device | str | None = None, exact_split: bool = False
                                ) -> ChunkGatedDeltaRulePlan:
    """Plan :func:`chunk_gated_delta_rule` for the sequences delimited by ``cu_seqlens``.

    Args:
        cu_seqlens: host data (a list of ints or a CPU tensor), ``[0, n0, n0 + n1, ...]``.
        num_heads_v: HV, the value heads (with the head dim, the blocks per segment).
        head_dim: K = V.
        num_sms: the SMs the split is planned for; default: the current CUDA device's, or the H200's without one.
        tile_n: force the recurrence's value slice (default: the spec's first for the head dim).
        segment_chunks: force the split: segments of this many chunks (default: the planner's cost
            model decides).
        device: copy the tables there now (needed before CUDA-graph capture).
        exact_split: compute every split sequence's start states in full. By default (decided on the device,
            from the gates) a segment's summary starts at the last chunk from which the gates to the segment's
            end sum below :data:`NEGLIGIBLE_LOG_DECAY`, and passes no start state through the segment: with
            unit-norm keys (l2norm, in the kernel or before) and beta in [0, 2] each token's ``I - beta k k^T``
            does not expand, so what is dropped is below fp32 rounding of the result. Under strong decay a
            summary then runs a chunk or two, not the whole segment. Keys of other norms need
            ``exact_split=True``.
    """
    seqlens = seqlens_from_cu(cu_seqlens, "cu_seqlens")
    check_int("num_heads_v", num_heads_v, minimum=1, maximum=GRID_YZ_LIMIT)
    check_int("head_dim", head_dim, minimum=1)
    check_bool("exact_split", exact_split)
    for name, value in (("tile_n", tile_n), ("segment_chunks", segment_chunks)):
        if value is not None:
            check_int(name, value, minimum=1)
    device = check_plan_device(device)
    num_sms = sm_count() if num_sms is None else num_sms
    check_int("num_sms", num_sms, minimum=1)
    recurrence = _recurrence(head_dim, tile_n)
    _check_size(seqlens, recurrence.chunk, num_heads_v, segment_chunks)
    slices = head_dim // recurrence.value_slice
    empty = sum(1 for n in seqlens if n == 0)  # a segment row each, besides the planner's
    # The summary covers K + V = 2 K columns.
    costs = RecurrenceCosts(num_sms=num_sms, blocks_per_sm=recurrence.blocks_per_sm,
                            summary_blocks_per_sm=recurrence.summary_blocks_per_sm,
                            wide_slices=recurrence.wide_value_width // recurrence.value_slice, shortcut=not exact_split)
    schedule = plan_chunks(seqlens, chunk=recurrence.chunk, parallel_per_segment=num_heads_v * slices,
                           summary_per_segment=2 * num_heads_v * slices, costs=costs,
                           segment_chunks=segment_chunks, max_segments=GRID_YZ_LIMIT - empty)
    lengths = np.asarray(seqlens, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])
    rows, chains, num_summaries = _segment_tables(schedule, lengths, starts)
    if len(rows) > GRID_YZ_LIMIT:
        raise ValueError(f"cu_seqlens: {len(rows)} segments; the kernels take at most {GRID_YZ_LIMIT}")
    plan = ChunkGatedDeltaRulePlan(schedule=schedule, num_heads_v=num_heads_v, head_dim=head_dim,
                                   value_slice=recurrence.value_slice, cu_seqlens=tuple(starts.tolist()),
                                   chunks=_chunk_table(schedule, starts), segments=rows,
                                   summary_segments=rows[rows[:, _SUMMARY_SLOT] >= 0], chains=chains, num_summaries=num_summaries,
                                   exact_split=exact_split)
    if device is not None:
        plan.tables.on(device)
    return plan


def _chunk_table(schedule: ChunkSchedule, starts: np.ndarray) -> np.ndarray:
    """int32 [chunks, 2]: every chunk's first token and tokens."""
    chunk = schedule.chunk
    chunk_seq = schedule.chunk_indices[:, 0].astype(np.int64)
    first = starts[chunk_seq] + chunk * schedule.chunk_indices[:, 1].astype(np.int64)
    return np.stack([first, np.minimum(starts[chunk_seq + 1] - first, chunk)], axis=1).astype(np.int32).reshape(-1, 2)


def _segment_tables(schedule: ChunkSchedule, lengths: np.ndarray, starts: np.ndarray
                    ) -> tuple[np.ndarray, np.ndarray, int]:
    """(segment rows, chains, summaries): see :class:`ChunkGatedDeltaRulePlan`.

    Segments in sequence order: the j-th of a sequence's n gets summary slot base + j (j < n - 1)
    and start slot base + j - 1 (j >= 1), where the chain writes it.
    """
    segs = schedule.segments
    by_sequence = segs[np.lexsort((segs[:, 1], segs[:, 0]))]
    pieces = np.bincount(by_sequence[:, 0], minlength=len(lengths)) if len(by_sequence) else np.zeros(len(lengths), np.int64)
    base = np.concatenate([[0], np.cumsum(np.maximum(pieces - 1, 0))])
    seq = by_sequence[:, 0].astype(np.int64)
    j = np.arange(len(by_sequence)) - (np.cumsum(pieces) - pieces)[seq]
    last = j == pieces[seq] - 1
    rows = np.stack([seq, starts[seq] + schedule.chunk * by_sequence[:, 1], starts[seq + 1],
                     schedule.chunk_offsets[seq] + by_sequence[:, 1], by_sequence[:, 2],
                     np.where(last, -1, base[seq] + j), np.where(j > 0, base[seq] + j - 1, -1),
                     last.astype(np.int64), starts[seq]], axis=1)
    empty = np.flatnonzero(lengths == 0)
    empty_rows = np.stack([empty, starts[empty], starts[empty], np.zeros_like(empty), np.zeros_like(empty),
                           -np.ones_like(empty), -np.ones_like(empty), np.ones_like(empty), starts[empty]], axis=1)
    fields = len(GDN_SEGMENT_FIELDS)
    rows = np.concatenate([rows.reshape(-1, fields), empty_rows.reshape(-1, fields)])
    rows = rows[np.argsort(-rows[:, _CHUNKS], kind="stable")].astype(np.int32)  # the longest first
    split = np.flatnonzero(pieces > 1)
    chains = np.stack([split, base[split], pieces[split] - 1], axis=1).astype(np.int32).reshape(-1, 3)
    return rows, chains, int(base[-1])


_fixed_plans = SpecPathMemo()


def fixed_length_plan(batch: int, tokens: int, heads_v: int, head_dim: int, device: torch.device
                      ) -> ChunkGatedDeltaRulePlan:
    """The plan of B sequences of T tokens, made once (its tables then stay on the device: no copy per call)."""
    key = (batch, tokens, heads_v, head_dim, device.index)
    found = _fixed_plans.get(key)
    if found is None:
        found = _fixed_plans.put(key, plan_chunk_gated_delta_rule([tokens * b for b in range(batch + 1)],
                                                                  num_heads_v=heads_v, head_dim=head_dim,
                                                                  device=device))
    return found
