"""Merging partial attention states: the combine step of split-KV decode and context-parallel attention.

A partial state is an attention output ``v`` normalised over some subset of the
keys and the log-sum-exp ``lse`` (natural log) of that subset's scores. Merging
two or more partials over disjoint key sets gives the state over their union.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kgen.launch import KernelLauncher
from kgen.ops._checks import check_dense_rows, check_shape, check_tensor
from kgen.ops._dispatch import DTYPE_NAMES, DispatchCache, launcher, tail_pair

FAMILY = "merge_attention_states"
_V_DTYPES = tuple(DTYPE_NAMES)
_MAX_ROWS = 2**31 - 1  # the kernel indexes (token, head) rows with 32-bit integers


@dataclass
class _Kernels:
    tile_rows: int
    two: tuple[KernelLauncher, KernelLauncher]  # (with tail, without tail)
    stacked: tuple[KernelLauncher, KernelLauncher]

    def pick(self, pair: tuple[KernelLauncher, KernelLauncher], rows: int) -> tuple[KernelLauncher, int]:
        tiles = -(-rows // self.tile_rows)
        return (pair[1] if rows % self.tile_rows == 0 else pair[0]), tiles


_dispatch = DispatchCache()


def _tile_rows(params: dict, itemsize: int) -> int:
    # Mirrors the template: each thread owns 16 bytes of a row; a block of
    # num_warps*32 threads covers threads // lanes_per_row rows per pass.
    lanes_per_row = params["head_dim"] * itemsize // 16
    return (params["num_warps"] * 32 // lanes_per_row) * params["rows_per_thread"]


def _kernels(device_index: int, head_dim: int, dtype: torch.dtype) -> _Kernels:
    key = (device_index, head_dim, dtype)
    found = _dispatch.get(key)
    if found is not None:
        return found
    with_tail, without_tail = tail_pair(FAMILY, head_dim=head_dim, dtype=DTYPE_NAMES[dtype])
    variants = (with_tail, without_tail)
    with torch.cuda.device(device_index):
        kernels = _Kernels(
            tile_rows=_tile_rows(with_tail.param_dict, dtype.itemsize),
            two=tuple(launcher(v, "merge_states_2") for v in variants),
            stacked=tuple(launcher(v, "merge_states_n") for v in variants),
        )
    if _tile_rows(without_tail.param_dict, dtype.itemsize) != kernels.tile_rows:
        raise ValueError(f"{FAMILY}: the variants {with_tail.name} and {without_tail.name} tile rows differently")
    return _dispatch.put(key, kernels)


def _check_lse(name: str, lse, device: torch.device, shape: tuple, what: str) -> None:
    check_tensor(name, lse, ndim=len(shape), dtypes=(torch.float32,), device=device)
    check_shape(name, lse, shape, what)


def _launch(device_index: int, pick: tuple[KernelLauncher, int], *args) -> None:
    kernel, tiles = pick
    if device_index == torch.cuda.current_device():
        kernel(device_index, tiles, *args)
    else:
        with torch.cuda.device(device_index):
            kernel(device_index, tiles, *args)


def merge_attention_states(v_a: torch.Tensor, lse_a: torch.Tensor, v_b: torch.Tensor, lse_b: torch.Tensor
                           ) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge two partial attention states over disjoint key sets.

    Args:
        v_a, v_b: ``[tokens, heads, head_dim]``, bf16, fp16 or fp32, contiguous, same shape and dtype.
        lse_a, lse_b: ``[tokens, heads]`` fp32 log-sum-exp (natural log) of each partial; any strides.
            A partial with ``lse = -inf`` saw no keys and contributes nothing (its ``v`` is ignored).

    Returns:
        ``(v, lse)``: ``v`` like ``v_a``, ``lse`` ``[tokens, heads]`` fp32. Rows where both
        partials are empty get ``v = 0`` and ``lse = -inf``.

    No host synchronisation; safe to capture in a CUDA graph.
    """
    # One cheap test for the common, valid call; the detailed checks below name what is wrong.
    if not (isinstance(v_a, torch.Tensor) and isinstance(v_b, torch.Tensor) and v_a.is_cuda
            and v_a.dtype in _V_DTYPES and v_b.dtype == v_a.dtype and v_a.dim() == 3 and v_b.shape == v_a.shape
            and v_b.device == v_a.device and v_a.is_contiguous() and v_b.is_contiguous()
            and not (v_a.data_ptr() | v_b.data_ptr()) % 16):
        check_tensor("v_a", v_a, ndim=3, dtypes=_V_DTYPES)
        check_tensor("v_b", v_b, ndim=3, dtypes=(v_a.dtype,), device=v_a.device)
        check_shape("v_b", v_b, v_a.shape, "the shape of v_a")
        check_dense_rows("v_a", v_a)
        check_dense_rows("v_b", v_b)
    tokens, heads, head_dim = v_a.shape
    if not (isinstance(lse_a, torch.Tensor) and isinstance(lse_b, torch.Tensor)
            and lse_a.dtype == torch.float32 and lse_b.dtype == torch.float32
            and lse_a.shape == (tokens, heads) and lse_b.shape == (tokens, heads)
            and lse_a.device == v_a.device and lse_b.device == v_a.device):
        _check_lse("lse_a", lse_a, v_a.device, (tokens, heads), "[tokens, heads] of v_a")
        _check_lse("lse_b", lse_b, v_a.device, (tokens, heads), "[tokens, heads] of v_a")
    rows = tokens * heads
    if rows > _MAX_ROWS:
        raise ValueError(f"v_a: tokens * heads = {rows} exceeds {_MAX_ROWS}")
    v = torch.empty_like(v_a)
    lse = torch.empty((tokens, heads), dtype=torch.float32, device=v_a.device)
    if rows == 0:
        return v, lse
    kernels = _kernels(v_a.device.index, head_dim, v_a.dtype)
    _launch(v_a.device.index, kernels.pick(kernels.two, rows),
            v_a.data_ptr(), lse_a.data_ptr(), np.int64(lse_a.stride(0)), np.int64(lse_a.stride(1)),
            v_b.data_ptr(), lse_b.data_ptr(), np.int64(lse_b.stride(0)), np.int64(lse_b.stride(1)),
            v.data_ptr(), lse.data_ptr(), np.int32(rows), np.int32(heads))
    return v, lse


