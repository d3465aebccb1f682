"""The chunked backward of the gated delta rule against autograd through its token-by-token definition,
in float64 on the host.

The backward kernels compute tests/gdn_backward_reference.py's decomposition; this pins every gradient
(dq, dk, dv, dg, dbeta, dh0) first, with the long-sequence split of both chains into segments:
varlen batches with partial last chunks, GVA, initial and final-state gradients in both layouts,
in-kernel L2 normalisation, custom scales, and gates from no decay to strong decay.
"""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import gdn_reference as ref
from gdn_backward_reference import chunked_backward
from kgen.families.gated_delta_rule.schedule import plan_chunks
from test_gdn_algebra import make_inputs

GRADIENTS = ("dq", "dk", "dv", "dg", "dbeta", "dh0")


def autograd_grads(q, k, v, g, beta, do, dht, initial_state, **options):
    """The gradients of sum(o * do) + sum(final * dht) through ``ref.recurrent``, by autograd
    (dh0 None without a state)."""
    leaves = [x.clone().requires_grad_() for x in (q, k, v, g, beta)]
    state = None if initial_state is None else initial_state.clone().requires_grad_()
    o, final = ref.recurrent(*leaves, initial_state=state, **options)
    loss = (o * do).sum() + (0 if dht is None else (final * dht).sum())
    grads = torch.autograd.grad(loss, leaves + ([] if state is None else [state]))
    return (*grads, None) if state is None else grads


def random_case(lengths, heads, group, dk, dv, layout, with_state, with_dht, seed):
    """Inputs (test_gdn_algebra's gates, from no decay to a = 16), an initial state, do and dht."""
    q, k, v, g, beta, cu = make_inputs(lengths, heads, group, dk, dv, seed)
    gen = torch.Generator().manual_seed(seed + 1)
    state_shape = (len(lengths), heads * group, *((dk, dv) if layout == "kv" else (dv, dk)))
    state = torch.randn(state_shape, generator=gen, dtype=torch.float64) if with_state else None
    do = torch.randn(v.shape, generator=gen, dtype=torch.float64)
    dht = torch.randn(state_shape, generator=gen, dtype=torch.float64) if with_dht else None
    return (q, k, v, g, beta, do, dht, state), cu


def assert_gradients_match(got, want, tolerance=1e-9):
    for name, a, b in zip(GRADIENTS, got, want):
        if b is None:
            assert a is None, name
            continue
        assert a.shape == b.shape and torch.isfinite(a).all(), name
        assert ref.rel_rms(a, b) < tolerance, (name, ref.rel_rms(a, b))


def segments_of(lengths, segment_chunks):
    """The planner's segments of 64-token chunks, ``segment_chunks`` chunks each; None leaves sequences whole."""
    if segment_chunks is None:
        return None
    return plan_chunks(lengths, chunk=64, segment_chunks=segment_chunks).segments.tolist()


# Lengths anywhere up to 200, and often one token either side of a chunk boundary.
LENGTHS = st.lists(st.one_of(st.integers(1, 200), st.sampled_from([63, 64, 65, 127, 128, 129])), min_size=1, max_size=3)


@settings(max_examples=100, deadline=None)
@given(lengths=LENGTHS, heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 2]),
       dims=st.sampled_from([(16, 16), (16, 32), (32, 16), (32, 32)]), with_state=st.booleans(),
       with_dht=st.booleans(), layout=st.sampled_from(["kv", "vk"]), l2norm=st.booleans(),
       scale=st.sampled_from([None, 0.3]), segment_chunks=st.sampled_from([None, 1, 2, 3]),
       seed=st.integers(0, 2**31 - 1))
def test_chunked_backward_equals_autograd_through_the_recurrence(lengths, heads, group, dims, with_state, with_dht,
                                                                 layout, l2norm, scale, segment_chunks, seed):
    dk, dv = dims
    case, cu = random_case(lengths, heads, group, dk, dv, layout, with_state, with_dht, seed)
    q, k, v, g, beta, do, dht, state = case
    options = dict(scale=scale, cu_seqlens=cu, use_qk_l2norm=l2norm, state_layout=layout)
    want = autograd_grads(q, k, v, g, beta, do, dht, state, **options)
    got = chunked_backward(q, k, v, g, beta, do, initial_state=state, dht=dht,
                           segments=segments_of(lengths, segment_chunks), **options)
    assert_gradients_match(got, want)


@pytest.mark.parametrize("segment_chunks", [None, 1])
def test_head_dims_of_64(segment_chunks):
    lengths = [129, 64]
    (q, k, v, g, beta, do, dht, state), cu = random_case(lengths, 1, 2, 64, 64, "vk", True, True, seed=11)
    options = dict(cu_seqlens=cu, use_qk_l2norm=True, state_layout="vk")
    want = autograd_grads(q, k, v, g, beta, do, dht, state, **options)
    got = chunked_backward(q, k, v, g, beta, do, initial_state=state, dht=dht,
                           segments=segments_of(lengths, segment_chunks), **options)
    assert_gradients_match(got, want)


