"""The merge ops as torch.library custom ops (``torch.ops.kgen.merge_attention_states(_n)``), for torch.compile.

The compiler keeps each op whole (no graph break); the fakes give the exact output shapes, dtypes and
strides. Ops return new tensors: a caller's preallocated ``out`` is filled by a copy.
"""

# No `from __future__ import annotations`: torch.library reads the ops' schemas from real annotations.
import torch
from torch import Tensor
from torch.library import custom_op

from kgen.families.merge_states import op
from kgen.runtime.compiled import into


@custom_op("kgen::merge_attention_states", mutates_args=())
def _merge_attention_states(v_a: Tensor, lse_a: Tensor, v_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    return op.merge_attention_states(v_a, lse_a, v_b, lse_b)


@_merge_attention_states.register_fake
def _(v_a, lse_a, v_b, lse_b):
    return torch.empty_like(v_a, memory_format=torch.contiguous_format), v_a.new_empty(v_a.shape[:2], dtype=torch.float32)


@custom_op("kgen::merge_attention_states_n", mutates_args=())
def _merge_attention_states_n(v: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
    return op.merge_attention_states_n(v, lse)


@_merge_attention_states_n.register_fake
def _(v, lse):
    return v.new_empty(v.shape[1:]), v.new_empty(v.shape[1:3], dtype=torch.float32)


def merge_attention_states(v_a, lse_a, v_b, lse_b, *, out=None, lse_out=None):
    return into(torch.ops.kgen.merge_attention_states(v_a, lse_a, v_b, lse_b), (out, lse_out))


def merge_attention_states_n(v, lse, *, out=None, lse_out=None):
    return into(torch.ops.kgen.merge_attention_states_n(v, lse), (out, lse_out))
