"""The toy kernel's launch contract."""

from __future__ import annotations

from typing import Any, Mapping

from kgen.contract import LaunchContract, parameters

_PARAMETERS = parameters("const T* x, T* out, long long n, float scale")


def _toy_scale(params: Mapping[str, Any]) -> LaunchContract:
    threads = params["num_warps"] * 32
    return LaunchContract(threads=threads, dynamic_smem_bytes=0,
                          sizes={"tile": threads * params["rows_per_thread"]}, parameters={"toy_scale": _PARAMETERS})


CONTRACTS = {"toy_scale": _toy_scale}
