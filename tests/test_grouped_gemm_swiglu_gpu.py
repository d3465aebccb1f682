"""kgen.ops.grouped_gemm_swiglu on the GPU, every element against float64: silu(g) * u from the fp32 gate and up
accumulators, rounded once, within the rounding of out plus g's and u's accumulation error carried through
silu(g) * u; random group sizes (0 and 1 rows, sizes that are no multiple of the tile), out poisoned with NaN
first and its rows of no group left so, clamped offs; quantize_out's codes and scales bitwise those of
quantize_fp8_blockwise(out) on the group rows; NaN and Inf kept to their row or expert column; a CUDA graph
replayed with new group sizes; torch.compile."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

import kgen.ops  # noqa: E402
from test_grouped_gemm_gpu import groups_of  # noqa: E402
from grouped_gemm_kernels import kernel  # noqa: E402,F401  (each test runs on both kernels)

#: Each dtype, its unit roundoff, and half its smallest subnormal (the absolute rounding error of a result that
#: underflows: silu(g) is about g * exp(g) for negative g, so fp16 outputs reach its subnormals at g near -20).
DTYPES = {"bf16": (torch.bfloat16, 2.0 ** -8, 2.0 ** -134), "fp16": (torch.float16, 2.0 ** -11, 2.0 ** -25)}
#: fp32 accumulation over K: a bound's share of sum_k |a b| (K at most a few hundred here).
ACCUMULATION = 2.0 ** -14
#: fp32 silu may come out 0 where its sigmoid underflows: where exp(-g) overflows (g < -88.7, an IEEE division
#: then gives 0), or where 1 + exp(-g) passes 2^126 (g < -87.3, where a fast division, __fdividef, gives 0).
#: |silu(g)| there is below 87.4 * 2^-126 < 2^-119.
FP32_UNDERFLOW = 2.0 ** -119
#: The largest |silu''| (at g = 0): how much silu's slope can change across g's accumulation error.
SILU_CURVATURE = 0.5
SIZES = [0, 1, 7, 64, 127, 128, 129, 300]


def bits(t: torch.Tensor) -> torch.Tensor:
    """t's bits as integers of its width (strides kept): bitwise comparison that NaN does not defeat."""
    return t.view({1: torch.int8, 2: torch.int16, 4: torch.int32}[t.element_size()])


def random_case(sizes, spare, inter, depth, dtype, seed):
    """a with NaN in its rows of no group (they must not reach any output), b_gate_up, offs on the host and device."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    grouped = sum(sizes)
    a = torch.randn(grouped + spare, depth, generator=gen, device="cuda").to(dtype)
    a[grouped:] = float("nan")
    b_gate_up = torch.randn(len(sizes), 2 * inter, depth, generator=gen, device="cuda").to(dtype)
    offs_host = torch.tensor(sizes).cumsum(0).tolist()
    return a, b_gate_up, offs_host, torch.tensor(offs_host, dtype=torch.int32, device="cuda")


def poisoned_out(a: torch.Tensor, inter: int) -> torch.Tensor:
    return torch.full((a.shape[0], inter), float("nan"), device="cuda", dtype=a.dtype)


def check(a, b_gate_up, offs_host, out) -> int:
    """Every element of every group's rows within rounding of float64; the rows of no group still NaN. Returns the
    number of group rows (groups follow one another from row 0, so they are out[:that])."""
    rows, inter = out.shape
    _, unit, half_subnormal = next(v for v in DTYPES.values() if v[0] == a.dtype)
    groups = groups_of(offs_host, rows)
    for e, (start, end) in enumerate(groups):
        if end == start:
            continue
        x, w = a[start:end].double(), b_gate_up[e].double()
        gate_up, magnitudes = x @ w.T, x.abs() @ w.abs().T
        g, u = gate_up[:, :inter], gate_up[:, inter:]
        err_g, err_u = ACCUMULATION * magnitudes[:, :inter], ACCUMULATION * magnitudes[:, inter:]
        sigmoid = torch.sigmoid(g)
        silu = g * sigmoid
        slope = silu + sigmoid * (1 - silu)  # silu'(g)
        want = silu * u
        # silu(g) * u with g and u each off by up to err: first order, the steepest slope within err_g of g and
        # u's own slack, doubled (for out's rounding of that error and fp32's evaluation of silu); then underflow.
        carried = (slope.abs() + SILU_CURVATURE * err_g) * err_g * (u.abs() + err_u) + silu.abs() * err_u
        bound = unit * want.abs() + 2 * carried + half_subnormal + FP32_UNDERFLOW * (1 + u.abs())
        got = out[start:end].double()
        assert torch.isfinite(got).all(), f"expert {e}: non-finite output"
        err = (got - want).abs()
        assert (err <= bound).all(), f"expert {e}: worst error {(err / bound).max().item():.2f}x the bound"
    grouped = groups[-1][1] if groups else 0
    assert out[grouped:].isnan().all(), "rows of no group must not be written"
    return grouped


def check_quantized(out, x_fp8, scales, grouped: int) -> None:
    """Codes and scales bitwise quantize_fp8_blockwise(out)'s on the group rows (rows never mix, so out's NaN rows of
    no group do not matter); the layout as the quantizer's."""
    rows, inter = out.shape
    assert x_fp8.shape == (rows, inter) and x_fp8.dtype == torch.float8_e4m3fn and x_fp8.is_contiguous()
    assert scales.shape == (rows, inter // 128) and scales.dtype == torch.float32
    if rows:
        assert scales.stride() == (1, -(-rows // 4) * 4)
    want_codes, want_scales = kgen.ops.quantize_fp8_blockwise(out)
    assert torch.equal(bits(x_fp8[:grouped]), bits(want_codes[:grouped])), "codes differ from the quantizer's"
    assert torch.equal(bits(scales[:grouped]), bits(want_scales[:grouped])), "scales differ from the quantizer's"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.sampled_from(SIZES), min_size=1, max_size=6), spare=st.integers(0, 40),
       inter=st.sampled_from([8, 64, 128, 200]), depth=st.sampled_from([8, 40, 128, 192, 200, 320]),
       dtype=st.sampled_from(sorted(DTYPES)), seed=st.integers(0, 2**31 - 1))
def test_every_group_against_float64(sizes, spare, inter, depth, dtype, seed):
    a, b_gate_up, offs_host, offs = random_case(sizes, spare, inter, depth, DTYPES[dtype][0], seed)
    out = poisoned_out(a, inter)
    assert kgen.ops.grouped_gemm_swiglu(a, b_gate_up, offs, out=out) is out
    check(a, b_gate_up, offs_host, out)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.sampled_from(SIZES), min_size=1, max_size=6), spare=st.integers(0, 40),
       inter=st.sampled_from([128, 256, 384]), depth=st.sampled_from([8, 40, 128, 192, 200, 320]),
       dtype=st.sampled_from(sorted(DTYPES)), seed=st.integers(0, 2**31 - 1))