def merge_attention_states_n(v: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Merge S partial attention states stacked along the first dimension.

    Args:
        v: ``[S, tokens, heads, head_dim]``, bf16, fp16 or fp32, contiguous.
        lse: ``[S, tokens, heads]`` fp32 log-sum-exp (natural log); any strides. ``-inf`` marks an empty partial.

    Returns:
        ``(v, lse)`` with shapes ``[tokens, heads, head_dim]`` and ``[tokens, heads]``.
        With S = 0, or every partial of a row empty, that row is ``v = 0``, ``lse = -inf``.

    No host synchronisation; safe to capture in a CUDA graph.
    """
    if not (isinstance(v, torch.Tensor) and v.is_cuda and v.dtype in _V_DTYPES and v.dim() == 4
            and v.is_contiguous() and not v.data_ptr() % 16):
        check_tensor("v", v, ndim=4, dtypes=_V_DTYPES)
        check_dense_rows("v", v)
    partials, tokens, heads, head_dim = v.shape
    if not (isinstance(lse, torch.Tensor) and lse.dtype == torch.float32
            and lse.shape == (partials, tokens, heads) and lse.device == v.device):
        _check_lse("lse", lse, v.device, (partials, tokens, heads), "[S, tokens, heads] of v")
    rows = tokens * heads
    if rows > _MAX_ROWS:
        raise ValueError(f"v: tokens * heads = {rows} exceeds {_MAX_ROWS}")
    out = torch.empty((tokens, heads, head_dim), dtype=v.dtype, device=v.device)
    lse_out = torch.empty((tokens, heads), dtype=torch.float32, device=v.device)
    if rows == 0:
        return out, lse_out
    kernels = _kernels(v.device.index, head_dim, v.dtype)
    _launch(v.device.index, kernels.pick(kernels.stacked, rows),
            v.data_ptr(), lse.data_ptr(), np.int32(partials),
            np.int64(v.stride(0)), np.int64(lse.stride(0)), np.int64(lse.stride(1)), np.int64(lse.stride(2)),
            out.data_ptr(), lse_out.data_ptr(), np.int32(rows), np.int32(heads))
    return out, lse_out
