"""The gated delta rule (Gated DeltaNet): the chunked forward over whole sequences and the one-token step
(families ``gated_delta_rule_kkt``, ``gated_delta_rule_chunk`` and ``gated_delta_rule_step``).

The chunked forward is fla's ``chunk_gated_delta_rule`` (plan varlen batches once with
:func:`plan_chunk_gated_delta_rule`), differentiable (its backward, :func:`chunk_gated_delta_rule_bwd`, also
serves callers with their own autograd); the step advances a state pool by one token per sequence, in place.
"""

from __future__ import annotations

import torch

from kgen.families.gated_delta_rule import backward, chunk, library, step
from kgen.families.gated_delta_rule.planner import ChunkGatedDeltaRulePlan, plan_chunk_gated_delta_rule
from kgen.runtime.checks import needs_grad, refuse_grad

__all__ = ["ChunkGatedDeltaRulePlan", "chunk_gated_delta_rule", "chunk_gated_delta_rule_bwd", "gated_delta_rule_step",
           "plan_chunk_gated_delta_rule"]
#: The public ops of this package, for tests that walk every op.
OPS = ("chunk_gated_delta_rule", "chunk_gated_delta_rule_bwd", "gated_delta_rule_step")
chunk_gated_delta_rule_bwd = backward.chunk_gated_delta_rule_bwd


def chunk_gated_delta_rule(q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                           cu_seqlens=None, use_qk_l2norm_in_kernel=False, state_layout="kv", plan=None, out=None):
    differentiable = needs_grad(q, k, v, g, beta, initial_state)
    if differentiable and out is not None:
        raise ValueError("out: a result that requires grad cannot be written into a preallocated tensor; "
                         "leave out=None")
    if differentiable and not torch.compiler.is_compiling():
        # Differentiable: through the registered op, whose autograd is the chunked backward (.backward), after
        # the eager op's checks, with the plan's tables on the device.
        plan, _ = chunk.checked_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                       output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                       use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout=state_layout,
                                       plan=plan)
        plan.tables.on(q.device)
    if differentiable or torch.compiler.is_compiling():
        return library.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                              output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                              use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout=state_layout,
                                              plan=plan, out=out)
    return chunk.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                        output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                        use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout=state_layout,
                                        plan=plan, out=out)


def gated_delta_rule_step(q, k, v, g, beta, state, *, scale=None, state_indices=None, state_layout="kv",
                          use_qk_l2norm_in_kernel=False, out=None):
    refuse_grad("gated_delta_rule_step", ("q", "k", "v", "g", "beta", "state"), q, k, v, g, beta, state)
    if torch.compiler.is_compiling():
        return library.gated_delta_rule_step(q, k, v, g, beta, state, scale=scale, state_indices=state_indices,
                                             state_layout=state_layout, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                             out=out)
    return step.gated_delta_rule_step(q, k, v, g, beta, state, scale=scale, state_indices=state_indices,
                                      state_layout=state_layout, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, out=out)


chunk_gated_delta_rule.__doc__ = chunk.chunk_gated_delta_rule.__doc__
gated_delta_rule_step.__doc__ = step.gated_delta_rule_step.__doc__
