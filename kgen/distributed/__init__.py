"""Context parallelism over torch.distributed: one family's op run across ranks that each hold part of every
sequence, exact for the whole sequences.

- :mod:`~kgen.distributed.shards`: cutting sequences into pieces (zigzag for causal attention) and the checks
  both schemes share;
- :mod:`~kgen.distributed.attention`: causal varlen prefill as ring attention over zigzag shards, merged
  through the partial results' LSEs;
- :mod:`~kgen.distributed.gated_delta_rule`: the chunked gated delta rule over contiguous pieces, composed
  through the pieces' gathered state transitions.
"""

from kgen.distributed.attention import (ContextParallelPlan, StepCall, attention_varlen_cp,
                                        attention_varlen_cp_simulated, plan_attention_varlen_cp, shard_tokens)
from kgen.distributed.gated_delta_rule import (ContextParallelGDNPlan, chunk_gated_delta_rule_cp,
                                               chunk_gated_delta_rule_cp_simulated, plan_chunk_gated_delta_rule_cp,
                                               shard_sequences)
from kgen.distributed.shards import BACK, FRONT, Shard, shard_of, zigzag_bounds

__all__ = ["BACK", "FRONT", "ContextParallelGDNPlan", "ContextParallelPlan", "Shard", "StepCall",
           "attention_varlen_cp", "attention_varlen_cp_simulated", "chunk_gated_delta_rule_cp",
           "chunk_gated_delta_rule_cp_simulated", "plan_attention_varlen_cp", "plan_chunk_gated_delta_rule_cp",
           "shard_of", "shard_sequences", "shard_tokens", "zigzag_bounds"]
