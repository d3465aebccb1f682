"""Context parallelism's decomposition on the CPU, with float64 stand-ins for the kernels: the zigzag shards and
the ring's steps (simulated, one process) against single-device attention; the gated delta rule's pieces,
composed through their transitions, against the per-token recurrence."""

from __future__ import annotations

import math
import sys
from pathlib import Path
from unittest import mock

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kgen.distributed as cp
import kgen.distributed.attention as cp_attention
import kgen.distributed.gated_delta_rule as cp_gdn

sys.path.insert(0, str(Path(__file__).parent))
import gdn_reference  # noqa: E402


def attention(q, k, v, cu_q, cu_k, *, causal, sink, softmax_scale, return_lse, plan, window=(-1, -1)):
    """attention_varlen's contract in float64: bottom-right causal and window, sink in the denominator, LSE
    [Hq, total_q]."""
    assert return_lse and plan is not None
    heads_q, group = q.shape[1], q.shape[1] // k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64)
    lse = torch.full((heads_q, q.shape[0]), -math.inf, dtype=torch.float64)
    q_bounds, k_bounds = cu_q.tolist(), cu_k.tolist()
    for (q0, q1), (k0, k1) in zip(zip(q_bounds[:-1], q_bounds[1:]), zip(k_bounds[:-1], k_bounds[1:])):
        lq, lk = q1 - q0, k1 - k0
        if not lq:
            continue
        s = torch.einsum("qhd,khd->hqk", q[q0:q1], k[k0:k1].repeat_interleave(group, 1)) * softmax_scale
        keys, rows = torch.arange(lk).view(1, -1), torch.arange(lq).view(-1, 1) + (lk - lq)
        allowed = torch.ones(lq, lk, dtype=torch.bool)
        if causal:
            allowed &= keys <= rows
        if window[0] >= 0:
            allowed &= keys >= rows - window[0]
        if window[1] >= 0:
            allowed &= keys <= rows + window[1]
        s = s.masked_fill(~allowed, -math.inf)
        if sink is not None:
            s = torch.cat([s, sink.view(-1, 1, 1).expand(-1, lq, 1)], dim=2)
        m = s.amax(2, keepdim=True).clamp(min=-1e300) if s.shape[2] else s.new_zeros((heads_q, lq, 1))
        p = torch.exp(s - m) if s.shape[2] else s
        denom = p.sum(2, keepdim=True)
        out[q0:q1] = (torch.einsum("hqk,khd->qhd", p[..., :lk], v[k0:k1].repeat_interleave(group, 1))
                      / torch.where(denom > 0, denom, 1).permute(1, 0, 2))
        lse[:, q0:q1] = torch.where(denom > 0, m + torch.log(denom), -math.inf).squeeze(2)
    return out, lse


def merge(v_a, lse_a, v_b, lse_b):
    top = torch.maximum(lse_a, lse_b)
    base = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    wa, wb = torch.exp(lse_a - base), torch.exp(lse_b - base)
    total = wa + wb
    v = (v_a * wa[..., None] + v_b * wb[..., None]) / torch.where(total > 0, total, 1)[..., None]
    return v, torch.where(total > 0, base + torch.log(total), -math.inf)


@pytest.fixture(autouse=True)
def float64_kernels(monkeypatch):
    monkeypatch.setattr(cp_attention, "attention_varlen", attention)
    monkeypatch.setattr(cp_attention, "merge_attention_states", merge)


@settings(max_examples=150, deadline=None)
@given(seqlens=st.lists(st.integers(0, 90), min_size=1, max_size=4), world_size=st.integers(1, 4),
       group=st.sampled_from([1, 2, 4]), use_sink=st.booleans(), window=st.sampled_from([-1, -1, 0, 1, 7, 30]),
       seed=st.integers(0, 2**31 - 1))
