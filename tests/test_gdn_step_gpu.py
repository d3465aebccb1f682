"""kgen.ops.gated_delta_rule_step on the GPU against the float64 recurrence (tests/gdn_reference.py).

Random batches over a state pool larger than the batch, with padded slots (-1) and pool rows
no sequence uses poisoned with NaN (they must stay bitwise as they were), both state layouts,
GVA ratios, both dtypes, beta in fp32 or q's dtype, in-kernel l2norm on and off, and gates from
no decay to a = 16. Outputs are poisoned first; the bar is the issue's relative RMS <= 5e-3.
"""

from __future__ import annotations

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
from kgen.ops import gated_delta_rule_step  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}


def head_dims():
    return registry.current().family("gated_delta_rule_step").supported("head_dim")


def run_step(batch, pool, heads, group, head_dim, dtype, layout, l2norm, beta_fp32, padded, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    heads_v = heads * group
    q = torch.randn(batch, heads, head_dim, generator=gen, device="cuda").to(dtype)
    k = torch.randn(batch, heads, head_dim, generator=gen, device="cuda")
    k = (k if l2norm else ref.l2norm(k)).to(dtype)
    v = torch.randn(batch, heads_v, head_dim, generator=gen, device="cuda").to(dtype)
    decay = torch.rand(heads_v, generator=gen, device="cuda") * 16
    decay[0] = 0.0
    decay[-1] = 16.0 if heads_v > 1 else decay[-1]
    g = -decay * torch.nn.functional.softplus(0.5 * torch.randn(batch, heads_v, generator=gen, device="cuda") + 1)
    beta = torch.rand(batch, heads_v, generator=gen, device="cuda").to(torch.float32 if beta_fp32 else dtype)
    states = torch.randn(pool, heads_v, head_dim, head_dim, generator=gen, device="cuda")
    slots = torch.randperm(pool, generator=gen, device="cuda")[:batch].to(torch.int32)
    slots[padded] = -1
    unused = torch.ones(pool, dtype=torch.bool, device="cuda")
    unused[slots[slots >= 0].long()] = False
    states[unused] = float("nan")
    before = states.clone()
    out = torch.full((batch, heads_v, head_dim), float("nan"), dtype=dtype, device="cuda")
    gated_delta_rule_step(q, k, v, g, beta, states, state_indices=slots, state_layout=layout,
                          use_qk_l2norm_in_kernel=l2norm, out=out)
    torch.cuda.synchronize()
    used = slots >= 0
    # The reference: one-token sequences from the pool rows they name, in the same layout.
    o_ref, s_ref = ref.recurrent(q[used].unsqueeze(1), k[used].unsqueeze(1), v[used].unsqueeze(1),
                                 g[used].unsqueeze(1), beta[used].unsqueeze(1), initial_state=before[slots[used].long()],
                                 use_qk_l2norm=l2norm, state_layout=layout)
    assert not out.isnan().any(), "o left unwritten"
    if used.any():
        assert ref.rel_rms(out[used], o_ref[:, 0]) <= ref.RMS_BAR
        assert ref.rel_rms(states[slots[used].long()], s_ref) <= ref.RMS_BAR
    assert (out[~used] == 0).all(), "a padded slot's o must be 0"
    # Pool rows no sequence names (NaN-poisoned, padded slots name none) are never touched.
    assert torch.equal(states[unused].isnan(), before[unused].isnan())
    return q, k, v, g, beta, before, slots, states, out


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batch=st.integers(1, 9), extra=st.integers(0, 5), heads=st.sampled_from([1, 2]), group=st.sampled_from([1, 2, 4]),
       head_dim=st.sampled_from(head_dims()), dtype=st.sampled_from(sorted(DTYPES)), layout=st.sampled_from(["kv", "vk"]),
       l2norm=st.booleans(), beta_fp32=st.booleans(), data=st.data(), seed=st.integers(0, 2**31 - 1))
def test_step_matches_the_recurrence(batch, extra, heads, group, head_dim, dtype, layout, l2norm, beta_fp32, data, seed):
    padded = data.draw(st.lists(st.integers(0, batch - 1), max_size=batch, unique=True), label="padded")
    run_step(batch, batch + extra, heads, group, head_dim, DTYPES[dtype], layout, l2norm, beta_fp32, padded, seed)


