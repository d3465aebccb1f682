"""kgen.ops.chunk_gated_delta_rule on the GPU against the float64 per-token recurrence (tests/gdn_reference.py).

Packed varlen batches with lengths over every residue mod 64 (1..3000), a neighbour sequence
poisoned with NaN and Inf (no other sequence may see it), GVA ratios, initial states on and off,
both state layouts, both dtypes, beta in fp32 or q's dtype, in-kernel l2norm on and off, and
gates g = -a softplus(0.5 x + 1) with a in [0, 16], one head at a = 0 and one at a = 16. Plans
that split sequences into segments are checked against the same reference, and so are KKT blocks of several
chunks (which may belong to different sequences). Outputs are poisoned first; the bar is the issue's relative
RMS <= 5e-3 for o and for the final states.
"""

from __future__ import annotations

import contextlib
from unittest import mock

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

import gdn_reference as ref  # noqa: E402
from kgen import registry  # noqa: E402
from kgen.families.gated_delta_rule import chunk as gdn_chunk  # noqa: E402
from kgen.ops import chunk_gated_delta_rule, plan_chunk_gated_delta_rule  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def head_dims():
    return registry.current().family("gated_delta_rule_chunk").supported("head_dim")


def make_inputs(lengths, heads, group, head_dim, dtype, l2norm, beta_fp32, seed, poisoned=None):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total, heads_v = sum(lengths), heads * group
    q = torch.randn(1, total, heads, head_dim, generator=gen, device="cuda")
    k = torch.randn(1, total, heads, head_dim, generator=gen, device="cuda")
    k = k if l2norm else ref.l2norm(k)
    v = torch.randn(1, total, heads_v, head_dim, generator=gen, device="cuda")
    decay = torch.rand(heads_v, generator=gen, device="cuda") * 16
    decay[0] = 0.0
    if heads_v > 1:
        decay[-1] = 16.0
    g = -decay * torch.nn.functional.softplus(0.5 * torch.randn(1, total, heads_v, generator=gen, device="cuda") + 1)
    beta = torch.rand(1, total, heads_v, generator=gen, device="cuda")
    q, k, v = (t.to(dtype) for t in (q, k, v))
    beta = beta if beta_fp32 else beta.to(dtype)
    if poisoned is not None:  # a neighbour sequence of NaN and Inf
        cu = [0, *torch.tensor(lengths).cumsum(0).tolist()]
        rows = slice(cu[poisoned], cu[poisoned + 1])
        q[:, rows], k[:, rows], v[:, rows] = float("nan"), float("inf"), float("nan")
        g[:, rows], beta[:, rows] = float("nan"), float("inf")
    return q, k, v, g, beta


def kkt_chunks_forced(chunks_per_block):
    """The KKT kernel's blocks take ``chunks_per_block`` chunks each (None: the host's choice)."""
    if chunks_per_block is None:
        return contextlib.nullcontext()
    return mock.patch.object(gdn_chunk, "kkt_chunks_per_block", lambda *_: chunks_per_block)


def check_against_reference(lengths, heads, group, head_dim, dtype, layout, l2norm, beta_fp32, with_initial, seed,
                            segment_chunks=None, poisoned=None, num_sms=None, kkt_chunks=None):
    q, k, v, g, beta = make_inputs(lengths, heads, group, head_dim, dtype, l2norm, beta_fp32, seed, poisoned)
    heads_v = heads * group
    cu_host = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    initial = None
    if with_initial:
        gen = torch.Generator(device="cuda").manual_seed(seed + 1)
        initial = torch.randn(len(lengths), heads_v, head_dim, head_dim, generator=gen, device="cuda")
    plan = plan_chunk_gated_delta_rule(cu_host, num_heads_v=heads_v, head_dim=head_dim, segment_chunks=segment_chunks,
                                       num_sms=num_sms)
    out = torch.full_like(v, float("nan"))
    with kkt_chunks_forced(kkt_chunks):
        o, final = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial, output_final_state=True,
                                          cu_seqlens=cu, use_qk_l2norm_in_kernel=l2norm, state_layout=layout, plan=plan,
                                          out=out)
    torch.cuda.synchronize()
    assert o is out
    keep = [i for i in range(len(lengths)) if i != poisoned]
    o_ref, s_ref = ref.recurrent(q, k, v, g, beta, initial_state=initial, cu_seqlens=cu_host, use_qk_l2norm=l2norm,
                                 state_layout=layout)
    rows = torch.cat([torch.arange(cu_host[i], cu_host[i + 1]) for i in keep]).cuda()
    assert torch.isfinite(o[:, rows]).all(), "o has NaN/Inf (or unwritten poison) in a clean sequence"
    assert torch.isfinite(final[keep]).all(), "a final state has NaN/Inf"
    assert ref.rel_rms(o[:, rows], o_ref[:, rows]) <= ref.RMS_BAR
    assert ref.rel_rms(final[keep], s_ref[keep]) <= ref.RMS_BAR
    return plan


