"""Host-side planning for the chunked gated delta rule over packed varlen batches.

Sequences are cut into chunks of ``chunk`` tokens that never cross a sequence; a sequence's last
chunk may be partial. The state recurrence runs chunk after chunk, so one long sequence is a
serial chain: to fill the GPU the planner splits sequences into segments of whole chunks, which
run side by side from a zero state; each segment's initial state is then corrected exactly with
the transitions of the segments before it (the kernels' job). Plans are built from host data
only, so a run never synchronises with the device.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from kgen.ops._checks import check_int, check_seqlens


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
    #: Some sequence ends inside a chunk, so the kernels need their tail variant.
    has_incomplete_tile: bool
    chunk: int
    total_tokens: int
    max_seqlen: int


def _segments_per_sequence(chunks: np.ndarray, segment_chunks: int) -> np.ndarray:
    return -(-chunks // segment_chunks)


def choose_segment_chunks(chunks: np.ndarray, *, parallel_per_segment: int, target_ctas: int,
                          min_segment_chunks: int) -> int:
    """The segment length (in chunks): the fewest segments that give at least ``target_ctas`` CTAs, as even as
    those segments can be.

    A segment runs as ``parallel_per_segment`` CTAs (v-heads x V slices). Fewer segments mean
    fewer state corrections; among splits into as many segments, the shortest length makes the
    shortest serial chain. Segments never get shorter than ``min_segment_chunks``, and a batch that
    fills the GPU unsplit is not split.
    """
    longest = int(chunks.max(initial=0))
    if longest <= min_segment_chunks:
        return max(longest, 1)

    def ctas(segment_chunks: int) -> int:
        return int(_segments_per_sequence(chunks, segment_chunks).sum()) * parallel_per_segment

    if ctas(longest) >= target_ctas:
        return longest
    # ctas() only grows as segments shrink. First the longest length that reaches the target ...
    low, high = min_segment_chunks, longest  # ctas(high) < target
    if ctas(low) >= target_ctas:
        while high - low > 1:
            middle = (low + high) // 2
            low, high = (middle, high) if ctas(middle) >= target_ctas else (low, middle)
    # ... then the shortest one that splits into as many segments.
    fewest = ctas(low)
    high, low = low, min_segment_chunks - 1  # ctas(high) == fewest; ctas(low) > fewest, or low is below the floor
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (low, middle) if ctas(middle) == fewest else (middle, high)
    return high


def plan_chunks(seqlens: Sequence[int], *, chunk: int = 64, parallel_per_segment: int = 1,
                target_ctas: int = 0, min_segment_chunks: int = 8) -> ChunkSchedule:
    """The chunks and segments of a batch of sequences of ``seqlens`` tokens (see the module docstring).

    ``target_ctas`` (e.g. two per SM) is what the split aims to fill with ``parallel_per_segment``
    CTAs per segment; 0 never splits.
    """
    lengths = check_seqlens("seqlens", seqlens)
    check_int("chunk", chunk, minimum=1)
    check_int("parallel_per_segment", parallel_per_segment, minimum=1)
    check_int("target_ctas", target_ctas, minimum=0)
    check_int("min_segment_chunks", min_segment_chunks, minimum=1)
    chunks = -(-lengths // chunk)
    offsets = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int64)
    seq = np.repeat(np.arange(len(lengths)), chunks)
    chunk_indices = np.stack([seq, np.arange(seq.size) - offsets[seq]], axis=1).astype(np.int32)

    segment_chunks = choose_segment_chunks(chunks, parallel_per_segment=parallel_per_segment,
                                           target_ctas=target_ctas, min_segment_chunks=min_segment_chunks)
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
    )
