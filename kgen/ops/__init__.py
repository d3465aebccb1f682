"""PyTorch ops backed by kgen kernels."""

from kgen.ops.attention import AttentionPlan, attention_varlen, plan_attention_varlen
from kgen.ops.decode import DecodePlan, attention_decode, plan_attention_decode
from kgen.ops.gated_delta_rule import gated_delta_rule_step
from kgen.ops.gdn_chunk import ChunkGatedDeltaRulePlan, chunk_gated_delta_rule, plan_chunk_gated_delta_rule
from kgen.ops.merge_states import merge_attention_states, merge_attention_states_n

__all__ = ["AttentionPlan", "ChunkGatedDeltaRulePlan", "DecodePlan", "attention_decode", "attention_varlen",
           "chunk_gated_delta_rule", "gated_delta_rule_step", "merge_attention_states", "merge_attention_states_n",
           "plan_attention_decode", "plan_attention_varlen", "plan_chunk_gated_delta_rule"]
