"""The gated delta rule (Gated DeltaNet): the decode step, in place on a pool of states.

Per sequence b and v-head, with the state S at pool row ``state_indices[b]``:
``S = e^g S;  u = beta (v - S^T k);  S = S + k u^T;  o = scale S^T q`` (g a natural-log gate).
GVA: v-head i reads q/k head ``i // (HV / H)``. States are fp32, ``[P, HV, K, V]`` for
``state_layout="kv"`` (fla's) or ``[P, HV, V, K]`` for ``"vk"`` (vLLM's, sglang's, FlashInfer's).
"""

from __future__ import annotations

import numpy as np
import torch

from kgen import registry
from kgen.families.gated_delta_rule.axes import spec_axes
from kgen.launch import KernelLauncher
from kgen.runtime.checks import check_bool, check_dense_rows, check_scale, check_shape, check_tensor
from kgen.runtime.device import GRID_YZ_LIMIT
from kgen.runtime.dispatch import DTYPE_NAMES, SpecPathMemo, contract, launcher

STEP_FAMILY = "gated_delta_rule_step"

_step_kernels = SpecPathMemo()


def _step_kernel(device_index: int, head_dim: int, dtype: torch.dtype, state_layout: str
                 ) -> tuple[KernelLauncher, int]:
    """The decode step's launcher on the device, and the value columns each of its blocks owns."""
    key = (device_index, head_dim, dtype, state_layout)
    found = _step_kernels.get(key)
    if found is not None:
        return found
    # select() names what the spec offers when it has no such variant.
    variant = registry.current().family(STEP_FAMILY).select(head_dim=head_dim, dtype=DTYPE_NAMES[dtype],
                                                            state_layout=state_layout)
    return _step_kernels.put(key, (launcher(variant, "gated_delta_rule_step", device_index),
                                   contract(variant).sizes["v_slice"]))


def _check_contiguous(name: str, t: torch.Tensor) -> None:
    if not t.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor, got strides {t.stride()}")


def gated_delta_rule_step(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor,
                          state: torch.Tensor, *, scale: float | None = None, state_indices: torch.Tensor | None = None,
                          state_layout: str = "kv", use_qk_l2norm_in_kernel: bool = False,
                          out: torch.Tensor | None = None) -> torch.Tensor:
    """One token of each of B sequences; updates ``state`` in place and returns o ``[B, HV, V]``.

    Args:
        q, k: ``[B, H, K]``; v: ``[B, HV, V]``; bf16 or fp16, contiguous; K = V, a head dim the spec lists.
        g: fp32 ``[B, HV]``, natural-log gates (<= 0). beta: ``[B, HV]``, fp32 or q's dtype.
        state: fp32 pool ``[P, HV, K, V]`` (``"kv"``) or ``[P, HV, V, K]`` (``"vk"``), contiguous.
        state_indices: int32 ``[B]``: the pool row of each sequence, -1 for a padded slot, whose
            state is never touched and whose o is 0. The host does not read them (that would
            synchronise); the kernel treats a value outside [-1, P) as an error of that sequence
            alone: the pool is untouched and its o is NaN. No row may appear twice (two sequences
            would update one state at once: undefined). Without it, sequence b uses row b.
        scale: default K^-1/2. use_qk_l2norm_in_kernel: normalise q and k over K first (eps 1e-6).
        out: optional preallocated o (contiguous ``[B, HV, V]`` in q's dtype).
    """
    axes = spec_axes(STEP_FAMILY)
    check_tensor("q", q, ndim=3, dtypes=axes.dtypes)
    device = q.device
    batch, heads, head_dim = q.shape
    check_tensor("k", k, ndim=3, dtypes=(q.dtype,), device=device)
    check_shape("k", k, q.shape, "[B, H, K] like q")
    check_tensor("v", v, ndim=3, dtypes=(q.dtype,), device=device)
    heads_v = v.shape[1]
    check_shape("v", v, (batch, heads_v, head_dim), "[B, HV, V] with V = K")
    if heads == 0 or heads_v == 0 or heads_v % heads:
        raise ValueError(f"v: HV={heads_v} v-heads must be a positive multiple of H={heads} q/k heads")
    if heads_v > GRID_YZ_LIMIT or batch > GRID_YZ_LIMIT:  # the grid's y and z
        raise ValueError(f"q, v: B={batch} and HV={heads_v} must each be at most {GRID_YZ_LIMIT} (the kernel's grid)")
    check_tensor("g", g, ndim=2, dtypes=(torch.float32,), device=device)
    check_shape("g", g, (batch, heads_v), "[B, HV]")
    check_tensor("beta", beta, ndim=2, dtypes=(torch.float32, q.dtype), device=device)
    check_shape("beta", beta, (batch, heads_v), "[B, HV]")
    if state_layout not in axes.state_layouts:
        raise ValueError(f"state_layout: expected one of {axes.state_layouts}, got {state_layout!r}")
    check_tensor("state", state, ndim=4, dtypes=(torch.float32,), device=device)
    check_shape("state", state, (state.shape[0], heads_v, head_dim, head_dim), f"[P, HV, K, V] ({state_layout})")
    if state_indices is None:
        if state.shape[0] < batch:
            raise ValueError(f"state: {state.shape[0]} pool rows for {batch} sequences; pass state_indices "
                             f"or a pool of at least B rows")
    else:
        check_tensor("state_indices", state_indices, ndim=1, dtypes=(torch.int32,), device=device)
        check_shape("state_indices", state_indices, (batch,), "[B]")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)) + (
            (("state_indices", state_indices),) if state_indices is not None else ()):
        _check_contiguous(name, t)
    check_dense_rows("state", state)  # contiguous and 16-byte aligned: the kernel moves it in float4s
    scale = head_dim ** -0.5 if scale is None else check_scale("scale", scale)
    check_bool("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)

    if out is None:
        out = v.new_empty((batch, heads_v, head_dim))
    else:
        check_tensor("out", out, ndim=3, dtypes=(q.dtype,), device=device)
        check_shape("out", out, (batch, heads_v, head_dim), "[B, HV, V]")
        _check_contiguous("out", out)
    if not batch:
        return out
    kernel, slice_v = _step_kernel(device.index, head_dim, q.dtype, state_layout)
    kernel.launch((head_dim // slice_v, heads_v, batch), q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), g=g.data_ptr(),
           beta=beta.data_ptr(), beta_is_fp32=int(beta.dtype is torch.float32), state=state.data_ptr(),
           state_indices=0 if state_indices is None else state_indices.data_ptr(), num_slots=state.shape[0],
           out=out.data_ptr(),
           num_heads=heads, num_heads_v=heads_v, scale=np.float32(scale), use_qk_l2norm=int(use_qk_l2norm_in_kernel))
    return out

