"""The gated delta rule kernels' launch contracts (see :mod:`kgen.contract`)."""

from __future__ import annotations

from typing import Any, Mapping

from kgen.contract import LaunchContract, SWIZZLE_ALIGNMENT, parameters
from kgen.dtypes import ELEMENT_TYPES


_GDN_STEP_PARAMETERS = parameters(
    "const T* q, const T* k, const T* v, const float* g, const void* beta, long long beta_is_fp32, float* state, "
    "const int* state_indices, long long num_slots, T* out, long long num_heads, long long num_heads_v, "
    "float scale, long long use_qk_l2norm")


def _gated_delta_rule_step(params: Mapping[str, Any]) -> LaunchContract:
    # A block per (value slice, v-head, sequence); its reductions use static shared memory only.
    return LaunchContract(threads=params["num_warps"] * 32, dynamic_smem_bytes=0,
                        sizes={"v_slice": params["tile_n"]},
                        parameters={"gated_delta_rule_step": _GDN_STEP_PARAMETERS})


_GDN_KKT_PARAMETERS = parameters(
    "const T* k, const float* g, const void* beta, long long beta_is_fp32, const int* chunks, long long num_chunks, "
    "long long chunks_per_block, T* tbeta, float* gamma_log2, long long num_heads, long long num_heads_v, "
    "long long use_qk_l2norm")


def _gated_delta_rule_kkt(params: Mapping[str, Any]) -> LaunchContract:
    # A block per chunks_per_block chunks of a q/k head; static shared memory only.
    return LaunchContract(threads=params["num_warps"] * 32, dynamic_smem_bytes=0, sizes={"chunk": params["tile_m"]},
                        parameters={"gated_delta_rule_kkt": _GDN_KKT_PARAMETERS})


_GDN_RECURRENCE_PARAMETERS = parameters(
    "kgen::TmaDescriptor map_q, kgen::TmaDescriptor map_k, kgen::TmaDescriptor map_v, kgen::TmaDescriptor map_tbeta, "
    "const T* q, const T* k, const T* v, const T* tbeta, const float* gamma_log2, const int* segments, "
    "const void* cu_seqlens, long long cu_seqlens_is_int64, const float* initial_state, const float* start_states, "
    "float* summary, int* negligible_summaries, T* out, unsigned char* state_residuals, float* final_state, "
    "long long num_heads, long long num_heads_v, float scale, long long use_qk_l2norm, float negligible_log_decay")
_GDN_REVERSE_PARAMETERS = parameters(
    "const T* q, const T* k, const float* g, const T* tbeta, const T* d_out, const float* d_final_state, "
    "const void* cu_seqlens, long long cu_seqlens_is_int64, const int* segments, const float* gamma_log2, "
    "const float* end_states, float* summary, int* negligible_summaries, T* d_states, "
    "unsigned char* d_state_residuals, float* d_initial_state, long long num_heads, long long num_heads_v, float scale, "
    "float negligible_log_decay")
_GDN_GRADS_PARAMETERS = parameters(
    "const T* q, const T* k, const T* v, const float* g, const void* beta, long long beta_is_fp32, const int* chunks, "
    "long long num_chunks, const T* tbeta, const T* states, const T* d_states, const unsigned char* state_residuals, "
    "const unsigned char* d_state_residuals, const T* d_out, float* dq, float* dk, T* dv, float* dg, float* dbeta, "
    "long long num_heads, long long num_heads_v, float scale")
#: The per-chunk gradients' block: threads.
GDN_GRADS_THREADS = 256
#: Fields of a segment row, as the planner writes them and the recurrence reads them (recurrence.cuh's
#: SegmentField): the segment's tokens and chunks, its summary and start-state slots (-1: none), whether it
#: writes its sequence's final state, and its sequence's first token, which with ``end_token`` are the bounds
#: the kernel checks the call's cu_seqlens against.
GDN_SEGMENT_FIELDS = ("sequence", "first_token", "end_token", "first_chunk", "chunks", "summary_slot", "start_slot",
                      "writes_final", "sequence_start")
#: An SM's 32-bit registers (sm_90), which bound the forward's blocks an SM.
GDN_REGISTERS_PER_SM = 65536
#: The chain's block: value columns per block and threads.
GDN_CHAIN_COLUMNS, GDN_CHAIN_THREADS = 8, 256


def _chain_dynamic_smem_bytes(head_dim: int) -> int:
    """The chain's running state (its columns) and two stages, each a summary's M and its h columns, fp32, every
    row padded by 16 bytes (chunk.cu.j2's ChainShared)."""
    column_rows = head_dim * (GDN_CHAIN_COLUMNS + 4)
    return 4 * (column_rows + 2 * (head_dim * (head_dim + 4) + column_rows))


def _reverse_dynamic_smem_bytes(chunk: int, head_dim: int, slice_v: int, itemsize: int) -> int:
    """reverse.cuh's Shared: two chunks' Q and K; a dO slice and Tbeta; dS'^T's 16-bit copy; dVn (then the gated
    Y); from a swizzle-aligned base."""
    elements = 2 * 2 * chunk * head_dim + chunk * slice_v + chunk * chunk + slice_v * head_dim + chunk * slice_v
    return SWIZZLE_ALIGNMENT + elements * itemsize


