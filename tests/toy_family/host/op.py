"""The toy op, eagerly: checks, the variant pair, the launch by name."""

from __future__ import annotations

import numpy as np
import torch

from kgen.runtime.checks import check_scale, check_tensor
from kgen.runtime.dispatch import DTYPE_NAMES, SpecPathMemo, contract, incomplete_tile_pair, launcher, spec_dtypes

FAMILY = "toy_scale"
_kernels = SpecPathMemo()


def _launchers(device_index: int, dtype: torch.dtype):
    key = (device_index, dtype)
    found = _kernels.get(key)
    if found is None:
        variants = incomplete_tile_pair(FAMILY, dtype=DTYPE_NAMES[dtype])
        found = _kernels.put(key, (contract(variants[0]).sizes["tile"],
                                   tuple(launcher(v, "toy_scale", device_index) for v in variants)))
    return found


def toy_scale(x: torch.Tensor, scale: float) -> torch.Tensor:
    """``x * scale`` for a contiguous CUDA tensor ``x`` of a dtype the spec offers."""
    scale = check_scale("scale", scale)
    check_tensor("x", x, ndim=x.dim() if isinstance(x, torch.Tensor) else 1, dtypes=spec_dtypes(FAMILY))
    if not x.is_contiguous():
        raise ValueError(f"x: expected a contiguous tensor, got strides {x.stride()}")
    out = torch.empty_like(x)
    n = x.numel()
    if n == 0:
        return out
    tile, (incomplete, full) = _launchers(x.get_device(), x.dtype)
    kernel = incomplete if n % tile else full
    kernel.launch(-(-n // tile), x=x.data_ptr(), out=out.data_ptr(), n=n, scale=np.float32(scale))
    return out
