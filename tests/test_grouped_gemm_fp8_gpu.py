"""kgen.ops.grouped_gemm with FP8 inputs on the GPU: e4m3 a and b with DeepGEMM's block scales (a's 1 x 128 per row,
b's 128 x 128), every element against the float64 product of the dequantized inputs. Random group sizes (0 and 1
rows, sizes no multiple of the tile), out poisoned with NaN first and its rows of no group left so, the masked
layout replayed in a CUDA graph with new masked_m, torch.compile, and the error beside the bf16 kernel's on the
same (dequantized) values."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
    pytest.mark.skipif(torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0),
                       reason="FP8 grouped GEMM runs on sm_90a's wgmma alone"),
]

import kgen.ops  # noqa: E402
from grouped_gemm_kernels import fp8_spec_path  # noqa: E402,F401  (each test runs on every FP8 tile form)
from kgen.families.grouped_gemm import op as grouped_gemm_op  # noqa: E402
from fp8_blocks import BLOCK, dequantized, quantize_rows, quantize_weights  # noqa: E402
from test_grouped_gemm_gpu import groups_of  # noqa: E402

#: The bound's shares: the bf16 result's rounding of |want|, and of sum_k |a b| the FP8 tensor core's narrower
#: accumulation inside a 128-wide K block (the blocks' sums are added in fp32).
RESULT_ROUNDING, BLOCK_ACCUMULATION = 2.0 ** -8, 2.0 ** -11


def check(a_values, b_values, offs, out, poison_rows) -> float:
    """Every element of every group's rows within the bound of float64; the rows of no group still NaN. Returns
    the rel RMS over the groups' rows."""
    rows = a_values.shape[0]
    covered = torch.zeros(rows, dtype=torch.bool)
    squared_error = squared_want = 0.0
    for e, (start, end) in enumerate(groups_of(offs, rows)):
        if end == start:
            continue
        covered[start:end] = True
        x, w = a_values[start:end], b_values[e]
        want = x @ w.T
        bound = RESULT_ROUNDING * want.abs() + BLOCK_ACCUMULATION * (x.abs() @ w.abs().T) + 1e-30
        got = out[start:end].double()
        assert torch.isfinite(got).all(), f"expert {e}: non-finite output"
        err = (got - want).abs()
        assert (err <= bound).all(), f"expert {e}: worst error {(err / bound).max().item():.2f}x the bound"
        squared_error += err.pow(2).sum().item()
        squared_want += want.pow(2).sum().item()
    for r in poison_rows:
        assert not covered[r]
        assert out[r].isnan().all(), f"row {r} belongs to no group: it must not be written"
    return (squared_error / max(squared_want, 1e-300)) ** 0.5


def make_case(sizes, spare, n, k, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    grouped = sum(sizes)
    rows = grouped + spare
    a, a_scale = quantize_rows(torch.randn(rows, k, generator=gen, device="cuda"))
    b, b_scale = quantize_weights(torch.randn(len(sizes), n, k, generator=gen, device="cuda"))
    offs_host = torch.tensor(sizes).cumsum(0).tolist()
    return a, a_scale, b, b_scale, offs_host


def test_the_op_launches_the_tile_under_test(fp8_spec_path):
    # The forms come from test spec folders and a patched cluster choice: one that silently ran the built-in kernel
    # would test nothing.
    for rows in (1, 1 << 20):
        _, sizes, launchers = grouped_gemm_op.launchers(torch.cuda.current_device(), "e4m3", "none", 256, rows, 8, False)
        assert sizes["tile_n"] == (128 if fp8_spec_path == "fp8_narrow" else 256)
        assert [launcher.cluster for launcher in launchers] == [2 if fp8_spec_path == "fp8_cluster" else 1] * 2


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.sampled_from([0, 1, 7, 64, 127, 128, 129, 300]), min_size=1, max_size=6),
       spare=st.integers(0, 40), n=st.sampled_from([128, 256, 384]), k=st.sampled_from([128, 256, 384, 512, 640]),
       mn_major=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_every_group_against_float64_of_the_dequantized_inputs(sizes, spare, n, k, mn_major, seed):
    a, a_scale, b, b_scale, offs_host = make_case(sizes, spare, n, k, seed)
    if mn_major:  # a's scales as kgen.ops.quantize_fp8_blockwise lays them out: column blocks apart
        a_scale = a_scale.t().contiguous().t()
    offs = torch.tensor(offs_host, dtype=torch.int32, device="cuda")
    out = torch.full((a.shape[0], n), float("nan"), device="cuda", dtype=torch.bfloat16)
    assert kgen.ops.grouped_gemm(a, b, offs, a_scale=a_scale, b_scale=b_scale, out=out) is out
    check(dequantized(a, a_scale, 1), dequantized(b, b_scale, BLOCK), offs_host, out, range(sum(sizes), a.shape[0]))


