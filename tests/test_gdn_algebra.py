"""The chunked gated delta rule against its token-by-token definition, in float64 on the host.

The kernels compute the chunked form (tests/gdn_reference.py); this pins its algebra first, and
the split of long sequences into segments corrected by their transitions:
varlen batches with partial last chunks, GVA, initial states in both layouts, in-kernel L2
normalisation, and gates from no decay (a = 0) to strong decay (a = 16), where a form that
factors e^{-Gamma} out would overflow.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gdn_reference as ref
from kgen.families.gated_delta_rule.schedule import plan_chunks


def gates(shape, decay: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """g = -a softplus(0.5 x + 1), with a per v-head (the issue's gate distribution)."""
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    return -decay * torch.nn.functional.softplus(0.5 * x + 1)


def make_inputs(lengths, heads, group, dk, dv, seed, packed=True):
    gen = torch.Generator().manual_seed(seed)
    heads_v = heads * group
    total = sum(lengths)
    batch, tokens = (1, total) if packed else (len(lengths), lengths[0])
    q = torch.randn(batch, tokens, heads, dk, generator=gen, dtype=torch.float64)
    k = ref.l2norm(torch.randn(batch, tokens, heads, dk, generator=gen, dtype=torch.float64))
    v = torch.randn(batch, tokens, heads_v, dv, generator=gen, dtype=torch.float64)
    # One v-head without decay, one at the strongest, the others in between.
    decay = torch.rand(heads_v, generator=gen, dtype=torch.float64) * 16
    decay[0] = 0.0
    if heads_v > 1:
        decay[-1] = 16.0
    g = gates((batch, tokens, heads_v), decay, gen)
    beta = torch.rand(batch, tokens, heads_v, generator=gen, dtype=torch.float64)
    cu = [0, *torch.tensor(lengths).cumsum(0).tolist()] if packed else None
    return q, k, v, g, beta, cu


@settings(max_examples=60, deadline=None)
@given(lengths=st.lists(st.integers(0, 150), min_size=1, max_size=4), heads=st.sampled_from([1, 2]),
       group=st.sampled_from([1, 2, 4]), dims=st.sampled_from([(8, 8), (16, 8), (8, 16)]),
       chunk=st.sampled_from([16, 64]), with_state=st.booleans(), layout=st.sampled_from(["kv", "vk"]),
       l2norm=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_chunked_form_equals_the_recurrence(lengths, heads, group, dims, chunk, with_state, layout, l2norm, seed):
    dk, dv = dims
    q, k, v, g, beta, cu = make_inputs(lengths, heads, group, dk, dv, seed)
    state = None
    if with_state:
        state = torch.randn(len(lengths), heads * group, *((dk, dv) if layout == "kv" else (dv, dk)),
                            generator=torch.Generator().manual_seed(seed + 1), dtype=torch.float64)
    options = dict(initial_state=state, cu_seqlens=cu, use_qk_l2norm=l2norm, state_layout=layout)
    o_ref, s_ref = ref.recurrent(q, k, v, g, beta, **options)
    o, s = ref.chunked(q, k, v, g, beta, chunk=chunk, **options)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    assert ref.rel_rms(o, o_ref) < 1e-9 and ref.rel_rms(s, s_ref) < 1e-9


def test_layouts_are_transposes_and_never_confused():
    # K = V, so both layouts have one shape: the values must still differ by a transpose.
    q, k, v, g, beta, cu = make_inputs([37, 70], 2, 2, 8, 8, seed=3)
    _, kv = ref.recurrent(q, k, v, g, beta, cu_seqlens=cu, state_layout="kv")
    _, vk = ref.recurrent(q, k, v, g, beta, cu_seqlens=cu, state_layout="vk")
    assert kv.shape == vk.shape and torch.equal(vk, kv.transpose(-1, -2))
    assert not torch.allclose(kv, vk)


@pytest.mark.parametrize("split", [1, 63, 64, 65, 100])
def test_a_run_resumed_from_its_state_equals_the_whole_run(split):
    q, k, v, g, beta, _ = make_inputs([130], 2, 2, 16, 8, seed=split, packed=False)
    o_all, s_all = ref.recurrent(q, k, v, g, beta)
    o_a, s_a = ref.chunked(q[:, :split], k[:, :split], v[:, :split], g[:, :split], beta[:, :split])
    o_b, s_b = ref.chunked(q[:, split:], k[:, split:], v[:, split:], g[:, split:], beta[:, split:], initial_state=s_a)
    assert ref.rel_rms(torch.cat([o_a, o_b], dim=1), o_all) < 1e-9 and ref.rel_rms(s_b, s_all) < 1e-9


def test_strong_decay_stays_finite_where_factored_gates_overflow():
    q, k, v, g, beta, cu = make_inputs([64], 1, 4, 8, 8, seed=5)
    g[..., -1] = -40.0  # the strongest head decays by e^-40 a token: Gamma reaches -2560 in a chunk
    gamma = g[0, :, -1].cumsum(0)
    assert torch.isinf(torch.exp(-gamma)).any()  # what e^{-Gamma} factoring would multiply by
    o, s = ref.chunked(q, k, v, g, beta, cu_seqlens=cu)
    o_ref, s_ref = ref.recurrent(q, k, v, g, beta, cu_seqlens=cu)
    assert torch.isfinite(o).all() and ref.rel_rms(o, o_ref) < 1e-9 and ref.rel_rms(s, s_ref) < 1e-9


@settings(max_examples=30, deadline=None)
@given(lengths=st.lists(st.integers(0, 300), min_size=1, max_size=3), group=st.sampled_from([1, 2]),
       segment_chunks=st.integers(1, 8), with_state=st.booleans(),
       layout=st.sampled_from(["kv", "vk"]), seed=st.integers(0, 2**31 - 1))
def test_segments_from_zero_states_corrected_by_their_transitions_equal_the_whole_run(
        lengths, group, segment_chunks, with_state, layout, seed):
    # The long-sequence path: the planner's segments (chunks of 16 so that short tests split), run
    # independently and made exact by the chain of start states.
    q, k, v, g, beta, cu = make_inputs(lengths, 1, group, 8, 8, seed)
    plan = plan_chunks(lengths, chunk=16, parallel_per_segment=group, segment_chunks=segment_chunks)
    state = (torch.randn(len(lengths), group, 8, 8, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
             if with_state else None)
    options = dict(initial_state=state, cu_seqlens=cu, state_layout=layout)
    o_ref, s_ref = ref.recurrent(q, k, v, g, beta, **options)
    o, s = ref.segmented(q, k, v, g, beta, segments=plan.segments.tolist(), chunk=16, **options)
    assert ref.rel_rms(o, o_ref) < 1e-9 and ref.rel_rms(s, s_ref) < 1e-9
