"""kgen.ops.quantize_fp8_blockwise's argument checks, on the host: every refusal names its argument."""

from __future__ import annotations

import pytest
import torch

import kgen.ops
from kgen.families.quantize_fp8_blockwise import op


def fake_cuda(*shape, dtype=torch.bfloat16):
    """A CUDA tensor's metadata without a GPU."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode():
        return torch.empty(shape, dtype=dtype, device="cuda")


@pytest.mark.parametrize("x, message", [
    (torch.zeros(4, 128, dtype=torch.bfloat16), "^x: expected a CUDA tensor"),
    ("x", "^x: expected a torch.Tensor"),
])
def test_non_cuda_inputs_are_refused_by_name(x, message):
    with pytest.raises((TypeError, ValueError), match=message):
        kgen.ops.quantize_fp8_blockwise(x)


def test_a_block_width_that_is_not_built_is_refused_by_name():
    with pytest.raises(ValueError, match="^block: only 128-column blocks are built, got 64"):
        kgen.ops.quantize_fp8_blockwise(torch.zeros(4, 128), block=64)


@pytest.mark.parametrize("shape, dtype, message", [
    ((4, 2, 128), torch.bfloat16, "^x: expected 2 dimensions"),
    ((4, 128), torch.int8, "^x: expected dtype in"),
    ((4, 192), torch.bfloat16, r"^x: the row length K = 192 must be a multiple of block = 128"),
])
def test_bad_shapes_and_dtypes_are_refused_by_name(shape, dtype, message):
    with pytest.raises((TypeError, ValueError), match=message):
        op.quantize_fp8_blockwise(fake_cuda(*shape, dtype=dtype))


def test_a_strided_x_is_refused_by_name():
    with pytest.raises(ValueError, match="^x: expected a contiguous tensor"):
        op.quantize_fp8_blockwise(fake_cuda(256, 8).t())


@pytest.mark.parametrize("rows", [0, 1, 3, 4, 5, 1000])
def test_each_column_blocks_scales_are_padded_to_four_rows(rows):
    assert op.scale_storage_rows(rows) % 4 == 0 and 0 <= op.scale_storage_rows(rows) - rows < 4
