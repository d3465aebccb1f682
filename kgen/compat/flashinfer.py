"""FlashInfer's ``merge_state`` and ``merge_states``, computed by kgen's merge ops.

The signatures are FlashInfer 0.6.17's (``flashinfer/cascade.py``), pinned in
tests/compat_signatures.json. Use them as ``from kgen.compat.flashinfer import merge_state, merge_states``.

FlashInfer's LSE ``s`` is base 2 (``log2(sum 2^x)``), kgen's natural: ``s`` is multiplied by ln 2
on the way in and the merged LSE by log2(e) on the way out, in fp32 (so a merged ``s`` may differ
from FlashInfer's in its last bits; ``-inf`` stays ``-inf``). ``merge_states`` stacks the states on
dim 1, ``v [seq_len, num_states, num_heads, head_dim]``, kgen on dim 0: ``v`` is copied once into
kgen's order (no copy when seq_len or num_states is 1), and ``s`` is read through strides.

A state with ``s = -inf`` (no keys) contributes nothing, its ``v`` unread; a row whose every state is
empty comes out ``v = 0``, ``s = -inf`` (FlashInfer 0.6.17's kernels give NaN there).
"""

from __future__ import annotations

import math

import torch

from kgen import ops as _ops  # looked up at each call (tests replace the ops)
from kgen.runtime.checks import refuse_grad

__all__ = ["merge_state", "merge_states"]

_LN2 = math.log(2.0)
_LOG2E = 1.0 / _LN2


def merge_state(v_a: torch.Tensor, s_a: torch.Tensor, v_b: torch.Tensor, s_b: torch.Tensor):
    """FlashInfer's ``merge_state``: merge two attention states over disjoint key sets.

    Args:
        v_a, v_b: ``[seq_len, num_heads, head_dim]`` (kgen's dtypes and head dims; contiguous).
        s_a, s_b: ``[seq_len, num_heads]`` base-2 LSE (any float dtype: used as fp32, as FlashInfer does).

    Returns:
        ``(V [seq_len, num_heads, head_dim], S [seq_len, num_heads] fp32, base 2)``.
    """
    refuse_grad("merge_state", ("v_a", "s_a", "v_b", "s_b"), v_a, s_a, v_b, s_b)
    shape = _rows_of("v_a", v_a, 3, "[seq_len, num_heads, head_dim]")
    s_a = _natural("s_a", s_a, "v_a", v_a, shape, "[seq_len, num_heads] of v_a")
    s_b = _natural("s_b", s_b, "v_a", v_a, shape, "[seq_len, num_heads] of v_a")
    v, lse = _ops.merge_attention_states(v_a, s_a, v_b, s_b)
    return v, lse.mul_(_LOG2E)


def merge_states(v: torch.Tensor, s: torch.Tensor):
    """FlashInfer's ``merge_states``: merge ``num_states`` attention states stacked on dim 1.

    Args:
        v: ``[seq_len, num_states, num_heads, head_dim]``.
        s: ``[seq_len, num_states, num_heads]`` base-2 LSE (any float dtype: used as fp32).

    Returns:
        ``(V [seq_len, num_heads, head_dim], S [seq_len, num_heads] fp32, base 2)``.
    """
    refuse_grad("merge_states", ("v", "s"), v, s)
    shape = _rows_of("v", v, 4, "[seq_len, num_states, num_heads, head_dim]")
    s = _natural("s", s, "v", v, shape, "[seq_len, num_states, num_heads] of v")
    # kgen stacks the states on dim 0 and reads each state's rows contiguously: one copy of v.
    out, lse = _ops.merge_attention_states_n(v.transpose(0, 1).contiguous(), s.transpose(0, 1))
    return out, lse.mul_(_LOG2E)


def _rows_of(name: str, v, ndim: int, what: str) -> tuple[int, ...]:
    """The LSE shape of ``v``: all its dims but the last; an error naming ``name`` unless v is an ndim-D tensor."""
    if not isinstance(v, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor {what}, got {type(v).__name__}")
    if v.dim() != ndim:
        raise ValueError(f"{name}: expected {what}, got shape {tuple(v.shape)}")
    return tuple(v.shape[:-1])


def _natural(name: str, s, v_name: str, v: torch.Tensor, shape: tuple[int, ...], what: str) -> torch.Tensor:
    """A base-2 LSE as a new fp32 natural-log one, after checking it against the rows of ``v`` (argument ``v_name``)."""
    if not isinstance(s, torch.Tensor):
        raise TypeError(f"{name}: expected a tensor {what}, got {type(s).__name__}")
    if not s.is_floating_point():
        raise TypeError(f"{name}: expected a float tensor (fp32 log-sum-exp, base 2), got {s.dtype}")
    if tuple(s.shape) != shape:
        raise ValueError(f"{name}: expected {what} {list(shape)}, got {tuple(s.shape)}")
    if s.device != v.device:
        raise ValueError(f"{name}: on {s.device}, {v_name} on {v.device}: expected the LSEs and states on one device")
    return s.to(torch.float32) * _LN2