def test_strong_decay_stays_finite_where_factored_gates_overflow():
    (q, k, v, g, beta, do, dht, state), cu = random_case([64, 30], 1, 2, 16, 16, "kv", True, True, seed=5)
    g[..., -1] = -40.0  # the strongest head decays by e^-40 a token: e^{-Gamma} overflows within a chunk
    assert torch.isinf(torch.exp(-g[0, :64, -1].cumsum(0))).any()
    options = dict(cu_seqlens=cu)
    want = autograd_grads(q, k, v, g, beta, do, dht, state, **options)
    assert_gradients_match(chunked_backward(q, k, v, g, beta, do, initial_state=state, dht=dht, **options), want)


@pytest.mark.parametrize("segment_chunks", [None, 1])
def test_a_nan_in_one_sequences_do_stays_in_that_sequence(segment_chunks):
    lengths = [70, 100, 40]
    (q, k, v, g, beta, do, dht, state), cu = random_case(lengths, 2, 2, 16, 16, "kv", True, True, seed=9)
    options = dict(initial_state=state, dht=dht, cu_seqlens=cu, use_qk_l2norm=True,
                   segments=segments_of(lengths, segment_chunks))
    clean = chunked_backward(q, k, v, g, beta, do, **options)
    poisoned_do = do.clone()
    poisoned_do[0, cu[1] + 37] = float("nan")
    poisoned = chunked_backward(q, k, v, g, beta, poisoned_do, **options)
    others = torch.ones(cu[-1], dtype=torch.bool)
    others[cu[1]:cu[2]] = False
    for name, a, b in zip(GRADIENTS[:-1], poisoned, clean):
        assert torch.isnan(a[0, cu[1]:cu[2]]).any(), name  # the poison did reach its own sequence
        assert torch.equal(a[0, others], b[0, others]), name
    dh0_poisoned, dh0_clean = poisoned[-1], clean[-1]
    assert torch.isnan(dh0_poisoned[1]).any()
    assert torch.equal(dh0_poisoned[[0, 2]], dh0_clean[[0, 2]])


@settings(max_examples=8, deadline=None)
@given(lengths=st.lists(st.sampled_from([1, 37, 63, 64, 65, 130]), min_size=1, max_size=3), group=st.sampled_from([1, 2]),
       seed=st.integers(0, 2**31 - 1))
def test_the_backward_host_stage_gathers_and_places_every_chunk(lengths, group, seed):
    # The op's per-chunk stage (backward._torch_grads: rows gathered into zero-padded chunks by the plan's chunk table,
    # dq and dk summed over each GVA group, every token's gradients taken back) on the reference's start states and
    # end-state gradients, laid out as the kernels write them (S^T, dS'^T per chunk), against chunked_backward.
    from kgen.families.gated_delta_rule.backward import _torch_grads
    from kgen.families.gated_delta_rule.planner import plan_chunk_gated_delta_rule
    from gdn_backward_reference import _chunk_forward, _end_state_grads, _start_states

    (q, k, v, g, beta, do, dht, state), cu = random_case(lengths, 1, group, 64, 64, "kv", True, True, seed)
    want = chunked_backward(q, k, v, g, beta, do, initial_state=state, dht=dht, cu_seqlens=cu)
    qn, kn, vd, gd, bd, scale, seqs, states = ref._prepare(q, k, v, g, beta, None, state, cu, False, "kv")
    starts, ends = [], []
    for n, (b, start, end) in enumerate(seqs):
        rows = [slice(c0, min(c0 + 64, end)) for c0 in range(start, end, 64)]
        inputs = [tuple(x[b, r].transpose(0, 1) for x in (qn, kn, vd, gd, bd)) for r in rows]
        terms = [_chunk_forward(*x) for x in inputs]
        starts += _start_states(terms, states[n], None)
        ends += _end_state_grads(terms, [x[0] for x in inputs], [do[b, r].transpose(0, 1) for r in rows], dht[n], None,
                                 scale)[0]
    plan = plan_chunk_gated_delta_rule(cu, num_heads_v=group, head_dim=64)
    assert len(plan.chunks) == len(starts)  # the plan's chunks are the reference's, in order
    as_kernels_write = [torch.stack(x).transpose(-1, -2).contiguous() for x in (starts, ends)]
    got = _torch_grads(q, k, v, g, beta, *as_kernels_write, do, torch.from_numpy(plan.chunks), scale, 64)
    for name, a, b in zip(GRADIENTS, got, want):
        assert a.shape == b.shape, name
        assert ref.rel_rms(a, b) < 1e-5, (name, ref.rel_rms(a, b))  # the stage computes in fp32
