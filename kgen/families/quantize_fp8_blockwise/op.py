"""Per-row block quantization to FP8, eagerly: checks, the variant pair, the launch by name."""

from __future__ import annotations

import torch

from kgen.runtime.checks import check_dense_rows, check_tensor
from kgen.runtime.dispatch import DTYPE_NAMES, spec_dtypes, tile_pair_launchers
from kgen.families.quantize_fp8_blockwise.contract import BLOCK

FAMILY = "quantize_fp8_blockwise"
#: The scale tensor's rows (per column block) are padded to this many floats: 16 bytes, as TMA wants.
SCALE_ROW_ALIGNMENT = 4


def scale_storage_rows(num_rows: int) -> int:
    """The padded length of each column block's scales in their MN-major storage."""
    return -(-num_rows // SCALE_ROW_ALIGNMENT) * SCALE_ROW_ALIGNMENT


def quantize_fp8_blockwise(x: torch.Tensor, block: int = BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """Quantize each row's ``block``-element blocks to FP8 e4m3, with one fp32 scale per block.

    Per row i and block j: ``amax = max |x[i, block j]|``, ``s = max(amax, 1e-4) / 448`` and
    ``q = e4m3(x * (1 / s))`` rounded to nearest (the product never exceeds 448 but by rounding, which saturates),
    so ``q.float() * s`` dequantizes with the error of e4m3's 3-bit mantissa. DeepGEMM's recipe, the A side of
    an FP8 grouped GEMM (:func:`kgen.ops.grouped_gemm` is to come, issue 26).

    Args:
        x: ``[M, K]`` bf16, fp16 or fp32 (the spec's dtypes), contiguous, on a CUDA device; K a multiple of ``block``.
        block: columns per scale; 128, the only width built.

    Returns:
        ``(x_fp8, scales)``: ``x_fp8`` ``[M, K]`` ``torch.float8_e4m3fn``, contiguous; ``scales`` ``[M, K / block]``
        fp32 as a view of MN-major storage (strides ``(1, M')``, M' = M rounded up to 4), the layout an FP8
        GEMM's TMA reads the A scales in.

    NaN and Inf: a NaN in a block makes its scale and all its codes NaN; an Inf makes its scale Inf, its finite
    values 0 and its infinities NaN (so the block dequantizes to NaN, as with torch arithmetic). Rows never mix.
    No host synchronisation; safe to capture in a CUDA graph.
    """
    if block != BLOCK:
        raise ValueError(f"block: only {BLOCK}-column blocks are built, got {block!r}")
    check_tensor("x", x, ndim=2, dtypes=spec_dtypes(FAMILY))
    rows, columns = x.shape
    if columns % BLOCK:
        raise ValueError(f"x: the row length K = {columns} must be a multiple of block = {BLOCK}")
    check_dense_rows("x", x)
    x_fp8, scales = new_results(x)
    quantize_into(x, x_fp8, scales)
    return x_fp8, scales


def new_results(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Uninitialised codes and scales for a checked ``x``, laid out as :func:`quantize_fp8_blockwise` returns them."""
    rows, columns = x.shape
    # [M, K / 128] over MN-major storage: column block j's scales start at j * M' (M' >= 1 for an empty batch).
    scales = x.new_empty_strided((rows, columns // BLOCK), (1, max(scale_storage_rows(rows), 1)), dtype=torch.float32)
    return x.new_empty((rows, columns), dtype=torch.float8_e4m3fn), scales


def quantize_into(x: torch.Tensor, x_fp8: torch.Tensor, scales: torch.Tensor) -> None:
    """The launch, into results made by :func:`new_results` for a checked ``x`` (tests fill them with NaN first)."""
    rows, blocks = scales.shape
    if rows == 0 or blocks == 0:
        return
    sizes, (incomplete, full) = tile_pair_launchers(FAMILY, FAMILY, x.get_device(), "x", dtype=DTYPE_NAMES[x.dtype])
    tile_rows, warps = sizes["tile_rows"], sizes["warps"]
    items = -(-rows // tile_rows) * blocks  # (row group, column block) per warp
    kernel = incomplete if rows % tile_rows or items % warps else full
    kernel.launch(-(-items // warps), x=x.data_ptr(), x_fp8=x_fp8.data_ptr(), scales=scales.data_ptr(),
                  scales_stride=scales.stride(1), num_rows=rows, num_blocks=blocks)
