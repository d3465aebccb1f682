"""kgen.ops.grouped_gemm's argument checks, on the host: every refusal names its argument."""

from __future__ import annotations

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kgen.ops
from kgen.families.grouped_gemm import op
from kgen.registry import UnsupportedVariantError
from kgen.runtime.dispatch import first_runnable


@pytest.fixture
def fake():
    """CUDA tensors' metadata without a GPU."""
    with FakeTensorMode() as mode:
        yield lambda *shape, dtype=torch.bfloat16: torch.empty(shape, dtype=dtype, device="cuda")
    del mode


def test_non_cuda_and_non_tensor_inputs_are_refused_by_name():
    x = torch.zeros(4, 8, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^a: expected a CUDA tensor"):
        kgen.ops.grouped_gemm(x, x[None], torch.zeros(1, dtype=torch.int32))
    with pytest.raises(TypeError, match="^a: expected a torch.Tensor"):
        kgen.ops.grouped_gemm("a", x[None], torch.zeros(1, dtype=torch.int32))


FP8 = torch.float8_e4m3fn


def test_scales_go_with_fp8_inputs_only(fake):
    a, b, offs = fake(10, 16), fake(3, 24, 16), fake(3, dtype=torch.int32)
    for name in ("a_scale", "b_scale"):
        with pytest.raises(ValueError, match=f"^{name}: block scales go with FP8"):
            op.grouped_gemm(a, b, offs, **{name: fake(10, 1, dtype=torch.float32)})


@pytest.mark.parametrize("case, message", [
    ("no a_scale", r"^a_scale: FP8 a and b need both block scales"),
    ("no b_scale", r"^b_scale: FP8 a and b need both block scales"),
    ("K", "^a: with FP8 inputs K = 192 must be a positive multiple of 128"),
    ("N", "^b: with FP8 inputs N = 136 must be a multiple of 128"),
    ("a_scale shape", r"^a_scale: expected shape \(10, 2\) \(a's rows by its K / 128 blocks\)"),
    ("a_scale dtype", "^a_scale: expected dtype in"),
    ("b_scale shape", r"^b_scale: expected shape \(3, 1, 2\) \(\[E, N / 128, K / 128\] of b\)"),
    ("b_scale strided", "^b_scale: expected a contiguous tensor"),
    ("masked a_scale experts apart", r"^a_scale: the experts' rows must follow each other"),
    ("out dtype", "^out: expected dtype in"),
    ("swiglu", "^a: grouped_gemm_swiglu takes 16-bit a and b_gate_up"),
])
def test_fp8_arguments_are_refused_by_name(fake, case, message):
    a, b, offs = fake(10, 256, dtype=FP8), fake(3, 128, 256, dtype=FP8), fake(3, dtype=torch.int32)
    kwargs = {"a_scale": fake(10, 2, dtype=torch.float32), "b_scale": fake(3, 1, 2, dtype=torch.float32)}
    if case == "swiglu":
        with pytest.raises(ValueError, match=message):
            op.grouped_gemm_swiglu(a, fake(3, 256, 256, dtype=FP8), offs)
        return
    if case == "no a_scale":
        del kwargs["a_scale"]
    elif case == "no b_scale":
        del kwargs["b_scale"]
    elif case == "K":
        a, b = fake(10, 192, dtype=FP8), fake(3, 128, 192, dtype=FP8)
    elif case == "N":
        b = fake(3, 136, 256, dtype=FP8)
    elif case == "a_scale shape":
        kwargs["a_scale"] = fake(10, 1, dtype=torch.float32)
    elif case == "a_scale dtype":
        kwargs["a_scale"] = fake(10, 2)
    elif case == "b_scale shape":
        kwargs["b_scale"] = fake(3, 2, 1, dtype=torch.float32)
    elif case == "b_scale strided":
        kwargs["b_scale"] = fake(3, 1, 4, dtype=torch.float32).as_strided((3, 1, 2), (4, 4, 2))
    elif case == "masked a_scale experts apart":  # a [E, M_max, K]: its scales' rows must run on across experts
        a, offs = fake(3, 5, 256, dtype=FP8), None
        kwargs["masked_m"] = fake(3, dtype=torch.int32)
        kwargs["a_scale"] = fake(3, 6, 2, dtype=torch.float32).as_strided((3, 5, 2), (12, 2, 1))
    elif case == "out dtype":  # FP8 inputs give bf16
        kwargs["out"] = fake(10, 128, dtype=FP8)
    with pytest.raises((TypeError, ValueError), match=message):
        op.grouped_gemm(a, b, offs, **kwargs)


def test_fp8_inputs_give_bf16(fake):
    assert op.result_dtype_of(fake(4, 128, dtype=FP8)) is torch.bfloat16
    assert op.result_dtype_of(fake(4, 128, dtype=torch.float16)) is torch.float16


@pytest.mark.parametrize("case, message", [
    ("b dtype", "^b: expected dtype in"),
    ("b rank", "^b: expected 3 dimensions"),
    ("b K", r"^b: expected shape \(3, 24, 16\) \(\[E, N, K\] with a's K\)"),
    ("offs dtype", "^offs: expected dtype in"),
    ("offs length", r"^offs: expected shape \(3,\) \(\[E\], one per expert of b\)"),
    ("K", "^a: K = 12 must be a multiple of 8"),
    ("N", "^b: N = 12 must be a multiple of 8"),
    ("a strided", "^a: expected a contiguous tensor"),
    ("out shape", r"^out: expected shape \(10, 24\) \(a's rows by the columns of b\)"),
    ("out dtype", "^out: expected dtype in"),
])
def test_bad_arguments_are_refused_by_name(fake, case, message):
    a, b, offs = fake(10, 16), fake(3, 24, 16), fake(3, dtype=torch.int32)
    kwargs = {}
    if case == "b dtype":
        b = fake(3, 24, 16, dtype=torch.float16)
    elif case == "b rank":
        b = fake(24, 16)
    elif case == "b K":
        b = fake(3, 24, 8)
    elif case == "offs dtype":
        offs = fake(3, dtype=torch.int64)
    elif case == "offs length":
        offs = fake(2, dtype=torch.int32)
    elif case == "K":
        a, b = fake(10, 12), fake(3, 24, 12)
    elif case == "N":
        b = fake(3, 12, 16)
    elif case == "a strided":
        a = fake(16, 10).t()
    elif case == "out shape":
        kwargs["out"] = fake(10, 16)
    elif case == "out dtype":
        kwargs["out"] = fake(10, 24, dtype=torch.float32)
    with pytest.raises((TypeError, ValueError), match=message):
        op.grouped_gemm(a, b, offs, **kwargs)


@pytest.mark.parametrize("rows, quantize_out, message", [
    (47, False, r"^b_gate_up: expected shape \(3, 46, 16\) \(\[E, 2I, K\] with a's K: gate rows, then up rows\)"),
    (44, False, "^b_gate_up: I = 22 must be a multiple of 8"),
    (48, True, "^b_gate_up: quantize_out needs I = 24 to be a multiple of 128"),
])
def test_swiglu_refuses_bad_gate_up_weights_by_name(fake, rows, quantize_out, message):
    with pytest.raises(ValueError, match=message):
        op.grouped_gemm_swiglu(fake(10, 16), fake(3, rows, 16), fake(3, dtype=torch.int32), quantize_out=quantize_out)


def test_the_grouping_is_offs_or_masked_m_and_each_is_checked_by_name(fake):
    a, b, groups = fake(10, 16), fake(3, 24, 16), fake(3, dtype=torch.int32)
    with pytest.raises(ValueError, match="^offs: give offs .* or masked_m .*, one of the two, got both"):
        op.grouped_gemm(a, b, groups, masked_m=groups)
    with pytest.raises(ValueError, match="^offs: give offs .* or masked_m .*, one of the two, got neither"):
        op.grouped_gemm(a, b)
    with pytest.raises(ValueError, match="^a: expected 3 dimensions"):
        op.grouped_gemm(a, b, masked_m=groups)
    with pytest.raises(ValueError, match=r"^a: expected shape \(3, 5, 16\) \(\[E, M_max, K\] with b's E and K\)"):
        op.grouped_gemm(fake(4, 5, 16), b, masked_m=groups)
    with pytest.raises(ValueError, match=r"^masked_m: expected shape \(3,\)"):
        op.grouped_gemm(fake(3, 5, 16), b, masked_m=fake(2, dtype=torch.int32))


@pytest.mark.parametrize("sm, epilogue, kernel", [
    (90, "none", "wgmma"), (90, "swiglu", "wgmma"), (90, "swiglu_quantize", "wgmma"),
    (100, "none", "mma_sync"), (89, "swiglu_quantize", "mma_sync"), (80, "swiglu", "mma_sync"),
])
def test_the_op_takes_the_first_kernel_the_arch_runs(sm, epilogue, kernel):
    assert first_runnable(op.FAMILY, "mma", sm, "a", dtype="bf16", epilogue=epilogue) == kernel


def test_an_arch_that_runs_no_kernel_is_refused_naming_the_tensor():
    with pytest.raises(UnsupportedVariantError, match="^a: no grouped_gemm variant .* runs on sm_80"):
        first_runnable(op.FAMILY, "mma", 80, "a", dtype="bf16", epilogue="swiglu_quantize")


@pytest.mark.parametrize("dtype, epilogue, mma, offered", [
    ("bf16", "none", "wgmma", (1, 2)), ("fp16", "swiglu_quantize", "wgmma", (1, 2)), ("e4m3", "none", "wgmma", (1,)),
    ("bf16", "swiglu", "mma_sync", (1,)),
])
def test_the_built_in_spec_offers_clusters_to_the_16_bit_wgmma_kernels(dtype, epilogue, mma, offered):
    assert op.offered_clusters(dtype, epilogue, mma) == offered


@pytest.mark.parametrize("rows, experts, masked, cluster", [
    (1024 * 8, 8, False, 2), (1024 * 8 - 1, 8, False, 1), (1 << 20, 8, True, 1), (0, 8, False, 1), (5000, 1, False, 2),
])
def test_clusters_run_where_the_experts_average_enough_rows(rows, experts, masked, cluster):
    assert op.CLUSTER_ROWS_PER_EXPERT == 1024
    assert op.cluster_size((1, 2), rows, experts, masked) == cluster
    assert op.cluster_size((1,), rows, experts, masked) == 1
