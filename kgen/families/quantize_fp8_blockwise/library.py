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
    rows, columns = x.shape
    return (x.new_empty((rows, columns), dtype=torch.float8_e4m3fn),
            x.new_empty_strided((rows, columns // block), (1, op.scale_storage_rows(rows)), dtype=torch.float32))


def quantize_fp8_blockwise(x, block=op.BLOCK):
    return torch.ops.kgen.quantize_fp8_blockwise(x, block)