def test_quantize_out_is_the_quantizer_of_out(sizes, spare, inter, depth, dtype, seed):
    a, b_gate_up, offs_host, offs = random_case(sizes, spare, inter, depth, DTYPES[dtype][0], seed)
    out = poisoned_out(a, inter)
    result, x_fp8, scales = kgen.ops.grouped_gemm_swiglu(a, b_gate_up, offs, out=out, quantize_out=True)
    assert result is out
    check_quantized(out, x_fp8, scales, check(a, b_gate_up, offs_host, out))


def test_blocks_that_take_many_tiles_with_a_long_k():
    # More tiles than the H200's 132 SMs (272), so each persistent block takes several in turn, and K of nine steps
    # with a tail, quantized output: what the consumer warpgroups meet from one tile to the next.
    a, b_gate_up, offs_host, offs = random_case([513, 0, 700, 129, 400], 9, 2048, 520, torch.bfloat16, 5)
    out = poisoned_out(a, 2048)
    result, x_fp8, scales = kgen.ops.grouped_gemm_swiglu(a, b_gate_up, offs, out=out, quantize_out=True)
    assert result is out
    check_quantized(out, x_fp8, scales, check(a, b_gate_up, offs_host, out))


@pytest.mark.parametrize("offs_host", [[300, 100, 450], [100, 900, 950], [-5, 200, 200]],
                         ids=["decreasing", "past-the-end", "negative"])
def test_hostile_offs_are_clamped(offs_host):
    rows, inter, depth = 400, 128, 64
    a = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
    b_gate_up = torch.randn(3, 2 * inter, depth, device="cuda", dtype=torch.bfloat16)
    out = poisoned_out(a, inter)
    offs = torch.tensor(offs_host, dtype=torch.int32, device="cuda")
    _, x_fp8, scales = kgen.ops.grouped_gemm_swiglu(a, b_gate_up, offs, out=out, quantize_out=True)
    check_quantized(out, x_fp8, scales, check(a, b_gate_up, offs_host, out))


