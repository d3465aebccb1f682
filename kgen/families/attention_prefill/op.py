"""Attention prefill, eagerly: every check of a call, its launch, and the checked call kept for the next.

Sequences are packed along the token dimension and delimited by ``cu_seqlens``; the plan
(:mod:`kgen.families.attention_prefill.planner`) is made on the host from their lengths, so
that with a plan the op does no device-to-host synchronisation and can be captured in a CUDA graph.
"""

from __future__ import annotations

import threading

import torch

from kgen.families.attention_prefill.plan import validate_window
from kgen.families.attention_prefill.planner import FAMILY, AttentionPlan, plan_attention_varlen, planning_sm
from kgen.launch import current_device
from kgen.runtime import tma
from kgen.runtime.checks import check_bool, check_rows, check_sink, check_tensor, softmax_scale_log2
from kgen.runtime.device import GRID_YZ_LIMIT
from kgen.runtime.dispatch import cached_launcher, contract, spec_dtypes


def attention_varlen(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                     cu_seqlens_q: torch.Tensor, cu_seqlens_k: torch.Tensor, *,
                     causal: bool = False, window: tuple[int, int] = (-1, -1), sink: torch.Tensor | None = None,
                     softmax_scale: float | None = None, return_lse: bool = False,
                     plan: AttentionPlan | None = None, out: torch.Tensor | None = None,
                     lse_out: torch.Tensor | None = None):
    """Attention over packed variable-length sequences, with grouped-query heads.

    Args:
        q: ``[total_q, Hq, D]``; k, v: ``[total_k, Hkv, D]``; bf16 or fp16; Hq a multiple of Hkv.
            The head dim must be contiguous; D must be one the spec lists.
        cu_seqlens_q, cu_seqlens_k: int32 ``[N+1]`` on q's device: sequence i is rows
            ``cu[i]:cu[i+1]`` (any length >= 0).
        causal: mask keys after the query, bottom-right aligned when Lq != Lk (as FlashAttention).
        window: ``(left, right)`` keys allowed around the aligned diagonal; -1 = unbounded.
        sink: optional fp32 ``[Hq]`` logits that join every row's softmax denominator.
        softmax_scale: default ``1/sqrt(D)``.
        return_lse: also return the natural-log LSE, fp32 ``[Hq, total_q]``.
        plan: from :func:`plan_attention_varlen` for these cu_seqlens. Without it the op
            plans for itself, which copies cu_seqlens to the host: a device synchronisation,
            and not capturable in a CUDA graph. The kernel addresses by the plan's bounds and
            checks them against cu_seqlens on the device: every sequence whose bounds there
            differ from the plan's gets NaN rows (O and LSE); the others are computed as usual.
        out, lse_out: optional preallocated results (contiguous ``[total_q, Hq, D]`` in q's
            dtype, 16-byte aligned, and fp32 ``[Hq, total_q]``).

    Returns:
        ``out`` ``[total_q, Hq, D]`` in q's dtype, or ``(out, lse)``. Rows with no key to
        attend (and no sink) are 0 with LSE -inf.
    """
    # A call shaped like an earlier one of the same plan (layouts, dtypes, devices, options, calling
    # thread) reuses what the checks established and launches with the new addresses: the hot path of
    # a model. Anything unusual (no plan, options of unusual types) takes the checks every time.
    if type(return_lse) is not bool:
        check_bool("return_lse", return_lse)
    key = _call_key(q, k, v, cu_seqlens_q, cu_seqlens_k, sink, out, lse_out, causal, window, softmax_scale)
    prepared = plan._prepared.get(key) if key is not None and isinstance(plan, AttentionPlan) else None
    if (prepared is None or (q.data_ptr() | k.data_ptr() | v.data_ptr()) & 15
            or (out is not None and out.data_ptr() & 15)):
        prepared = _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, sink, softmax_scale, plan,
                            out, lse_out)
        if key is not None and plan is not None:
            if len(plan._prepared) >= _MAX_PREPARED_CALLS:
                plan._prepared.clear()
            plan._prepared[key] = prepared
    return prepared.run(q, k, v, cu_seqlens_q, cu_seqlens_k, sink, out, lse_out, return_lse)


_MAX_PREPARED_CALLS = 16  # per plan: distinct layouts and options one batch layout is called with


def _call_key(q, k, v, cu_seqlens_q, cu_seqlens_k, sink, out, lse_out, causal, window, softmax_scale):
    """What the checks depend on, addresses aside; None when an argument is not of a plain type.

    Types are part of it: ``True == 1``, but a bool scale or an int ``causal`` must be refused.
    """
    if (type(causal) is not bool or type(window) is not tuple or len(window) != 2
            or type(window[0]) is not int or type(window[1]) is not int
            or not (softmax_scale is None or type(softmax_scale) is float)):
        return None
    try:
        return (threading.get_ident(), causal, window, softmax_scale,
                *(None if t is None else (t.shape, t.stride(), t.dtype, t.get_device())
                  for t in (q, k, v, cu_seqlens_q, cu_seqlens_k, sink, out, lse_out)))
    except AttributeError:  # not a tensor: the checks say which
        return None


