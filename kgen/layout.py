"""What the host must know about a kernel, computed once from a variant's parameters.

Threads per block, dynamic shared memory, the sizes the host shapes its work
by (tile rows, TMA boxes) and each entry's parameter list are computed here and
nowhere else. :func:`kgen.render.render` hands the layout to the template,
which ``static_assert``\\ s its own layout and signature against it; the ops,
the launcher and ``kgen build`` read the same object. A disagreement between
host and kernel therefore fails to compile (in CPU CI too) instead of becoming
a silent memory bug.

A family without a layout function here (a user's own template) gets ``None``:
kgen then knows nothing of its launch shape, and its op must supply it.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping

from kgen.dtypes import ELEMENT_TYPES


@dataclass(frozen=True)
class Parameter:
    name: str
    ctype: str  # as the template's signature spells the type, less top-level const and __restrict__

    @property
    def kind(self) -> str:
        """How the launcher passes it: ``pointer``, ``int64``, ``float32`` or ``tensor_map``."""
        if self.ctype.endswith("*"):
            return "pointer"
        return _SCALAR_KINDS[self.ctype]


_SCALAR_KINDS = {"long long": "int64", "float": "float32", "kgen::TmaDescriptor": "tensor_map"}


def _parameters(text: str) -> tuple[Parameter, ...]:
    """``"const T* q, long long n"`` -> parameters, so a signature reads here as it does in C++."""
    out = []
    for item in text.split(","):
        ctype, _, name = item.strip().rpartition(" ")
        out.append(Parameter(name, ctype.strip()))
    return tuple(out)


@dataclass(frozen=True)
class KernelLayout:
    threads: int
    dynamic_smem_bytes: int
    #: Named sizes the host relies on; the template asserts each against its own.
    sizes: Mapping[str, int]
    #: Each entry's parameters, in order.
    parameters: Mapping[str, tuple[Parameter, ...]]
    #: Entries whose block differs from ``threads``: entry -> threads (dynamic shared memory 0).
    entry_threads: Mapping[str, int] = dataclasses.field(default_factory=dict)

    def launch_shape(self, entry: str) -> tuple[int, int]:
        """(threads per block, dynamic shared-memory bytes) of ``entry``."""
        if entry in self.entry_threads:
            return self.entry_threads[entry], 0
        return self.threads, self.dynamic_smem_bytes

    def parameter_types(self, entry: str) -> str:
        """The entry's parameter types as a C++ list, for the template's signature check."""
        return ", ".join(p.ctype for p in self.parameters[entry])


#: TMA's 128-byte swizzle repeats every 1024 bytes; tiles start on such a boundary.
SWIZZLE_ALIGNMENT = 1024
#: Room for the prefill kernels' mbarriers, 8 bytes each, padded: mma.sync's three (one per
#: K/V buffer, one for Q); wgmma's nine (full and empty per K and per V buffer, one for Q).
ATTENTION_BARRIER_BYTES = {"mma_sync": 64, "wgmma": 128}
#: A warpgroup: wgmma's unit, four warps.
WARPGROUP_THREADS = 128

_QKV_MAPS = "kgen::TmaDescriptor map_q, kgen::TmaDescriptor map_k, kgen::TmaDescriptor map_v, "
# wgmma also stores full tiles of O by TMA.
_ATTENTION_MAPS = {"mma_sync": _QKV_MAPS, "wgmma": _QKV_MAPS + "kgen::TmaDescriptor map_o, "}
_ATTENTION_PARAMETERS = {mma: _parameters(maps + (
    "const T* q, const T* k, const T* v, T* out, float* lse, "
    "const int* cu_seqlens_q, const int* cu_seqlens_k, const int* work, const float* sink, "
    "long long heads_per_kv, long long q_stride_t, long long q_stride_h, long long k_stride_t, long long k_stride_h, "
    "long long v_stride_t, long long v_stride_h, long long o_stride_t, long long o_stride_h, long long lse_stride_h, "
    "float scale_log2, long long window_left, long long window_right")) for mma, maps in _ATTENTION_MAPS.items()}


def _attention_prefill(params: Mapping[str, Any]) -> KernelLayout:
    row_bytes = params["head_dim"] * ELEMENT_TYPES[params["dtype"]].itemsize
    # A TMA box spans one swizzle width of the head dim (128 bytes, or the whole row if shorter);
    # in shared memory a row takes whole spans (head dim 96's last half span is padding).
    span_bytes = min(row_bytes, 128)
    tile_row_bytes = -(-row_bytes // span_bytes) * span_bytes
    # One Q tile, two buffers each of K and V.
    tile_bytes = (params["tile_m"] + 4 * params["tile_n"]) * tile_row_bytes
    mma = params["mma"]
    # wgmma: num_warps consumer warps (a warpgroup per 64 query rows) and a producer warpgroup.
    threads = params["num_warps"] * 32 + (WARPGROUP_THREADS if mma == "wgmma" else 0)
    return KernelLayout(
        threads=threads,
        dynamic_smem_bytes=SWIZZLE_ALIGNMENT + tile_bytes + ATTENTION_BARRIER_BYTES[mma],
        # The box's span is also its swizzle width.
        sizes={"q_box_rows": params["tile_m"], "kv_box_rows": params["tile_n"], "box_span_bytes": span_bytes},
        parameters={"attention_prefill": _ATTENTION_PARAMETERS[mma]},
    )


_MERGE_PARAMETERS = {
    "merge_states_2": _parameters(
        "const T* v_a, const float* lse_a, long long lse_a_stride_t, long long lse_a_stride_h, "
        "const T* v_b, const float* lse_b, long long lse_b_stride_t, long long lse_b_stride_h, "
        "T* v_out, float* lse_out, long long num_rows, long long num_heads"),
    "merge_states_n": _parameters(
        "const T* v, const float* lse, long long num_partials, long long v_stride_s, long long lse_stride_s, "
        "long long lse_stride_t, long long lse_stride_h, T* v_out, float* lse_out, long long num_rows, "
        "long long num_heads"),
}


def _merge_attention_states(params: Mapping[str, Any]) -> KernelLayout:
    threads = params["num_warps"] * 32
    # Each thread owns 16 bytes of a row; a block covers threads // lanes_per_row rows per pass.
    lanes_per_row = max(1, params["head_dim"] * ELEMENT_TYPES[params["dtype"]].itemsize // 16)
    return KernelLayout(
        threads=threads,
        dynamic_smem_bytes=0,
        sizes={"tile_rows": threads // lanes_per_row * params["rows_per_thread"]},
        parameters=_MERGE_PARAMETERS,
    )


_GDN_STEP_PARAMETERS = _parameters(
    "const T* q, const T* k, const T* v, const float* g, const void* beta, long long beta_is_fp32, float* state, "
    "const int* state_indices, T* out, long long num_heads, long long num_heads_v, float scale, "
    "long long use_qk_l2norm")


def _gated_delta_rule_step(params: Mapping[str, Any]) -> KernelLayout:
    # A block per (value slice, v-head, sequence); its reductions use static shared memory only.
    return KernelLayout(threads=params["num_warps"] * 32, dynamic_smem_bytes=0,
                        sizes={"v_slice": params["tile_n"]},
                        parameters={"gated_delta_rule_step": _GDN_STEP_PARAMETERS})


_GDN_KKT_PARAMETERS = _parameters(
    "const T* k, const float* g, const void* beta, long long beta_is_fp32, const int* chunks, T* tbeta, "
    "long long num_heads, long long num_heads_v, long long use_qk_l2norm")


def _gated_delta_rule_kkt(params: Mapping[str, Any]) -> KernelLayout:
    # A block per (chunk, q/k head); static shared memory only.
    return KernelLayout(threads=params["num_warps"] * 32, dynamic_smem_bytes=0, sizes={"chunk": params["tile_m"]},
                        parameters={"gated_delta_rule_kkt": _GDN_KKT_PARAMETERS})


_GDN_RECURRENCE_PARAMETERS = _parameters(
    "kgen::TmaDescriptor map_q, kgen::TmaDescriptor map_k, kgen::TmaDescriptor map_v, kgen::TmaDescriptor map_tbeta, "
    "const T* q, const T* k, const T* v, const float* g, const T* tbeta, const int* segments, "
    "const float* initial_state, const float* start_states, float* summary, T* out, float* final_state, "
    "long long num_heads, long long num_heads_v, float scale, long long use_qk_l2norm")
#: Fields of a segment row (kgen/ops/gdn_plan.py writes them, the recurrence reads them).
GDN_SEGMENT_FIELDS = 8
#: The chain's block: value columns per block and threads.
GDN_CHAIN_COLUMNS, GDN_CHAIN_THREADS = 32, 256


def _gated_delta_rule_chunk(params: Mapping[str, Any]) -> KernelLayout:
    itemsize = ELEMENT_TYPES[params["dtype"]].itemsize
    chunk, head_dim, slice_v = params["tile_m"], params["head_dim"], params["tile_n"]
    # K twice, Q, the V slice and Tbeta once; S^T's 16-bit copy; W (then Vn) and decayed Vn; five
    # mbarriers and q's and k's l2norm row scales, padded to 64 bytes; from a swizzle-aligned base.
    elements = 3 * chunk * head_dim + chunk * slice_v + chunk * chunk + head_dim * slice_v + 2 * chunk * slice_v
    small_bytes = -(-(5 * 8 + 2 * chunk * 4) // 64) * 64
    return KernelLayout(
        threads=params["num_warps"] * 32, dynamic_smem_bytes=SWIZZLE_ALIGNMENT + elements * itemsize + small_bytes,
        sizes={"value_slice": slice_v, "chunk": chunk, "segment_fields": GDN_SEGMENT_FIELDS, "box_span_bytes": 128,
               "chain_columns": GDN_CHAIN_COLUMNS, "chain_threads": GDN_CHAIN_THREADS},
        parameters={"gated_delta_rule_chunk": _GDN_RECURRENCE_PARAMETERS,
                    "gated_delta_rule_chunk_summary": _GDN_RECURRENCE_PARAMETERS,
                    "gated_delta_rule_chunk_chain": _parameters(
                        "const float* summary, const float* initial_state, float* start_states, const int* chains, "
                        "long long num_heads_v")},
        entry_threads={"gated_delta_rule_chunk_chain": GDN_CHAIN_THREADS})


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


def _attention_decode(params: Mapping[str, Any]) -> KernelLayout:
    row_bytes = params["head_dim"] * ELEMENT_TYPES[params["dtype"]].itemsize
    warps, slice_rows = params["num_warps"], params["tile_n"]
    # Q's rows; per warp and stage a K and a V slice; each warp's row LSEs and a flag; an mbarrier per warp and stage.
    pipeline = warps * params["stages"] * 2 * slice_rows * row_bytes
    small = warps * DECODE_ROWS_PER_BLOCK * 4 + 16 + warps * params["stages"] * 8
    maps = "kgen::TmaDescriptor map_k, kgen::TmaDescriptor map_v, " if params["kv_load"] == "tma" else ""
    return KernelLayout(
        threads=warps * 32,
        dynamic_smem_bytes=SWIZZLE_ALIGNMENT + DECODE_ROWS_PER_BLOCK * row_bytes + pipeline + small,
        sizes={"kv_box_rows": slice_rows, "cta_keys": warps * slice_rows, "rows_per_block": DECODE_ROWS_PER_BLOCK,
               "box_span_bytes": 128},
        parameters={"attention_decode": _parameters(maps + _DECODE_PARAMETERS)},
    )


_LAYOUTS: dict[str, Callable[[Mapping[str, Any]], KernelLayout]] = {
    "attention_prefill": _attention_prefill,
    "attention_decode": _attention_decode,
    "merge_attention_states": _merge_attention_states,
    "gated_delta_rule_step": _gated_delta_rule_step,
    "gated_delta_rule_kkt": _gated_delta_rule_kkt,
    "gated_delta_rule_chunk": _gated_delta_rule_chunk,
}


def layout_of(variant) -> KernelLayout | None:
    """The layout of ``variant`` (a :class:`kgen.registry.Variant`), or None if its family has none here."""
    return _layout(variant.family.name, variant.params)


# Ops ask on every call; a layout depends on the family and the parameters alone.
@functools.lru_cache(maxsize=1024)
def _layout(family: str, params: tuple) -> KernelLayout | None:
    function = _LAYOUTS.get(family)
    return function(dict(params)) if function is not None else None
