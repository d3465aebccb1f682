"""merge_attention_states(_n) on the GPU against a float64 reference, on fresh random inputs.

Outputs are preallocated and poisoned with NaN before every run, and every
element is checked, so an unwritten row cannot pass.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from kgen import registry  # noqa: E402
from kgen.ops import merge_attention_states, merge_attention_states_n  # noqa: E402
from kgen.families.merge_states import op as merge_module  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# Inputs are exactly representable; the error is the output rounding plus fp32 arithmetic.
V_TOL = {torch.bfloat16: (1e-2, 1e-2), torch.float16: (2e-3, 2e-3), torch.float32: (2e-5, 2e-5)}


def supported_head_dims() -> list[int]:
    return registry.current().family("merge_attention_states").supported("head_dim")


def reference(v: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 merge of v [S, T, H, D], lse [S, T, H]; empty partials (lse = -inf) ignored."""
    v64, lse64 = v.double(), lse.double()
    if v.shape[0] == 0:
        shape = v.shape[1:]
        return torch.zeros(shape, dtype=torch.float64, device=v.device), torch.full(shape[:2], -math.inf, dtype=torch.float64, device=v.device)
    m = lse64.amax(0)
    m_safe = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp(lse64 - m_safe)  # 0 for empty partials
    has_keys = (w > 0).unsqueeze(-1)
    total = w.sum(0)
    v_sum = (w.unsqueeze(-1) * torch.where(has_keys, v64, torch.zeros_like(v64))).sum(0)
    out = v_sum / torch.where(total > 0, total, torch.ones_like(total)).unsqueeze(-1)
    lse_out = torch.where(total > 0, m_safe + torch.log(total), torch.full_like(total, -math.inf))
    return out, lse_out


def random_partials(partials, tokens, heads, head_dim, dtype, empty_fraction, gen):
    v = torch.randn((partials, tokens, heads, head_dim), generator=gen, device="cuda").to(dtype)
    lse = torch.empty((partials, tokens, heads), device="cuda").uniform_(-8, 8, generator=gen)
    empty = torch.rand((partials, tokens, heads), generator=gen, device="cuda") < empty_fraction
    lse[empty] = -math.inf
    # An empty partial's v may hold anything; NaN must not leak into the result.
    v[empty.unsqueeze(-1).expand_as(v)] = float("nan")
    return v, lse


def poisoned(shape, dtype) -> torch.Tensor:
    return torch.full(shape, float("nan"), dtype=dtype, device="cuda")


def assert_matches(v, lse, v_ref, lse_ref) -> None:
    rtol, atol = V_TOL[v.dtype]
    assert not torch.isnan(v).any(), "NaN in v (unwritten or poisoned by an empty partial)"
    torch.testing.assert_close(v.double(), v_ref, rtol=rtol, atol=atol)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref)), "-inf rows differ"
    finite = torch.isfinite(lse_ref)
    torch.testing.assert_close(lse.double()[finite], lse_ref[finite], rtol=1e-5, atol=1e-5)
    assert not torch.isnan(lse).any()


shapes = st.fixed_dictionaries({
    "tokens": st.integers(0, 700),
    "heads": st.integers(1, 20),
    "dtype": st.sampled_from(list(DTYPES)),
    "empty_fraction": st.sampled_from([0.0, 0.1, 0.5, 1.0]),
    "seed": st.integers(0, 2**31 - 1),
    "full_tiles": st.booleans(),
    "lse_layout": st.sampled_from(["token_major", "head_major"]),
})


def _tokens_for(case, head_dim) -> int:
    """With full_tiles, round tokens up so every tile is full (the has_incomplete_tile=false variant)."""
    tokens = case["tokens"]
    if case["full_tiles"]:
        tile = merge_module._kernels(torch.cuda.current_device(), head_dim, DTYPES[case["dtype"]], "v").tile_rows
        while (tokens * case["heads"]) % tile:
            tokens += 1
    return tokens


def _lse_view(lse: torch.Tensor, layout: str) -> torch.Tensor:
    """[.., T, H] values in memory either as is or head-major ([.., H, T] transposed)."""
    if layout == "token_major":
        return lse
    return lse.transpose(-1, -2).contiguous().transpose(-1, -2)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=shapes, head_dim=st.sampled_from(supported_head_dims()))
def test_merge_two_matches_reference(case, head_dim):
    tokens = _tokens_for(case, head_dim)
    dtype = DTYPES[case["dtype"]]
    gen = torch.Generator(device="cuda").manual_seed(case["seed"])
    v, lse = random_partials(2, tokens, case["heads"], head_dim, dtype, case["empty_fraction"], gen)
    lse_a, lse_b = (_lse_view(x, case["lse_layout"]) for x in lse.unbind(0))
    out, lse_out = poisoned((tokens, case["heads"], head_dim), dtype), poisoned((tokens, case["heads"]), torch.float32)
    result = merge_attention_states(v[0].contiguous(), lse_a, v[1].contiguous(), lse_b, out=out, lse_out=lse_out)
    assert result[0] is out and result[1] is lse_out
    torch.cuda.synchronize()
    assert_matches(out, lse_out, *reference(v, lse))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(case=shapes, head_dim=st.sampled_from([64, 128, 256]), partials=st.integers(0, 9))