lengths_st = st.lists(st.one_of(st.integers(1, 200), st.integers(1, 3000), st.integers(0, 46).map(lambda m: 64 * m + 63),
                                st.integers(1, 46).map(lambda m: 64 * m)), min_size=1, max_size=4)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lengths=lengths_st, heads=st.integers(1, 2), group=st.sampled_from([1, 2, 4]), dtype=st.sampled_from(sorted(DTYPES)),
       layout=st.sampled_from(["kv", "vk"]), l2norm=st.booleans(), beta_fp32=st.booleans(), with_initial=st.booleans(),
       split=st.booleans(), data=st.data())
def test_matches_recurrence(lengths, heads, group, dtype, layout, l2norm, beta_fp32, with_initial, split, data):
    head_dim = data.draw(st.sampled_from(head_dims()))
    if sum(lengths) > 4000:
        lengths = lengths[:1]
    # split: segments of 1 to 8 chunks, so sequences of more chunks run as several exact segments. A plan for
    # one SM runs in wide blocks (head_dim 128) wherever it has two or more one-slice blocks, the default one
    # mostly in one-slice blocks.
    check_against_reference(lengths, heads, group, head_dim, DTYPES[dtype], layout, l2norm, beta_fp32, with_initial,
                            seed=len(lengths) * 7919 + sum(lengths),
                            segment_chunks=data.draw(st.integers(1, 8)) if split else None,
                            num_sms=data.draw(st.sampled_from([None, 1])),
                            kkt_chunks=data.draw(st.sampled_from([None, 2, 3, 4, 8])))


@pytest.mark.parametrize("kkt_chunks", [None, 3])
@pytest.mark.parametrize("num_sms", [None, 1])
@pytest.mark.parametrize("head_dim", head_dims())
def test_split_sequence_is_exact_and_neighbours_are_isolated(head_dim, num_sms, kkt_chunks):
    # 2100 tokens = 33 chunks in 5 segments of 8 (the last of 1); a poisoned neighbour in the middle. Planned for
    # one SM, the forward runs in wide blocks (head_dim 128: two value slices a block).
    plan = check_against_reference([2100, 77, 1000], 2, 2, head_dim, torch.bfloat16, "kv", False, True, True, seed=5,
                                   segment_chunks=8, poisoned=1, num_sms=num_sms, kkt_chunks=kkt_chunks)
    assert len(plan.chains) == 2 and plan.num_summaries == 4 + 1  # both long sequences were split
    assert plan.wide is (num_sms == 1 and head_dim == 128)


def test_empty_sequence_passes_its_state_through():
    lengths = [0, 130, 0]
    q, k, v, g, beta = make_inputs(lengths, 1, 2, 128, torch.bfloat16, False, True, seed=3)
    initial = torch.randn(3, 2, 128, 128, device="cuda")
    cu = torch.tensor([0, 0, 130, 130], dtype=torch.int32, device="cuda")
    _, final = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial, output_final_state=True, cu_seqlens=cu)
    assert torch.equal(final[0], initial[0]) and torch.equal(final[2], initial[2])


def test_fixed_length_batch_and_determinism():
    q, k, v, g, beta = (t.reshape(3, 100, *t.shape[2:]) for t in make_inputs([300], 2, 2, 128, torch.bfloat16, False,
                                                                           True, seed=11))
    runs = [chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True) for _ in range(2)]
    assert torch.equal(runs[0][0], runs[1][0]) and torch.equal(runs[0][1], runs[1][1])
    o_ref, s_ref = ref.recurrent(q, k, v, g, beta)
    assert ref.rel_rms(runs[0][0], o_ref) <= ref.RMS_BAR and ref.rel_rms(runs[0][1], s_ref) <= ref.RMS_BAR


def test_cuda_graph_replay_with_plan():
    lengths = [700, 64, 1]
    cu_host = [0, 700, 764, 765]
    q, k, v, g, beta = make_inputs(lengths, 2, 2, 128, torch.bfloat16, False, True, seed=13)
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    plan = plan_chunk_gated_delta_rule(cu_host, num_heads_v=4, head_dim=128, segment_chunks=3, device="cuda")
    out = torch.full_like(v, float("nan"))
    chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, plan=plan, out=out)  # warm-up: compiles and loads
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, plan=plan, out=out)
    fresh = make_inputs(lengths, 2, 2, 128, torch.bfloat16, False, True, seed=14)
    for t, new in zip((q, k, v, g, beta), fresh):
        t.copy_(new)
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    o_ref, _ = ref.recurrent(q, k, v, g, beta, cu_seqlens=cu_host)
    assert ref.rel_rms(out, o_ref) <= ref.RMS_BAR


