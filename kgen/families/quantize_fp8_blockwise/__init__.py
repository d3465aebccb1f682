"""Per-row block quantization to FP8 e4m3: the input side of an FP8 grouped GEMM (issue 26).

Family ``quantize_fp8_blockwise`` (specs/quantize_fp8_blockwise.yaml).
"""

from __future__ import annotations

import torch

from kgen.families.quantize_fp8_blockwise import library, op
from kgen.runtime.checks import refuse_grad

#: The public ops of this package, for tests that walk every op.
OPS = ("quantize_fp8_blockwise",)


def quantize_fp8_blockwise(x, block=op.BLOCK):
    refuse_grad("quantize_fp8_blockwise", ("x",), x)
    if torch.compiler.is_compiling():
        return library.quantize_fp8_blockwise(x, block)
    return op.quantize_fp8_blockwise(x, block)


quantize_fp8_blockwise.__doc__ = op.quantize_fp8_blockwise.__doc__
