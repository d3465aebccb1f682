"""Prefill as a torch.library custom op (``torch.ops.kgen.attention_varlen``), for torch.compile.

The plan crosses as its recipe (ints) and its tables (the work list and the plan's cu_seqlens); the op makes the
plan from them once per recipe and device. The fake gives the exact output shapes, dtypes and strides.
"""

# No `from __future__ import annotations`: torch.library reads the ops' schemas from real annotations.
from typing import Optional

import torch
from torch import Tensor
from torch.library import custom_op

from kgen.families.attention_prefill import op
from kgen.families.attention_prefill.plan import validate_window
from kgen.families.attention_prefill.planner import plan_from_recipe
from kgen.families.attention_prefill.recipe import AttentionRecipe
from kgen.runtime.compiled import into, needs_plan, placed


@custom_op("kgen::attention_varlen", mutates_args=())
def _attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, work: Tensor,
                      plan_cu_seqlens: Tensor, sink: Optional[Tensor], recipe: list[int],
                      softmax_scale: Optional[float]) -> tuple[Tensor, Tensor]:
    recipe = AttentionRecipe(recipe)
    return op.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=recipe.causal, window=recipe.window,
                               sink=sink, softmax_scale=softmax_scale, return_lse=True,
                               plan=plan_from_recipe(recipe, work, plan_cu_seqlens))


@_attention_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, work, plan_cu_seqlens, sink, recipe, softmax_scale):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal, window, sink, softmax_scale, return_lse, plan,
                     out, lse_out):
    needs_plan("attention_varlen", plan)
    if plan.window != validate_window(causal, window):
        raise ValueError(f"plan: made for window {plan.window}; this call has causal={causal}, window={window}")
    work, plan_cu_seqlens = placed(plan.tables, q.device, "work list")
    results = into(torch.ops.kgen.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, work, plan_cu_seqlens, sink,
                                                    list(plan.recipe), softmax_scale), (out, lse_out))
    return results if return_lse else results[0]
