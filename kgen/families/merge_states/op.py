"""Merging partial attention states, eagerly: checks, variant choice and launch.

A partial state is an attention output ``v`` normalised over some subset of the
keys and the log-sum-exp ``lse`` (natural log) of that subset's scores. Merging
two or more partials over disjoint key sets gives the state over their union.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from kgen.launch import KernelLauncher
from kgen.registry import UnsupportedVariantError
from kgen.runtime.checks import check_dense_rows, check_shape, check_tensor
from kgen.runtime.dispatch import DTYPE_NAMES, SpecPathMemo, contract, incomplete_tile_pair, launcher, spec_dtypes

FAMILY = "merge_attention_states"
_MAX_ROWS = 2**31 - 1  # the kernel indexes (token, head) rows with 32-bit integers


@dataclass
class _Kernels:
    tile_rows: int
    two: tuple[KernelLauncher, KernelLauncher]  # (has_incomplete_tile true, false)
    stacked: tuple[KernelLauncher, KernelLauncher]


_dispatch = SpecPathMemo()


def _kernels(device_index: int, head_dim: int, dtype: torch.dtype, states: str) -> _Kernels:
    """The launchers for ``states`` (the argument holding the partial outputs, for errors)."""
    key = (device_index, head_dim, dtype)
    found = _dispatch.get(key)
    if found is not None:
        return found
    try:
        variants = incomplete_tile_pair(FAMILY, head_dim=head_dim, dtype=DTYPE_NAMES[dtype])
    except UnsupportedVariantError as exc:  # names the family: name the tensor too
        raise UnsupportedVariantError(f"{states}: {exc}") from None
    tile_rows = {contract(v).sizes["tile_rows"] for v in variants}
    if len(tile_rows) != 1:
        raise ValueError(f"{FAMILY}: the variants {variants[0].name} and {variants[1].name} tile rows differently")
    kernels = _Kernels(
        tile_rows=tile_rows.pop(),
        two=tuple(launcher(v, "merge_states_2", device_index) for v in variants),
        stacked=tuple(launcher(v, "merge_states_n", device_index) for v in variants),
    )
    return _dispatch.put(key, kernels)


def _check_lse(name: str, lse, device: torch.device, shape: tuple, what: str) -> None:
    check_tensor(name, lse, ndim=len(shape), dtypes=(torch.float32,), device=device)
    check_shape(name, lse, shape, what)


def _outputs(out, lse_out, shape, dtype: torch.dtype, device_index: int, like_v: torch.Tensor,
             like_lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """New results (dtype and device of the inputs ``like_v`` and ``like_lse``), or the caller's after checking them."""
    # new_empty takes dtype and device from the input inside torch, with no torch.device
    # built in Python for each call.
    if out is None and lse_out is None:
        return like_v.new_empty(shape), like_lse.new_empty(shape[:2])
    # One cheap test for the common, valid call; the detailed checks name what is wrong.
    if (out is not None and lse_out is not None and out.dtype is dtype and out.shape == shape
            and lse_out.dtype is torch.float32 and lse_out.shape == shape[:2] and out.get_device() == device_index
            and lse_out.get_device() == device_index and out.is_contiguous() and lse_out.is_contiguous()
            and not out.data_ptr() & 15):
        return out, lse_out
    if out is None:
        out = like_v.new_empty(shape)
    else:
        check_tensor("out", out, ndim=3, dtypes=(dtype,), device=like_v.device)
        check_shape("out", out, shape, "[tokens, heads, head_dim] of the inputs")
        check_dense_rows("out", out)
    if lse_out is None:
        lse_out = like_lse.new_empty(shape[:2])
    else:
        check_tensor("lse_out", lse_out, ndim=2, dtypes=(torch.float32,), device=like_v.device)
        check_shape("lse_out", lse_out, shape[:2], "[tokens, heads] of the inputs")
        if not lse_out.is_contiguous():
            raise ValueError(f"lse_out: expected a contiguous tensor, got strides {lse_out.stride()}")
    return out, lse_out


