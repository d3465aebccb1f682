"""flash-attn's ``flash_attn_varlen_func``, computed by :func:`kgen.ops.attention_varlen`.

The signature is flash-attn 2.8.3.post1's (``flash_attn/flash_attn_interface.py``), pinned in
tests/compat_signatures.json. Use it as ``from kgen.compat.flash_attn import flash_attn_varlen_func``.
"""

from __future__ import annotations

import math
import operator

import torch

from kgen import ops as _ops  # looked up at each call (tests replace the ops)
from kgen.compat import PlanCache, _host_cu

__all__ = ["flash_attn_varlen_func", "plan_cache"]

#: The plans of the batch layouts seen lately, keyed by both cu_seqlens, head dim, dtype, causal, window, device.
plan_cache = PlanCache(maxsize=32)


def flash_attn_varlen_func(
    q,
    k,
    v,
    cu_seqlens_q,
    cu_seqlens_k,
    max_seqlen_q,
    max_seqlen_k,
    dropout_p=0.0,
    softmax_scale=None,
    causal=False,
    window_size=(-1, -1),  # -1 means infinite context window
    softcap=0.0,  # 0.0 means deactivated
    alibi_slopes=None,
    deterministic=False,
    return_attn_probs=False,
    block_table=None,
):
    """flash-attn's varlen attention forward, computed by :func:`kgen.ops.attention_varlen`.

    Arguments are flash-attn's: q ``(total_q, nheads, headdim)``, k and v ``(total_k, nheads_k,
    headdim)`` (GQA when nheads_k divides nheads), cu_seqlens_q / cu_seqlens_k int32 ``(batch + 1,)``
    on q's device; causal masks are bottom-right aligned; ``window_size=(left, right)`` keys around the
    aligned diagonal, a negative side unbounded (with ``causal``, right is 0). kgen's dtypes and head
    dims apply (bf16/fp16, the head dims its spec lists).

    - ``max_seqlen_q``, ``max_seqlen_k``: accepted and not used; kgen's plan takes the maxima from the lengths.
    - ``deterministic``: accepted; it chooses flash-attn's backward, and kgen has none (tensors that
      require grad are refused). kgen's forward is deterministic.
    - Refused with a ValueError naming the argument: ``dropout_p`` other than 0, ``softcap`` > 0
      (flash-attn treats softcap <= 0 as off, and so does this), ``alibi_slopes``, ``block_table``.

    Returns ``out (total_q, nheads, headdim)``; with ``return_attn_probs=True``, ``(out, softmax_lse,
    None)``: ``softmax_lse`` fp32 ``(nheads, total_q)``, natural log, as flash-attn's, with flash-attn's
    ``+inf`` for a row that attends no key (kgen's op writes ``-inf``; it is converted). The third item,
    flash-attn's ``S_dmask``, is None: flash-attn returns it only with dropout (also None there at
    ``dropout_p=0``), and kgen never forms the probabilities.

    Each call copies ``cu_seqlens_q`` and ``cu_seqlens_k`` to the host (one synchronisation each; one
    when both are the same tensor) to find the plan: made once per lengths and options, then taken
    from :data:`plan_cache`. For no synchronisation, call ``kgen.ops.attention_varlen`` with ``plan=``.
    """
    _refuse_nonzero("dropout_p", dropout_p, "kgen's attention has no dropout")
    if not _is_off(softcap):
        raise ValueError(f"softcap: kgen's attention has no logit soft-capping; expected 0.0 (or <= 0: off), "
                         f"got {softcap!r}")
    if alibi_slopes is not None:
        raise ValueError("alibi_slopes: kgen's attention has no ALiBi bias; expected None")
    if block_table is not None:
        raise ValueError("block_table: kgen.ops.attention_varlen takes contiguous packed k and v, not a paged "
                         "cache; expected None (kgen.ops.attention_decode reads a paged cache for decoding)")
    window = _window(window_size)
    plan = _plan(q, cu_seqlens_q, cu_seqlens_k, causal, window)
    result = _ops.attention_varlen(q, k, v, cu_seqlens_q, cu_seqlens_k, causal=causal, window=window,
                                   softmax_scale=softmax_scale, return_lse=bool(return_attn_probs), plan=plan)
    if not return_attn_probs:
        return result
    out, lse = result
    # flash-attn writes +inf as the LSE of a row with no key to attend (kgen: -inf); lse is ours to change.
    lse.masked_fill_(lse == -math.inf, math.inf)
    return out, lse, None


def _refuse_nonzero(name: str, value, why: str) -> None:
    try:
        zero = float(value) == 0.0
    except (TypeError, ValueError):
        raise TypeError(f"{name}: expected a float, got {type(value).__name__} {value!r}") from None
    if not zero:
        raise ValueError(f"{name}: {why}; expected 0.0, got {value!r}")


def _is_off(softcap) -> bool:
    try:
        return float(softcap) <= 0.0
    except (TypeError, ValueError):
        raise TypeError(f"softcap: expected a float, got {type(softcap).__name__} {softcap!r}") from None


def _window(window_size) -> tuple[int, int]:
    """flash-attn's window_size as kgen's window: a pair of ints, any negative side as -1 (unbounded)."""
    try:
        left, right = window_size
        left, right = operator.index(left), operator.index(right)
    except (TypeError, ValueError):
        raise TypeError(f"window_size: expected a pair of ints (left, right), -1 unbounded; got {window_size!r}") from None
    return max(left, -1), max(right, -1)


def _plan(q, cu_seqlens_q, cu_seqlens_k, causal, window):
    """The cached plan of this call's lengths and options; None where the op should check the arguments itself."""
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        return None
    cu_q = _host_cu(cu_seqlens_q, q.device, (torch.int32,))
    if cu_q is None:
        return None
    cu_k = cu_q if cu_seqlens_k is cu_seqlens_q else _host_cu(cu_seqlens_k, q.device, (torch.int32,))
    if cu_k is None:
        return None
    head_dim, dtype, device = q.shape[2], q.dtype, q.device
    try:
        key = (cu_q, cu_k, head_dim, dtype, causal, window, device)
        return plan_cache.get(key, lambda: _ops.plan_attention_varlen(
            list(cu_q), list(cu_k), head_dim=head_dim, dtype=dtype, causal=causal, window=window, device=device))
    except Exception:  # noqa: BLE001 - not dropped: the op, given no plan, plans and checks again and raises by name
        return None
