"""The gated delta rule's host planner (kgen.ops.gdn_plan) against a pure-Python model of it."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kgen.ops.gdn_plan import choose_segment_chunks, plan_chunks

lengths = st.lists(st.integers(0, 3000) | st.sampled_from([1, 63, 64, 65, 127, 128, 129]), max_size=12)


def model_chunks(seqlens, chunk):
    return [(s, c) for s, n in enumerate(seqlens) for c in range(-(-n // chunk))]


@settings(max_examples=200, deadline=None)
@given(seqlens=lengths, chunk=st.sampled_from([16, 64]), parallel=st.integers(1, 64), target=st.integers(0, 600),
       min_chunks=st.integers(1, 16))
def test_chunks_and_segments_match_the_model(seqlens, chunk, parallel, target, min_chunks):
    plan = plan_chunks(seqlens, chunk=chunk, parallel_per_segment=parallel, target_ctas=target,
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

    # The segment length: the fewest segments (of at least min_chunks) that reach the target, as even as can be.
    def segments(length):
        return sum(-(-c // length) for c in counts)
    longest = max(counts, default=0)
    if longest <= min_chunks:
        assert seg == max(longest, 1)
    else:
        lengths_allowed = range(min_chunks, longest + 1)
        reaching = [n for n in lengths_allowed if segments(n) * parallel >= target]
        fewest = segments(max(reaching) if reaching else min_chunks)
        assert seg == min(n for n in lengths_allowed if segments(n) == fewest)


def test_one_long_sequence_is_split_to_fill_the_gpu():
    # 1 x 32k tokens at 32 v-heads: 512 chunks; 264 CTAs (two per SM) need 9 segments of 57 chunks.
    plan = plan_chunks([32768], parallel_per_segment=32, target_ctas=264)
    assert plan.segment_chunks == 57 and len(plan.segments) == 9
    assert plan.segments[:, 2].sum() == 512
    # Many sequences already fill it: no split.
    assert plan_chunks([1024] * 64, parallel_per_segment=32, target_ctas=264).segment_chunks == 16
    assert choose_segment_chunks(np.array([512]), parallel_per_segment=32, target_ctas=0, min_segment_chunks=8) == 512


@pytest.mark.parametrize("bad,error", [
    (dict(seqlens=[1, -1]), ValueError), (dict(seqlens=[True]), TypeError), (dict(seqlens=(1.5,)), TypeError),
    (dict(seqlens=[8], chunk=0), ValueError), (dict(seqlens=[8], target_ctas=-1), ValueError),
    (dict(seqlens=[8], parallel_per_segment=0), ValueError), (dict(seqlens=[2**31]), ValueError),
])
def test_bad_plans_are_refused_with_the_argument_named(bad, error):
    name = next(k for k in bad if k != "seqlens") if len(bad) > 1 else "seqlens"
    with pytest.raises(error, match=name):
        plan_chunks(**bad)
