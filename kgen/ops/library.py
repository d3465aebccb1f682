"""kgen's ops as torch.library custom ops (``torch.ops.kgen.*``), for programs that torch.compile traces.

In eager mode the public functions (``kgen.ops.*``) launch directly: the dispatcher would add host
cost to every call. While torch.compile traces a program (``torch.compiler.is_compiling()``) they
call the wrappers here instead, which check what can be checked at trace time and call the custom
ops; the compiler keeps each op whole (no graph break), with a fake implementation that gives its
exact output shapes, dtypes and strides. A plan crosses as its recipe (ints, see kgen.ops.recipes)
and its device tables (tensors); the op makes the plan from them once per recipe and device. The
decode step declares the state it updates in place. No op has a backward: the public functions
refuse tensors that require grad in a grad-enabled context, before they get here.
"""

# No `from __future__ import annotations`: torch.library reads the ops' schemas from real annotations.
from typing import Optional

import torch
from torch import Tensor
from torch.library import custom_op


# ---- merge states ----------------------------------------------------------------------------


@custom_op("kgen::merge_attention_states", mutates_args=())
def _merge_attention_states(v_a: Tensor, lse_a: Tensor, v_b: Tensor, lse_b: Tensor) -> tuple[Tensor, Tensor]:
    from kgen.ops.merge_states import merge_attention_states
    return merge_attention_states(v_a, lse_a, v_b, lse_b)


@_merge_attention_states.register_fake
def _(v_a, lse_a, v_b, lse_b):
    return torch.empty_like(v_a, memory_format=torch.contiguous_format), v_a.new_empty(v_a.shape[:2], dtype=torch.float32)


@custom_op("kgen::merge_attention_states_n", mutates_args=())
def _merge_attention_states_n(v: Tensor, lse: Tensor) -> tuple[Tensor, Tensor]:
    from kgen.ops.merge_states import merge_attention_states_n
    return merge_attention_states_n(v, lse)


@_merge_attention_states_n.register_fake
def _(v, lse):
    return v.new_empty(v.shape[1:]), v.new_empty(v.shape[1:3], dtype=torch.float32)


def _into(results: tuple, outs: tuple) -> tuple:
    """The op's fresh results, copied into the caller's preallocated tensors where given (ops return new tensors)."""
    return tuple(r if o is None else o.copy_(r) for r, o in zip(results, outs))


def merge_attention_states(v_a, lse_a, v_b, lse_b, *, out=None, lse_out=None):
    return _into(torch.ops.kgen.merge_attention_states(v_a, lse_a, v_b, lse_b), (out, lse_out))


def merge_attention_states_n(v, lse, *, out=None, lse_out=None):
    return _into(torch.ops.kgen.merge_attention_states_n(v, lse), (out, lse_out))


# ---- varlen prefill ------------------------------------------------------------------------------


@custom_op("kgen::attention_varlen", mutates_args=())
def _attention_varlen(q: Tensor, k: Tensor, v: Tensor, cu_seqlens_q: Tensor, cu_seqlens_k: Tensor, work: Tensor,
                      sink: Optional[Tensor], recipe: list[int], softmax_scale: Optional[float]) -> tuple[Tensor, Tensor]:
    from kgen.ops import attention
    plan = attention.plan_from_recipe(tuple(recipe), work)
    causal, left, right = recipe[2:5]
    return attention.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=bool(causal),
                                      window=(left, right), sink=sink, softmax_scale=softmax_scale,
                                      return_lse=True, plan=plan)


@_attention_varlen.register_fake
def _(q, k, v, cu_seqlens_q, cu_seqlens_k, work, sink, recipe, softmax_scale):
    return q.new_empty(q.shape), q.new_empty((q.shape[1], q.shape[0]), dtype=torch.float32)


def _placed(tensor: Tensor, device: torch.device, what: str) -> Tensor:
    if tensor.device != device:
        raise ValueError(f"plan: its {what} is on {tensor.device}, the tensors on {device}; under torch.compile "
                         f"plan with device={str(device)!r}")
    return tensor


def _needs_plan(op: str, plan) -> None:
    if plan is None:
        raise ValueError(f"{op}: under torch.compile pass a plan (made outside the compiled code, with device=): "
                         f"planning reads the lengths on the host")


def attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, *, causal, window, sink, softmax_scale, return_lse, plan,
                     out, lse_out):
    from kgen.ops.attention_plan import validate_window
    _needs_plan("attention_varlen", plan)
    if plan.window != validate_window(causal, window):
        raise ValueError(f"plan: made for window {plan.window}; this call has causal={causal}, window={window}")
    results = _into(torch.ops.kgen.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k,
                                                    _placed(plan.work, q.device, "work list"), sink,
                                                    list(plan.recipe), softmax_scale), (out, lse_out))
    return results if return_lse else results[0]


# ---- decode ----------------------------------------------------------------------------------