def test_ring_steps_equal_single_device_attention(seqlens, world_size, group, use_sink, window, seed):
    gen = torch.Generator().manual_seed(seed)
    total, heads_kv, head_dim = sum(seqlens), 2, 16
    q = torch.randn(total, heads_kv * group, head_dim, generator=gen, dtype=torch.float64)
    k, v = (torch.randn(total, heads_kv, head_dim, generator=gen, dtype=torch.float64) for _ in range(2))
    sink = torch.randn(heads_kv * group, generator=gen, dtype=torch.float64) if use_sink else None
    cu = [0, *np.cumsum(seqlens).tolist()]
    scale = head_dim ** -0.5
    expected, expected_lse = attention(q, k, v, torch.tensor(cu), torch.tensor(cu), causal=True, sink=sink,
                                       softmax_scale=scale, return_lse=True, plan=object(), window=(window, -1))
    plans = [cp.plan_attention_varlen_cp(cu, world_size=world_size, rank=r, head_dim=128, window_left=window)
             for r in range(world_size)]
    shards = [[cp.shard_tokens(t, p) for p in plans] for t in (q, k, v)]
    results = cp.attention_varlen_cp_simulated(*shards, plans=plans, sink=sink, softmax_scale=scale)
    seen = []
    for plan, (out, lse) in zip(plans, results):
        # The running LSE is fp32, as the kernels keep it: tolerances of fp32, far below a wrong step's error.
        torch.testing.assert_close(out, cp.shard_tokens(expected, plan), atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(lse.double(), cp.shard_tokens(expected_lse.transpose(0, 1), plan), atol=1e-5,
                                   rtol=1e-6)
        seen += plan.shard.global_rows().tolist()
    assert sorted(seen) == list(range(total))  # every token on exactly one rank


def test_zigzag_balances_causal_work():
    # Rank r holds chunks r and 2W-1-r: the causal work (keys before each query) is the same for every rank.
    plans = [cp.plan_attention_varlen_cp([0, 8000], world_size=4, rank=r, head_dim=128) for r in range(4)]
    work = [sum(int(p) + 1 for p in plan.shard.global_rows()) for plan in plans]
    assert max(work) / min(work) < 1.001
    assert [plan.shard.tokens for plan in plans] == [2000] * 4


def test_bad_input_is_refused():
    with pytest.raises(ValueError, match="rank"):
        cp.plan_attention_varlen_cp([0, 10], world_size=2, rank=2, head_dim=128)
    with pytest.raises(ValueError, match="causal"):
        cp.plan_attention_varlen_cp([0, 10], world_size=2, rank=0, head_dim=128, causal=False)
    plans = [cp.plan_attention_varlen_cp([0, 40], world_size=2, rank=r, head_dim=128) for r in range(2)]
    q = torch.zeros(20, 2, 16, dtype=torch.float64)
    with pytest.raises(ValueError, match="q: rank 0's shard has 20 tokens"):
        cp.attention_varlen_cp_simulated([q[:19], q], [q, q], [q, q], plans=plans)


def test_a_plan_for_another_world_size_is_refused():
    import torch.distributed as dist
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        plan = cp.plan_attention_varlen_cp([0, 40], world_size=2, rank=0, head_dim=128)
        q = torch.zeros(20, 2, 16)
        with pytest.raises(ValueError, match="made for rank 0 of 2; this group has rank 0 of 1"):
            cp.attention_varlen_cp(q, q, q, group=dist.group.WORLD, plan=plan)
    finally:
        dist.destroy_process_group()


def gdn_op(q, k, v, g, beta, *, cu_seqlens, plan, scale, output_final_state=False, use_qk_l2norm_in_kernel=False,
           initial_state=None):
    """chunk_gated_delta_rule's contract in float64: the per-token recurrence (tests/gdn_reference)."""
    assert plan is not None
    o, final = gdn_reference.recurrent(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                       cu_seqlens=cu_seqlens, use_qk_l2norm=use_qk_l2norm_in_kernel)
    return o, final if output_final_state else None


@settings(max_examples=25, deadline=None)
@given(seqlens=st.lists(st.integers(0, 40), min_size=1, max_size=3), world_size=st.integers(1, 4),
       layout=st.sampled_from(["kv", "vk"]), with_initial=st.booleans(), l2norm=st.booleans(),
       seed=st.integers(0, 2**31 - 1))
def test_gdn_pieces_compose_to_the_single_device_result(seqlens, world_size, layout, with_initial, l2norm, seed):
    with mock.patch.object(cp_gdn, "chunk_gated_delta_rule", gdn_op):
        check_gdn_pieces(seqlens, world_size, layout, with_initial, l2norm, seed)


def check_gdn_pieces(seqlens, world_size, layout, with_initial, l2norm, seed):
    gen = torch.Generator().manual_seed(seed)
    total, heads, heads_v, dim = sum(seqlens), 1, 2, 8
    q = torch.randn(1, total, heads, dim, generator=gen, dtype=torch.float64)
    k = gdn_reference.l2norm(torch.randn(1, total, heads, dim, generator=gen, dtype=torch.float64))
    v = torch.randn(1, total, heads_v, dim, generator=gen, dtype=torch.float64)
    g = -torch.rand(1, total, heads_v, generator=gen, dtype=torch.float64)
    beta = torch.rand(1, total, heads_v, generator=gen, dtype=torch.float64)
    h0 = torch.randn(len(seqlens), heads_v, dim, dim, generator=gen, dtype=torch.float64) if with_initial else None
    cu = [0, *np.cumsum(seqlens).tolist()]
    want_o, want_final = gdn_reference.recurrent(q, k, v, g, beta, initial_state=h0, cu_seqlens=torch.tensor(cu),
                                                 use_qk_l2norm=l2norm, state_layout=layout)
    with mock.patch.object(cp_gdn, "plan_chunk_gated_delta_rule", return_value=object()):  # kernels' plan: unused here
        plans = [cp.plan_chunk_gated_delta_rule_cp(cu, world_size=world_size, rank=r, num_heads_v=heads_v, head_dim=dim)
                 for r in range(world_size)]
    pieces = [[cp.shard_sequences(t, p) for p in plans] for t in (q, k, v, g, beta)]
    results = cp.chunk_gated_delta_rule_cp_simulated(*pieces, plans=plans, initial_state=h0,
                                                     use_qk_l2norm_in_kernel=l2norm, state_layout=layout)
    for plan, (o, final) in zip(plans, results):
        torch.testing.assert_close(o, cp.shard_sequences(want_o, plan), atol=1e-9, rtol=1e-9)
        torch.testing.assert_close(final, want_final, atol=1e-9, rtol=1e-9)
