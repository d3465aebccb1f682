"""PyTorch ops backed by kgen kernels."""

from kgen.ops.attention import AttentionPlan, attention_varlen, plan_attention_varlen
from kgen.ops.merge_states import merge_attention_states, merge_attention_states_n

__all__ = ["AttentionPlan", "attention_varlen", "merge_attention_states", "merge_attention_states_n",
           "plan_attention_varlen"]
