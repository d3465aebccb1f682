"""GQA decode attention over a KV cache, eagerly: the call's checks and its launch.

Each request has ``Lq`` (1..8) new query tokens, the last ``Lq`` positions of its ``seqlens_k[b]``
keys and causal among themselves. The plan (:mod:`kgen.families.attention_decode.planner`) fixes the
grid, the kernel variant and the split workspace; this module checks a call's tensors against it and
launches.
"""

from __future__ import annotations

import torch

from kgen.families.attention_decode.planner import FAMILY, DecodePlan, plan_attention_decode
from kgen.runtime.checks import (check_bool, check_int, check_rows, check_shape, check_sink, check_tensor,
                                 softmax_scale_log2)
from kgen.runtime.device import sm_count
from kgen.runtime.dispatch import cached_launcher, contract, spec_dtypes
from kgen.runtime.tma import DescriptorCache, TensorMaps


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, seqlens_k: torch.Tensor, *,
                     block_table: torch.Tensor | None = None, window_left: int = -1, sink: torch.Tensor | None = None,
                     softmax_scale: float | None = None, return_lse: bool = False, plan: DecodePlan | None = None,
                     out: torch.Tensor | None = None):
    """Attention of each request's new query tokens over its cached keys and values.

    Args:
        q: ``[B, Hq, D]`` (one new token per request) or ``[B, Lq, Hq, D]`` with Lq in 1..8, the
            last Lq positions of each request, causal among themselves; bf16 or fp16.
        k_cache, v_cache: contiguous ``[B, Lmax, Hkv, D]``, or paged ``[num_pages, page_size, Hkv, D]``
            with ``block_table``; views of one interleaved cache are fine (the head dim contiguous).
        seqlens_k: int32 ``[B]`` on q's device: each request's keys, new tokens included (a length below
            Lq leaves the tokens at negative positions with no key: 0 out, LSE -inf).
        block_table: int32 ``[B, max_pages]``: request b's key j is row ``j % page_size`` of page
            ``block_table[b, j // page_size]``.
        window_left: keys a query sees before its own position (-1: all); must match the plan's.
        sink: optional fp32 ``[Hq]`` logits that join every row's softmax denominator.
        softmax_scale: default ``1/sqrt(D)``.
        return_lse: also return the natural-log LSE, fp32 ``[B, Hq]`` (``[B, Lq, Hq]`` for 4-D q).
        plan: from :func:`plan_attention_decode`. Without it the op plans for itself, which copies
            seqlens_k to the host: a synchronisation, and not capturable in a CUDA graph.
        out: optional preallocated output, contiguous, q's shape and dtype.

    Returns:
        ``out``, or ``(out, lse)``. A request with no keys gets 0 (LSE -inf, or the sink's). A request
        the kernel refuses on the device (a length past the cache's capacity; a block-table entry
        outside the cache; with a plan for whole slices only, a length that ends mid-slice) gets NaN.
    """
    dtypes = spec_dtypes(FAMILY)
    if not isinstance(q, torch.Tensor) or q.dim() != 3:
        check_tensor("q", q, ndim=4, dtypes=dtypes)  # names what is wrong unless q is a 4-D tensor
    q4 = q.unsqueeze(1) if q.dim() == 3 else q
    check_tensor("q", q4, ndim=4, dtypes=dtypes)
    device = q.device
    batch, q_len, heads_q, head_dim = q4.shape
    paged = block_table is not None
    for name, t in (("k_cache", k_cache), ("v_cache", v_cache)):
        check_tensor(name, t, ndim=4, dtypes=(q.dtype,), device=device)
        check_rows(name, t)
    if v_cache.shape != k_cache.shape:
        raise ValueError(f"v_cache: expected k_cache's shape {tuple(k_cache.shape)}, got {tuple(v_cache.shape)}")
    heads_kv = k_cache.shape[2]
    if k_cache.shape[3] != head_dim:
        raise ValueError(f"k_cache: head dim {k_cache.shape[3]} differs from q's {head_dim}")
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"q: Hq={heads_q} must be a multiple of Hkv={heads_kv} (the cache's heads)")
    if not paged and k_cache.shape[0] != batch:
        raise ValueError(f"k_cache: a contiguous cache has one row per request: expected {batch}, got {k_cache.shape[0]} "
                         f"(for a paged cache pass block_table)")
    check_rows("q", q4)
    check_tensor("seqlens_k", seqlens_k, ndim=1, dtypes=(torch.int32,), device=device)
    check_shape("seqlens_k", seqlens_k, (batch,), "[B]")
    if not seqlens_k.is_contiguous():
        raise ValueError("seqlens_k: expected a contiguous tensor")
    if paged:
        check_tensor("block_table", block_table, ndim=2, dtypes=(torch.int32,), device=device)
        if block_table.shape[0] != batch or block_table.stride(1) != 1:
            raise ValueError(f"block_table: expected [{batch}, max_pages] with contiguous rows, got shape "
                             f"{tuple(block_table.shape)}, strides {block_table.stride()}")
    check_sink(sink, heads_q, device)
    scale_log2 = softmax_scale_log2(softmax_scale, head_dim)
    check_int("window_left", window_left, minimum=-1)
    check_bool("return_lse", return_lse)
    page_size = k_cache.shape[1] if paged else None
    if plan is None:
        plan = plan_attention_decode(seqlens_k.cpu(), num_heads_q=heads_q, num_heads_kv=heads_kv, head_dim=head_dim,
                                     q_len=q_len, dtype=q.dtype, page_size=page_size, window_left=window_left,
                                     num_sms=sm_count(device))
    elif not isinstance(plan, DecodePlan):
        raise TypeError(f"plan: expected a DecodePlan from plan_attention_decode, got {type(plan).__name__}")
    made = (plan.num_requests, plan.num_heads_q, plan.num_heads_kv, plan.head_dim, plan.q_len, plan.dtype,
            plan.page_size, plan.window_left)
    given = (batch, heads_q, heads_kv, head_dim, q_len, q.dtype, page_size, window_left)
    if made != given:
        names = ("B", "Hq", "Hkv", "D", "Lq", "dtype", "page_size", "window_left")
        raise ValueError("plan: made for " + ", ".join(f"{n}={m}" for n, m, g in zip(names, made, given) if m != g) +
                         "; this call has " + ", ".join(f"{n}={g}" for n, m, g in zip(names, made, given) if m != g))
    capacity = k_cache.shape[1] * (block_table.shape[1] if paged else 1)
    if plan.max_seqlen_k > capacity:
        holds = (f"block_table gives each request {block_table.shape[1]} pages of {page_size} keys" if paged
                 else f"the cache holds {capacity} keys per request")
        raise ValueError(f"{'block_table' if paged else 'k_cache'}: the plan is for requests of up to "
                         f"{plan.max_seqlen_k} keys; {holds}")
    result_shape = tuple(q.shape)
    if out is None:
        out = q.new_empty(result_shape)
    else:
        check_tensor("out", out, ndim=q.dim(), dtypes=(q.dtype,), device=device)
        check_shape("out", out, result_shape, "q's shape")
        if not out.is_contiguous() or out.data_ptr() % 16:
            raise ValueError("out: expected a contiguous, 16-byte aligned tensor")
    lse = torch.empty(result_shape[:-1], dtype=torch.float32, device=device) if return_lse else None
    if batch:
        _launch(plan, q4, k_cache, v_cache, seqlens_k, block_table, sink, out, lse, scale_log2, capacity)
    return (out, lse) if return_lse else out


