"""Attention prefill over packed variable-length sequences (family ``attention_prefill``).

Grouped-query heads, causal or sliding-window masks (bottom-right aligned when Lq != Lk), per-head sink
logits and the LSE; a drop-in for ``flash_attn_varlen_func``. Plan once per batch layout on the host
(:func:`plan_attention_varlen`), then call :func:`attention_varlen` with no host synchronisation.
"""

from __future__ import annotations

import torch

from kgen.families.attention_prefill import library, op
from kgen.families.attention_prefill.planner import AttentionPlan, plan_attention_varlen
from kgen.runtime.checks import refuse_grad

__all__ = ["AttentionPlan", "attention_varlen", "plan_attention_varlen"]
#: The public ops of this package, for tests that walk every op.
OPS = ("attention_varlen",)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal=False, window=(-1, -1), sink=None,
                     softmax_scale=None, return_lse=False, plan=None, out=None, lse_out=None):
    refuse_grad("attention_varlen", ("q", "k", "v", "sink"), q, k, v, sink)
    if torch.compiler.is_compiling():
        return library.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, window=window, sink=sink,
                                        softmax_scale=softmax_scale, return_lse=return_lse, plan=plan, out=out,
                                        lse_out=lse_out)
    return op.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, window=window, sink=sink,
                               softmax_scale=softmax_scale, return_lse=return_lse, plan=plan, out=out, lse_out=lse_out)


attention_varlen.__doc__ = op.attention_varlen.__doc__
