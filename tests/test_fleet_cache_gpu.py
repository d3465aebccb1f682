"""A node that only imported a cache archive compiles nothing on the first call of any op (GPU)."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

sys.path.insert(0, str(Path(__file__).parent))
import first_call  # noqa: E402


def test_first_calls_with_an_imported_cache_compile_nothing(tmp_path):
    imported, empty = first_call.fleet_run(tmp_path)
    assert set(imported) == set(empty) and len(imported) == 6
    for op, result in imported.items():
        assert result["compiled"] == 0, f"{op} compiled {result['compiled']} kernels despite the imported cache"
    # The same calls with an empty cache do compile: the counter counts. merge_attention_states_n's kernel
    # is in the module merge_attention_states's first call compiled (one variant, both entries).
    shares_a_module = {"merge_attention_states_n"}
    assert all(result["compiled"] > 0 for op, result in empty.items() if op not in shares_a_module), empty
    assert empty["merge_attention_states_n"]["compiled"] == 0 < empty["merge_attention_states"]["compiled"], empty
