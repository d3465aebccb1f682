"""The grouped GEMM kernel's launch contract (see :mod:`kgen.contract`)."""

from __future__ import annotations

from typing import Any, Mapping

from kgen.contract import LaunchContract, parameters
from kgen.dtypes import ELEMENT_TYPES

_PARAMETERS = {
    "grouped_gemm": parameters(
        "const T* a, const T* b, const int* offs, T* out, long long num_rows, long long num_n, long long num_k, "
        "long long num_experts, long long row_tiles, long long column_tiles"),
}


def _grouped_gemm(params: Mapping[str, Any]) -> LaunchContract:
    # kernel.cu.j2's stages: A and B tiles with rows padded by 8 elements, and 16 bytes of alignment slack.
    row = (params["tile_k"] + 8) * ELEMENT_TYPES[params["dtype"]].itemsize
    stage = (params["tile_m"] + params["tile_n"]) * row
    return LaunchContract(
        threads=params["num_warps"] * 32,
        dynamic_smem_bytes=params["stages"] * stage + 16,
        sizes={"tile_m": params["tile_m"], "tile_n": params["tile_n"], "tile_k": params["tile_k"]},
        parameters=_PARAMETERS,
    )


CONTRACTS = {"grouped_gemm": _grouped_gemm}
