"""The grouped GEMM kernel's launch contract (see :mod:`kgen.contract`)."""

from __future__ import annotations

from typing import Any, Mapping

from kgen.contract import LaunchContract, SWIZZLE_ALIGNMENT, WARPGROUP_THREADS, parameters
from kgen.dtypes import ELEMENT_TYPES

_COMMON = ("const TIn* a, const TIn* b, const float* a_scale, long long a_scale_row_stride, long long a_scale_block_stride, "
           "const float* b_scale, const int* offs, T* out, "
           "long long num_rows, long long num_n, long long num_k, long long num_experts, long long row_tiles, "
           "long long column_tiles, long long masked_rows")
#: FP8 inputs give a bf16 result; 16-bit inputs one of their own type.
FP8_RESULT_DTYPE = "bf16"
#: FP8's scale blocks: a's 1 x SCALE_BLOCK per row, b's SCALE_BLOCK x SCALE_BLOCK.
SCALE_BLOCK = 128
#: Per epilogue: swiglu_quantize also writes the FP8 codes and their MN-major scales.
_EPILOGUE_PARAMETERS = {"none": "", "swiglu": "", "swiglu_quantize": ", unsigned char* out_fp8, float* scales, long long scales_stride"}
#: Per kernel: wgmma loads a and b by TMA, through descriptors of boxes of TMA_BOX_ROWS rows.
_MMA_PARAMETERS = {"mma_sync": "", "wgmma": "kgen::TmaDescriptor map_a, kgen::TmaDescriptor map_b, "}
#: The wgmma kernel's TMA boxes: 128 rows by one 128-byte swizzle span of K.
TMA_BOX_ROWS, TMA_SPAN_BYTES = 128, 128
#: The wgmma kernel's epilogue stages its results EPILOGUE_PASS_COLUMNS columns at a time: the staging rows of a
#: 128 x 256 tile's whole width would take the shared memory of a fourth stage.
EPILOGUE_PASS_COLUMNS = 64


def b_rows_per_column(epilogue: str) -> int:
    """Rows of b a block reads per output column: SwiGLU's gate and up."""
    return 1 if epilogue == "none" else 2


def result_dtype(dtype: str) -> str:
    """The result's dtype (a spec name) for inputs of ``dtype``."""
    return FP8_RESULT_DTYPE if ELEMENT_TYPES[dtype].itemsize == 1 else dtype


def _grouped_gemm(params: Mapping[str, Any]) -> LaunchContract:
    itemsize, out_itemsize = ELEMENT_TYPES[params["dtype"]].itemsize, ELEMENT_TYPES[result_dtype(params["dtype"])].itemsize
    stage_rows = params["tile_m"] + b_rows_per_column(params["epilogue"]) * params["tile_n"]
    if params["mma"] == "wgmma":
        # wgmma.cuh: num_warps consumer warps and a producer warpgroup; swizzled stages on a 1024-byte boundary,
        # then a full and an empty mbarrier (8 bytes each) per stage, then the epilogue's staging rows of one pass's
        # columns (padded by 16 bytes): the result's, and the FP8 codes'.
        threads = params["num_warps"] * 32 + WARPGROUP_THREADS
        columns = EPILOGUE_PASS_COLUMNS
        staging_row = columns * out_itemsize + 16 + (columns + 16 if params["epilogue"] == "swiglu_quantize" else 0)
        smem = (SWIZZLE_ALIGNMENT + params["stages"] * (stage_rows * params["tile_k"] * itemsize + 16) +
                params["tile_m"] * staging_row)
    else:
        # mma_sync.cuh: A and B tiles with rows padded by 8 elements, and 16 bytes of alignment slack.
        threads = params["num_warps"] * 32
        smem = params["stages"] * stage_rows * (params["tile_k"] + 8) * itemsize + 16
    return LaunchContract(
        threads=threads,
        dynamic_smem_bytes=smem,
        cluster=params["cluster"],
        sizes={"tile_m": params["tile_m"], "tile_n": params["tile_n"], "tile_k": params["tile_k"], "box_rows": TMA_BOX_ROWS,
               "result_bytes": out_itemsize, "scale_block": SCALE_BLOCK,
               "pass_columns": EPILOGUE_PASS_COLUMNS},
        parameters={"grouped_gemm": parameters(_MMA_PARAMETERS[params["mma"]] + _COMMON + _EPILOGUE_PARAMETERS[params["epilogue"]])},
    )


CONTRACTS = {"grouped_gemm": _grouped_gemm}
