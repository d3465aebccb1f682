"""fla's gated delta rule (Gated DeltaNet) forward, computed by kgen's ops.

``chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule`` take the signatures of
flash-linear-attention 0.5.2 (``fla/ops/gated_delta_rule/chunk.py`` and ``fused_recurrent.py``),
pinned in tests/compat_signatures.json. Use them as ``from kgen.compat.fla import ...``.

What is converted for kgen: ``g`` (and ``initial_state``) of any float dtype to fp32, as fla's
kernels read them; ``beta`` to fp32 unless it has q's dtype; fla's in-kernel gate and beta
activations are computed before the call in fp32 (the same formulas); ``state_v_first`` becomes
kgen's ``state_layout`` (False: ``"kv"``, states ``[N, HV, K, V]``; True: ``"vk"``, ``[N, HV, V, K]``),
so states are never transposed. Final states are fp32, as fla's.
"""

from __future__ import annotations

import warnings

import torch
import torch.nn.functional as F

from kgen import ops as _ops  # looked up at each call (tests replace the ops)
from kgen.compat import PlanCache, _host_cu
from kgen.runtime.checks import refuse_grad

#: fla's names of the tensors a backward would differentiate (refused by name where kgen has no backward).
_GRAD_NAMES = ("q", "k", "v", "g", "beta", "initial_state")

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "plan_cache"]

#: The plans of the varlen batch layouts seen lately, keyed by cu_seqlens, HV, head dim and device.
plan_cache = PlanCache(maxsize=32)

_CU_DTYPES = (torch.int32, torch.int64)


