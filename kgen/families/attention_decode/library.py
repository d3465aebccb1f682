"""Decode as a torch.library custom op (``torch.ops.kgen.attention_decode``), for torch.compile.

The plan crosses as its recipe (ints); the op makes the plan, with a split workspace of its own, once
per recipe and device. The fake gives the exact output shapes, dtypes and strides.
"""

# No `from __future__ import annotations`: torch.library reads the ops' schemas from real annotations.
from typing import Optional

import torch
from torch import Tensor
from torch.library import custom_op

from kgen.families.attention_decode import op
from kgen.families.attention_decode.planner import plan_from_recipe
from kgen.families.attention_decode.recipe import DecodeRecipe
from kgen.runtime.compiled import into, needs_plan


@custom_op("kgen::attention_decode", mutates_args=())
def _attention_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, seqlens_k: Tensor, block_table: Optional[Tensor],
                      sink: Optional[Tensor], recipe: list[int], softmax_scale: Optional[float]) -> tuple[Tensor, Tensor]:
    recipe = DecodeRecipe(recipe)
    # The plan made here has a split workspace of its own, which the kernel leaves as it found it.
    return op.attention_decode(q, k_cache, v_cache, seqlens_k, block_table=block_table, window_left=recipe.window_left,
                               sink=sink, softmax_scale=softmax_scale, return_lse=True,
                               plan=plan_from_recipe(recipe, q.device))


@_attention_decode.register_fake
def _(q, k_cache, v_cache, seqlens_k, block_table, sink, recipe, softmax_scale):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


def attention_decode(q, k_cache, v_cache, seqlens_k, *, block_table, window_left, sink, softmax_scale, return_lse,
                     plan, out):
    needs_plan("attention_decode", plan)
    if plan.window_left != window_left:
        raise ValueError(f"plan: made for window_left={plan.window_left}; this call has {window_left}")
    results = into(torch.ops.kgen.attention_decode(q, k_cache, v_cache, seqlens_k, block_table, sink,
                                                    list(plan.recipe), softmax_scale), (out, None))
    return results if return_lse else results[0]
