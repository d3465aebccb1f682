"""Attention decode over a KV cache, contiguous or paged, split over the keys where that fills the GPU
(family ``attention_decode``). Plan once per batch layout (:func:`plan_attention_decode`), then call
:func:`attention_decode` with no host synchronisation.
"""

from __future__ import annotations

import torch

from kgen.families.attention_decode import library, op
from kgen.families.attention_decode.planner import DecodePlan, plan_attention_decode
from kgen.runtime.checks import refuse_grad

__all__ = ["DecodePlan", "attention_decode", "plan_attention_decode"]
#: The public ops of this package, for tests that walk every op.
OPS = ("attention_decode",)


def attention_decode(q, k_cache, v_cache, seqlens_k, *, block_table=None, window_left=-1, sink=None,
                     softmax_scale=None, return_lse=False, plan=None, out=None):
    refuse_grad("attention_decode", ("q", "k_cache", "v_cache", "sink"), q, k_cache, v_cache, sink)
    if torch.compiler.is_compiling():
        return library.attention_decode(q, k_cache, v_cache, seqlens_k, block_table=block_table, window_left=window_left,
                                        sink=sink, softmax_scale=softmax_scale, return_lse=return_lse, plan=plan, out=out)
    return op.attention_decode(q, k_cache, v_cache, seqlens_k, block_table=block_table, window_left=window_left,
                               sink=sink, softmax_scale=softmax_scale, return_lse=return_lse, plan=plan, out=out)


attention_decode.__doc__ = op.attention_decode.__doc__