#: The TMA descriptors of the launches, per calling thread and cache layout (patched with each call's addresses).
_descriptors = DescriptorCache()


def _tensor_maps(variant) -> TensorMaps:
    sizes = contract(variant).sizes
    return TensorMaps({"k": sizes["kv_box_rows"], "v": sizes["kv_box_rows"]}, sizes["box_span_bytes"])


def _flat_rows(name: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` [pages, rows, Hkv, D] as the 3-D [pages * rows, Hkv, D] a tensor map describes; needs adjacent pages."""
    if t.shape[0] > 1 and t.stride(0) != t.shape[1] * t.stride(1):
        raise ValueError(f"{name}: TMA needs each page (or request) to follow the last in memory (stride(0) = "
                         f"{t.shape[1]} x stride(1)), got strides {t.stride()}; plan with kv_load='cp_async'")
    return t.as_strided((t.shape[0] * t.shape[1], t.shape[2], t.shape[3]), (t.stride(1), t.stride(2), 1))


def _launch(plan: DecodePlan, q, k_cache, v_cache, seqlens_k, block_table, sink, out, lse, scale_log2, capacity):
    device = q.device
    variant = plan.variant
    kernel = cached_launcher(variant, "attention_decode", device.index)
    if plan.workspace is None:
        partial_o = partial_lse = counters = 0
    else:
        workspace = plan.workspace.on(device)
        partial_o, partial_lse, counters = workspace[0].data_ptr(), workspace[1].data_ptr(), workspace[2].data_ptr()
    q_ptr, k_ptr, v_ptr, out_ptr = q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr()
    lse_ptr, seqlens_ptr = 0 if lse is None else lse.data_ptr(), seqlens_k.data_ptr()
    table_ptr, table_stride = (0, 0) if block_table is None else (block_table.data_ptr(), block_table.stride(0))
    sink_ptr = 0 if sink is None else sink.data_ptr()
    q_len, num_heads_q, heads_per_kv = plan.q_len, plan.num_heads_q, plan.num_heads_q // plan.num_heads_kv
    q_stride_b, q_stride_t, q_stride_h, _ = q.stride()
    k_strides, v_strides = k_cache.stride(), v_cache.stride()
    k_stride_page, k_stride_t, k_stride_h, _ = k_strides
    v_stride_page, v_stride_t, v_stride_h, _ = v_strides
    num_pages, page_size = k_cache.shape[0], k_cache.shape[1]  # a contiguous cache: a page per request
    splits = plan.splits
    # The recipe's fields and the variant's params are read here, not Variant.param_dict or .name, which build a
    # dict and a string per call.
    if plan.recipe.kv_load == "tma":  # pages of whole slices: plan_attention_decode chose it so
        maps = _descriptors.get((device.index, variant.params, tuple(k_cache.shape), k_strides, v_strides),
                                _tensor_maps, variant)
        map_k, map_v = maps.get("k", _flat_rows("k_cache", k_cache)), maps.get("v", _flat_rows("v_cache", v_cache))
        # Two calls spelled out, one with the descriptors: merging them in with ** would build a keyword dict
        # per call, which a spelled-out call does not (bench/NOTES.md, decode host cost).
        kernel.launch(plan.grid, map_k=map_k, map_v=map_v, q=q_ptr, k=k_ptr, v=v_ptr, out=out_ptr, lse=lse_ptr,
                      seqlens_k=seqlens_ptr, block_table=table_ptr, sink=sink_ptr, partial_o=partial_o,
                      partial_lse=partial_lse, counters=counters, q_len=q_len, heads_per_kv=heads_per_kv,
                      num_heads_q=num_heads_q, q_stride_b=q_stride_b, q_stride_t=q_stride_t, q_stride_h=q_stride_h,
                      k_stride_page=k_stride_page, k_stride_t=k_stride_t, k_stride_h=k_stride_h,
                      v_stride_page=v_stride_page, v_stride_t=v_stride_t, v_stride_h=v_stride_h, page_size=page_size,
                      num_pages=num_pages,
                      block_table_stride=table_stride, kv_capacity=capacity, max_splits=splits.max_splits,
                      tiles_per_split=splits.tiles_per_split, row_groups=plan.row_groups, scale_log2=scale_log2,
                      window_left=plan.window_left)
    else:
        kernel.launch(plan.grid, q=q_ptr, k=k_ptr, v=v_ptr, out=out_ptr, lse=lse_ptr,
                      seqlens_k=seqlens_ptr, block_table=table_ptr, sink=sink_ptr, partial_o=partial_o,
                      partial_lse=partial_lse, counters=counters, q_len=q_len, heads_per_kv=heads_per_kv,
                      num_heads_q=num_heads_q, q_stride_b=q_stride_b, q_stride_t=q_stride_t, q_stride_h=q_stride_h,
                      k_stride_page=k_stride_page, k_stride_t=k_stride_t, k_stride_h=k_stride_h,
                      v_stride_page=v_stride_page, v_stride_t=v_stride_t, v_stride_h=v_stride_h, page_size=page_size,
                      num_pages=num_pages,
                      block_table_stride=table_stride, kv_capacity=capacity, max_splits=splits.max_splits,
                      tiles_per_split=splits.tiles_per_split, row_groups=plan.row_groups, scale_log2=scale_log2,
                      window_left=plan.window_left)
