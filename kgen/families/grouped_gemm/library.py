"""The grouped GEMM as a torch.library custom op (``torch.ops.kgen.grouped_gemm``), for torch.compile.

The op writes into ``out`` (declared mutated): rows of no group keep what ``out`` held, so a fresh copy could
not stand for it.
"""

# No `from __future__ import annotations`: torch.library reads the op's schema from real annotations.
import torch
from torch import Tensor
from torch.library import custom_op

from kgen.families.grouped_gemm import op


@custom_op("kgen::grouped_gemm", mutates_args=("out",))
def _grouped_gemm(a: Tensor, b: Tensor, offs: Tensor, out: Tensor) -> None:
    op.grouped_gemm(a, b, offs, out=out)


@_grouped_gemm.register_fake
def _(a, b, offs, out):
    return None


def grouped_gemm(a, b, offs, *, a_scale=None, b_scale=None, out=None):
    if a_scale is not None or b_scale is not None:  # refused by name, as eagerly
        return op.grouped_gemm(a, b, offs, a_scale=a_scale, b_scale=b_scale, out=out)
    if out is None:
        out = a.new_empty((a.shape[0], b.shape[1]))
    torch.ops.kgen.grouped_gemm(a, b, offs, out)
    return out