def test_bad_input_is_refused():
    q, k, v, g, beta = make_inputs([100], 2, 2, 128, torch.bfloat16, False, True, seed=1)
    cu = torch.tensor([0, 100], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="multiple of H"):
        chunk_gated_delta_rule(q, k, v[:, :, :3].contiguous(), g[:, :, :3].contiguous(), beta[:, :, :3].contiguous())
    with pytest.raises(TypeError, match="g: expected dtype"):
        chunk_gated_delta_rule(q, k, v, g.to(torch.bfloat16), beta)
    with pytest.raises(ValueError, match="state_layout"):
        chunk_gated_delta_rule(q, k, v, g, beta, state_layout="kvv")
    with pytest.raises(ValueError, match="initial_state: expected shape"):
        chunk_gated_delta_rule(q, k, v, g, beta, initial_state=torch.zeros(2, 4, 128, 128, device="cuda"))
    other = plan_chunk_gated_delta_rule([0, 50, 100], num_heads_v=4, head_dim=128)
    with pytest.raises(ValueError, match=r"cu_seqlens: the plan is for 2 sequences \(3 entries\), got 2"):
        chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, plan=other)
    with pytest.raises(ValueError, match="packed varlen takes B = 1"):
        chunk_gated_delta_rule(*(torch.cat([t, t]) for t in (q, k, v, g, beta)), cu_seqlens=cu)


def test_no_tokens_passes_the_states_through():
    # T = 0: no chunk at all, yet every sequence's final state is written (= its initial state).
    q, k = (torch.empty(1, 0, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v = torch.empty(1, 0, 4, 128, device="cuda", dtype=torch.bfloat16)
    g, beta = torch.empty(1, 0, 4, device="cuda"), torch.empty(1, 0, 4, device="cuda")
    initial = torch.randn(2, 4, 128, 128, device="cuda")
    cu = torch.zeros(3, dtype=torch.int32, device="cuda")
    o, final = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial, output_final_state=True, cu_seqlens=cu)
    assert o.shape == v.shape and torch.equal(final, initial)


def test_graph_capture_with_a_fresh_plan_made_for_the_device():
    # The kernels are loaded by an earlier call with another plan; a fresh plan made with device="cuda"
    # must need no copy at its first use, inside the capture.
    lengths, cu_host = [300, 65], [0, 300, 365]
    q, k, v, g, beta = make_inputs(lengths, 2, 2, 128, torch.bfloat16, False, True, seed=17)
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)
    torch.cuda.synchronize()
    plan = plan_chunk_gated_delta_rule(cu_host, num_heads_v=4, head_dim=128, segment_chunks=2, device="cuda")
    out = torch.full_like(v, float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, plan=plan, out=out)
    graph.replay()
    torch.cuda.synchronize()
    o_ref, _ = ref.recurrent(q, k, v, g, beta, cu_seqlens=cu_host)
    assert ref.rel_rms(out, o_ref) <= ref.RMS_BAR


@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
@pytest.mark.parametrize("call_cu", [[0, 310, 377, 1377], [0, 300, 250, 1377], [0, 300, 377, 1400]],
                         ids=["moved-boundary", "decreasing", "past-the-end"])
def test_a_plan_used_with_other_cu_seqlens_gives_nan_to_the_moved_sequences_alone(call_cu, index_dtype):
    lengths, heads_v = [300, 77, 1000], 4
    planned = [0, 300, 377, 1377]
    # Segments of 2 chunks: every sequence but the short one is split, so the summary and chain run too.
    plan = plan_chunk_gated_delta_rule(planned, num_heads_v=heads_v, head_dim=128, segment_chunks=2)
    q, k, v, g, beta = make_inputs(lengths, 2, 2, 128, torch.bfloat16, False, True, seed=21)
    initial = torch.randn(3, heads_v, 128, 128, device="cuda")
    right = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial, output_final_state=True, plan=plan,
                                   cu_seqlens=torch.tensor(planned, dtype=index_dtype, device="cuda"))
    out = torch.zeros_like(v)
    _, final = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial, output_final_state=True, plan=plan,
                                      cu_seqlens=torch.tensor(call_cu, dtype=index_dtype, device="cuda"), out=out)
    moved = [i for i in range(3) if (call_cu[i], call_cu[i + 1]) != (planned[i], planned[i + 1])]
    assert moved
    for i in range(3):
        rows = slice(planned[i], planned[i + 1])
        if i in moved:
            assert out[:, rows].isnan().all() and final[i].isnan().all(), f"sequence {i} moved: it must be NaN"
        else:
            assert torch.equal(out[:, rows], right[0][:, rows]) and torch.equal(final[i], right[1][i]), f"sequence {i}"


