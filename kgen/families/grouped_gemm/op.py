"""The grouped GEMMs over experts, eagerly: checks, the variant pair, the launch by name."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from kgen import registry
from kgen.dtypes import ELEMENT_TYPES
from kgen.families.grouped_gemm.contract import SCALE_BLOCK, TMA_BOX_ROWS, TMA_SPAN_BYTES, result_dtype
from kgen.families.quantize_fp8_blockwise.contract import BLOCK as QUANTIZE_BLOCK
from kgen.families.quantize_fp8_blockwise.op import new_results as new_fp8_results
from kgen.runtime import tma
from kgen.runtime.checks import check_dense_rows, check_no_overlap, check_shape, check_tensor
from kgen.runtime.device import sm_count
from kgen.runtime.dispatch import (DTYPE_NAMES, SpecPathMemo, first_runnable, planning_sm, spec_dtypes,
                                   tile_pair_launchers)

FAMILY = "grouped_gemm"
#: Clusters of blocks sharing B tiles pay where the experts average at least this many rows: up to 7% faster in
#: bf16 at 1024 and 2048 rows an expert (none at DeepSeek-V3's down projection), up to 12% slower at 128 and 256
#: (bench/NOTES.md, twenty-ninth session).
CLUSTER_ROWS_PER_EXPERT = 1024
#: Rows and K move in 16-byte pieces, and the output in 2-element pairs.
_K_MULTIPLE, _N_MULTIPLE = 8, 8
_MAX_BLOCKS = 2**31 - 1  # the grid's x dimension
_MAX_TMA_ROWS = 2**31 - 1  # TMA's coordinates are 32-bit

_OFFS_DOC = """offs: ``[E]`` int32 on a's device: the cumulative end row of each group, as
            ``torch.nn.functional.grouped_mm`` takes it: group e holds rows ``[offs[e - 1], offs[e])`` (from row 0
            for e = 0); an expert may have no rows. The kernel reads offs on the device (no host synchronisation;
            a CUDA graph replays with new group sizes). Offs that are not non-decreasing and within [0, M] are
            clamped, never followed outside a: each group starts where the one before ended and ends at
            ``offs[e]`` clamped into [its start, M].
        masked_m: instead of offs, DeepGEMM's masked layout for decode: a is ``[E, M_max, K]`` and expert e's
            rows are its first ``masked_m[e]`` (int32 ``[E]`` on the device, clamped into [0, M_max]); out is
            ``[E, M_max, N]``. The grid depends on M_max alone, so a captured graph serves any masked_m."""


def grouped_gemm(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor | None = None, *,
                 masked_m: torch.Tensor | None = None, a_scale=None, b_scale=None,
                 out: torch.Tensor | None = None) -> torch.Tensor:
    """One GEMM per expert over its rows: ``out[rows of e] = a[rows of e] @ b[e].T``.

    Args:
        a: ``[M, K]`` bf16, fp16 or FP8 (``torch.float8_e4m3fn``), contiguous: rows grouped by expert. K a
            multiple of 8 (FP8: a positive multiple of 128).
        b: ``[E, N, K]``, a's dtype, contiguous: each expert's weight, K contiguous. N a multiple of 8 (FP8: of
            128).
        {offs}
        a_scale, b_scale: FP8 only, and then both: fp32 block scales, DeepGEMM's recipe. ``a_scale`` ``[M, K /
            128]`` (masked: ``[E, M_max, K / 128]``), one per row and 128-wide K block, in any strides (the
            MN-major ones :func:`kgen.ops.quantize_fp8_blockwise` returns, or row-major); ``b_scale`` ``[E, N / 128,
            K / 128]``, one per 128 x 128 block of b, contiguous. The value of a's element is its code times
            its block's scale, as :func:`kgen.ops.quantize_fp8_blockwise` makes them. Each K block's product is
            scaled and added to the result in fp32 outside the tensor core.
        out: optional ``[M, N]`` result, contiguous, sharing no memory with a or b: a's dtype, or bf16 for FP8
            inputs. Rows of no group (from the last group's end on; masked: past masked_m) are never written:
            they keep what ``out`` held (undefined for a new result).

    Returns:
        ``out``, ``[M, N]`` (masked: ``[E, M_max, N]``) in a's dtype (bf16 for FP8 inputs). Accumulation is fp32
        (FP8: the tensor core's own within each 128-wide K block, fp32 across them); each row depends on its own
        row of a alone.
    """
    groups = _checked(a, b, "b", offs, masked_m, 1, "[E, N, K] with a's K")
    scaled = _checked_scales(a, b, a_scale, b_scale)
    out = _result(out, a, b, "b", groups)
    if scaled:  # a's scales by row and K block, with the strides they have (a masked a's rows run on across experts)
        check_no_overlap("out", out, a_scale=a_scale, b_scale=b_scale)
        _launch("none", a, b, groups, out, a_scale=a_scale.data_ptr(), a_scale_row_stride=_scale_row_stride(a_scale),
                a_scale_block_stride=a_scale.stride(-1), b_scale=b_scale.data_ptr())
    else:
        _launch("none", a, b, groups, out)
    return out


def result_dtype_of(a: torch.Tensor) -> torch.dtype:
    """The result's dtype for inputs like ``a``: a's own, or bf16 for FP8 (the contract's ``result_dtype``). A dtype
    kgen has no name for keeps its own, for the checks to refuse by name."""
    name = DTYPE_NAMES.get(a.dtype)
    return a.dtype if name is None else getattr(torch, ELEMENT_TYPES[result_dtype(name)].torch_name)


def _scale_row_stride(a_scale: torch.Tensor) -> int:
    """The stride from one of a's rows to the next in a_scale, a masked a's rows running on across experts (a
    dimension of size 1 may carry any stride)."""
    if a_scale.dim() == 3 and a_scale.shape[1] == 1:
        return a_scale.stride(0)
    return a_scale.stride(-2)


def _checked_scales(a, b, a_scale, b_scale) -> bool:
    """Whether the call is FP8 (with its block scales, each checked by name) or 16-bit (with none)."""
    if a.element_size() != 1:
        if a_scale is not None or b_scale is not None:
            name = "a_scale" if a_scale is not None else "b_scale"
            raise ValueError(f"{name}: block scales go with FP8 (float8_e4m3fn) a and b; a is {a.dtype}")
        return False
    for name, scale in (("a_scale", a_scale), ("b_scale", b_scale)):
        if scale is None:
            raise ValueError(f"{name}: FP8 a and b need both block scales (a_scale [rows, K / {SCALE_BLOCK}], "
                             f"b_scale [E, N / {SCALE_BLOCK}, K / {SCALE_BLOCK}], fp32)")
    depth, columns = a.shape[-1], b.shape[1]
    if depth == 0 or depth % SCALE_BLOCK:
        raise ValueError(f"a: with FP8 inputs K = {depth} must be a positive multiple of {SCALE_BLOCK} (whole scale "
                         f"blocks)")
    if columns % SCALE_BLOCK:
        raise ValueError(f"b: with FP8 inputs N = {columns} must be a multiple of {SCALE_BLOCK} (whole scale blocks)")
    blocks = depth // SCALE_BLOCK
    check_tensor("a_scale", a_scale, ndim=a.dim(), dtypes=(torch.float32,), device=a.device)
    check_shape("a_scale", a_scale, (*a.shape[:-1], blocks), f"a's rows by its K / {SCALE_BLOCK} blocks")
    check_tensor("b_scale", b_scale, ndim=3, dtypes=(torch.float32,), device=a.device)
    check_shape("b_scale", b_scale, (b.shape[0], columns // SCALE_BLOCK, blocks),
                f"[E, N / {SCALE_BLOCK}, K / {SCALE_BLOCK}] of b")
    # a_scale is read by row and K block with its own strides (quantize_fp8_blockwise's MN-major scales as they
    # are, or row-major ones); a masked a's experts must follow each other as its rows do. b_scale is dense.
    if (a_scale.dim() == 3 and a_scale.shape[0] > 1 and a_scale.shape[1] > 1
            and a_scale.stride(0) != a_scale.shape[1] * a_scale.stride(1)):
        raise ValueError(f"a_scale: the experts' rows must follow each other (stride(0) = M_max x stride(1)), got "
                         f"strides {a_scale.stride()}")
    if not b_scale.is_contiguous():
        raise ValueError(f"b_scale: expected a contiguous tensor, got strides {b_scale.stride()}")
    return True


def grouped_gemm_swiglu(a: torch.Tensor, b_gate_up: torch.Tensor, offs: torch.Tensor | None = None, *,
                        masked_m: torch.Tensor | None = None, out: torch.Tensor | None = None,
                        quantize_out: bool = False):
    """The gate and up projections of a SwiGLU MLP per expert, fused: ``silu(a_e @ gate_e.T) * (a_e @ up_e.T)``.

    Args:
        a: ``[M, K]`` bf16 or fp16, contiguous: rows grouped by expert. K a multiple of 8.
        b_gate_up: ``[E, 2I, K]``, a's dtype, contiguous, gate and up STACKED: rows ``[0, I)`` of each expert are
            its gate projection, rows ``[I, 2I)`` its up projection. I a multiple of 8 (of 128 with quantize_out).
        {offs}
        out: optional ``[M, I]`` (masked: ``[E, M_max, I]``) result, as ``grouped_gemm``'s out (rows of no group
            never written).
        quantize_out: also return the result in FP8 e4m3 with 1 x 128 scales, exactly as
            :func:`kgen.ops.quantize_fp8_blockwise` would make them from ``out`` (the down projection's input),
            without reading ``out`` back.

    Returns:
        ``out`` in a's dtype: silu(g) * u from the fp32 products g and u (not rounded to 16 bits first, as an
        unfused path would), rounded once. With quantize_out, ``(out, out_fp8, scales)``: ``out_fp8`` shaped like
        ``out`` in ``torch.float8_e4m3fn`` and ``scales`` ``[rows, I / 128]`` fp32 (rows of out's 2-D view,
        MN-major, strides ``(1, M')``), written for the rows of the groups only.
    """
    groups, out = checked_swiglu(a, b_gate_up, offs, masked_m, out, quantize_out)
    if not quantize_out:
        _launch("swiglu", a, b_gate_up, groups, out)
        return out
    out_fp8, scales = new_fp8_results(rows_view(out))
    quantized_swiglu_into(a, b_gate_up, groups, out, out_fp8, scales)
    return out, out_fp8.view(out.shape), scales


def rows_view(t: torch.Tensor) -> torch.Tensor:
    """A contiguous result as [rows, columns] (rows of every expert in the masked layout), any size."""
    return t.view(math.prod(t.shape[:-1]), t.shape[-1])


def check_fp8_results(a, b_gate_up, out, out_fp8, scales) -> None:
    """FP8 results handed to the op (by torch.ops.kgen.grouped_gemm_swiglu_quantize): laid out as
    ``quantize_fp8_blockwise``'s ``new_results`` makes them for out's rows, apart from every input."""
    rows, columns = rows_view(out).shape
    check_tensor("out_fp8", out_fp8, ndim=2, dtypes=(torch.float8_e4m3fn,), device=a.device)
    check_shape("out_fp8", out_fp8, (rows, columns), "out's [rows, columns]")
    check_dense_rows("out_fp8", out_fp8)
    check_tensor("scales", scales, ndim=2, dtypes=(torch.float32,), device=a.device)
    check_shape("scales", scales, (rows, columns // QUANTIZE_BLOCK), "out's rows by its 128-column blocks")
    if rows and columns and (scales.stride(0) != 1 or scales.stride(1) < rows):
        raise ValueError(f"scales: expected MN-major strides (1, >= {rows}), got {scales.stride()}")
    for name, result in (("out_fp8", out_fp8), ("scales", scales)):
        check_no_overlap(name, result, a=a, b_gate_up=b_gate_up, out=out)


for _documented in (grouped_gemm, grouped_gemm_swiglu):
    if _documented.__doc__:  # None under python -OO
        _documented.__doc__ = _documented.__doc__.format(offs=_OFFS_DOC)


@dataclass(frozen=True)
class Groups:
    """How a call groups a's rows: the tensor the kernel reads (offs or masked_m), M_max of the masked layout (0
    for offs), and the result's shape."""
    tensor: torch.Tensor
    masked_rows: int
    out_shape: tuple[int, ...]


def checked_swiglu(a, b_gate_up, offs, masked_m, out, quantize_out: bool) -> tuple[Groups, torch.Tensor]:
    """The checks of :func:`grouped_gemm_swiglu`; its grouping and ``out`` (the caller's, or a new one)."""
    if a.element_size() == 1:
        raise ValueError(f"a: grouped_gemm_swiglu takes 16-bit a and b_gate_up, got {a.dtype} (FP8 inputs: "
                         f"grouped_gemm with a_scale and b_scale)")
    groups = _checked(a, b_gate_up, "b_gate_up", offs, masked_m, 2, "[E, 2I, K] with a's K: gate rows, then up rows")
    columns = groups.out_shape[-1]
    if quantize_out and columns % QUANTIZE_BLOCK:
        raise ValueError(f"b_gate_up: quantize_out needs I = {columns} to be a multiple of {QUANTIZE_BLOCK} "
                         f"(whole scale blocks)")
    return groups, _result(out, a, b_gate_up, "b_gate_up", groups)


def quantized_swiglu_into(a, b_gate_up, groups: Groups, out, out_fp8, scales) -> None:
    """The quantizing launch of :func:`grouped_gemm_swiglu` into results of checked inputs, the FP8 ones made by
    ``quantize_fp8_blockwise``'s ``new_results`` for out's 2-D view (the compiled op's come from its caller)."""
    _launch("swiglu_quantize", a, b_gate_up, groups, out, out_fp8=out_fp8.data_ptr(), scales=scales.data_ptr(),
            scales_stride=scales.stride(1))


def _checked(a, b, b_name: str, offs, masked_m, rows_per_column: int, b_shape: str) -> Groups:
    """The call's grouping, its inputs checked; b holds ``rows_per_column`` rows per output column."""
    if (offs is None) == (masked_m is None):
        raise ValueError("offs: give offs (a [M, K]) or masked_m (a [E, M_max, K]), one of the two, got "
                         f"{'both' if offs is not None else 'neither'}")
    masked = masked_m is not None
    check_tensor("a", a, ndim=3 if masked else 2, dtypes=spec_dtypes(FAMILY))
    check_tensor(b_name, b, ndim=3, dtypes=(a.dtype,), device=a.device)
    depth = a.shape[-1]
    experts, columns = b.shape[0], b.shape[1] // rows_per_column
    check_shape(b_name, b, (experts, columns * rows_per_column, depth), b_shape)
    name, tensor = ("masked_m", masked_m) if masked else ("offs", offs)
    if masked:
        check_shape("a", a, (experts, a.shape[1], depth), f"[E, M_max, K] with {b_name}'s E and K")
    check_tensor(name, tensor, ndim=1, dtypes=(torch.int32,), device=a.device)
    check_shape(name, tensor, (experts,), f"[E], one per expert of {b_name}")
    if not tensor.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {tensor.stride()}")
    if depth % _K_MULTIPLE:
        raise ValueError(f"a: K = {depth} must be a multiple of {_K_MULTIPLE} (rows move in 16-byte pieces)")
    if columns % _N_MULTIPLE:
        raise ValueError(f"{b_name}: {'N' if rows_per_column == 1 else 'I'} = {columns} must be a multiple of "
                         f"{_N_MULTIPLE}")
    return Groups(tensor, a.shape[1] if masked else 0, (*a.shape[:-1], columns))


def _result(out, a, b, b_name: str, groups: Groups) -> torch.Tensor:
    """The caller's out, checked, or a new one; a and b checked dense last (their shapes are known by then)."""
    result = result_dtype_of(a)
    if out is not None:
        check_tensor("out", out, ndim=len(groups.out_shape), dtypes=(result,), device=a.device)
        check_shape("out", out, groups.out_shape, f"a's rows by the columns of {b_name}")
    check_dense_rows("a", a)
    check_dense_rows(b_name, b)
    if out is None:
        return a.new_empty(groups.out_shape, dtype=result)
    check_dense_rows("out", out)
    check_no_overlap("out", out, a=a, **{b_name: b})
    return out


def _launch(epilogue: str, a, b, groups: Groups, out, **extra) -> None:
    depth, columns, experts = a.shape[-1], out.shape[-1], b.shape[0]
    rows = math.prod(a.shape[:-1])  # of a's 2-D view
    if rows == 0 or columns == 0 or experts == 0:
        return
    device = a.get_device()
    mma, sizes, (incomplete, full) = launchers(device, DTYPE_NAMES[a.dtype], epilogue, depth, rows, experts,
                                               bool(groups.masked_rows))
    tile_m = sizes["tile_m"]
    if groups.masked_rows:  # a fixed number of row tiles per expert
        row_tiles = experts * -(-groups.masked_rows // tile_m)
    else:  # every expert's last row tile may be partial: at most ceil(M / tile_m) + E
        row_tiles = -(-rows // tile_m) + experts
    column_tiles = -(-columns // sizes["tile_n"])
    if row_tiles * column_tiles > _MAX_BLOCKS:
        raise ValueError(f"a: {row_tiles} row tiles x {column_tiles} column tiles exceed a grid's {_MAX_BLOCKS} blocks")
    grid = row_tiles * column_tiles
    kernel = incomplete if columns % sizes["tile_n"] or depth % sizes["tile_k"] else full
    if mma == "wgmma":  # persistent: a block per SM at most, each taking every grid-th tile
        extra.update(_maps(a, b, rows, depth))
        if kernel.cluster == 1:
            grid = min(grid, sm_count(torch.device("cuda", device)))
        else:  # clusters take row tiles kernel.cluster at a time: as many clusters as run at once, or as units
            units = -(-row_tiles // kernel.cluster) * column_tiles
            grid = kernel.cluster * min(units, kernel.resident_clusters())
    kernel.launch(grid, a=a.data_ptr(), b=b.data_ptr(), offs=groups.tensor.data_ptr(),
                  out=out.data_ptr(), num_rows=rows, num_n=columns, num_k=depth, num_experts=experts,
                  row_tiles=row_tiles, column_tiles=column_tiles, masked_rows=groups.masked_rows,
                  **{"a_scale": 0, "a_scale_row_stride": 0, "a_scale_block_stride": 0, "b_scale": 0, **extra})  # FP8 only


def launchers(device: int, dtype: str, epilogue: str, depth: int, rows: int, experts: int, masked: bool):
    """The kernel (``mma``) a call takes, its variants' contract sizes and (any tiles, full tiles) launchers."""
    # K = 0 (zeros in the groups' rows) has no TMA map to make: the mma_sync kernel, which runs anywhere, takes it.
    mma = first_runnable(FAMILY, "mma", planning_sm(device), "a", dtype=dtype, epilogue=epilogue) if depth else "mma_sync"
    cluster = cluster_size(offered_clusters(dtype, epilogue, mma), rows, experts, masked)
    return mma, *tile_pair_launchers(FAMILY, FAMILY, device, "a", dtype=dtype, epilogue=epilogue, mma=mma,
                                     cluster=cluster)


def cluster_size(offered: tuple[int, ...], rows: int, experts: int, masked: bool) -> int:
    """The blocks per cluster for a call, of those the spec path offers (sorted): the most where the experts average
    :data:`CLUSTER_ROWS_PER_EXPERT` rows or more, else the fewest. The masked layout (decode) takes the fewest:
    one row tile an expert shares no B tile."""
    if not offered:  # no variant for the request: the variant lookup refuses it, naming the argument
        return 1
    return offered[-1] if not masked and rows >= CLUSTER_ROWS_PER_EXPERT * experts else offered[0]


def offered_clusters(dtype: str, epilogue: str, mma: str) -> tuple[int, ...]:
    """The cluster sizes the spec path offers for the kernel, sorted."""
    key = (dtype, epilogue, mma)
    found = _offered_clusters.get(key)
    if found is None:
        values = registry.current().family(FAMILY).supported("cluster", dtype=dtype, epilogue=epilogue, mma=mma)
        found = _offered_clusters.put(key, tuple(values))
    return found


_offered_clusters = SpecPathMemo()


#: The wgmma kernel's descriptors of a and b, per calling thread and layout.
_descriptors = tma.DescriptorCache()


def _maps(a, b, rows: int, depth: int) -> dict:
    """map_a and map_b: a's rows and b's rows (every expert's, one after the other) as [rows, 1, K] tensors of
    TMA boxes of TMA_BOX_ROWS rows by one swizzle span of K."""
    b_rows = b.shape[0] * b.shape[1]
    for name, count in (("a", rows), ("b", b_rows)):
        if count > _MAX_TMA_ROWS:
            raise ValueError(f"{name}: {count} rows exceed the {_MAX_TMA_ROWS} that TMA's 32-bit coordinates reach")
    maps = _descriptors.get((a.device.index, a.dtype, rows, b_rows, depth), tma.TensorMaps,
                            {"a": TMA_BOX_ROWS, "b": TMA_BOX_ROWS}, TMA_SPAN_BYTES)
    return {"map_a": maps.get("a", a.view(rows, 1, depth)), "map_b": maps.get("b", b.view(b_rows, 1, depth))}