def merge_attention_states(v_a: torch.Tensor, lse_a: torch.Tensor, v_b: torch.Tensor, lse_b: torch.Tensor, *,
                           out: torch.Tensor | None = None, lse_out: torch.Tensor | None = None,
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention states over disjoint key sets.

    Args:
        v_a, v_b: ``[tokens, heads, head_dim]``, bf16, fp16 or fp32, contiguous, same shape and dtype.
        lse_a, lse_b: ``[tokens, heads]`` fp32 log-sum-exp (natural log) of each partial; any strides.
            A partial with ``lse = -inf`` saw no keys and contributes nothing (its ``v`` is ignored).

        out, lse_out: optional preallocated results (contiguous, shaped like the returns).

    Returns:
        ``(v, lse)``: ``v`` like ``v_a``, ``lse`` ``[tokens, heads]`` fp32. Rows where both
        partials are empty get ``v = 0`` and ``lse = -inf``.

    No host synchronisation; safe to capture in a CUDA graph.
    """
    # One cheap test for the common, valid call (about 1 us); the detailed checks name what is wrong.
    try:
        device_index, shape, dtype = v_a.get_device(), v_a.shape, v_a.dtype
        rows_shape = shape[:2]
        ptr_a, ptr_b = v_a.data_ptr(), v_b.data_ptr()
        valid = (device_index >= 0 and dtype in DTYPE_NAMES and len(shape) == 3
                 and v_b.dtype is dtype and v_b.shape == shape and v_b.get_device() == device_index
                 and v_a.is_contiguous() and v_b.is_contiguous() and not (ptr_a | ptr_b) & 15
                 and lse_a.dtype is torch.float32 and lse_b.dtype is torch.float32
                 and lse_a.shape == rows_shape and lse_b.shape == rows_shape
                 and lse_a.get_device() == device_index and lse_b.get_device() == device_index)
    except AttributeError:  # not a tensor
        valid = False
    if not valid:
        check_tensor("v_a", v_a, ndim=3, dtypes=spec_dtypes(FAMILY))
        check_tensor("v_b", v_b, ndim=3, dtypes=(v_a.dtype,), device=v_a.device)
        check_shape("v_b", v_b, v_a.shape, "the shape of v_a")
        check_dense_rows("v_a", v_a)
        check_dense_rows("v_b", v_b)
        _check_lse("lse_a", lse_a, v_a.device, v_a.shape[:2], "[tokens, heads] of v_a")
        _check_lse("lse_b", lse_b, v_a.device, v_a.shape[:2], "[tokens, heads] of v_a")
        raise AssertionError("unreachable: the detailed checks must reject what the fast test rejected")
    tokens, heads, head_dim = shape
    rows = tokens * heads
    if rows > _MAX_ROWS:
        raise ValueError(f"v_a: tokens * heads = {rows} exceeds {_MAX_ROWS}")
    v, lse = _outputs(out, lse_out, shape, dtype, device_index, v_a, lse_a)
    if rows == 0:
        return v, lse
    kernels = _kernels(device_index, head_dim, dtype, "v_a")
    lse_a_stride_t, lse_a_stride_h = lse_a.stride()
    lse_b_stride_t, lse_b_stride_h = lse_b.stride()
    tile_rows = kernels.tile_rows  # the kernel for an incomplete last tile only where there is one
    (kernels.two[0] if rows % tile_rows else kernels.two[1]).launch(
        -(-rows // tile_rows),
        v_a=ptr_a, lse_a=lse_a.data_ptr(), lse_a_stride_t=lse_a_stride_t, lse_a_stride_h=lse_a_stride_h,
        v_b=ptr_b, lse_b=lse_b.data_ptr(), lse_b_stride_t=lse_b_stride_t, lse_b_stride_h=lse_b_stride_h,
        v_out=v.data_ptr(), lse_out=lse.data_ptr(), num_rows=rows, num_heads=heads)
    return v, lse


def merge_attention_states_n(v: torch.Tensor, lse: torch.Tensor, *,
                             out: torch.Tensor | None = None, lse_out: torch.Tensor | None = None,
                             ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge S partial attention states stacked along the first dimension.

    Args:
        v: ``[S, tokens, heads, head_dim]``, bf16, fp16 or fp32, contiguous.
        lse: ``[S, tokens, heads]`` fp32 log-sum-exp (natural log); any strides. ``-inf`` marks an empty partial.
        out, lse_out: optional preallocated results (contiguous, shaped like the returns).

    Returns:
        ``(v, lse)`` with shapes ``[tokens, heads, head_dim]`` and ``[tokens, heads]``.
        With S = 0, or every partial of a row empty, that row is ``v = 0``, ``lse = -inf``.

    No host synchronisation; safe to capture in a CUDA graph.
    """
    try:
        device_index, shape, dtype = v.get_device(), v.shape, v.dtype
        valid = (device_index >= 0 and dtype in DTYPE_NAMES and len(shape) == 4 and v.is_contiguous()
                 and not v.data_ptr() & 15 and lse.dtype is torch.float32 and lse.shape == shape[:3]
                 and lse.get_device() == device_index)
    except AttributeError:  # not a tensor
        valid = False
    if not valid:
        check_tensor("v", v, ndim=4, dtypes=spec_dtypes(FAMILY))
        check_dense_rows("v", v)
        _check_lse("lse", lse, v.device, v.shape[:3], "[S, tokens, heads] of v")
        raise AssertionError("unreachable: the detailed checks must reject what the fast test rejected")
    partials, tokens, heads, head_dim = shape
    rows = tokens * heads
    if rows > _MAX_ROWS:
        raise ValueError(f"v: tokens * heads = {rows} exceeds {_MAX_ROWS}")
    out, lse_out = _outputs(out, lse_out, torch.Size((tokens, heads, head_dim)), dtype, device_index, v, lse)
    if rows == 0:
        return out, lse_out
    kernels = _kernels(device_index, head_dim, dtype, "v")
    lse_stride_s, lse_stride_t, lse_stride_h = lse.stride()
    tile_rows = kernels.tile_rows
    (kernels.stacked[0] if rows % tile_rows else kernels.stacked[1]).launch(
        -(-rows // tile_rows),
        v=v.data_ptr(), lse=lse.data_ptr(), num_partials=partials, v_stride_s=v.stride(0),
        lse_stride_s=lse_stride_s, lse_stride_t=lse_stride_t, lse_stride_h=lse_stride_h,
        v_out=out.data_ptr(), lse_out=lse_out.data_ptr(), num_rows=rows, num_heads=heads)
    return out, lse_out