def test_a_varlen_plan_for_a_batch_without_cu_seqlens_is_refused():
    q, k, v, g, beta = (t.reshape(2, 50, *t.shape[2:]) for t in make_inputs([100], 2, 2, 128, torch.bfloat16, False,
                                                                          True, seed=1))
    uneven = plan_chunk_gated_delta_rule([0, 30, 100], num_heads_v=4, head_dim=128)
    with pytest.raises(ValueError, match="plan: made for 2 sequences of other lengths; without cu_seqlens these "
                                         "tensors are 2 sequences of 50 tokens"):
        chunk_gated_delta_rule(q, k, v, g, beta, plan=uneven)
    even = plan_chunk_gated_delta_rule([0, 50, 100], num_heads_v=4, head_dim=128)
    assert torch.equal(chunk_gated_delta_rule(q, k, v, g, beta, plan=even)[0], chunk_gated_delta_rule(q, k, v, g, beta)[0])


def _split_runs(g_scale, layout, seed, lengths=(2100, 77, 1000), segment_chunks=2):
    """(default plan's o and final states, exact_split's, the float64 reference's) on sequences split into segments of
    ``segment_chunks`` chunks, gates g = g_scale * logsigmoid(randn) (unit-norm keys, beta in [0, 1])."""
    heads_v = 4
    cu_host = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    q, k, v, _, beta = make_inputs(lengths, 2, 2, 128, torch.bfloat16, False, True, seed=seed)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    g = g_scale * torch.nn.functional.logsigmoid(torch.randn(1, cu_host[-1], heads_v, generator=gen, device="cuda"))
    initial = torch.randn(3, heads_v, 128, 128, generator=gen, device="cuda")
    runs = [chunk_gated_delta_rule(q, k, v, g, beta, initial_state=initial, output_final_state=True, cu_seqlens=cu,
                                   state_layout=layout, plan=plan_chunk_gated_delta_rule(
                                       cu_host, num_heads_v=heads_v, head_dim=128, segment_chunks=segment_chunks,
                                       exact_split=exact))
            for exact in (False, True)]
    return runs, ref.recurrent(q, k, v, g, beta, initial_state=initial, cu_seqlens=cu_host, state_layout=layout)


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_the_decay_bounded_shortcut_equals_the_exact_split_within_fp32_rounding(layout):
    # Strong decay (the benchmark gates): every chunk sums far below -17, so a summary runs its last chunk.
    (fast, exact), (o_ref, s_ref) = _split_runs(1.0, layout, 31)
    assert ref.rel_rms(fast[1], exact[1]) <= 1e-6  # the fp32 final states
    # o is bf16: the states' last-bit differences may round an element to its neighbour, never further.
    ulp = torch.finfo(torch.bfloat16).eps * exact[0].float().abs().clamp_min(torch.finfo(torch.bfloat16).tiny)
    assert ((fast[0].float() - exact[0].float()).abs() <= ulp).all()
    assert ref.rel_rms(fast[0], o_ref) <= ref.RMS_BAR and ref.rel_rms(fast[1], s_ref) <= ref.RMS_BAR


def test_a_shortcut_found_deep_in_a_segment_is_as_accurate_as_the_exact_split():
    # A chunk sums to about -0.2: the gates fall below -17 about 85 chunks before a 100-chunk segment's end, in the
    # second step of the summary's backward walk (64 chunks a step). Under weak decay the kernels' 16-bit copies of
    # the state make two summations of the same sum differ at their rounding level (in a float64 emulation with
    # the kernels' roundings, a start 11 chunks later moved the end state by 1.9e-3, from a true difference of
    # 4e-10), so both are held to the float64 reference, and the shortcut to the exact split's own error.
    (fast, exact), (o_ref, s_ref) = _split_runs(0.0039, "kv", 31, (13000, 77, 1000), 100)
    assert not torch.equal(fast[1], exact[1])  # the shortcut applied
    for name, (o, states) in (("fast", fast), ("exact", exact)):
        assert ref.rel_rms(o, o_ref) <= ref.RMS_BAR and ref.rel_rms(states, s_ref) <= ref.RMS_BAR, name
    assert ref.rel_rms(fast[0], o_ref) <= 1.25 * ref.rel_rms(exact[0], o_ref)
    assert ref.rel_rms(fast[1], s_ref) <= 1.25 * ref.rel_rms(exact[1], s_ref)


def test_without_strong_decay_the_shortcut_never_applies():
    # Gates of about -0.001 per token: a segment sums to about -0.15, so the default plan computes exactly what
    # exact_split does.
    (fast, exact), _ = _split_runs(0.0015, "kv", 32)
    assert torch.equal(fast[0], exact[0]) and torch.equal(fast[1], exact[1])
