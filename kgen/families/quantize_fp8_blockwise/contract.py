"""The quantize kernel's launch contract (see :mod:`kgen.contract`)."""

from __future__ import annotations

from typing import Any, Mapping

from kgen.contract import LaunchContract, parameters
from kgen.dtypes import ELEMENT_TYPES

#: Columns per scale (the FP8 grouped GEMM's K block).
BLOCK = 128

_PARAMETERS = {
    "quantize_fp8_blockwise": parameters(
        "const T* x, unsigned char* x_fp8, float* scales, long long scales_stride, long long num_rows, "
        "long long num_blocks"),
}


def _quantize_fp8_blockwise(params: Mapping[str, Any]) -> LaunchContract:
    # A lane holds 16 bytes of a block, so a warp covers 32 / (BLOCK * itemsize / 16) rows of a column block a pass.
    lanes_per_block = BLOCK * ELEMENT_TYPES[params["dtype"]].itemsize // 16
    return LaunchContract(
        threads=params["num_warps"] * 32,
        dynamic_smem_bytes=0,
        sizes={"tile_rows": params["rows_per_thread"] * (32 // lanes_per_block), "warps": params["num_warps"]},
        parameters=_PARAMETERS,
    )


CONTRACTS = {"quantize_fp8_blockwise": _quantize_fp8_blockwise}
