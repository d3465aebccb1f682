"""The grouped GEMM over experts, eagerly: checks, the variant pair, the launch by name."""

from __future__ import annotations

import torch

from kgen.runtime.checks import check_dense_rows, check_no_overlap, check_shape, check_tensor
from kgen.runtime.dispatch import dtype_tile_pair, spec_dtypes

FAMILY = "grouped_gemm"
#: Rows and K move in 16-byte pieces, and the output in 2-element pairs.
_K_MULTIPLE, _N_MULTIPLE = 8, 8
_MAX_BLOCKS = 2**31 - 1  # the grid's x dimension


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, *, a_scale=None, b_scale=None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """One GEMM per expert over its rows: ``out[rows of e] = a[rows of e] @ b[e].T``.

    Args:
        a: ``[M, K]`` bf16 or fp16, contiguous: rows grouped by expert. K a multiple of 8.
        b: ``[E, N, K]``, a's dtype, contiguous: each expert's weight, K contiguous. N a multiple of 8.
        offs: ``[E]`` int32 on a's device: the cumulative end row of each group, as
            ``torch.nn.functional.grouped_mm`` takes it: group e holds rows ``[offs[e - 1], offs[e])`` (from row 0
            for e = 0); an expert may have no rows. The kernel reads offs on the device (no host synchronisation;
            a CUDA graph replays with new group sizes). Offs that are not non-decreasing and within [0, M] are
            clamped, never followed outside a: each group starts where the one before ended and ends at
            ``offs[e]`` clamped into [its start, M].
        a_scale, b_scale: the FP8 path's block scales; FP8 is not built yet (issue 26), so they must be None.
        out: optional ``[M, N]`` result, a's dtype, contiguous, sharing no memory with a or b. Rows of no group
            (from the last group's end on) are never written: they keep what ``out`` held (undefined for a new
            result).

    Returns:
        ``out``, ``[M, N]`` in a's dtype. Accumulation is fp32; each row depends on its own row of a alone.
    """
    if a_scale is not None or b_scale is not None:
        name = "a_scale" if a_scale is not None else "b_scale"
        raise ValueError(f"{name}: FP8 inputs with block scales are not built yet; pass bf16 or fp16 a and b "
                         f"without scales")
    check_tensor("a", a, ndim=2, dtypes=spec_dtypes(FAMILY))
    check_tensor("b", b, ndim=3, dtypes=(a.dtype,), device=a.device)
    rows, depth = a.shape
    experts, columns = b.shape[0], b.shape[1]
    check_shape("b", b, (experts, columns, depth), "[E, N, K] with a's K")
    check_tensor("offs", offs, ndim=1, dtypes=(torch.int32,), device=a.device)
    check_shape("offs", offs, (experts,), "[E], one end row per expert of b")
    if not offs.is_contiguous():
        raise ValueError(f"offs: expected a contiguous tensor, got strides {offs.stride()}")
    if depth % _K_MULTIPLE:
        raise ValueError(f"a: K = {depth} must be a multiple of {_K_MULTIPLE} (rows move in 16-byte pieces)")
    if columns % _N_MULTIPLE:
        raise ValueError(f"b: N = {columns} must be a multiple of {_N_MULTIPLE}")
    if out is not None:
        check_tensor("out", out, ndim=2, dtypes=(a.dtype,), device=a.device)
        check_shape("out", out, (rows, columns), "[M, N] of a and b")
    check_dense_rows("a", a)
    check_dense_rows("b", b)
    if out is None:
        out = a.new_empty((rows, columns))
    else:
        check_dense_rows("out", out)
        check_no_overlap("out", out, a=a, b=b)
    if rows == 0 or columns == 0 or experts == 0:
        return out
    sizes, (incomplete, full) = dtype_tile_pair(FAMILY, FAMILY, a.get_device(), a.dtype, "a")
    # Every expert's last row tile may be partial: the row tiles number at most ceil(M / tile_m) + E.
    row_tiles, column_tiles = -(-rows // sizes["tile_m"]) + experts, -(-columns // sizes["tile_n"])
    if row_tiles * column_tiles > _MAX_BLOCKS:
        raise ValueError(f"a: {row_tiles} row tiles x {column_tiles} column tiles exceed a grid's {_MAX_BLOCKS} blocks")
    kernel = incomplete if columns % sizes["tile_n"] or depth % sizes["tile_k"] else full
    kernel.launch(row_tiles * column_tiles, a=a.data_ptr(), b=b.data_ptr(), offs=offs.data_ptr(), out=out.data_ptr(),
                  num_rows=rows, num_n=columns, num_k=depth, num_experts=experts, row_tiles=row_tiles,
                  column_tiles=column_tiles)
    return out