class _PreparedCall:
    """A checked call's launch: its kernel's launch with all but the addresses bound, and the descriptors to patch."""

    def __init__(self, device_index, launch, grid, maps, map_args, tables, out_shape, lse_shape):
        #: ``launch`` is the kernel's launch function with every argument but the addresses set (the plan's tables'
        #: addresses among them, so the call keeps ``tables`` alive); None when there is nothing to compute.
        self.device_index, self.launch, self.grid, self.maps, self.map_args = device_index, launch, grid, maps, map_args
        self.tables, self.out_shape, self.lse_shape = tables, out_shape, lse_shape

    def run(self, *args):
        # Descriptors are built and patched on the tensors' device, which need not be the current one.
        if current_device() == self.device_index:
            return self._run(*args)
        with torch.cuda.device(self.device_index):
            return self._run(*args)

    def _run(self, q, k, v, cu_seqlens_q, cu_seqlens_k, sink, out, lse_out, return_lse):
        out = q.new_empty(self.out_shape) if out is None else out
        lse = q.new_empty(self.lse_shape, dtype=torch.float32) if lse_out is None else lse_out
        if self.launch is not None:
            maps, tensors = self.maps, (q, k, v, out)
            self.launch(self.grid, q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), out=out.data_ptr(), lse=lse.data_ptr(),
                        cu_seqlens_q=cu_seqlens_q.data_ptr(), cu_seqlens_k=cu_seqlens_k.data_ptr(),
                        sink=0 if sink is None else sink.data_ptr(),
                        **{name: maps.get(role, tensors[slot]) for name, role, slot in self.map_args})
        return (out, lse) if return_lse else out


