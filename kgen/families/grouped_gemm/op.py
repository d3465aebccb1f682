"""The grouped GEMMs over experts, eagerly: checks, the variant pair, the launch by name."""

from __future__ import annotations

import torch

from kgen.families.quantize_fp8_blockwise.contract import BLOCK as QUANTIZE_BLOCK
from kgen.families.quantize_fp8_blockwise.op import new_results as new_fp8_results
from kgen.runtime.checks import check_dense_rows, check_no_overlap, check_shape, check_tensor
from kgen.runtime.dispatch import DTYPE_NAMES, spec_dtypes, tile_pair_launchers

FAMILY = "grouped_gemm"
#: Rows and K move in 16-byte pieces, and the output in 2-element pairs.
_K_MULTIPLE, _N_MULTIPLE = 8, 8
_MAX_BLOCKS = 2**31 - 1  # the grid's x dimension

_OFFS_DOC = """offs: ``[E]`` int32 on a's device: the cumulative end row of each group, as
            ``torch.nn.functional.grouped_mm`` takes it: group e holds rows ``[offs[e - 1], offs[e])`` (from row 0
            for e = 0); an expert may have no rows. The kernel reads offs on the device (no host synchronisation;
            a CUDA graph replays with new group sizes). Offs that are not non-decreasing and within [0, M] are
            clamped, never followed outside a: each group starts where the one before ended and ends at
            ``offs[e]`` clamped into [its start, M]."""


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, *, a_scale=None, b_scale=None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """One GEMM per expert over its rows: ``out[rows of e] = a[rows of e] @ b[e].T``.

    Args:
        a: ``[M, K]`` bf16 or fp16, contiguous: rows grouped by expert. K a multiple of 8.
        b: ``[E, N, K]``, a's dtype, contiguous: each expert's weight, K contiguous. N a multiple of 8.
        {offs}
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
    rows, columns = _checked(a, b, "b", offs, 1, "[E, N, K] with a's K")
    out = _result(out, a, b, "b", rows, columns)
    _launch("none", a, b, offs, out, columns)
    return out


def grouped_gemm_swiglu(a: torch.Tensor, b_gate_up: torch.Tensor, offs: torch.Tensor, *,
                        out: torch.Tensor | None = None, quantize_out: bool = False):
    """The gate and up projections of a SwiGLU MLP per expert, fused: ``silu(a_e @ gate_e.T) * (a_e @ up_e.T)``.

    Args:
        a: ``[M, K]`` bf16 or fp16, contiguous: rows grouped by expert. K a multiple of 8.
        b_gate_up: ``[E, 2I, K]``, a's dtype, contiguous, gate and up STACKED: rows ``[0, I)`` of each expert are
            its gate projection, rows ``[I, 2I)`` its up projection. I a multiple of 8 (of 128 with quantize_out).
        {offs}
        out: optional ``[M, I]`` result, as ``grouped_gemm``'s out (rows of no group never written).
        quantize_out: also return the result in FP8 e4m3 with 1 x 128 scales, exactly as
            :func:`kgen.ops.quantize_fp8_blockwise` would make them from ``out`` (the down projection's input),
            without reading ``out`` back.

    Returns:
        ``out`` ``[M, I]`` in a's dtype: silu(g) * u from the fp32 products g and u (not rounded to 16 bits first,
        as an unfused path would), rounded once. With quantize_out, ``(out, out_fp8, scales)``: ``out_fp8``
        ``[M, I]`` ``torch.float8_e4m3fn`` and ``scales`` ``[M, I / 128]`` fp32 (MN-major, strides ``(1, M')``),
        written for the rows of the groups only.
    """
    out = checked_swiglu(a, b_gate_up, offs, out, quantize_out)
    if not quantize_out:
        _launch("swiglu", a, b_gate_up, offs, out, out.shape[1])
        return out
    out_fp8, scales = new_fp8_results(out)
    quantized_swiglu_into(a, b_gate_up, offs, out, out_fp8, scales)
    return out, out_fp8, scales


def checked_swiglu(a, b_gate_up, offs, out, quantize_out: bool) -> torch.Tensor:
    """The checks of :func:`grouped_gemm_swiglu`; its ``out`` (the caller's, or a new one)."""
    rows, columns = _checked(a, b_gate_up, "b_gate_up", offs, 2, "[E, 2I, K] with a's K: gate rows, then up rows")
    if quantize_out and columns % QUANTIZE_BLOCK:
        raise ValueError(f"b_gate_up: quantize_out needs I = {columns} to be a multiple of {QUANTIZE_BLOCK} "
                         f"(whole scale blocks)")
    return _result(out, a, b_gate_up, "b_gate_up", rows, columns)


def quantized_swiglu_into(a, b_gate_up, offs, out, out_fp8, scales) -> None:
    """The quantizing launch of :func:`grouped_gemm_swiglu` into results of checked inputs, the FP8 ones made by
    ``quantize_fp8_blockwise``'s ``new_results(out)`` (the compiled op's results come from its caller)."""
    _launch("swiglu_quantize", a, b_gate_up, offs, out, out.shape[1], out_fp8=out_fp8.data_ptr(),
            scales=scales.data_ptr(), scales_stride=scales.stride(1))


for _documented in (grouped_gemm, grouped_gemm_swiglu):
    if _documented.__doc__:  # None under python -OO
        _documented.__doc__ = _documented.__doc__.format(offs=_OFFS_DOC)


def _checked(a, b, b_name: str, offs, rows_per_column: int, b_shape: str) -> tuple[int, int]:
    """(M, output columns) of checked inputs; b holds ``rows_per_column`` rows per output column."""
    check_tensor("a", a, ndim=2, dtypes=spec_dtypes(FAMILY))
    check_tensor(b_name, b, ndim=3, dtypes=(a.dtype,), device=a.device)
    rows, depth = a.shape
    experts, columns = b.shape[0], b.shape[1] // rows_per_column
    check_shape(b_name, b, (experts, columns * rows_per_column, depth), b_shape)
    check_tensor("offs", offs, ndim=1, dtypes=(torch.int32,), device=a.device)
    check_shape("offs", offs, (experts,), f"[E], one end row per expert of {b_name}")
    if not offs.is_contiguous():
        raise ValueError(f"offs: expected a contiguous tensor, got strides {offs.stride()}")
    if depth % _K_MULTIPLE:
        raise ValueError(f"a: K = {depth} must be a multiple of {_K_MULTIPLE} (rows move in 16-byte pieces)")
    if columns % _N_MULTIPLE:
        raise ValueError(f"{b_name}: {'N' if rows_per_column == 1 else 'I'} = {columns} must be a multiple of "
                         f"{_N_MULTIPLE}")
    return rows, columns


def _result(out, a, b, b_name: str, rows: int, columns: int) -> torch.Tensor:
    """The caller's out, checked, or a new one; a and b checked dense last (their shapes are known by then)."""
    if out is not None:
        check_tensor("out", out, ndim=2, dtypes=(a.dtype,), device=a.device)
        check_shape("out", out, (rows, columns), f"[M, N] of a and {b_name}")
    check_dense_rows("a", a)
    check_dense_rows(b_name, b)
    if out is None:
        return a.new_empty((rows, columns))
    check_dense_rows("out", out)
    check_no_overlap("out", out, a=a, **{b_name: b})
    return out


def _launch(epilogue: str, a, b, offs, out, columns: int, **extra) -> None:
    rows, depth = a.shape
    experts = b.shape[0]
    if rows == 0 or columns == 0 or experts == 0:
        return
    sizes, (incomplete, full) = tile_pair_launchers(FAMILY, FAMILY, a.get_device(), "a", dtype=DTYPE_NAMES[a.dtype],
                                                    epilogue=epilogue)
    # Every expert's last row tile may be partial: the row tiles number at most ceil(M / tile_m) + E.
    row_tiles, column_tiles = -(-rows // sizes["tile_m"]) + experts, -(-columns // sizes["tile_n"])
    if row_tiles * column_tiles > _MAX_BLOCKS:
        raise ValueError(f"a: {row_tiles} row tiles x {column_tiles} column tiles exceed a grid's {_MAX_BLOCKS} blocks")
    kernel = incomplete if columns % sizes["tile_n"] or depth % sizes["tile_k"] else full
    kernel.launch(row_tiles * column_tiles, a=a.data_ptr(), b=b.data_ptr(), offs=offs.data_ptr(), out=out.data_ptr(),
                  num_rows=rows, num_n=columns, num_k=depth, num_experts=experts, row_tiles=row_tiles,
                  column_tiles=column_tiles, **extra)
