"""The prefill kernels' launch contract (see :mod:`kgen.contract`)."""

from __future__ import annotations

from typing import Any, Mapping

from kgen.contract import LaunchContract, SWIZZLE_ALIGNMENT, WARPGROUP_THREADS, parameters
from kgen.dtypes import ELEMENT_TYPES


#: Room for the prefill kernels' mbarriers, 8 bytes each, padded: mma.sync's three (one per
#: K/V buffer, one for Q); wgmma's nine (full and empty per K and per V buffer, one for Q).
ATTENTION_BARRIER_BYTES = {"mma_sync": 64, "wgmma": 128}

#: A work item's fields, as the planner writes them (:func:`kgen.families.attention_prefill.plan.plan_tiles`) and
#: rows.cuh reads them: the query tile, and the bounds the plan made it for, which the kernel addresses by and
#: checks against the call's cu_seqlens. A packed item (rows=packed, :func:`~kgen.families.attention_prefill.plan.
#: plan_packed_tiles`) fills the same six with its first and last sequence, its tokens and its keys.
ATTENTION_WORK_FIELDS = ("sequence", "query_tile", "query_start", "query_end", "key_start", "key_end")

_QKV_MAPS = "kgen::TmaDescriptor map_q, kgen::TmaDescriptor map_k, kgen::TmaDescriptor map_v, "
# wgmma also stores full tiles of O by TMA.
_ATTENTION_MAPS = {"mma_sync": _QKV_MAPS, "wgmma": _QKV_MAPS + "kgen::TmaDescriptor map_o, "}
_ATTENTION_PARAMETERS = {mma: parameters(maps + (
    "const T* q, const T* k, const T* v, T* out, float* lse, "
    "const int* cu_seqlens_q, const int* cu_seqlens_k, const int* work, const int* plan_cu_seqlens, const float* sink, "
    "long long heads_per_kv, long long q_stride_t, long long q_stride_h, long long k_stride_t, long long k_stride_h, "
    "long long v_stride_t, long long v_stride_h, long long o_stride_t, long long o_stride_h, long long lse_stride_h, "
    "float scale_log2, long long window_left, long long window_right, long long heads_fastest"))
    for mma, maps in _ATTENTION_MAPS.items()}


def _attention_prefill(params: Mapping[str, Any]) -> LaunchContract:
    row_bytes = params["head_dim"] * ELEMENT_TYPES[params["dtype"]].itemsize
    # A TMA box spans one swizzle width of the head dim (128 bytes, or the whole row if shorter);
    # in shared memory a row takes whole spans (head dim 96's last half span is padding).
    span_bytes = min(row_bytes, 128)
    tile_row_bytes = -(-row_bytes // span_bytes) * span_bytes
    mma = params["mma"]
    # wgmma from three blocks an SM: one warpgroup, no producer, one buffer each of K and V (its template says why).
    single_warpgroup = mma == "wgmma" and params["min_blocks_per_sm"] >= 3
    # One Q tile, and two buffers each of K and V (one in a single warpgroup).
    tile_bytes = (params["tile_m"] + (2 if single_warpgroup else 4) * params["tile_n"]) * tile_row_bytes
    # wgmma: num_warps consumer warps (a warpgroup per 64 query rows) and a producer warpgroup.
    threads = params["num_warps"] * 32 + (WARPGROUP_THREADS if mma == "wgmma" and not single_warpgroup else 0)
    return LaunchContract(
        threads=threads,
        dynamic_smem_bytes=SWIZZLE_ALIGNMENT + tile_bytes + ATTENTION_BARRIER_BYTES[mma],
        # The box's span is also its swizzle width.
        sizes={"q_box_rows": params["tile_m"], "kv_box_rows": params["tile_n"], "box_span_bytes": span_bytes,
               "work_fields": len(ATTENTION_WORK_FIELDS)},
        parameters={"attention_prefill": _ATTENTION_PARAMETERS[mma]},
    )


CONTRACTS = {"attention_prefill": _attention_prefill}
