"""The chunked gated delta rule's schedule over packed varlen batches: chunks, segments and the cost model.

Sequences are cut into chunks of ``chunk`` tokens that never cross a sequence; a sequence's last
chunk may be partial. The state recurrence runs chunk after chunk, so one long sequence is a
serial chain: to fill the GPU the planner splits sequences into segments of whole chunks, which
run side by side from a zero state; each segment's initial state is then corrected exactly with
the transitions of the segments before it (the kernels' job). A split costs a summary pass over
the split segments, so the planner splits only where a model of the kernels' time
(:class:`RecurrenceCosts`) says it pays. Plans are built from host data only, so a run never
synchronises with the device; the gates are not host data, so the model prices a split both ways the summaries
can go (:func:`choose_segment_chunks`). :mod:`kgen.families.gated_delta_rule.planner` turns a schedule into
the kernels' tables.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kgen.runtime.checks import check_int, check_seqlens
from kgen.runtime.device import DEFAULT_NUM_SMS


@dataclass(frozen=True, eq=False)
class ChunkSchedule:
    #: (sequence, chunk of the sequence) of every chunk, sequence by sequence: int32 [num_chunks, 2].
    chunk_indices: np.ndarray
    #: Where each sequence's chunks start in ``chunk_indices``: int64 [num_seqs + 1].
    chunk_offsets: np.ndarray
    #: (sequence, first chunk, chunks) of every segment, the longest first: int32 [num_segments, 3].
    segments: np.ndarray
    #: The most chunks a segment holds (a sequence at most this long is not split).
    segment_chunks: int
    #: Some sequence ends inside a chunk, so the kernels need their has_incomplete_tile=true variant.
    has_incomplete_tile: bool
    chunk: int
    total_tokens: int
    max_seqlen: int
    #: The forward runs in wide blocks (see :meth:`RecurrenceCosts.wide`).
    wide: bool = False


def _segments_per_sequence(chunks: np.ndarray, segment_chunks: int) -> np.ndarray:
    return -(-chunks // segment_chunks)


@dataclass(frozen=True)
class RecurrenceCosts:
    """The planner's model of the recurrence kernels, in units of one chunk of one one-slice block alone on an
    SM (the defaults are the H200's: bench/NOTES.md, thirteenth session for the chain and the split's overhead,
    nineteenth for the blocks, fitted with every summary run in full)."""

    num_sms: int = DEFAULT_NUM_SMS
    #: One-slice forward blocks an SM holds (registers: one at head dim 128, two at 64).
    blocks_per_sm: int = 2
    #: Summary blocks an SM holds.
    summary_blocks_per_sm: int = 2
    #: A chunk's time, each, when two or more blocks share an SM.
    shared: float = 1.47
    #: A summary block's time per chunk (no outputs), in the unit above, fitted with every summary run in full (the
    #: decay-bounded shortcut stops a summary early only where its head decays, which the host cannot know:
    #: :func:`choose_segment_chunks` prices both).
    summary: float = 0.7
    #: A step of the chain of start states, in chunks.
    chain_step: float = 1.5
    #: What splitting adds besides: two more launches, each block's start and drain, and the summary's pipeline
    #: fill (1 x 2k 32/32, two one-slice segments against one: 84 against 94 us under strong gates, twentieth
    #: session).
    split_overhead: float = 12.0
    #: Whether the summaries take the decay-bounded shortcut (the plan's exact_split: not).
    shortcut: bool = True
    #: The kernels every plan runs (the KKT solve: 12.5 ns a chunk and v-head), per one-slice block-chunk: what a
    #: plan's share of the whole op's time is measured against.
    fixed: float = 0.0033
    #: Value slices of the forward's wide block (1: it has none), and its chunk's time, alone on its SM
    #: (3.55 us at 4 x 8k 16/32, against 2.17 us for a one-slice block's at 1 x 32k 16/64, at 1f16fb6; 3.1 and
    #: 1.87 us, the same ratio, once the gates came from the KKT kernel).
    wide_slices: int = 1
    wide_chunk: float = 1.64

    def wide(self, blocks: int) -> bool:
        """Whether a forward of ``blocks`` one-slice blocks runs in wide blocks instead (a block per segment and
        v-head, one on an SM, loading each tile once for all its slices): where the one-slice blocks would share
        SMs or wait for one."""
        return self.wide_slices > 1 and blocks > self.num_sms * self.blocks_per_sm

    def phase(self, blocks: int, work: float, longest: int, blocks_per_sm: int) -> float:
        """Time of a launch of ``blocks`` blocks doing ``work`` block-chunks, the longest ``longest`` chunks, with up
        to ``blocks_per_sm`` blocks on an SM."""
        if blocks <= self.num_sms:
            return float(longest)
        slots = self.num_sms * blocks_per_sm
        return (self.shared if blocks_per_sm > 1 else 1.0) * max(longest * -(-blocks // slots), work / slots)

    def forward(self, blocks: int, work: float, longest: int) -> float:
        """Time of the forward over ``blocks`` one-slice blocks' worth of segments (:meth:`phase`'s arguments)."""
        if not self.wide(blocks):
            return self.phase(blocks, work, longest, self.blocks_per_sm)
        wide_blocks = -(-blocks // self.wide_slices)
        return self.wide_chunk * self.phase(wide_blocks, work / self.wide_slices, longest, 1)


def estimated_time(chunks: np.ndarray, segment_chunks: int, *, parallel_per_segment: int,
                   summary_per_segment: int, costs: RecurrenceCosts, summaries_cut_short: bool = False) -> float:
    """The model's time of the op with sequences of ``chunks`` split into ``segment_chunks``-chunk segments: the
    fixed kernels, the summaries of all but each sequence's last segment, their chain, then every segment forward.
    Each summary runs all its segment's chunks, or, ``summaries_cut_short``, one (the decay-bounded shortcut where
    every head decays)."""
    pieces = _segments_per_sequence(chunks, segment_chunks)
    work = float(chunks.sum()) * parallel_per_segment
    forward = costs.fixed * work + costs.forward(int(pieces.sum()) * parallel_per_segment, work,
                                                 int(min(segment_chunks, chunks.max(initial=0))))
    split = pieces > 1
    if not split.any():
        return forward
    summary_chunks = 1 if summaries_cut_short else segment_chunks
    summary_blocks = int((pieces[split] - 1).sum()) * summary_per_segment  # every segment's but the last
    summary = costs.summary * costs.phase(summary_blocks, float(summary_blocks * summary_chunks), summary_chunks,
                                          costs.summary_blocks_per_sm)
    return costs.split_overhead + summary + costs.chain_step * float((pieces - 1).max()) + forward


def choose_segment_chunks(chunks: np.ndarray, *, parallel_per_segment: int, summary_per_segment: int,
                          costs: RecurrenceCosts | None, min_segment_chunks: int, max_segments: int | None = None) -> int:
    """The segment length (in chunks), among those that split the longest sequence evenly, are at least
    ``min_segment_chunks`` and make at most ``max_segments`` segments, whose modelled time is nearest the best
    under both extremes of the gates: every summary run in full (heads that barely decay), and every summary cut
    short (heads that all decay; none is where ``costs.shortcut`` is off). Its worse ratio to each extreme's fastest is the smallest; on a tie the longer
    (fewer segments). ``costs`` None never splits.

    Minimising either extreme alone loses to the other: at 1 x 32k 16/32, two one-slice segments are the fastest
    with summaries in full (1014 us, four wide segments 1057) and 11% slower under strong gates (696 against 628)
    and 21% under FlashQLA's (1015 against 841; bench/NOTES.md, twentieth session)."""
    longest = int(chunks.max(initial=0))
    if costs is None or longest <= min_segment_chunks:
        return max(longest, 1)
    candidates = sorted({-(-longest // k) for k in range(1, longest // min_segment_chunks + 1)}, reverse=True)
    if max_segments is not None:  # the unsplit length always stays a candidate
        candidates = [n for n in candidates if n == longest or int(_segments_per_sequence(chunks, n).sum()) <= max_segments]
    full, cut = (np.array([estimated_time(chunks, n, parallel_per_segment=parallel_per_segment,
                                          summary_per_segment=summary_per_segment, costs=costs,
                                          summaries_cut_short=cut_short) for n in candidates])
                 for cut_short in (False, costs.shortcut))
    regret = np.maximum(full / full.min(), cut / cut.min())
    return candidates[int(np.argmin(regret))]  # argmin takes the first, the longest, of equal regrets


def plan_chunks(seqlens: Sequence[int], *, chunk: int, parallel_per_segment: int = 1,
                summary_per_segment: int | None = None, costs: RecurrenceCosts | None = None,
                min_segment_chunks: int = 8, segment_chunks: int | None = None,
                max_segments: int | None = None) -> ChunkSchedule:
    """The chunks and segments of a batch of sequences of ``seqlens`` tokens (see the module docstring).

    A segment runs as ``parallel_per_segment`` forward blocks (v-heads x value slices) and, when a
    later segment needs its summary, ``summary_per_segment`` summary blocks (default twice as many:
    the summary has K + V columns). The split is the one ``costs`` models fastest; None never splits.
    ``segment_chunks`` forces the segment length instead; the planner's choice makes at most
    ``max_segments`` segments (the kernels' grid limit) where a split does.
    """
    lengths = check_seqlens("seqlens", seqlens)
    check_int("chunk", chunk, minimum=1)
    check_int("parallel_per_segment", parallel_per_segment, minimum=1)
    if summary_per_segment is None:
        summary_per_segment = 2 * parallel_per_segment
    check_int("summary_per_segment", summary_per_segment, minimum=1)
    check_int("min_segment_chunks", min_segment_chunks, minimum=1)
    chunks = -(-lengths // chunk)
    offsets = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int64)
    seq = np.repeat(np.arange(len(lengths)), chunks)
    chunk_indices = np.stack([seq, np.arange(seq.size) - offsets[seq]], axis=1).astype(np.int32)

    if segment_chunks is None:
        segment_chunks = choose_segment_chunks(chunks, parallel_per_segment=parallel_per_segment,
                                               summary_per_segment=summary_per_segment, costs=costs,
                                               min_segment_chunks=min_segment_chunks, max_segments=max_segments)
    else:
        check_int("segment_chunks", segment_chunks, minimum=1)
    pieces = _segments_per_sequence(chunks, segment_chunks)
    seg_seq = np.repeat(np.arange(len(lengths)), pieces)
    seg_index = np.arange(seg_seq.size) - np.repeat(np.cumsum(pieces) - pieces, pieces)
    first = seg_index * segment_chunks
    count = np.minimum(chunks[seg_seq] - first, segment_chunks)
    order = np.lexsort((first, seg_seq, -count))
    segments = np.stack([seg_seq[order], first[order], count[order]], axis=1).astype(np.int32)
    return ChunkSchedule(
        chunk_indices=chunk_indices,
        chunk_offsets=offsets,
        segments=segments.reshape(-1, 3),
        segment_chunks=segment_chunks,
        has_incomplete_tile=bool(np.any(lengths % chunk)),
        chunk=chunk,
        total_tokens=int(lengths.sum()),
        max_seqlen=int(lengths.max(initial=0)),
        wide=costs is not None and costs.wide(int(pieces.sum()) * parallel_per_segment),
    )
