"""The decode kernel's launch contract (see :mod:`kgen.contract`)."""

from __future__ import annotations

from typing import Any, Mapping

from kgen.contract import LaunchContract, SWIZZLE_ALIGNMENT, parameters
from kgen.dtypes import ELEMENT_TYPES


_DECODE_PARAMETERS = (
    "const T* q, const T* k, const T* v, T* out, float* lse, const int* seqlens_k, const int* block_table, "
    "const float* sink, float* partial_o, float* partial_lse, int* counters, long long q_len, long long heads_per_kv, "
    "long long num_heads_q, long long q_stride_b, long long q_stride_t, long long q_stride_h, "
    "long long k_stride_page, long long k_stride_t, long long k_stride_h, "
    "long long v_stride_page, long long v_stride_t, long long v_stride_h, "
    "long long page_size, long long num_pages, long long block_table_stride, long long kv_capacity, "
    "long long max_splits, long long tiles_per_split, long long row_groups, float scale_log2, long long window_left")
#: Packed query rows (Lq tokens x the heads of a GQA group) per decode block: one 16-row mma block.
DECODE_ROWS_PER_BLOCK = 16


def _attention_decode(params: Mapping[str, Any]) -> LaunchContract:
    row_bytes = params["head_dim"] * ELEMENT_TYPES[params["dtype"]].itemsize
    warps, slice_rows = params["num_warps"], params["tile_n"]
    # Q's rows; per warp and stage a K and a V slice; each warp's row LSEs and a flag; an mbarrier per warp and stage.
    pipeline = warps * params["stages"] * 2 * slice_rows * row_bytes
    small = warps * DECODE_ROWS_PER_BLOCK * 4 + 16 + warps * params["stages"] * 8
    maps = "kgen::TmaDescriptor map_k, kgen::TmaDescriptor map_v, " if params["kv_load"] == "tma" else ""
    return LaunchContract(
        threads=warps * 32,
        dynamic_smem_bytes=SWIZZLE_ALIGNMENT + DECODE_ROWS_PER_BLOCK * row_bytes + pipeline + small,
        sizes={"kv_box_rows": slice_rows, "cta_keys": warps * slice_rows, "rows_per_block": DECODE_ROWS_PER_BLOCK,
               "box_span_bytes": 128},
        parameters={"attention_decode": parameters(maps + _DECODE_PARAMETERS)},
    )


CONTRACTS = {"attention_decode": _attention_decode}