@custom_op("kgen::attention_decode", mutates_args=())
def _attention_decode(q: Tensor, k_cache: Tensor, v_cache: Tensor, seqlens_k: Tensor, block_table: Optional[Tensor],
                      sink: Optional[Tensor], recipe: list[int], softmax_scale: Optional[float]) -> tuple[Tensor, Tensor]:
    # The plan made here has a split workspace of its own, which the kernel leaves as it found it.
    from kgen.ops import decode
    plan = decode.plan_from_recipe(tuple(recipe), q.device)
    return decode.attention_decode(q, k_cache, v_cache, seqlens_k, block_table=block_table,
                                   window_left=recipe[6], sink=sink, softmax_scale=softmax_scale,
                                   return_lse=True, plan=plan)


@_attention_decode.register_fake
def _(q, k_cache, v_cache, seqlens_k, block_table, sink, recipe, softmax_scale):
    return q.new_empty(q.shape), q.new_empty(q.shape[:-1], dtype=torch.float32)


def attention_decode(q, k_cache, v_cache, seqlens_k, *, block_table, window_left, sink, softmax_scale, return_lse,
                     plan, out):
    _needs_plan("attention_decode", plan)
    if plan.window_left != window_left:
        raise ValueError(f"plan: made for window_left={plan.window_left}; this call has {window_left}")
    results = _into(torch.ops.kgen.attention_decode(q, k_cache, v_cache, seqlens_k, block_table, sink,
                                                    list(plan.recipe), softmax_scale), (out, None))
    return results if return_lse else results[0]


# ---- gated delta rule ------------------------------------------------------------------------


@custom_op("kgen::chunk_gated_delta_rule", mutates_args=())
def _chunk_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Optional[Tensor],
                            cu_seqlens: Optional[Tensor], tables: list[Tensor], recipe: list[int], scale: Optional[float],
                            output_final_state: bool, use_qk_l2norm_in_kernel: bool,
                            state_layout: str) -> tuple[Tensor, Tensor]:
    from kgen.ops import gdn_chunk
    from kgen.ops._dispatch import kept_allocations
    if recipe:
        plan = gdn_chunk.plan_from_recipe(tuple(recipe), tables)
    else:  # fixed-length sequences without cu_seqlens: planned from the shapes alone, its tables kept
        with kept_allocations(q.device):
            plan = gdn_chunk.fixed_length_plan(q.shape[0], q.shape[1], v.shape[2], q.shape[3], q.device)
    o, final = gdn_chunk.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                                output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                                state_layout=state_layout, plan=plan)
    return o, final if final is not None else v.new_empty((0,), dtype=torch.float32)


@_chunk_gated_delta_rule.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, tables, recipe, scale, output_final_state, use_qk_l2norm_in_kernel,
      state_layout):
    sequences = recipe[4] if recipe else q.shape[0]
    head_dim, heads_v = q.shape[3], v.shape[2]
    final = (sequences, heads_v, head_dim, head_dim) if output_final_state else (0,)
    return torch.empty_like(v, memory_format=torch.contiguous_format), v.new_empty(final, dtype=torch.float32)


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens,
                           use_qk_l2norm_in_kernel, state_layout, plan, out):
    if plan is None and cu_seqlens is not None:
        _needs_plan("chunk_gated_delta_rule (with cu_seqlens)", plan)
    tables = [] if plan is None else [_placed(t, q.device, "tables") for t in plan.tables(q.device)]
    recipe = [] if plan is None else list(plan.recipe)
    o, final = torch.ops.kgen.chunk_gated_delta_rule(q, k, v, g, beta, initial_state, cu_seqlens, tables, recipe,
                                                     scale, output_final_state, use_qk_l2norm_in_kernel, state_layout)
    return _into((o,), (out,))[0], final if output_final_state else None


@custom_op("kgen::gated_delta_rule_step", mutates_args=("state",))
def _gated_delta_rule_step(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                           state_indices: Optional[Tensor], scale: Optional[float], state_layout: str,
                           use_qk_l2norm_in_kernel: bool) -> Tensor:
    from kgen.ops.gated_delta_rule import gated_delta_rule_step
    return gated_delta_rule_step(q, k, v, g, beta, state, scale=scale, state_indices=state_indices,
                                 state_layout=state_layout, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)


@_gated_delta_rule_step.register_fake
def _(q, k, v, g, beta, state, state_indices, scale, state_layout, use_qk_l2norm_in_kernel):
    return torch.empty_like(v, memory_format=torch.contiguous_format)


def gated_delta_rule_step(q, k, v, g, beta, state, *, scale, state_indices, state_layout, use_qk_l2norm_in_kernel,
                          out):
    o = torch.ops.kgen.gated_delta_rule_step(q, k, v, g, beta, state, state_indices, scale, state_layout,
                                             use_qk_l2norm_in_kernel)
    return _into((o,), (out,))[0]


#: Every op this module registers, for tests that walk them all.
OPS = ("merge_attention_states", "merge_attention_states_n", "attention_varlen", "attention_decode",
       "chunk_gated_delta_rule", "gated_delta_rule_step")