def test_the_error_beside_the_bf16_kernels_on_the_same_values():
    # Issue 26: the FP8 kernel's error against float64 of the dequantized inputs, next to the bf16 kernel's on the
    # same values rounded to bf16. Both are bounded by the bf16 result's rounding; the FP8 one's tensor-core
    # accumulation is narrower but promoted to fp32 every 128 of K.
    sizes, n, k = [300, 0, 129, 1, 640], 256, 2048
    a, a_scale, b, b_scale, offs_host = make_case(sizes, 0, n, k, 5)
    offs = torch.tensor(offs_host, dtype=torch.int32, device="cuda")
    a_values, b_values = dequantized(a, a_scale, 1), dequantized(b, b_scale, BLOCK)
    fp8 = kgen.ops.grouped_gemm(a, b, offs, a_scale=a_scale, b_scale=b_scale)
    bf16 = kgen.ops.grouped_gemm(a_values.bfloat16(), b_values.bfloat16(), offs)
    fp8_error = check(a_values, b_values, offs_host, fp8, [])
    bf16_error = check(a_values.bfloat16().double(), b_values.bfloat16().double(), offs_host, bf16, [])
    assert fp8_error <= 4e-3, (fp8_error, bf16_error)
    assert fp8_error <= 2 * bf16_error + 1e-3, (fp8_error, bf16_error)


@pytest.mark.parametrize("k", [256, 640])
def test_a_block_takes_many_tiles(k):
    # More tiles than SMs: each persistent block runs several, so the stages, the step count and the result's
    # reset at each tile's first K block carry over from tile to tile; with K of fewer steps than the stages and
    # of more (640: five), where anything that paces the warpgroups by K step crosses from tile to tile.
    sizes, n = [2000, 1, 0, 2100], 768
    a, a_scale, b, b_scale, offs_host = make_case(sizes, 5, n, k, 13)
    assert (sum(-(-size // 128) for size in sizes) * n // 128) > torch.cuda.get_device_properties(0).multi_processor_count
    offs = torch.tensor(offs_host, dtype=torch.int32, device="cuda")
    out = torch.full((a.shape[0], n), float("nan"), device="cuda", dtype=torch.bfloat16)
    kgen.ops.grouped_gemm(a, b, offs, a_scale=a_scale, b_scale=b_scale, out=out)
    check(dequantized(a, a_scale, 1), dequantized(b, b_scale, BLOCK), offs_host, out, range(sum(sizes), a.shape[0]))


def test_masked_layout_replayed_in_a_cuda_graph_with_new_masked_m():
    experts, m_max, n, k = 4, 96, 256, 384
    gen = torch.Generator(device="cuda").manual_seed(3)
    a, a_scale = quantize_rows(torch.randn(experts * m_max, k, generator=gen, device="cuda"))
    # MN-major scales, as kgen.ops.quantize_fp8_blockwise makes them, the experts' rows running on.
    a, a_scale = a.view(experts, m_max, k), a_scale.t().contiguous().t().view(experts, m_max, k // BLOCK)
    b, b_scale = quantize_weights(torch.randn(experts, n, k, generator=gen, device="cuda"))
    masked_m = torch.tensor([96, 0, 1, 50], dtype=torch.int32, device="cuda")
    out = torch.full((experts, m_max, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    kgen.ops.grouped_gemm(a, b, masked_m=masked_m, a_scale=a_scale, b_scale=b_scale, out=out)  # compiled, loaded
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kgen.ops.grouped_gemm(a, b, masked_m=masked_m, a_scale=a_scale, b_scale=b_scale, out=out)
    b_values = dequantized(b, b_scale, BLOCK)
    for given in ([5, 96, 0, 17], [96, 0, 1, 50], [-1, 200, 95, 3]):  # clamped into [0, M_max]
        masked_m.copy_(torch.tensor(given, dtype=torch.int32))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        for e, count in enumerate(min(max(c, 0), m_max) for c in given):
            rows = dequantized(a[e], a_scale[e], 1)
            check(rows, b_values[e:e + 1], [count], out[e], range(count, m_max))


def test_the_quantizers_own_scales_go_in_as_they_are():
    # kgen.ops.quantize_fp8_blockwise's codes and MN-major scales straight into the grouped GEMM.
    gen = torch.Generator(device="cuda").manual_seed(7)
    x = torch.randn(200, 256, generator=gen, device="cuda", dtype=torch.bfloat16)
    codes, scales = kgen.ops.quantize_fp8_blockwise(x)
    b, b_scale = quantize_weights(torch.randn(2, 128, 256, generator=gen, device="cuda"))
    offs_host = [150, 200]
    out = kgen.ops.grouped_gemm(codes, b, torch.tensor(offs_host, dtype=torch.int32, device="cuda"), a_scale=scales,
                                b_scale=b_scale)
    check(dequantized(codes, scales, 1), dequantized(b, b_scale, BLOCK), offs_host, out, [])


def test_torch_compile_fullgraph_matches_eager():
    a, a_scale, b, b_scale, offs_host = make_case([130, 7, 0, 64], 3, 256, 256, 11)
    offs = torch.tensor(offs_host, dtype=torch.int32, device="cuda")

    def step(a, b, offs, a_scale, b_scale):
        return kgen.ops.grouped_gemm(a, b, offs, a_scale=a_scale, b_scale=b_scale)

    eager = step(a, b, offs, a_scale, b_scale)
    compiled = torch.compile(step, fullgraph=True)(a, b, offs, a_scale, b_scale)
    grouped = offs_host[-1]
    torch.testing.assert_close(compiled[:grouped], eager[:grouped], rtol=0, atol=0)
