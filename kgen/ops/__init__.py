"""PyTorch ops backed by kgen kernels."""

from kgen.ops.merge_states import merge_attention_states, merge_attention_states_n

__all__ = ["merge_attention_states", "merge_attention_states_n"]
