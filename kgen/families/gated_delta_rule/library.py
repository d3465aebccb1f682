"""The gated delta rule's ops as torch.library custom ops, for torch.compile.

``torch.ops.kgen.chunk_gated_delta_rule`` takes its plan as a recipe (ints) and tables (tensors);
``torch.ops.kgen.gated_delta_rule_step`` declares the state it updates in place. The fakes give the
exact output shapes, dtypes and strides.
"""

# No `from __future__ import annotations`: torch.library reads the ops' schemas from real annotations.
from typing import Optional

import torch
from torch import Tensor
from torch.library import custom_op

from kgen.families.gated_delta_rule import backward, chunk, step
from kgen.families.gated_delta_rule.planner import chunk_tokens, fixed_length_plan
from kgen.families.gated_delta_rule.recipe import ChunkRecipe, plan_from_recipe
from kgen.runtime.compiled import into, needs_plan, placed
from kgen.runtime.dispatch import kept_allocations


@custom_op("kgen::chunk_gated_delta_rule", mutates_args=())
def _chunk_gated_delta_rule(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, initial_state: Optional[Tensor],
                            cu_seqlens: Optional[Tensor], tables: list[Tensor], recipe: list[int], scale: Optional[float],
                            output_final_state: bool, use_qk_l2norm_in_kernel: bool,
                            state_layout: str) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """(o, final state or an empty tensor, and chunk.ForwardKept's tensors, which autograd keeps for the
    backward)."""
    plan = _plan_of(q, v, tables, recipe)
    o, final, kept = chunk.forward_keeping(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                           output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout=state_layout,
                                           plan=plan)
    if not recipe:  # planned from the shapes: the fake cannot know the split (B and T may be symbolic), so none kept
        kept = kept._replace(start_states=kept.start_states.new_empty((0, *kept.start_states.shape[1:])))
    return o, final if final is not None else v.new_empty((0,), dtype=torch.float32), *kept