def test_nan_stays_in_its_row_and_inf_in_its_experts_column():
    rows, inter, depth = 500, 128, 64
    a = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
    b_gate_up = torch.randn(3, 2 * inter, depth, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([130, 260, 500], dtype=torch.int32, device="cuda")
    clean = kgen.ops.grouped_gemm_swiglu(a, b_gate_up, offs)
    poisoned_a, poisoned_b = a.clone(), b_gate_up.clone()
    poisoned_a[5, 3] = float("nan")  # expert 0's row 5: its g and u both NaN
    poisoned_b[2, inter + 7, 1] = float("inf")  # expert 2's up row 7: u = +-Inf in column 7 of its rows
    got = kgen.ops.grouped_gemm_swiglu(poisoned_a, poisoned_b, offs)
    assert got[5].isnan().all()
    others = torch.cat([torch.arange(5), torch.arange(6, 260)]).cuda()
    assert torch.equal(bits(got[others]), bits(clean[others]))
    assert not torch.isfinite(got[260:, 7]).any()  # silu(g) * Inf: Inf, or NaN where silu(g) is 0
    keep = torch.ones(inter, dtype=torch.bool, device="cuda")
    keep[7] = False
    assert torch.equal(bits(got[260:][:, keep]), bits(clean[260:][:, keep]))


def test_a_nan_in_one_gate_column_reaches_its_rows_fp8_blocks_alone():
    # A NaN weight in gate column 40 (the second column warp's) makes that column NaN in expert 1's rows: each such
    # row's 128-column scale and codes must be NaN through the column warps' amax (a NaN-dropping max would not),
    # and every other row equal to the clean run.
    rows, inter, depth = 300, 128, 64
    a = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
    b_gate_up = torch.randn(3, 2 * inter, depth, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([100, 200, 300], dtype=torch.int32, device="cuda")
    clean = kgen.ops.grouped_gemm_swiglu(a, b_gate_up, offs, quantize_out=True)
    b_gate_up[1, 40, 1] = float("nan")
    out, x_fp8, scales = kgen.ops.grouped_gemm_swiglu(a, b_gate_up, offs, quantize_out=True)
    check_quantized(out, x_fp8, scales, rows)
    assert scales[100:200].isnan().all() and x_fp8[100:200].float().isnan().all()
    others = torch.cat([torch.arange(100), torch.arange(200, 300)]).cuda()
    for got, want in zip((out, x_fp8, scales), clean):
        assert torch.equal(bits(got[others]), bits(want[others]))


@pytest.mark.parametrize("inter, depth", [(128, 40), (256, 128)], ids=["k-tail", "whole-tiles"])
def test_the_masked_layout_with_fp8_output(inter, depth):
    # quantize_out in the masked layout: out [E, M_max, I]; the codes shaped like it, the scales [E M_max, I / 128]
    # over out's rows; on each expert's first masked_m rows they are the quantizer's of out. (quantize_out needs
    # whole 128-column blocks, so the variant with bounds checks is reached through K's tail.)
    experts, m_max = 4, 150
    a = torch.randn(experts, m_max, depth, device="cuda", dtype=torch.bfloat16)
    b_gate_up = torch.randn(experts, 2 * inter, depth, device="cuda", dtype=torch.bfloat16)
    masked_m = torch.tensor([3, 0, 150, 129], dtype=torch.int32, device="cuda")
    out, x_fp8, scales = kgen.ops.grouped_gemm_swiglu(a, b_gate_up, masked_m=masked_m, quantize_out=True)
    assert out.shape == x_fp8.shape == (experts, m_max, inter) and scales.shape == (experts * m_max, inter // 128)
    want_codes, want_scales = kgen.ops.quantize_fp8_blockwise(out.view(-1, inter))
    rows = (torch.arange(m_max, device="cuda")[None, :] < masked_m[:, None]).flatten()
    assert torch.equal(bits(x_fp8.view(-1, inter)[rows]), bits(want_codes[rows]))
    assert torch.equal(bits(scales[rows]), bits(want_scales[rows]))


@pytest.mark.parametrize("quantize_out", [False, True], ids=["out", "out-and-fp8"])
def test_a_graph_replays_with_new_group_sizes_and_compile_matches_eager(quantize_out):
    rows, inter, depth = 700, 256, 128
    a = torch.randn(rows, depth, device="cuda", dtype=torch.bfloat16)
    b_gate_up = torch.randn(4, 2 * inter, depth, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([100, 100, 350, 700], dtype=torch.int32, device="cuda")
    out = torch.empty(rows, inter, device="cuda", dtype=torch.bfloat16)

    def call(fn, **out_arg):
        result = fn(a, b_gate_up, offs, quantize_out=quantize_out, **out_arg)
        return result if quantize_out else (result,)

    call(kgen.ops.grouped_gemm_swiglu, out=out)  # warm: the kernel loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = call(kgen.ops.grouped_gemm_swiglu, out=out)
    # Both offs cover every row, so every element of every result is written and compared.
    offs.copy_(torch.tensor([0, 513, 1, 186], device="cuda").cumsum(0).to(torch.int32))
    for t in captured:  # all ones bits: NaN in bf16, fp32 and e4m3
        bits(t).fill_(-1)
    graph.replay()
    torch.cuda.synchronize()
    eager = call(kgen.ops.grouped_gemm_swiglu)
    check(a, b_gate_up, offs.tolist(), captured[0])
    compiled = call(torch.compile(kgen.ops.grouped_gemm_swiglu, fullgraph=True))
    for got_graph, got_compiled, want in zip(captured, compiled, eager, strict=True):
        assert torch.equal(bits(got_graph), bits(want))
        assert torch.equal(bits(got_compiled), bits(want)) and got_compiled.stride() == want.stride()


def test_quantize_out_refuses_an_intermediate_size_not_a_multiple_of_128():
    a = torch.randn(16, 64, device="cuda", dtype=torch.bfloat16)
    b_gate_up = torch.randn(1, 2 * 64, 64, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([16], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="^b_gate_up: "):
        kgen.ops.grouped_gemm_swiglu(a, b_gate_up, offs, quantize_out=True)
