"""Merging partial attention states: the combine step of split-KV decode and context-parallel attention.

A partial state is an attention output ``v`` normalised over some subset of the
keys and the log-sum-exp ``lse`` (natural log) of that subset's scores. Merging
two or more partials over disjoint key sets gives the state over their union.
Family ``merge_attention_states`` (specs/merge_attention_states.yaml).
"""

from __future__ import annotations

import torch

from kgen.families.merge_states import library, op
from kgen.runtime.checks import refuse_grad

#: The public ops of this package, for tests that walk every op.
OPS = ("merge_attention_states", "merge_attention_states_n")


def merge_attention_states(v_a, lse_a, v_b, lse_b, *, out=None, lse_out=None):
    refuse_grad("merge_attention_states", ("v_a", "lse_a", "v_b", "lse_b"), v_a, lse_a, v_b, lse_b)
    if torch.compiler.is_compiling():
        return library.merge_attention_states(v_a, lse_a, v_b, lse_b, out=out, lse_out=lse_out)
    return op.merge_attention_states(v_a, lse_a, v_b, lse_b, out=out, lse_out=lse_out)


def merge_attention_states_n(v, lse, *, out=None, lse_out=None):
    refuse_grad("merge_attention_states_n", ("v", "lse"), v, lse)
    if torch.compiler.is_compiling():
        return library.merge_attention_states_n(v, lse, out=out, lse_out=lse_out)
    return op.merge_attention_states_n(v, lse, out=out, lse_out=lse_out)


merge_attention_states.__doc__ = op.merge_attention_states.__doc__
merge_attention_states_n.__doc__ = op.merge_attention_states_n.__doc__