def _grads_dynamic_smem_bytes(chunk: int, head_dim: int, itemsize: int) -> int:
    """local_grads.cuh's Shared: Q, K, V, dO and two wide scratch tiles (chunk x head_dim), S^T and dS'^T (head_dim
    x head_dim), Tbeta, T and X (chunk x chunk), unpadded (swizzled); two fp32 chunk x chunk scratch tiles, rows of
    chunk + 4; eight per-row float vectors and a float per warp; a swizzle repeat of alignment slack."""
    tiles = (6 * chunk * head_dim + 2 * head_dim * head_dim + 3 * chunk * chunk) * itemsize
    return tiles + 2 * chunk * (chunk + 4) * 4 + (8 * chunk + GDN_GRADS_THREADS // 32) * 4 + SWIZZLE_ALIGNMENT


def _gated_delta_rule_chunk(params: Mapping[str, Any]) -> LaunchContract:
    itemsize = ELEMENT_TYPES[params["dtype"]].itemsize
    chunk, head_dim, slice_v = params["tile_m"], params["head_dim"], params["tile_n"]
    def smem_bytes_of(slices: int) -> int:
        # K and Tbeta twice, Q once; per value slice V twice, S^T's 16-bit copy and Vn^T's; seven mbarriers, the
        # l2norm row scales (q's, and k's twice) and each state warp's two gate factors a token, padded to 64 bytes;
        # from a swizzle-aligned base (recurrence.cuh's Tiles).
        elements = 3 * chunk * head_dim + 2 * chunk * chunk + slices * (3 * chunk * slice_v + head_dim * slice_v)
        small_bytes = -(-(7 * 8 + 3 * chunk * 4 + slices * params["num_warps"] * chunk * 8) // 64) * 64
        return SWIZZLE_ALIGNMENT + elements * itemsize + small_bytes

    smem_bytes = smem_bytes_of(1)
    # The forward's blocks: gated_delta_rule_chunk_slice's own a value slice, with a second warpgroup, which
    # computes the output; gated_delta_rule_chunk's the whole head dim, a state warpgroup per value slice and
    # one output warpgroup. min_blocks_per_sm counts one-slice blocks.
    wide_slices = max(head_dim // slice_v, 1)  # a tile_n that does not divide head_dim fails in the template
    slice_threads = 2 * params["num_warps"] * 32
    wide_threads = (wide_slices + 1) * params["num_warps"] * 32
    wide_smem = smem_bytes_of(wide_slices)
    # As many as min_blocks_per_sm asks (it counts one-slice blocks) and the registers allow: a state warpgroup
    # needs head_dim / 2 + 96 a thread (chunk.cu.j2's kChainRegisters).
    chain_registers = head_dim // 2 + 96
    def blocks_that_fit(wanted: int, threads: int) -> int:
        return max(min(wanted, GDN_REGISTERS_PER_SM // (threads * chain_registers)), 1)
    slice_blocks_per_sm = blocks_that_fit(params["min_blocks_per_sm"], slice_threads)
    wide_blocks_per_sm = blocks_that_fit(params["min_blocks_per_sm"] // wide_slices, wide_threads)
    reverse_smem = _reverse_dynamic_smem_bytes(chunk, head_dim, slice_v, itemsize)
    grads_smem = _grads_dynamic_smem_bytes(chunk, head_dim, itemsize)
    return LaunchContract(
        threads=params["num_warps"] * 32, dynamic_smem_bytes=smem_bytes,
        sizes={"value_slice": slice_v, "chunk": chunk, "segment_fields": len(GDN_SEGMENT_FIELDS), "box_span_bytes": 128,
               "chain_columns": GDN_CHAIN_COLUMNS, "chain_threads": GDN_CHAIN_THREADS,
               "chain_dynamic_smem_bytes": _chain_dynamic_smem_bytes(head_dim),
               "reverse_dynamic_smem_bytes": reverse_smem, "grads_dynamic_smem_bytes": grads_smem,
               "grads_threads": GDN_GRADS_THREADS, "slice_threads": slice_threads, "wide_threads": wide_threads,
               "wide_value_width": wide_slices * slice_v, "wide_dynamic_smem_bytes": wide_smem,
               "wide_blocks_per_sm": wide_blocks_per_sm, "slice_blocks_per_sm": slice_blocks_per_sm},
        parameters={"gated_delta_rule_chunk": _GDN_RECURRENCE_PARAMETERS,
                    "gated_delta_rule_chunk_slice": _GDN_RECURRENCE_PARAMETERS,
                    "gated_delta_rule_chunk_summary": _GDN_RECURRENCE_PARAMETERS,
                    "gated_delta_rule_chunk_states": _GDN_RECURRENCE_PARAMETERS,
                    "gated_delta_rule_chunk_reverse": _GDN_REVERSE_PARAMETERS,
                    "gated_delta_rule_chunk_reverse_summary": _GDN_REVERSE_PARAMETERS,
                    "gated_delta_rule_chunk_grads": _GDN_GRADS_PARAMETERS,
                    "gated_delta_rule_chunk_chain": parameters(
                        "const float* summary, const int* negligible_summaries, const float* initial_state, "
                        "float* start_states, const int* chains, "
                        "long long num_heads_v, long long reverse_order")},
        entry_shapes={"gated_delta_rule_chunk": (wide_threads, wide_smem),
                      "gated_delta_rule_chunk_slice": (slice_threads, smem_bytes),
                      "gated_delta_rule_chunk_chain": (GDN_CHAIN_THREADS, _chain_dynamic_smem_bytes(head_dim)),
                      "gated_delta_rule_chunk_reverse": (params["num_warps"] * 32, reverse_smem),
                      "gated_delta_rule_chunk_reverse_summary": (params["num_warps"] * 32, reverse_smem),
                      "gated_delta_rule_chunk_grads": (GDN_GRADS_THREADS, grads_smem)})


CONTRACTS = {
    "gated_delta_rule_step": _gated_delta_rule_step,
    "gated_delta_rule_kkt": _gated_delta_rule_kkt,
    "gated_delta_rule_chunk": _gated_delta_rule_chunk,
}