def chunk_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor,
    beta: torch.Tensor,
    scale: float | None = None,
    initial_state: torch.Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    cu_seqlens_cpu: torch.LongTensor | None = None,
    cp_context=None,
    **kwargs,
):
    """fla's ``chunk_gated_delta_rule``, computed by :func:`kgen.ops.chunk_gated_delta_rule`: differentiable, as
    fla's is (gradients for q, k, v, g, beta and initial_state, through the gate and beta transforms below).

    Args are fla's: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]`` (GVA: HV a multiple of H; kgen needs
    V = K, bf16/fp16, a head dim its spec lists); g ``[B, T, HV]`` natural-log gates (any float dtype:
    converted to fp32); beta ``[B, T, HV]``; scale (default ``K ** -0.5``); initial_state ``[N, HV, K,
    V]``, or ``[N, HV, V, K]`` with ``state_v_first=True`` (any float dtype: converted to fp32);
    cu_seqlens ``[N + 1]`` for packed varlen (B = 1); cu_seqlens_cpu: the same values on the host,
    which spares the copy from the device.

    Also as in fla: ``use_beta_sigmoid_in_kernel`` (beta = sigmoid(beta), times 2 with
    ``allow_neg_eigval``), and in ``kwargs`` ``use_gate_in_kernel`` with ``A_log`` and ``dt_bias``
    (g = -exp(A_log) * softplus(g + dt_bias)), both computed in fp32 before kgen's op;
    ``transpose_state_layout`` (fla's deprecated name of ``state_v_first``); ``chunk_size`` (16, 32 or
    64: checked, and of no effect on the result, which kgen computes in chunks of 64);
    ``head_first=False``.

    Refused with a ValueError naming the argument: ``cp_context`` (kgen's context parallelism is
    ``kgen.distributed.chunk_gated_delta_rule_cp``), ``head_first=True``; with a TypeError, any other
    keyword (fla ignores unknown keywords; kgen says so rather than ignore one).

    Returns ``(o [B, T, HV, V], final_state)``: final_state fp32 in initial_state's layout if
    ``output_final_state``, else None.

    With cu_seqlens (and no cu_seqlens_cpu) each call copies it to the host (a synchronisation) to
    find the plan: made once per lengths, then taken from :data:`plan_cache`. For no
    synchronisation, call ``kgen.ops.chunk_gated_delta_rule`` with ``plan=``.
    """
    state_v_first = _state_v_first(state_v_first, kwargs)
    gate_in_kernel, A_log, dt_bias = (kwargs.pop("use_gate_in_kernel", False), kwargs.pop("A_log", None),
                                      kwargs.pop("dt_bias", None))
    chunk_size = kwargs.pop("chunk_size", 64)
    if chunk_size not in (16, 32, 64):
        raise ValueError(f"chunk_size: must be 16, 32, or 64 for Gated Delta Rule (as in fla), got {chunk_size!r}")
    _check_kwargs("chunk_gated_delta_rule", kwargs)
    if cp_context is not None:
        raise ValueError("cp_context: fla's context parallelism is not supported here; expected None "
                         "(kgen's is kgen.distributed.chunk_gated_delta_rule_cp)")
    _check_beta_options(use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if gate_in_kernel and A_log is None:
        raise ValueError("A_log: must be given when use_gate_in_kernel=True")
    g = _gate(g, A_log, dt_bias) if gate_in_kernel else _fp32(g)
    beta = _beta(beta, q, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    plan = None
    if cu_seqlens is not None:
        plan = _chunk_plan(q, v, _cu_values(cu_seqlens, cu_seqlens_cpu, q))
    return _ops.chunk_gated_delta_rule(
        _dense(q), _dense(k), _dense(v), g, beta, scale=scale, initial_state=_fp32(initial_state),
        output_final_state=bool(output_final_state), cu_seqlens=cu_seqlens,
        use_qk_l2norm_in_kernel=bool(use_qk_l2norm_in_kernel), state_layout=_layout(state_v_first), plan=plan)


def fused_recurrent_gated_delta_rule(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    g: torch.Tensor | None = None,
    gk: torch.Tensor | None = None,
    gv: torch.Tensor | None = None,
    beta: torch.Tensor | None = None,
    scale: float = None,
    initial_state: torch.Tensor = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    use_gate_in_kernel: bool = False,
    A_log: torch.Tensor | None = None,
    dt_bias: torch.Tensor | None = None,
    use_beta_sigmoid_in_kernel: bool = False,
    allow_neg_eigval: bool = False,
    state_v_first: bool = False,
    cu_seqlens: torch.LongTensor | None = None,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """fla's ``fused_recurrent_gated_delta_rule`` forward: the same recurrence, computed by kgen's ops.

    kgen has no token-by-token kernel for many tokens of a sequence, and needs none: the chunked
    form computes the same recurrence exactly (up to rounding). So:

    - one token a sequence (T = 1 without cu_seqlens, or every cu_seqlens length 1): kgen's decode
      step, :func:`kgen.ops.gated_delta_rule_step`, on a copy of the initial states (fla leaves
      ``initial_state`` unchanged, and so does this);
    - otherwise :func:`kgen.ops.chunk_gated_delta_rule` (the chunked form, in 64-token chunks).

    Args are fla's (see :func:`chunk_gated_delta_rule` for shapes, dtypes, the gate and beta options
    and ``state_v_first``); ``g=None`` means no decay (g = 0) and ``beta=None`` beta = 1, as in fla.

    Refused with a ValueError naming the argument: ``gk`` and ``gv`` (per-key and per-value decays:
    kgen's rule has one gate per head), a per-value-channel ``beta [B, T, HV, V]``,
    ``head_first=True``; with a TypeError, unknown keywords.

    Returns ``(o [B, T, HV, V], final_state fp32 or None)``. With cu_seqlens each call copies it to
    the host (a synchronisation) to find the plan, taken from :data:`plan_cache` after the first call
    with those lengths.
    """
    state_v_first = _state_v_first(state_v_first, kwargs)
    _check_kwargs("fused_recurrent_gated_delta_rule", kwargs)
    refuse_grad("fused_recurrent_gated_delta_rule", _GRAD_NAMES, q, k, v, g, beta, initial_state)
    if gk is not None:
        raise ValueError("gk: per-key decays are not supported (kgen's gated delta rule has one gate per "
                         "v-head: g); expected None")
    if gv is not None:
        raise ValueError("gv: per-value decays are not supported (kgen's gated delta rule has one gate per "
                         "v-head: g); expected None")
    if isinstance(beta, torch.Tensor) and beta.dim() == 4:
        raise ValueError(f"beta: per-value-channel betas {tuple(beta.shape)} are not supported; expected one "
                         f"beta per token and v-head, [B, T, HV]")
    _check_beta_options(use_beta_sigmoid_in_kernel, allow_neg_eigval)
    if use_gate_in_kernel:
        if A_log is None:
            raise ValueError("A_log: must be given when use_gate_in_kernel=True")
        if g is None:
            raise ValueError("g: the raw gate input must be given when use_gate_in_kernel=True")
    if not all(isinstance(t, torch.Tensor) and t.dim() == 4 for t in (q, k, v)):
        # Not fla's shapes: kgen's op says what is wrong.
        return _ops.chunk_gated_delta_rule(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                           output_final_state=output_final_state, cu_seqlens=cu_seqlens)
    batch, tokens, heads_v = v.shape[:3]
    for name, t in (("q", q), ("k", k)):  # the one-token path below reads token 0 alone: check them all here
        if t.shape[:2] != (batch, tokens):
            raise ValueError(f"{name}: expected [B, T, H, K] with v's B={batch} and T={tokens}, got {tuple(t.shape)}")
    if g is None:
        g = torch.zeros((batch, tokens, heads_v), dtype=torch.float32, device=v.device)
    else:
        g = _gate(g, A_log, dt_bias) if use_gate_in_kernel else _fp32(g)
    if beta is None:
        beta = torch.ones((batch, tokens, heads_v), dtype=torch.float32, device=v.device)
    else:
        beta = _beta(beta, q, use_beta_sigmoid_in_kernel, allow_neg_eigval)
    layout = _layout(state_v_first)
    output_final_state, l2norm = bool(output_final_state), bool(use_qk_l2norm_in_kernel)

    plan = None
    if cu_seqlens is None:
        if tokens == 1:  # B sequences of one token
            return _step(q[:, 0], k[:, 0], v[:, 0], g[:, 0], beta[:, 0], scale, initial_state, output_final_state,
                         l2norm, layout, unsqueeze=1)
    else:
        cu = _cu_values(cu_seqlens, None, q)
        if cu is not None and batch == 1 and len(cu) == tokens + 1 and all(b - a == 1 for a, b in zip(cu, cu[1:])):
            # T sequences of one token each (packed decode)
            return _step(q[0], k[0], v[0], g[0], beta[0], scale, initial_state, output_final_state, l2norm,
                         layout, unsqueeze=0)
        plan = _chunk_plan(q, v, cu)
    return _ops.chunk_gated_delta_rule(
        _dense(q), _dense(k), _dense(v), g, beta, scale=scale, initial_state=_fp32(initial_state),
        output_final_state=output_final_state, cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=l2norm,
        state_layout=layout, plan=plan)


def _step(q, k, v, g, beta, scale, initial_state, output_final_state, l2norm, layout, unsqueeze):
    """N sequences of one token each (q, k ``[N, H, K]``, v ``[N, HV, V]``): kgen's decode step on new states."""
    n, heads_v, head_dim = v.shape
    shape = (n, heads_v, head_dim, head_dim)
    if initial_state is None:
        state = torch.zeros(shape, dtype=torch.float32, device=v.device)
    else:
        if not isinstance(initial_state, torch.Tensor) or tuple(initial_state.shape) != shape:
            got = tuple(initial_state.shape) if isinstance(initial_state, torch.Tensor) else type(initial_state).__name__
            raise ValueError(f"initial_state: expected {list(shape)} ([N, HV, K, V] ({layout})), got {got}")
        # The step updates its states in place: a copy, so the caller's initial_state stays as it was.
        state = torch.empty(shape, dtype=torch.float32, device=v.device).copy_(initial_state)
    o = _ops.gated_delta_rule_step(_dense(q), _dense(k), _dense(v), _dense(g), _dense(beta), state,
                                   scale=scale, state_layout=layout, use_qk_l2norm_in_kernel=l2norm)
    return o.unsqueeze(unsqueeze), (state if output_final_state else None)


def _state_v_first(state_v_first, kwargs: dict) -> bool:
    """``state_v_first``, or fla's deprecated ``transpose_state_layout`` (popped from ``kwargs``), as fla takes them."""
    if "transpose_state_layout" in kwargs:
        if state_v_first:
            raise ValueError("transpose_state_layout: cannot pass both `state_v_first` and the deprecated "
                             "`transpose_state_layout`")
        warnings.warn("`transpose_state_layout` is deprecated and renamed to `state_v_first`.", DeprecationWarning,
                      stacklevel=3)
        state_v_first = kwargs.pop("transpose_state_layout")
    return bool(state_v_first)


def _check_kwargs(function: str, kwargs: dict) -> None:
    if kwargs.pop("head_first", False):
        raise ValueError("head_first: [B, H, T, ...] inputs are not supported (fla removed them too); pass "
                         "[B, T, H, ...] tensors and head_first=False")
    if kwargs:
        raise TypeError(f"{function}: unexpected keyword argument(s) {sorted(kwargs)}: kgen does not compute them")


def _check_beta_options(use_beta_sigmoid_in_kernel, allow_neg_eigval) -> None:
    if allow_neg_eigval and not use_beta_sigmoid_in_kernel:
        raise ValueError("allow_neg_eigval: `allow_neg_eigval=True` requires `use_beta_sigmoid_in_kernel=True`")


def _layout(state_v_first: bool) -> str:
    return "vk" if state_v_first else "kv"


def _fp32(t):
    """A float tensor as contiguous fp32 (no copy if it is); anything else as it is, for kgen's checks to name."""
    if isinstance(t, torch.Tensor) and t.is_floating_point():
        return t.to(torch.float32).contiguous()
    return t


def _dense(t):
    return t.contiguous() if isinstance(t, torch.Tensor) else t


def _gate(g, A_log, dt_bias):
    """fla's in-kernel gate, g = -exp(A_log) * softplus(g + dt_bias), in fp32."""
    x = g.to(torch.float32)
    if dt_bias is not None:
        x = x + dt_bias.to(torch.float32)
    return (-A_log.to(torch.float32).exp() * F.softplus(x)).contiguous()


def _beta(beta, q, sigmoid: bool, neg_eigval: bool):
    """beta as kgen takes it: fp32 or q's dtype; fla's in-kernel sigmoid (x2 with neg_eigval) applied in fp32."""
    if not isinstance(beta, torch.Tensor) or not beta.is_floating_point():
        return beta
    if sigmoid:
        beta = torch.sigmoid(beta.to(torch.float32))
        return beta * 2.0 if neg_eigval else beta
    if beta.dtype == torch.float32 or (isinstance(q, torch.Tensor) and beta.dtype == q.dtype):
        return beta.contiguous()
    return beta.to(torch.float32).contiguous()


def _cu_values(cu_seqlens, cu_seqlens_cpu, q) -> tuple[int, ...] | None:
    """The cumulative lengths on the host: from cu_seqlens_cpu if given, else copied from cu_seqlens."""
    if not isinstance(q, torch.Tensor):
        return None
    if cu_seqlens_cpu is not None:
        if isinstance(cu_seqlens_cpu, torch.Tensor):
            if cu_seqlens_cpu.device.type != "cpu" or cu_seqlens_cpu.dim() != 1:
                raise ValueError(f"cu_seqlens_cpu: expected a 1-D CPU tensor, got {tuple(cu_seqlens_cpu.shape)} "
                                 f"on {cu_seqlens_cpu.device}")
            return tuple(cu_seqlens_cpu.tolist())
        return tuple(cu_seqlens_cpu)
    return _host_cu(cu_seqlens, q.device, _CU_DTYPES)


def _chunk_plan(q, v, cu):
    """The cached plan of these lengths for q's head dim and v's heads; None where the op should check the arguments."""
    if cu is None or not isinstance(v, torch.Tensor) or q.dim() != 4 or v.dim() != 4:
        return None
    heads_v, head_dim, device = v.shape[2], q.shape[3], q.device
    try:
        return plan_cache.get((cu, heads_v, head_dim, device), lambda: _ops.plan_chunk_gated_delta_rule(
            list(cu), num_heads_v=heads_v, head_dim=head_dim, device=device))
    except Exception:  # noqa: BLE001 - not dropped: the op, given no plan, plans and checks again and raises by name
        return None
