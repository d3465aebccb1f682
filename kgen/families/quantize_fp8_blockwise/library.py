"""The quantize op as a torch.library custom op (``torch.ops.kgen.quantize_fp8_blockwise``), for torch.compile.

The compiler keeps the op whole (no graph break); the fake gives the exact shapes, dtypes and strides (the
scales' MN-major view included).
"""

# No `from __future__ import annotations`: torch.library reads the op's schema from real annotations.
import torch
from torch import Tensor
from torch.library import custom_op

from kgen.families.quantize_fp8_blockwise import op


@custom_op("kgen::quantize_fp8_blockwise", mutates_args=())
def _quantize_fp8_blockwise(x: Tensor, block: int) -> tuple[Tensor, Tensor]:
    return op.quantize_fp8_blockwise(x, block)


@_quantize_fp8_blockwise.register_fake
def _(x, block):
    return op.new_results(x)  # as eagerly, strides of an empty batch included


def quantize_fp8_blockwise(x, block=op.BLOCK):
    return torch.ops.kgen.quantize_fp8_blockwise(x, block)
