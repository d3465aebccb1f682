"""Input checks of the merge ops that need no GPU: they fail before any launch."""

import pytest
import torch

from kgen.ops import merge_attention_states, merge_attention_states_n


def test_cpu_tensors_are_refused_by_name():
    v = torch.randn(2, 8, 4, 128)
    lse = torch.randn(2, 8, 4)
    with pytest.raises(ValueError, match="v_a: expected a CUDA tensor"):
        merge_attention_states(v[0], lse[0], v[1], lse[1])
    with pytest.raises(ValueError, match="v: expected a CUDA tensor"):
        merge_attention_states_n(v, lse)


def test_non_tensors_are_refused_by_name():
    with pytest.raises(TypeError, match="v_a: expected a torch.Tensor"):
        merge_attention_states([1.0], None, None, None)
    with pytest.raises(TypeError, match="v: expected a torch.Tensor"):
        merge_attention_states_n("v", None)
