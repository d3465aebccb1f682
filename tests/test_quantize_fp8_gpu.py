"""kgen.ops.quantize_fp8_blockwise on the GPU, every element against float64: each scale is max(amax, 1e-4) / 448
of its block, and each code the e4m3 value nearest x / s (ties either way, within fp32's rounding of x * (1 / s));
rows and blocks never mix; NaN and Inf as documented; zero rows; CUDA-graph replay; the torch.compile path."""

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
from kgen.families.quantize_fp8_blockwise import op  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
E4M3_MAX, MIN_AMAX, BLOCK = 448.0, 1e-4, 128
#: e4m3: 3 mantissa bits; normals from 2^-6, subnormals spaced 2^-9.
E4M3_MIN_NORMAL, E4M3_SUBNORMAL_STEP = 2.0 ** -6, 2.0 ** -9


def reference_scales(x: torch.Tensor) -> torch.Tensor:
    """[M, K / 128] float64: max(amax, 1e-4) / 448 per block (NaN where the block holds a NaN)."""
    amax = x.double().abs().view(x.shape[0], -1, BLOCK).amax(-1)
    return torch.where(amax.isnan(), amax, amax.clamp_min(MIN_AMAX) / E4M3_MAX)


def half_step(y: torch.Tensor) -> torch.Tensor:
    """Half the e4m3 spacing at |y| (float64): the most a nearest rounding moves y."""
    magnitude = y.abs().clamp_min(E4M3_MIN_NORMAL)
    return torch.where(y.abs() < E4M3_MIN_NORMAL, torch.full_like(y, E4M3_SUBNORMAL_STEP),
                       2.0 ** (torch.floor(torch.log2(magnitude)) - 3)) / 2


def poisoned_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The op's launch into results filled with NaN first (0xFF bytes: an e4m3 NaN; NaN scales)."""
    codes, scales = op.new_results(x)
    codes.view(torch.uint8).fill_(0xFF)
    scales.fill_(float("nan"))
    op.quantize_into(x, codes, scales)
    return codes, scales