def _prepare(q, k, v, cu_seqlens_q, cu_seqlens_k, causal, window, sink, softmax_scale, plan, out, lse_out
             ) -> _PreparedCall:
    """Every check of a call, and the launch it makes; an error names the argument at fault."""
    if plan is not None and not isinstance(plan, AttentionPlan):
        raise TypeError(f"plan: expected an AttentionPlan from plan_attention_varlen, got {type(plan).__name__}")
    check_tensor("q", q, ndim=3, dtypes=spec_dtypes(FAMILY))
    check_tensor("k", k, ndim=3, dtypes=(q.dtype,), device=q.device)
    check_tensor("v", v, ndim=3, dtypes=(q.dtype,), device=q.device)
    total_q, heads_q, head_dim = q.shape
    total_k, heads_kv, _ = k.shape
    if k.shape[2] != head_dim or v.shape != k.shape:
        raise ValueError(f"k, v: expected [total_k, Hkv, {head_dim}] each, got {tuple(k.shape)} and {tuple(v.shape)}")
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"q: Hq={heads_q} must be a multiple of Hkv={heads_kv} (k's heads)")
    if heads_q > GRID_YZ_LIMIT:
        raise ValueError(f"q: {heads_q} query heads exceed the kernel's grid limit of {GRID_YZ_LIMIT}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        check_rows(name, t)
    check_sink(sink, heads_q, q.device)
    scale_log2 = softmax_scale_log2(softmax_scale, head_dim)
    merged_window = validate_window(causal, window)
    if plan is None:
        _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device, None)
        _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device, None)
        plan = plan_attention_varlen(cu_seqlens_q.cpu(), cu_seqlens_k.cpu(), head_dim=head_dim, dtype=q.dtype,
                                     causal=causal, window=window, device=q.device)
    elif (plan.head_dim, plan.dtype, plan.window) != (head_dim, q.dtype, merged_window):
        raise ValueError(f"plan: made for head_dim={plan.head_dim}, dtype={plan.dtype}, window={plan.window}; "
                         f"this call has head_dim={head_dim}, dtype={q.dtype}, window={merged_window}")
    if (plan.schedule.total_q, plan.schedule.total_k) != (total_q, total_k):
        raise ValueError(f"q, k: the plan covers {plan.schedule.total_q} query and {plan.schedule.total_k} key tokens; "
                         f"got {total_q} and {total_k}")
    sm = planning_sm(q.device)
    if not plan.variant.supports_sm(sm):
        raise ValueError(f"plan: its kernel {plan.variant.name} cannot run on {q.device} (sm_{sm}): such variants "
                         f"{plan.variant.arch_refusal(sm)}; plan with device={str(q.device)!r}")
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device, plan.num_seqs)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device, plan.num_seqs)
    tables = plan.tables.on(q.device)
    work, plan_cu_seqlens = tables

    out_shape, lse_shape = (total_q, heads_q, head_dim), (heads_q, total_q)
    _check_result("out", out, out_shape, q.dtype, q)
    if out is not None and out.data_ptr() % 16:  # TMA stores whole tiles; rechecked per call
        raise ValueError("out: expected a 16-byte aligned data pointer")
    _check_result("lse_out", lse_out, lse_shape, torch.float32, q)
    num_work = work.shape[0]
    if not (num_work and heads_q):
        return _PreparedCall(q.device.index, None, None, None, (), tables, out_shape, lse_shape)
    kernel = contract(plan.variant)
    parameters = kernel.parameters[FAMILY]
    # The kernel's descriptors, map_q, map_k, ... by its parameters: q, k, v, and o where it stores O by TMA;
    # each with its tensor's place in (q, k, v, out).
    roles = [p.name.removeprefix("map_") for p in parameters if p.kind == "tensor_map"]
    map_args = tuple((f"map_{role}", role, "qkvo".index(role)) for role in roles)
    # out's layout follows from q's (contiguous, or new), v's shape is k's.
    maps = _descriptors.get((q.device.index, plan.variant.name, q.shape, q.stride(), k.shape, k.stride(), v.stride()),
                            lambda: _tensor_maps(kernel.sizes, roles, total_k))
    window_left, window_right = kernel_window(merged_window, plan.schedule.max_seqlen_q, plan.schedule.max_seqlen_k)
    # The kernel's row strides of out and lse are those of contiguous tensors (checked above, or new).
    launch = cached_launcher(plan.variant, FAMILY, q.device.index).bound(
        work=work.data_ptr(), plan_cu_seqlens=plan_cu_seqlens.data_ptr(), heads_per_kv=heads_q // heads_kv,
        q_stride_t=q.stride(0), q_stride_h=q.stride(1), k_stride_t=k.stride(0), k_stride_h=k.stride(1),
        v_stride_t=v.stride(0), v_stride_h=v.stride(1),
        o_stride_t=heads_q * head_dim, o_stride_h=head_dim, lse_stride_h=total_q, scale_log2=scale_log2,
        window_left=window_left, window_right=window_right,
        heads_fastest=int(heads_fastest(plan.schedule.max_seqlen_k, heads_q // heads_kv)))
    return _PreparedCall(q.device.index, launch, (num_work, heads_q), maps, map_args, tables, out_shape, lse_shape)


#: Sequences up to this many keys take their blocks heads fastest without GQA (see heads_fastest).
HEADS_FASTEST_MAX_KEYS = 1024


def heads_fastest(max_seqlen_k: int, heads_per_kv: int) -> bool:
    """Whether the kernel's blocks take their (work item, head) heads fastest in launch order, not heads slowest.

    Heads fastest, the blocks resident at once read every head of their tokens and the query heads that share a K/V
    head run together: faster under GQA, and for sequences of up to about 1k keys (1-4% from 127 to 512 tokens,
    2-4% on GQA batches up to 4k). Longer sequences of one K/V head a query head run heads slowest, whose resident
    blocks read fewer K/V tiles at once (1-2% faster at 1025 and 2048 tokens); bench/NOTES.md, session 27.
    """
    return heads_per_kv > 1 or max_seqlen_k <= HEADS_FASTEST_MAX_KEYS


def _check_cu_seqlens(name: str, cu: torch.Tensor, device: torch.device, num_seqs: int | None) -> None:
    check_tensor(name, cu, ndim=1, dtypes=(torch.int32,), device=device)
    if num_seqs is not None and cu.shape[0] != num_seqs + 1:
        raise ValueError(f"{name}: the plan is for {num_seqs} sequences ({num_seqs + 1} entries), got {cu.shape[0]}")
    if not cu.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")


def _check_result(name: str, given: torch.Tensor | None, shape: tuple, dtype: torch.dtype, like: torch.Tensor) -> None:
    if given is None:
        return
    check_tensor(name, given, ndim=len(shape), dtypes=(dtype,), device=like.device)
    if tuple(given.shape) != shape or not given.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor of shape {shape}, got {tuple(given.shape)}")


#: The descriptors of the op's launches, per calling thread and tensor layout (a checked call keeps its own).
_descriptors = tma.DescriptorCache()


def _tensor_maps(sizes, roles, total_k: int) -> tma.TensorMaps:
    box_rows = {"q": sizes["q_box_rows"], "k": sizes["kv_box_rows"], "v": sizes["kv_box_rows"], "o": sizes["q_box_rows"]}
    # With no keys at all no key tile is ever loaded; the parameter still needs a descriptor.
    return tma.TensorMaps({role: box_rows[role] for role in roles}, sizes["box_span_bytes"],
                          alias_of={"k": "q", "v": "q"} if not total_k else {})


def kernel_window(window: tuple[int, int], max_seqlen_q: int, max_seqlen_k: int) -> tuple[int, int]:
    """The window as the kernel takes it: a side that bounds no key of any sequence becomes -1 (unbounded).

    The kernel adds the window to 32-bit positions: a left side of max_seqlen_k or more, or a
    right side of max_seqlen_q or more, allows every key yet could overflow there.
    """
    left, right = window
    return (-1 if left >= max_seqlen_k else left), (-1 if right >= max_seqlen_q else right)
