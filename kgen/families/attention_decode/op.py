"""GQA decode attention over a KV cache: split-KV and head-packed, contiguous or paged.

Each request has ``Lq`` (1..8) new query tokens, the last ``Lq`` positions of its ``seqlens_k[b]``
keys and causal among themselves. A plan, made once on the host from the lengths, fixes the grid
(splits per request, see :mod:`kgen.families.attention_decode.plan`), the kernel variant and the workspace of
split partials; with a plan the op does no device-to-host synchronisation and can be captured in
a CUDA graph that survives new lengths.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from kgen import registry
from kgen.runtime import tma
from kgen.families.attention_decode.contract import DECODE_ROWS_PER_BLOCK
from kgen.runtime import recipes
from kgen.runtime.checks import (INT32_LIMIT, check_int, check_rows, check_seqlens, check_shape, check_tensor, cuda_device,
                                 check_sink, softmax_scale_log2)
from kgen.runtime.dispatch import (DTYPE_NAMES, DispatchCache, cached_launcher, kept_allocations, contract, spec_dtypes,
                                full_tiles_twin)
from kgen.families.attention_decode.plan import SplitPlan, max_request_tiles, plan_splits, request_tiles
from kgen.registry import UnsupportedVariantError, Variant

FAMILY = "attention_decode"
MAX_Q_LEN = 8  # speculative decoding's new tokens per request
_MAX_GRID_YZ = 65535  # KV heads and requests are the grid's y and z dimensions
DEFAULT_NUM_SMS = 132


@dataclass(frozen=True, eq=False)
class DecodePlan:
    """What :func:`attention_decode` needs to launch without looking at device data.

    Made by :func:`plan_attention_decode`. Its workspace (split partials and a counter per
    request and KV head, which the kernel leaves at zero) lives on one device; one plan serves
    every layer of a model, one call at a time: two calls in flight at once on different streams
    must not share a plan.
    """

    num_requests: int
    num_heads_q: int
    num_heads_kv: int
    head_dim: int
    q_len: int
    dtype: torch.dtype
    page_size: int | None  # None: a contiguous cache
    window_left: int
    #: The longest request the plan's grid was sized for; longer ones are still exact, only slower.
    max_seqlen_k: int
    variant: Variant
    splits: SplitPlan
    row_groups: int
    #: The plan's inputs as plain ints, its kernel's choices forced (see kgen.runtime.recipes).
    recipe: tuple = ()
    #: [partial O, partial LSE, counters] once placed on a device (empty without splits).
    _workspace: list = field(default_factory=list, repr=False)

    @property
    def has_incomplete_tile(self) -> bool:
        return self.variant.param_dict["has_incomplete_tile"]

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.splits.max_splits * self.row_groups, self.num_heads_kv, self.num_requests

    def workspace_on(self, device: torch.device) -> list:
        """The workspace on ``device``, allocated there on first use (not inside a CUDA-graph capture)."""
        if self.splits.single_pass:
            return []
        if self._workspace:
            if self._workspace[0].device != device:
                raise ValueError(f"plan: its workspace is on {self._workspace[0].device}, the tensors on {device}; "
                                 f"plan with device={str(device)!r}")
            return self._workspace
        if torch.cuda.is_current_stream_capturing():
            raise RuntimeError("plan: its workspace is allocated on first use, which a CUDA-graph capture cannot do; "
                               "plan with device= (or run once) before capturing")
        rows = self.num_requests * self.num_heads_kv * self.row_groups * self.splits.max_splits * DECODE_ROWS_PER_BLOCK
        self._workspace[:] = [torch.empty(rows * self.head_dim, dtype=torch.float32, device=device),
                              torch.empty(rows, dtype=torch.float32, device=device),
                              torch.zeros(self.num_requests * self.num_heads_kv * self.row_groups, dtype=torch.int32,
                                          device=device)]
        return self._workspace


def _variant(head_dim: int, dtype: torch.dtype, paged: bool, kv_load: str | None, tail: str | None,
             has_incomplete_tile: bool, split_of: Variant | None = None) -> Variant:
    """The spec's first variant for the call; for a split grid (one block per SM), its first of one block per SM
    with the slices and warps of ``split_of``, the single-pass variant, in whose CTA tiles the splits are counted."""
    wanted = {"kv_load": kv_load} if kv_load is not None else {}
    if tail is not None:
        wanted["tail"] = tail
    if split_of is not None:
        wanted.update(min_blocks_per_sm=1, tile_n=split_of.param_dict["tile_n"], num_warps=split_of.param_dict["num_warps"])
    family = registry.current().family(FAMILY)
    with_tail = family.select(head_dim=head_dim, dtype=DTYPE_NAMES[dtype], kv_layout="paged" if paged else "contiguous",
                              has_incomplete_tile=True, **wanted)
    return with_tail if has_incomplete_tile else full_tiles_twin(FAMILY, with_tail)


def plan_attention_decode(seqlens_k, *, num_heads_q: int, num_heads_kv: int, head_dim: int, q_len: int = 1,
                          dtype: torch.dtype = torch.bfloat16, page_size: int | None = None,
                          block_table=None, num_pages: int | None = None, max_seqlen_k: int | None = None,
                          window_left: int = -1, kv_load: str | None = None, tail: str | None = None,
                          num_sms: int | None = None, device: torch.device | str | None = None) -> DecodePlan:
    """Plan decode attention for requests of ``seqlens_k`` keys (host data: a list of ints or a CPU tensor).

    Args:
        num_heads_q, num_heads_kv, head_dim, q_len, dtype: the shapes of the calls (q ``[B, Lq, Hq, D]``).
        page_size: the cache's page size for a paged cache (``[num_pages, page_size, Hkv, D]``);
            None for a contiguous one (``[B, Lmax, Hkv, D]``).
        block_table, num_pages: optionally the host copy of the block table (``[B, max_pages]``) and the
            cache's page count, to check here that every request's pages exist. Without them the kernel
            still never reads outside the cache: a request naming a bad page gets NaN.
        max_seqlen_k: the longest request the grid is sized for, for a CUDA graph replayed with new
            lengths (default: the longest given). Longer requests are still exact, only slower. A
            bound also keeps the tail code (has_incomplete_tile), since new lengths may end mid-slice.
        window_left: keys a query sees before its own position (-1: all).
        kv_load: ``"tma"`` or ``"cp_async"`` (default: TMA where the page size allows it). TMA needs
            pages a multiple of the kernel's slice (16 keys) long and adjacent in memory (each cache
            tensor's page stride is page_size rows).
        tail: how the last, incomplete slice of a request loads under TMA (``"cp_async"``, the default,
            or ``"tma"``).
        num_sms: the SMs the grid is planned for (default: the current device's).
        device: allocate the split workspace there now (needed before a CUDA-graph capture).
    """
    if isinstance(seqlens_k, torch.Tensor):
        seqlens_k = seqlens_k.tolist()
    lengths = check_seqlens("seqlens_k", seqlens_k)
    check_int("num_heads_kv", num_heads_kv, minimum=1, maximum=_MAX_GRID_YZ)
    check_int("num_heads_q", num_heads_q, minimum=1)
    if num_heads_q % num_heads_kv:
        raise ValueError(f"num_heads_q: {num_heads_q} must be a multiple of num_heads_kv={num_heads_kv}")
    check_int("q_len", q_len, minimum=1, maximum=MAX_Q_LEN)
    check_int("head_dim", head_dim, minimum=1)
    check_int("window_left", window_left, minimum=-1)
    if len(lengths) > _MAX_GRID_YZ:
        raise ValueError(f"seqlens_k: {len(lengths)} requests exceed the kernel's grid limit of {_MAX_GRID_YZ}")
    dtypes = spec_dtypes(FAMILY)
    if dtype not in dtypes:
        raise TypeError(f"dtype: expected one of {[str(d) for d in dtypes]}, got {dtype}")
    longest = int(lengths.max(initial=0))
    bounded = max_seqlen_k is not None
    if max_seqlen_k is None:
        max_seqlen_k = longest
    check_int("max_seqlen_k", max_seqlen_k, minimum=0)
    if max_seqlen_k < longest:
        raise ValueError(f"max_seqlen_k: {max_seqlen_k} is below the longest request's {longest} keys")
    paged = page_size is not None
    if paged:
        check_int("page_size", page_size, minimum=1, maximum=INT32_LIMIT)
    first = _variant(head_dim, dtype, paged, kv_load, tail, True)
    sizes = contract(first).sizes
    slice_keys, warps = sizes["kv_box_rows"], sizes["cta_keys"] // sizes["kv_box_rows"]
    if kv_load is None and paged and page_size % slice_keys:  # boxes of a slice must lie within one page
        first = _variant(head_dim, dtype, paged, "cp_async", tail, True)
    elif kv_load == "tma" and paged and page_size % slice_keys:
        raise ValueError(f"kv_load: TMA loads slices of {slice_keys} keys within a page; page_size={page_size} is "
                         f"not a multiple (use kv_load='cp_async')")
    if block_table is not None:
        _check_block_table_host(block_table, lengths, page_size, num_pages)
    partial_slices = bounded or bool(np.any(lengths % slice_keys))
    row_groups = -(-(q_len * num_heads_q // num_heads_kv) // DECODE_ROWS_PER_BLOCK)
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count \
            if torch.cuda.is_available() else DEFAULT_NUM_SMS
    tiles = max(int(request_tiles(lengths, q_len=q_len, window_left=window_left, slice_keys=slice_keys,
                                  warps=warps).max(initial=1)),
                max_request_tiles(max_seqlen_k, q_len=q_len, window_left=window_left, slice_keys=slice_keys, warps=warps))
    # One block per SM, though two fit: on the H200 (bench/NOTES.md) B1 L32k took 42.9 us in 16 splits
    # against 50.1 in 32, B1 L128k 131 against 141, B8 L8k 69 in 2 against 72 in 4. The split grid then
    # takes the spec's variant of one block per SM, whose shared memory holds more stages.
    splits = plan_splits(len(lengths) * num_heads_kv * row_groups, tiles, num_sms=num_sms, blocks_per_sm=1)
    if splits.max_splits * row_groups > 2**31 - 1:
        raise ValueError("plan: the grid's x dimension overflows")
    if not splits.single_pass:  # the same slices and warps, more stages
        try:
            first = _variant(head_dim, dtype, paged, first.param_dict["kv_load"], first.param_dict["tail"], True,
                             split_of=first)
        except UnsupportedVariantError as exc:
            raise UnsupportedVariantError(
                f"{FAMILY}: a split grid needs a config of min_blocks_per_sm 1 with the tile_n and num_warps of the "
                f"single-pass variant {first.name}, in whose CTA tiles the splits are counted ({exc})") from None
    variant = first if partial_slices else full_tiles_twin(FAMILY, first)
    chosen = variant.param_dict
    recipe = (num_heads_q, num_heads_kv, head_dim, q_len, recipes.code(recipes.DTYPES, dtype),
              recipes.NONE if page_size is None else page_size, window_left, max_seqlen_k if bounded else recipes.NONE,
              recipes.code(recipes.TAILS, chosen["kv_load"]), recipes.code(recipes.TAILS, chosen["tail"]), num_sms,
              len(lengths), *(int(n) for n in lengths))
    plan = DecodePlan(len(lengths), num_heads_q, num_heads_kv, head_dim, q_len, dtype, page_size, window_left,
                      max_seqlen_k, variant, splits, row_groups, recipe)
    if device is not None:
        plan.workspace_on(cuda_device(device))
    return plan


def plan_from_recipe(recipe: tuple, device: torch.device) -> DecodePlan:
    """The plan ``recipe`` describes (see DecodePlan.recipe), with a workspace of its own on ``device``; made once."""
    key = (recipe, device)
    found = _from_recipe.get(key)
    if found is None:
        (heads_q, heads_kv, head_dim, q_len, dtype, page_size, window_left, bound, kv_load, tail, num_sms, _,
         *lengths) = recipe
        found = plan_attention_decode(
            lengths, num_heads_q=heads_q, num_heads_kv=heads_kv, head_dim=head_dim, q_len=q_len,
            dtype=recipes.DTYPES[dtype], page_size=None if page_size == recipes.NONE else page_size,
            window_left=window_left, max_seqlen_k=None if bound == recipes.NONE else bound,
            kv_load=recipes.TAILS[kv_load], tail=recipes.TAILS[tail], num_sms=num_sms)
        if not found.splits.single_pass:
            _place_workspace(found, device)
        found = _from_recipe.put(key, found)
    return found


def _place_workspace(plan: DecodePlan, device: torch.device) -> None:
    with kept_allocations(device):  # the plan, and its workspace, outlive the op call that made them
        plan.workspace_on(device)


_from_recipe = DispatchCache()


def _check_block_table_host(block_table, lengths: np.ndarray, page_size: int | None, num_pages: int | None) -> None:
    if page_size is None:
        raise ValueError("block_table: given for a contiguous cache (page_size=None)")
    table = np.asarray(block_table.cpu() if isinstance(block_table, torch.Tensor) else block_table)
    if table.ndim != 2 or table.shape[0] != len(lengths):
        raise ValueError(f"block_table: expected [{len(lengths)}, max_pages], got shape {table.shape}")
    for b, n in enumerate(lengths.tolist()):
        needed = -(-n // page_size)
        if needed > table.shape[1]:
            raise ValueError(f"block_table: request {b} has {n} keys, {needed} pages of {page_size}; the table holds "
                             f"{table.shape[1]} per request")
        used = table[b, :needed]
        if needed and (used.min() < 0 or (num_pages is not None and used.max() >= num_pages)):
            raise ValueError(f"block_table: request {b} names a page outside [0, {num_pages}): {used.tolist()}")


def _flat_rows(name: str, t: torch.Tensor) -> torch.Tensor:
    """``t`` [pages, rows, Hkv, D] as the 3-D [pages * rows, Hkv, D] a tensor map describes; needs adjacent pages."""
    if t.shape[0] > 1 and t.stride(0) != t.shape[1] * t.stride(1):
        raise ValueError(f"{name}: TMA needs each page (or request) to follow the last in memory (stride(0) = "
                         f"{t.shape[1]} x stride(1)), got strides {t.stride()}; plan with kv_load='cp_async'")
    return t.as_strided((t.shape[0] * t.shape[1], t.shape[2], t.shape[3]), (t.stride(1), t.stride(2), 1))


_maps = DispatchCache()


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
    page_size = k_cache.shape[1] if paged else None
    if plan is None:
        plan = plan_attention_decode(seqlens_k.cpu(), num_heads_q=heads_q, num_heads_kv=heads_kv, head_dim=head_dim,
                                     q_len=q_len, dtype=q.dtype, page_size=page_size, window_left=window_left,
                                     num_sms=torch.cuda.get_device_properties(device).multi_processor_count)
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
        raise ValueError(f"k_cache: the plan is for requests of up to {plan.max_seqlen_k} keys; the cache holds "
                         f"{capacity} per request")
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


def _launch(plan: DecodePlan, q, k_cache, v_cache, seqlens_k, block_table, sink, out, lse, scale_log2, capacity):
    device = q.device
    variant = plan.variant
    workspace = plan.workspace_on(device)
    maps = ()
    if variant.param_dict["kv_load"] == "tma":  # pages of whole slices: plan_attention_decode chose it so
        # Descriptors are patched per call with the caches' addresses: one set per calling thread and cache layout.
        key = (threading.get_ident(), device.index, variant.name, tuple(k_cache.shape), k_cache.stride(), v_cache.stride())
        found = _maps.get(key)
        if found is None:
            sizes = contract(variant).sizes
            found = _maps.put(key, tma.TensorMaps({"k": sizes["kv_box_rows"], "v": sizes["kv_box_rows"]},
                                                  sizes["box_span_bytes"]))
        maps = (found.get("k", _flat_rows("k_cache", k_cache)), found.get("v", _flat_rows("v_cache", v_cache)))
    partial_o, partial_lse, counters = workspace if workspace else (None, None, None)
    rows_per_request = k_cache.shape[1]
    cached_launcher(variant, "attention_decode", device.index)(
        plan.grid, *maps, q.data_ptr(), k_cache.data_ptr(), v_cache.data_ptr(), out.data_ptr(),
        0 if lse is None else lse.data_ptr(), seqlens_k.data_ptr(), 0 if block_table is None else block_table.data_ptr(),
        0 if sink is None else sink.data_ptr(), 0 if partial_o is None else partial_o.data_ptr(),
        0 if partial_lse is None else partial_lse.data_ptr(), 0 if counters is None else counters.data_ptr(),
        plan.q_len, plan.num_heads_q // plan.num_heads_kv, plan.num_heads_q,
        q.stride(0), q.stride(1), q.stride(2),
        k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        rows_per_request, k_cache.shape[0], 0 if block_table is None else block_table.stride(0), capacity,
        plan.splits.max_splits, plan.splits.tiles_per_split, plan.row_groups, scale_log2, plan.window_left)
