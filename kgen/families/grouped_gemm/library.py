"""The grouped GEMMs as torch.library custom ops (``torch.ops.kgen.grouped_gemm``, ``grouped_gemm_fp8``,
``grouped_gemm_swiglu`` and ``grouped_gemm_swiglu_quantize``), for torch.compile.

The ops write into their results (declared mutated): rows of no group keep what the results held, so a fresh
copy could not stand for them. ``groups`` is offs, or masked_m where ``masked``.
"""

# No `from __future__ import annotations`: torch.library reads the ops' schemas from real annotations.
import torch
from torch import Tensor
from torch.library import custom_op

from kgen.families.grouped_gemm import op


def _grouping(groups: Tensor, masked: bool) -> dict:
    return {"masked_m": groups} if masked else {"offs": groups}


@custom_op("kgen::grouped_gemm", mutates_args=("out",))
def _grouped_gemm(a: Tensor, b: Tensor, groups: Tensor, masked: bool, out: Tensor) -> None:
    op.grouped_gemm(a, b, **_grouping(groups, masked), out=out)


@custom_op("kgen::grouped_gemm_swiglu", mutates_args=("out",))
def _grouped_gemm_swiglu(a: Tensor, b_gate_up: Tensor, groups: Tensor, masked: bool, out: Tensor) -> None:
    op.grouped_gemm_swiglu(a, b_gate_up, **_grouping(groups, masked), out=out)


@custom_op("kgen::grouped_gemm_swiglu_quantize", mutates_args=("out", "out_fp8", "scales"))
def _grouped_gemm_swiglu_quantize(a: Tensor, b_gate_up: Tensor, groups: Tensor, masked: bool, out: Tensor,
                                  out_fp8: Tensor, scales: Tensor) -> None:
    grouping = _grouping(groups, masked)
    checked, _ = op.checked_swiglu(a, b_gate_up, grouping.get("offs"), grouping.get("masked_m"), out, True)
    op.check_fp8_results(a, b_gate_up, out, out_fp8, scales)
    op.quantized_swiglu_into(a, b_gate_up, checked, out, out_fp8, scales)


@custom_op("kgen::grouped_gemm_fp8", mutates_args=("out",))
def _grouped_gemm_fp8(a: Tensor, b: Tensor, a_scale: Tensor, b_scale: Tensor, groups: Tensor, masked: bool,
                      out: Tensor) -> None:
    op.grouped_gemm(a, b, **_grouping(groups, masked), a_scale=a_scale, b_scale=b_scale, out=out)


for _op in (_grouped_gemm, _grouped_gemm_swiglu, _grouped_gemm_swiglu_quantize, _grouped_gemm_fp8):
    _op.register_fake(lambda *args: None)


def grouped_gemm(a, b, offs=None, *, masked_m=None, a_scale=None, b_scale=None, out=None):
    scaled = a_scale is not None or b_scale is not None
    if (offs is None) == (masked_m is None) or (scaled and (a_scale is None or b_scale is None or a.element_size() != 1)):
        # refused by name, as eagerly
        return op.grouped_gemm(a, b, offs, masked_m=masked_m, a_scale=a_scale, b_scale=b_scale, out=out)
    if out is None:
        out = a.new_empty((*a.shape[:-1], b.shape[1]), dtype=op.result_dtype_of(a))
    groups, masked = (offs, False) if masked_m is None else (masked_m, True)
    if scaled:
        torch.ops.kgen.grouped_gemm_fp8(a, b, a_scale, b_scale, groups, masked, out)
    else:
        torch.ops.kgen.grouped_gemm(a, b, groups, masked, out)
    return out


def grouped_gemm_swiglu(a, b_gate_up, offs=None, *, masked_m=None, out=None, quantize_out=False):
    if (offs is None) == (masked_m is None):  # refused by name, as eagerly
        return op.grouped_gemm_swiglu(a, b_gate_up, offs, masked_m=masked_m, out=out, quantize_out=quantize_out)
    groups, masked = (offs, False) if masked_m is None else (masked_m, True)
    if out is None:
        out = a.new_empty((*a.shape[:-1], b_gate_up.shape[1] // 2))
    if not quantize_out:
        torch.ops.kgen.grouped_gemm_swiglu(a, b_gate_up, groups, masked, out)
        return out
    out_fp8, scales = op.new_fp8_results(op.rows_view(out))
    torch.ops.kgen.grouped_gemm_swiglu_quantize(a, b_gate_up, groups, masked, out, out_fp8, scales)
    return out, out_fp8.view(out.shape), scales
