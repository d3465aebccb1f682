"""Input checks shared by the ops. Each error names the argument and what was expected."""

from __future__ import annotations

import math
import numbers
from typing import Iterable, Sequence

import numpy as np
import torch

from kgen.launch import current_device

#: The kernels index tokens, offsets and window bounds with 32-bit integers, and
#: cu_seqlens reach the device as int32: every length, total and window stays below this.
INT32_LIMIT = 2**31 - 1
_LOG2E = 1.4426950408889634
_FLOAT32_MAX = float(np.finfo(np.float32).max)
#: The dtypes cumulative sequence lengths may have.
_CU_DTYPES = (torch.int32, torch.int64)


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


def _byte_range(t: torch.Tensor) -> tuple[int, int]:
    """The bytes from ``t``'s first element to just past its last, whatever its (non-negative) strides."""
    start = t.data_ptr()
    last = sum((size - 1) * stride for size, stride in zip(t.shape, t.stride()))
    return start, start + (last + 1) * t.element_size()


def check_no_overlap(name: str, t: torch.Tensor, **inputs: torch.Tensor) -> None:
    """A result shares no byte with the inputs its kernel reads while writing it, in no order between blocks (each
    taken as the whole range its strides span)."""
    start, end = _byte_range(t)
    for other_name, other in inputs.items():
        other_start, other_end = _byte_range(other)
        if start < other_end and other_start < end and t.numel() and other.numel():
            raise ValueError(f"{name}: overlaps {other_name} in memory; the kernel reads {other_name} while it writes "
                             f"{name}")


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


def check_plan_device(device) -> torch.device | None:
    """A planner's ``device=``: None, or a CUDA device this process has (with its index)."""
    if device is None:
        return None
    try:
        found = torch.device(device)
    except (TypeError, RuntimeError, ValueError):
        raise TypeError(f"device: expected a CUDA device (\"cuda\", \"cuda:1\", 1 or a torch.device), "
                        f"got {type(device).__name__} {device!r}") from None
    if found.type != "cuda":
        raise ValueError(f"device: plans run on a CUDA device, got {found}")
    if not torch.cuda.is_available():
        raise ValueError(f"device: {found} asked for, but torch sees no CUDA device (a CPU-only build, or no GPU)")
    count = torch.cuda.device_count()
    if found.index is not None and found.index >= count:
        raise ValueError(f"device: {found} does not exist: torch sees {count} CUDA device{'s' if count != 1 else ''}")
    return cuda_device(found)


class NoBackwardError(RuntimeError, ValueError):
    """A tensor that requires grad, given to an op with no backward: a RuntimeError as autograd's own refusals
    are, and a ValueError as kgen's refusals of an argument are."""


def needs_grad(*tensors) -> bool:
    """Whether autograd would record a call on these (grad enabled, and one of them a tensor that requires grad);
    anything not a tensor is left to the argument checks. A plain loop, as in refuse_grad."""
    if not torch.is_grad_enabled():
        return False
    for t in tensors:
        if isinstance(t, torch.Tensor) and t.requires_grad:
            return True
    return False


def refuse_grad(op: str, names: tuple[str, ...], *tensors) -> None:
    """No kgen op has a backward: tensors that require grad, in a grad-enabled context, are refused (by their
    argument's name in ``names``), not detached; anything not a tensor is left to the argument checks. Positional,
    with the names a constant, so that the common call builds nothing."""
    if not torch.is_grad_enabled():
        return
    for t in tensors:  # a plain loop over the tensors alone: a generator, or zip with the names, costs a third more
        if isinstance(t, torch.Tensor) and t.requires_grad:
            name = next(n for n, u in zip(names, tensors) if u is t)
            raise NoBackwardError(f"{name}: requires grad, and {op} has no backward: call it under torch.no_grad() "
                                  f"or on detached tensors")


def check_sink(sink, heads_q: int, device: torch.device) -> None:
    """Attention's optional sink: fp32 ``[Hq]``, one logit per query head, contiguous, on ``device``."""
    if sink is None:
        return
    check_tensor("sink", sink, ndim=1, dtypes=(torch.float32,), device=device)
    if sink.shape[0] != heads_q or not sink.is_contiguous():
        raise ValueError(f"sink: expected a contiguous [{heads_q}] tensor (one logit per query head), got {tuple(sink.shape)}")


