"""The grouped GEMM kernel's launch contract (see :mod:`kgen.contract`)."""

from __future__ import annotations

from typing import Any, Mapping

from kgen.contract import LaunchContract, parameters
from kgen.dtypes import ELEMENT_TYPES

_COMMON = ("const T* a, const T* b, const int* offs, T* out, long long num_rows, long long num_n, long long num_k, "
           "long long num_experts, long long row_tiles, long long column_tiles, long long masked_rows")
#: Per epilogue: swiglu_quantize also writes the FP8 codes and their MN-major scales.
_PARAMETERS = {
    "none": parameters(_COMMON),
    "swiglu": parameters(_COMMON),
    "swiglu_quantize": parameters(_COMMON + ", unsigned char* out_fp8, float* scales, long long scales_stride"),
}


def b_rows_per_column(epilogue: str) -> int:
    """Rows of b a block reads per output column: SwiGLU's gate and up."""
    return 1 if epilogue == "none" else 2


def _grouped_gemm(params: Mapping[str, Any]) -> LaunchContract:
    # kernel.cu.j2's stages: A and B tiles with rows padded by 8 elements, and 16 bytes of alignment slack.
    row = (params["tile_k"] + 8) * ELEMENT_TYPES[params["dtype"]].itemsize
    stage = (params["tile_m"] + b_rows_per_column(params["epilogue"]) * params["tile_n"]) * row
    return LaunchContract(
        threads=params["num_warps"] * 32,
        dynamic_smem_bytes=params["stages"] * stage + 16,
        sizes={"tile_m": params["tile_m"], "tile_n": params["tile_n"], "tile_k": params["tile_k"]},
        parameters={"grouped_gemm": _PARAMETERS[params["epilogue"]]},
    )


CONTRACTS = {"grouped_gemm": _grouped_gemm}