def test_merge_n_matches_reference(case, head_dim, partials):
    tokens = _tokens_for(case, head_dim)
    dtype = DTYPES[case["dtype"]]
    gen = torch.Generator(device="cuda").manual_seed(case["seed"])
    v, lse = random_partials(partials, tokens, case["heads"], head_dim, dtype, case["empty_fraction"], gen)
    out, lse_out = poisoned((tokens, case["heads"], head_dim), dtype), poisoned((tokens, case["heads"]), torch.float32)
    merge_attention_states_n(v, _lse_view(lse, case["lse_layout"]), out=out, lse_out=lse_out)
    torch.cuda.synchronize()
    assert_matches(out, lse_out, *reference(v, lse))


def test_all_empty_gives_zero_and_minus_inf():
    v = torch.randn((2, 33, 4, 128), device="cuda").to(torch.bfloat16)
    lse = torch.full((2, 33, 4), -math.inf, device="cuda")
    out, lse_out = merge_attention_states(v[0], lse[0], v[1], lse[1])
    assert torch.equal(out, torch.zeros_like(out))
    assert torch.isneginf(lse_out).all()


def test_one_empty_partial_returns_the_other_exactly():
    v = torch.randn((2, 40, 8, 128), device="cuda").to(torch.float32)
    lse = torch.randn((2, 40, 8), device="cuda")
    lse[1] = -math.inf
    v[1] = float("nan")
    out, lse_out = merge_attention_states(v[0], lse[0], v[1], lse[1])
    torch.testing.assert_close(out, v[0], rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(lse_out, lse[0], rtol=1e-6, atol=1e-6)


def test_empty_batch_launches_nothing():
    v = torch.randn((2, 0, 8, 128), device="cuda").to(torch.bfloat16)
    lse = torch.randn((2, 0, 8), device="cuda")
    out, lse_out = merge_attention_states(v[0], lse[0], v[1], lse[1])
    assert out.shape == (0, 8, 128) and lse_out.shape == (0, 8)


def test_cuda_graph_capture_and_replay():
    tokens, heads, head_dim = 257, 8, 128
    v = torch.randn((3, tokens, heads, head_dim), device="cuda").to(torch.bfloat16)
    lse = torch.randn((3, tokens, heads), device="cuda") * 4
    out, lse_out = poisoned((tokens, heads, head_dim), torch.bfloat16), poisoned((tokens, heads), torch.float32)
    out_n, lse_out_n = poisoned((tokens, heads, head_dim), torch.bfloat16), poisoned((tokens, heads), torch.float32)
    # Warm up (load the modules) outside the capture, on a side stream as torch asks.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        merge_attention_states(v[0], lse[0], v[1], lse[1], out=out, lse_out=lse_out)
        merge_attention_states_n(v, lse, out=out_n, lse_out=lse_out_n)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        merge_attention_states(v[0], lse[0], v[1], lse[1], out=out, lse_out=lse_out)
        merge_attention_states_n(v, lse, out=out_n, lse_out=lse_out_n)
    for _ in range(3):
        # New inputs in place, poisoned outputs: only the replay can produce the right answer.
        v.copy_(torch.randn_like(v, dtype=torch.float32).to(torch.bfloat16))
        lse.copy_(torch.randn_like(lse) * 4)
        for t in (out, lse_out, out_n, lse_out_n):
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        assert_matches(out, lse_out, *reference(v[:2], lse[:2]))
        assert_matches(out_n, lse_out_n, *reference(v, lse))


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs")
def test_runs_on_a_non_current_device():
    v = torch.randn((2, 64, 4, 128), device="cuda:1").to(torch.bfloat16)
    lse = torch.randn((2, 64, 4), device="cuda:1")
    out, lse_out = merge_attention_states(v[0], lse[0], v[1], lse[1])
    torch.cuda.synchronize(1)
    assert_matches(out, lse_out, *reference(v, lse))


def test_bad_inputs_name_the_argument():
    v = torch.randn((2, 16, 4, 128), device="cuda").to(torch.bfloat16)
    lse = torch.randn((2, 16, 4), device="cuda")
    with pytest.raises(TypeError, match="v_b"):
        merge_attention_states(v[0], lse[0], v[1].half(), lse[1])
    with pytest.raises(ValueError, match="v_b: expected shape"):
        merge_attention_states(v[0], lse[0], v[1, :8], lse[1])
    with pytest.raises(TypeError, match="lse_a"):
        merge_attention_states(v[0], lse[0].double(), v[1], lse[1])
    with pytest.raises(ValueError, match="lse_b: expected shape"):
        merge_attention_states(v[0], lse[0], v[1], lse[1, :8])
    with pytest.raises(ValueError, match="v_a: expected a contiguous"):
        merge_attention_states(v[0].transpose(0, 1).contiguous().transpose(0, 1), lse[0], v[1], lse[1])
    with pytest.raises(ValueError, match=r"head_dim=72 is not supported.*supported: \["):
        w = torch.randn((2, 16, 4, 72), device="cuda").to(torch.bfloat16)
        merge_attention_states(w[0], lse[0], w[1], lse[1])
    with pytest.raises(ValueError, match="lse: expected shape"):
        merge_attention_states_n(v, lse[:1])
