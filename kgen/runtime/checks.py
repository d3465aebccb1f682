"""Input checks shared by the ops. Each error names the argument and what was expected."""

from __future__ import annotations

import numbers
from typing import Iterable, Sequence

import numpy as np
import torch

from kgen.launch import current_device

#: The kernels index tokens, offsets and window bounds with 32-bit integers, and
#: cu_seqlens reach the device as int32: every length, total and window stays below this.
INT32_LIMIT = 2**31 - 1


def check_tensor(name: str, t, *, ndim: int, dtypes: Iterable[torch.dtype], device: torch.device | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
    if not t.is_cuda:
        raise ValueError(f"{name}: expected a CUDA tensor, got one on {t.device}")
    if device is not None and t.device != device:
        raise ValueError(f"{name}: expected a tensor on {device}, got one on {t.device}")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim} dimensions, got shape {tuple(t.shape)}")
    if t.dtype not in dtypes:
        raise TypeError(f"{name}: expected dtype in {[str(d) for d in dtypes]}, got {t.dtype}")


def check_shape(name: str, t: torch.Tensor, expected: tuple, what: str) -> None:
    if tuple(t.shape) != tuple(expected):
        raise ValueError(f"{name}: expected shape {tuple(expected)} ({what}), got {tuple(t.shape)}")


def check_dense_rows(name: str, t: torch.Tensor) -> None:
    """Contiguous and 16-byte aligned: the kernels read rows with 16-byte vector loads."""
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")
    if t.data_ptr() % 16:
        raise ValueError(f"{name}: expected a 16-byte aligned data pointer (a view with an odd offset?)")


def check_rows(name: str, t: torch.Tensor) -> None:
    """Rows of 16-bit elements that kernels move in 16-byte chunks (cp.async, TMA): the last dimension
    contiguous, every row's start 16-byte aligned."""
    if t.stride(-1) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous, got strides {t.stride()}")
    if t.data_ptr() % 16 or any(s % 8 for s in t.stride()[:-1]):
        raise ValueError(f"{name}: rows must start at 16-byte aligned addresses (strides {t.stride()})")


def check_int(name: str, value, *, minimum: int, maximum: int = INT32_LIMIT, what: str = "") -> int:
    # bool is an int subclass, but True as a length or a window is a caller's mistake.
    if isinstance(value, bool) or not isinstance(value, int):
        raise TypeError(f"{name}: expected an int{what}, got {type(value).__name__} {value!r}")
    if not minimum <= value <= maximum:
        raise ValueError(f"{name}: expected an int in [{minimum}, {maximum}]{what}, got {value}")
    return value


def check_seqlens(name: str, seqlens: Sequence[int]) -> np.ndarray:
    if not isinstance(seqlens, (list, tuple)):
        raise TypeError(f"{name}: expected a list or tuple of ints, got {type(seqlens).__name__}")
    if not all(type(n) is int and 0 <= n <= INT32_LIMIT for n in seqlens):  # the common case, without a call per entry
        for i, n in enumerate(seqlens):
            check_int(f"{name}[{i}]", n, minimum=0)
    lengths = np.array(seqlens, dtype=np.int64).reshape(-1)
    total = int(lengths.sum())
    if total > INT32_LIMIT:
        raise ValueError(f"{name}: the lengths add up to {total} tokens; the kernels index at most {INT32_LIMIT}")
    return lengths


def check_scale(name: str, value) -> float:
    """A real number (numpy scalars included) that stays finite as the kernels' fp32."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not np.isfinite(np.float32(value)):
        raise ValueError(f"{name}: expected a real number finite in fp32, got {value!r}")
    return float(value)


def cuda_device(device) -> torch.device:
    """``device`` with its index: "cuda" means the current device (a table keyed by device must not
    tell "cuda" from "cuda:0")."""
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", current_device())
    return device


def refuse_grad(op: str, *tensors) -> None:
    """No kgen op has a backward: tensors that require grad, in a grad-enabled context, are refused, not detached
    (anything not a tensor is left to the argument checks)."""
    if torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad for t in tensors):
        raise RuntimeError(f"{op} has no backward: call it under torch.no_grad() or on detached tensors")
