"""Grouped GEMMs over experts (mixture of experts), plain and with a fused SwiGLU (and FP8) epilogue: issue 26's
family: a persistent warp-specialised wgmma kernel on sm_90a, an mma.sync one elsewhere.

Family ``grouped_gemm`` (specs/grouped_gemm.yaml).
"""

from __future__ import annotations

import torch

from kgen.families.grouped_gemm import library, op
from kgen.runtime.checks import refuse_grad

#: The public ops of this package, for tests that walk every op.
OPS = ("grouped_gemm", "grouped_gemm_fp8", "grouped_gemm_swiglu", "grouped_gemm_swiglu_quantize")


def grouped_gemm(a, b, offs=None, *, masked_m=None, a_scale=None, b_scale=None, out=None):
    refuse_grad("grouped_gemm", ("a", "b", "a_scale", "b_scale", "out"), a, b, a_scale, b_scale, out)
    if torch.compiler.is_compiling():
        return library.grouped_gemm(a, b, offs, masked_m=masked_m, a_scale=a_scale, b_scale=b_scale, out=out)
    return op.grouped_gemm(a, b, offs, masked_m=masked_m, a_scale=a_scale, b_scale=b_scale, out=out)


def grouped_gemm_swiglu(a, b_gate_up, offs=None, *, masked_m=None, out=None, quantize_out=False):
    refuse_grad("grouped_gemm_swiglu", ("a", "b_gate_up", "out"), a, b_gate_up, out)
    if torch.compiler.is_compiling():
        return library.grouped_gemm_swiglu(a, b_gate_up, offs, masked_m=masked_m, out=out, quantize_out=quantize_out)
    return op.grouped_gemm_swiglu(a, b_gate_up, offs, masked_m=masked_m, out=out, quantize_out=quantize_out)


grouped_gemm.__doc__ = op.grouped_gemm.__doc__
grouped_gemm_swiglu.__doc__ = op.grouped_gemm_swiglu.__doc__