def softmax_scale_log2(softmax_scale, head_dim: int) -> np.float32:
    """The kernel's score scale in the log2 domain; ``softmax_scale`` must be a finite positive fp32 number."""
    if softmax_scale is None:
        return np.float32(_LOG2E / math.sqrt(head_dim))
    if isinstance(softmax_scale, bool) or not isinstance(softmax_scale, (int, float, np.floating)):
        raise TypeError(f"softmax_scale: expected a float, got {type(softmax_scale).__name__} {softmax_scale!r}")
    scale = float(softmax_scale)
    # The kernel takes row maxima of unscaled scores, so the scale must be positive; it is an fp32 there.
    if not (math.isfinite(scale) and 0 < scale and scale * _LOG2E <= _FLOAT32_MAX and np.float32(scale) > 0):
        raise ValueError(f"softmax_scale: expected a finite positive number representable in fp32, got {softmax_scale!r}")
    return np.float32(scale * _LOG2E)


def check_bool(name: str, value) -> bool:
    if not isinstance(value, bool):
        raise TypeError(f"{name}: expected a bool, got {value!r}")
    return value


def check_host_tensor(name: str, t: torch.Tensor) -> None:
    """Plans are built from host data: a CUDA tensor would force a device->host sync."""
    if t.is_cuda:
        raise ValueError(f"{name}: plans are built from host data, and reading a CUDA tensor "
                         f"would force a device->host sync; pass a CPU tensor or a list of ints instead")
    if t.device.type != "cpu":
        raise ValueError(f"{name}: expected a CPU tensor or a list of ints, got a tensor on {t.device}")


def seqlens_from_cu(cu: Sequence[int] | torch.Tensor, name: str) -> list[int]:
    """The sequence lengths described by cumulative lengths ``cu`` (``[0, n0, n0 + n1, ...]``).

    ``cu`` is a list or tuple of ints, or a CPU int32/int64 1-D tensor; ``name``
    is the argument's name for error messages.
    """
    if isinstance(cu, torch.Tensor):
        check_host_tensor(name, cu)
        if cu.dim() != 1:
            raise ValueError(f"{name}: expected a 1-D tensor, got shape {tuple(cu.shape)}")
        if cu.dtype not in _CU_DTYPES:
            raise TypeError(f"{name}: expected dtype in {[str(d) for d in _CU_DTYPES]}, got {cu.dtype}")
        values = cu.numpy().astype(np.int64)
    elif isinstance(cu, (list, tuple)):
        if not all(type(value) is int for value in cu):  # the common case, without a call per entry
            for i, value in enumerate(cu):
                if isinstance(value, bool) or not isinstance(value, int):
                    raise TypeError(f"{name}[{i}]: expected an int, got {type(value).__name__} {value!r}")
        # Checked before numpy sees them: 2**63 would overflow int64.
        if cu and not (-INT32_LIMIT <= min(cu) and max(cu) <= INT32_LIMIT):
            raise ValueError(f"{name}: entries must be at most {INT32_LIMIT} in magnitude (cu_seqlens reach the "
                             f"kernels as int32), got values from {min(cu)} to {max(cu)}")
        values = np.array(cu, dtype=np.int64).reshape(-1)
    else:
        raise TypeError(f"{name}: expected a list or tuple of ints or a CPU int32/int64 1-D tensor, "
                        f"got {type(cu).__name__}")
    if not values.size:
        raise ValueError(f"{name}: expected at least one entry (the leading 0), got none")
    if values[0] != 0:
        raise ValueError(f"{name}: must start at 0, got {name}[0]={values[0]}")
    if values.max() > INT32_LIMIT:
        raise ValueError(f"{name}: entries must be at most {INT32_LIMIT} (cu_seqlens reach the kernels as int32), "
                         f"got {values.max()}")
    lengths = np.diff(values)
    if (lengths < 0).any():
        i = int(np.argmax(lengths < 0)) + 1
        raise ValueError(f"{name}: must be non-decreasing, but {name}[{i}]={values[i]} "
                         f"< {name}[{i - 1}]={values[i - 1]}")
    return lengths.tolist()