@_chunk_gated_delta_rule.register_fake
def _(q, k, v, g, beta, initial_state, cu_seqlens, tables, recipe, scale, output_final_state, use_qk_l2norm_in_kernel,
      state_layout):
    sequences = ChunkRecipe.from_ints(recipe).num_seqs if recipe else q.shape[0]
    head_dim, heads_v = q.shape[3], v.shape[2]
    final = (sequences, heads_v, head_dim, head_dim) if output_final_state else (0,)
    # The plan's chunks and summaries: the rows of its chunk and summary-segment tables; planned from the shapes
    # (which may be symbolic), B sequences of ceil(T / chunk) chunks, and no start states kept.
    tokens = chunk_tokens(head_dim)
    if recipe:
        chunks, summaries = tables[0].shape[0], tables[2].shape[0]
    else:
        chunks, summaries = q.shape[0] * -(-q.shape[1] // tokens), 0
    shapes = chunk.kept_shapes(chunks, summaries, heads_v, head_dim, tokens)
    return (torch.empty_like(v, memory_format=torch.contiguous_format), v.new_empty(final, dtype=torch.float32),
            q.new_empty(shapes[0]), *(q.new_empty(shape, dtype=torch.float32) for shape in shapes[1:]))


def _plan_of(q, v, tables, recipe):
    """The plan a recipe names, or (no recipe: fixed-length sequences without cu_seqlens) the shapes' own."""
    if recipe:
        return plan_from_recipe(tuple(recipe), tables)
    with kept_allocations(q.device):  # planned from the shapes alone, its tables kept
        return fixed_length_plan(q.shape[0], q.shape[1], v.shape[2], q.shape[3], q.device)


@custom_op("kgen::chunk_gated_delta_rule_bwd", mutates_args=())
def _chunk_gated_delta_rule_bwd(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, d_out: Tensor,
                                initial_state: Optional[Tensor], d_final_state: Optional[Tensor],
                                cu_seqlens: Optional[Tensor], tables: list[Tensor], recipe: list[int],
                                scale: Optional[float], use_qk_l2norm_in_kernel: bool,
                                state_layout: str, tbeta: Optional[Tensor] = None, gamma_log2: Optional[Tensor] = None,
                                start_states: Optional[Tensor] = None
                                ) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    grads = backward.chunk_gated_delta_rule_bwd(
        q, k, v, g, beta, d_out.contiguous(), scale=scale, initial_state=initial_state, d_final_state=d_final_state,
        cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout=state_layout,
        plan=_plan_of(q, v, tables, recipe),
        forward_kept=None if tbeta is None else chunk.ForwardKept(tbeta, gamma_log2, start_states))
    return (*grads[:5], grads[5] if grads[5] is not None else v.new_empty((0,), dtype=torch.float32))


@_chunk_gated_delta_rule_bwd.register_fake
def _(q, k, v, g, beta, d_out, initial_state, d_final_state, cu_seqlens, tables, recipe, scale,
      use_qk_l2norm_in_kernel, state_layout, tbeta=None, gamma_log2=None, start_states=None):
    d_initial = (0,) if initial_state is None else initial_state.shape
    return (torch.empty_like(q, memory_format=torch.contiguous_format),
            torch.empty_like(k, memory_format=torch.contiguous_format),
            torch.empty_like(v, memory_format=torch.contiguous_format),
            torch.empty_like(g, memory_format=torch.contiguous_format),
            torch.empty_like(beta, memory_format=torch.contiguous_format), v.new_empty(d_initial, dtype=torch.float32))


def _save_inputs(ctx, inputs, output):
    q, k, v, g, beta, initial_state, cu_seqlens, tables, recipe, scale, _, l2norm, state_layout = inputs
    kept = output[2:]
    # The inputs, and chunk.ForwardKept's tensors, which the backward then does not compute again.
    ctx.save_for_backward(q, k, v, g, beta, initial_state, cu_seqlens, *kept, *tables)
    ctx.mark_non_differentiable(*kept)
    # Eager autograd would otherwise hand the backward zero tensors of the kept outputs' sizes (a Tbeta's worth).
    ctx.set_materialize_grads(False)
    ctx.options = (recipe, scale, l2norm, state_layout)


def _chunk_backward(ctx, d_out, d_final, *_kept_grads):
    q, k, v, g, beta, initial_state, cu_seqlens, tbeta, gamma_log2, start_states, *tables = ctx.saved_tensors
    recipe, scale, l2norm, state_layout = ctx.options
    if d_out is None:  # o unused (only the final state's gradient)
        d_out = torch.zeros_like(v)
    dq, dk, dv, dg, dbeta, d_initial = torch.ops.kgen.chunk_gated_delta_rule_bwd(
        q, k, v, g, beta, d_out, initial_state, d_final if d_final is not None and d_final.numel() else None,
        cu_seqlens, tables, recipe, scale, l2norm, state_layout, tbeta, gamma_log2, start_states)
    # A gradient per input, in the inputs' structure: none for cu_seqlens, each table, the recipe and the options.
    # (torch.library takes a list of ints as one input, but an empty list as a list: the recipe of a call planned
    # from the shapes, which torch.compile makes.)
    return (dq, dk, dv, dg, dbeta, d_initial if initial_state is not None else None, None, [None] * len(tables),
            None if recipe else [], None, None, None, None)


_chunk_gated_delta_rule.register_autograd(_chunk_backward, setup_context=_save_inputs)


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens,
                           use_qk_l2norm_in_kernel, state_layout, plan, out):
    if plan is None and cu_seqlens is not None:
        needs_plan("chunk_gated_delta_rule (with cu_seqlens)", plan)
    tables = [] if plan is None else list(placed(plan.tables, q.device, "tables"))
    recipe = [] if plan is None else ChunkRecipe.of(plan).ints()
    o, final, *_ = torch.ops.kgen.chunk_gated_delta_rule(q, k, v, g, beta, initial_state, cu_seqlens, tables, recipe,
                                                         scale, output_final_state, use_qk_l2norm_in_kernel,
                                                         state_layout)
    return into((o,), (out,))[0], final if output_final_state else None


@custom_op("kgen::gated_delta_rule_step", mutates_args=("state",))
def _gated_delta_rule_step(q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Tensor,
                           state_indices: Optional[Tensor], scale: Optional[float], state_layout: str,
                           use_qk_l2norm_in_kernel: bool) -> Tensor:
    return step.gated_delta_rule_step(q, k, v, g, beta, state, scale=scale, state_indices=state_indices,
                                      state_layout=state_layout, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)


@_gated_delta_rule_step.register_fake
def _(q, k, v, g, beta, state, state_indices, scale, state_layout, use_qk_l2norm_in_kernel):
    return torch.empty_like(v, memory_format=torch.contiguous_format)


def gated_delta_rule_step(q, k, v, g, beta, state, *, scale, state_indices, state_layout, use_qk_l2norm_in_kernel,
                          out):
    o = torch.ops.kgen.gated_delta_rule_step(q, k, v, g, beta, state, state_indices, scale, state_layout,
                                             use_qk_l2norm_in_kernel)
    return into((o,), (out,))[0]
