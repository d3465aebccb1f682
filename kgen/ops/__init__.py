"""The public ops of kgen's built-in families, in one place (each family's package is the source)."""

from kgen.families.attention_decode import DecodePlan, attention_decode, plan_attention_decode
from kgen.families.attention_prefill import AttentionPlan, attention_varlen, plan_attention_varlen
from kgen.families.gated_delta_rule import (ChunkGatedDeltaRulePlan, chunk_gated_delta_rule, chunk_gated_delta_rule_bwd,
                                            gated_delta_rule_step,
                                            plan_chunk_gated_delta_rule)
from kgen.families.grouped_gemm import grouped_gemm, grouped_gemm_swiglu
from kgen.families.merge_states import merge_attention_states, merge_attention_states_n
from kgen.families.quantize_fp8_blockwise import quantize_fp8_blockwise

__all__ = ["AttentionPlan", "ChunkGatedDeltaRulePlan", "DecodePlan", "attention_decode", "attention_varlen",
           "chunk_gated_delta_rule", "chunk_gated_delta_rule_bwd", "gated_delta_rule_step", "grouped_gemm", "grouped_gemm_swiglu", "merge_attention_states", "merge_attention_states_n",
           "plan_attention_decode", "plan_attention_varlen", "plan_chunk_gated_delta_rule", "quantize_fp8_blockwise"]
