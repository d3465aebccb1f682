"""The merge kernels' launch contract (see :mod:`kgen.contract`)."""

from __future__ import annotations

from typing import Any, Mapping

from kgen.contract import LaunchContract, parameters
from kgen.dtypes import ELEMENT_TYPES


_MERGE_PARAMETERS = {
    "merge_states_2": parameters(
        "const T* v_a, const float* lse_a, long long lse_a_stride_t, long long lse_a_stride_h, "
        "const T* v_b, const float* lse_b, long long lse_b_stride_t, long long lse_b_stride_h, "
        "T* v_out, float* lse_out, long long num_rows, long long num_heads"),
    "merge_states_n": parameters(
        "const T* v, const float* lse, long long num_partials, long long v_stride_s, long long lse_stride_s, "
        "long long lse_stride_t, long long lse_stride_h, T* v_out, float* lse_out, long long num_rows, "
        "long long num_heads"),
}


def _merge_attention_states(params: Mapping[str, Any]) -> LaunchContract:
    threads = params["num_warps"] * 32
    # Each thread owns 16 bytes of a row; a block covers threads // lanes_per_row rows per pass.
    lanes_per_row = max(1, params["head_dim"] * ELEMENT_TYPES[params["dtype"]].itemsize // 16)
    return LaunchContract(
        threads=threads,
        dynamic_smem_bytes=0,
        sizes={"tile_rows": threads // lanes_per_row * params["rows_per_thread"]},
        parameters=_MERGE_PARAMETERS,
    )


CONTRACTS = {"merge_attention_states": _merge_attention_states}