@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_two_runs_are_bitwise_equal(layout):
    q, k, v, g, beta, before, slots, states, out = run_step(6, 9, 2, 2, 128, torch.bfloat16, layout, False, True,
                                                            [2], seed=11)
    again = before.clone()
    out2 = gated_delta_rule_step(q, k, v, g, beta, again, state_indices=slots, state_layout=layout)
    assert torch.equal(out2, out) and torch.equal(again.nan_to_num(), states.nan_to_num())


def test_layouts_are_not_interchangeable():
    # K = V: one pool, read as kv and as vk, gives different results (the layout is honoured).
    q, k, v, g, beta, before, slots, states, out = run_step(4, 4, 1, 2, 64, torch.float16, "kv", False, True, [], seed=5)
    other = before.clone()
    out_vk = gated_delta_rule_step(q, k, v, g, beta, other, state_indices=slots, state_layout="vk")
    assert not torch.allclose(out_vk.float(), out.float(), atol=1e-2)


def test_bad_input_is_refused_with_the_argument_named():
    q = torch.randn(2, 2, 128, device="cuda", dtype=torch.bfloat16)
    v = torch.randn(2, 4, 128, device="cuda", dtype=torch.bfloat16)
    g, beta = torch.zeros(2, 4, device="cuda"), torch.ones(2, 4, device="cuda")
    state = torch.zeros(2, 4, 128, 128, device="cuda")
    with pytest.raises(ValueError, match="state_layout"):
        gated_delta_rule_step(q, q, v, g, beta, state, state_layout="kvv")
    with pytest.raises(TypeError, match="g: expected dtype"):
        gated_delta_rule_step(q, q, v, g.half(), beta, state)
    with pytest.raises(ValueError, match="v: HV=3"):
        gated_delta_rule_step(q, q, v[:, :3], g[:, :3], beta[:, :3], state[:, :3])
    with pytest.raises(ValueError, match="state: 1 pool rows for 2 sequences"):
        gated_delta_rule_step(q, q, v, g, beta, state[:1])
    with pytest.raises(ValueError, match="state_indices"):
        gated_delta_rule_step(q, q, v, g, beta, state, state_indices=torch.zeros(3, dtype=torch.int32, device="cuda"))
    with pytest.raises(RuntimeError, match="no backward"):
        gated_delta_rule_step(q.requires_grad_(), q, v, g, beta, state)


@pytest.mark.parametrize("bad", [8, 1000, -2, -(2**31)])
@pytest.mark.parametrize("layout", ["kv", "vk"])
def test_a_state_index_outside_the_pool_gives_nan_to_its_sequence_alone(bad, layout):
    # Once an illegal memory access (or a write into another tensor): now that sequence's o is NaN, the pool is
    # untouched, and every other sequence's o and state are bitwise those of a batch without it.
    gen = torch.Generator(device="cuda").manual_seed(bad & 0xFFFF)
    batch, pool, heads, heads_v, head_dim = 4, 8, 2, 4, head_dims()[0]
    q, k = (torch.randn(batch, heads, head_dim, generator=gen, device="cuda").bfloat16() for _ in range(2))
    v = torch.randn(batch, heads_v, head_dim, generator=gen, device="cuda").bfloat16()
    g = -torch.rand(batch, heads_v, generator=gen, device="cuda")
    beta = torch.rand(batch, heads_v, generator=gen, device="cuda")
    states = torch.randn(pool, heads_v, head_dim, head_dim, generator=gen, device="cuda")
    guard = torch.randn(pool, heads_v, head_dim, head_dim, generator=gen, device="cuda")  # the next allocation
    guard_before = guard.clone()
    slots = torch.tensor([3, bad, 5, -1], dtype=torch.int32, device="cuda")
    good = torch.tensor([3, 7, 5, -1], dtype=torch.int32, device="cuda")  # row 7 stands in for the bad one
    expected_states = states.clone()
    expected = gated_delta_rule_step(q, k, v, g, beta, expected_states, state_indices=good, state_layout=layout)
    expected_states[7] = states[7]  # the bad sequence's row is not written in the run under test
    out = torch.full((batch, heads_v, head_dim), float("nan"), dtype=torch.bfloat16, device="cuda")
    gated_delta_rule_step(q, k, v, g, beta, states, state_indices=slots, state_layout=layout, out=out)
    torch.cuda.synchronize()
    assert out[1].isnan().all(), "the sequence with a row outside the pool must get NaN"
    for b in (0, 2, 3):
        assert torch.equal(out[b], expected[b]), b
    assert torch.equal(states, expected_states) and torch.equal(guard, guard_before)