def check_against_float64(x: torch.Tensor, codes: torch.Tensor, scales: torch.Tensor) -> None:
    rows, columns = x.shape
    assert codes.shape == (rows, columns) and codes.dtype == torch.float8_e4m3fn and codes.is_contiguous()
    assert scales.shape == (rows, columns // BLOCK) and scales.dtype == torch.float32
    assert scales.stride() == (1, -(-rows // 4) * 4)
    want_scales = reference_scales(x)
    # The kernel's scale is fp32 arithmetic on an exact amax: within one fp32 rounding of the float64 one.
    finite = want_scales.isfinite()
    assert torch.equal(scales.isnan(), want_scales.isnan()) and torch.equal(scales.isinf(), want_scales.isinf())
    assert ((scales.double() - want_scales).abs() <= 2 ** -23 * want_scales.abs())[finite].all()
    y = x.double() / scales.double().repeat_interleave(BLOCK, dim=1)  # the exact quotient, by the kernel's scale
    got = codes.double()
    ok = (got - y).abs() <= half_step(y) * (1 + 2 ** -20) + y.abs() * 2 ** -22  # fp32's rounding of x * (1 / s)
    ok |= y.isnan() & got.isnan()
    assert ok.all(), f"{(~ok).sum().item()} codes off, first at {(~ok).nonzero()[0].tolist()}"


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(rows=st.one_of(st.integers(1, 70), st.sampled_from([128, 129, 1000, 4099])), blocks=st.integers(1, 9),
       dtype=st.sampled_from(sorted(DTYPES)), magnitude=st.sampled_from([1e-6, 1e-3, 1.0, 1e3]),
       seed=st.integers(0, 2**31 - 1))
def test_every_code_and_scale_against_float64(rows, blocks, dtype, magnitude, seed):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = (torch.randn(rows, blocks * BLOCK, generator=gen, device="cuda") * magnitude).to(DTYPES[dtype])
    x[rows // 2] = 0  # a zero row: its scales are 1e-4 / 448, its codes 0
    codes, scales = poisoned_quantize(x)
    check_against_float64(x, codes, scales)
    assert (codes[rows // 2].float() == 0).all()


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("rows, blocks", [(128, 4), (4, 1), (256, 3)])
def test_rows_and_blocks_that_fill_every_warp_or_not(dtype, rows, blocks):
    # 128 x 4 and 256 x 3 fill every warp's rows and every block's warps (the variant without bounds checks, for
    # each dtype); 4 x 1 fills the rows but not the warps.
    x = torch.randn(rows, blocks * BLOCK, device="cuda").to(DTYPES[dtype])
    check_against_float64(x, *poisoned_quantize(x))


@pytest.mark.parametrize("dtype", sorted(DTYPES))
def test_nan_and_inf_stay_in_their_block(dtype):
    x = torch.randn(9, 4 * BLOCK, device="cuda").to(DTYPES[dtype])
    x[2, 5] = float("nan")          # block (2, 0)
    x[4, BLOCK + 7] = float("inf")  # block (4, 1)
    x[7, 3 * BLOCK] = -float("inf")  # block (7, 3)
    codes, scales = kgen.ops.quantize_fp8_blockwise(x)
    check_against_float64(x, codes, scales)
    assert scales[2, 0].isnan() and codes[2, :BLOCK].float().isnan().all()
    for row, block, column in ((4, 1, BLOCK + 7), (7, 3, 3 * BLOCK)):
        assert scales[row, block].isinf()
        span = codes[row, block * BLOCK:(block + 1) * BLOCK].float()
        assert span[column - block * BLOCK].isnan()  # Inf * 0
        assert (torch.cat([span[:column - block * BLOCK], span[column - block * BLOCK + 1:]]) == 0).all()
    poisoned = {(2, 0), (4, 1), (7, 3)}
    clean_x = x.clone()
    clean_x[2, 5], clean_x[4, BLOCK + 7], clean_x[7, 3 * BLOCK] = 0, 0, 0
    clean_codes, clean_scales = kgen.ops.quantize_fp8_blockwise(clean_x)
    for row in range(9):
        for block in range(4):
            if (row, block) in poisoned:
                continue
            cols = slice(block * BLOCK, (block + 1) * BLOCK)
            assert torch.equal(codes[row, cols].view(torch.uint8), clean_codes[row, cols].view(torch.uint8))
            assert torch.equal(scales[row, block], clean_scales[row, block])


def test_empty_inputs_give_empty_outputs():
    for shape in ((0, 256), (5, 0)):
        codes, scales = kgen.ops.quantize_fp8_blockwise(torch.empty(shape, device="cuda", dtype=torch.bfloat16))
        assert codes.shape == shape and scales.shape == (shape[0], shape[1] // BLOCK)


def test_a_graph_replays_it_and_compile_matches_eager():
    x = torch.randn(300, 5 * BLOCK, device="cuda", dtype=torch.bfloat16)
    eager = kgen.ops.quantize_fp8_blockwise(x)
    kgen.ops.quantize_fp8_blockwise(x)  # warm: the kernel loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        captured = kgen.ops.quantize_fp8_blockwise(x)
    captured[1].fill_(float("nan"))
    captured[0].view(torch.uint8).fill_(0x7F)  # e4m3 NaN
    graph.replay()
    torch.cuda.synchronize()
    assert torch.equal(captured[0].view(torch.uint8), eager[0].view(torch.uint8))
    assert torch.equal(captured[1], eager[1])
    compiled = torch.compile(kgen.ops.quantize_fp8_blockwise, fullgraph=True)(x)
    assert torch.equal(compiled[0].view(torch.uint8), eager[0].view(torch.uint8))
    assert torch.equal(compiled[1], eager[1]) and compiled[1].stride() == eager[1].stride()
