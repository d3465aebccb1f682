"""Planning a decode batch: its grid, its kernel and its split workspace, made once on the host from the lengths.

The split arithmetic is :mod:`kgen.families.attention_decode.splits`'; this module checks the planner's
inputs, picks the spec's variant for them and makes the :class:`DecodePlan` (from the lengths, or again
from its recipe). With a plan the op does no device-to-host synchronisation and can be captured in a CUDA
graph that survives new lengths.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from kgen import registry
from kgen.families.attention_decode.contract import DECODE_ROWS_PER_BLOCK
from kgen.families.attention_decode.recipe import DecodeRecipe
from kgen.families.attention_decode.splits import SplitPlan, max_request_tiles, plan_splits, request_tiles
from kgen.registry import UnsupportedVariantError, Variant
from kgen.runtime.checks import INT32_LIMIT, check_host_tensor, check_int, check_plan_device, check_seqlens
from kgen.runtime.device import GRID_X_LIMIT, GRID_YZ_LIMIT, sm_count
from kgen.runtime.dispatch import DTYPE_NAMES, SpecPathMemo, contract, full_tiles_twin, kept_allocations, spec_dtypes
from kgen.runtime.tables import DeviceTables

FAMILY = "attention_decode"
MAX_Q_LEN = 8  # speculative decoding's new tokens per request


@dataclass(frozen=True, eq=False)
class DecodePlan:
    """What :func:`attention_decode` needs to launch without looking at device data.

    Made by :func:`plan_attention_decode`. Its split workspace (partials and a counter per request and KV
    head, which the kernel leaves at zero) is allocated on each device the plan runs on, at its first call
    there (or when planning, with ``device=``); one plan serves every layer of a model, one call at a time:
    two calls in flight at once on different streams must not share a plan.
    """

    def __repr__(self) -> str:
        # A summary: the per-request lengths would fill a screen for a large batch.
        return (f"DecodePlan({self.num_requests} requests, q_len={self.q_len}, max_seqlen_k={self.max_seqlen_k}, "
                f"{self.splits.max_splits} splits, window_left={self.window_left}, {self.variant.name})")


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
    #: The plan's inputs as plain ints, its kernel's choices forced: what :func:`plan_from_recipe` makes
    #: the same plan from.
    recipe: DecodeRecipe
    #: [partial O, partial LSE, counters] per device; None for a single pass, which writes no partials.
    workspace: DeviceTables | None

    @property
    def has_incomplete_tile(self) -> bool:
        return self.variant.param_dict["has_incomplete_tile"]

    @property
    def grid(self) -> tuple[int, int, int]:
        return self.splits.max_splits * self.row_groups, self.num_heads_kv, self.num_requests


def _split_workspace(rows: int, head_dim: int, items: int) -> DeviceTables:
    """fp32 partial outputs and LSEs of ``rows`` packed query rows, and an int32 counter per (request, KV head,
    row group) item."""
    def make(device: torch.device) -> tuple[torch.Tensor, ...]:
        return (torch.empty(rows * head_dim, dtype=torch.float32, device=device),
                torch.empty(rows, dtype=torch.float32, device=device),
                torch.zeros(items, dtype=torch.int32, device=device))
    return DeviceTables(make, "split workspace tensors")


def _choose_variant(head_dim: int, dtype: torch.dtype, paged: bool, kv_load: str | None, tail: str | None,
                    has_incomplete_tile: bool, split_of: Variant | None = None) -> Variant:
    """The spec's first variant for the call; for a split grid (one block per SM), its first of one block per SM
    with the slices and warps of ``split_of``, the single-pass variant, in whose CTA tiles the splits are counted."""
    wanted = {"kv_load": kv_load} if kv_load is not None else {}
    if tail is not None:
        wanted["tail"] = tail
    if split_of is not None:
        wanted.update(min_blocks_per_sm=1, tile_n=split_of.param_dict["tile_n"], num_warps=split_of.param_dict["num_warps"])
    family = registry.current().family(FAMILY)
    any_tiles = family.select(head_dim=head_dim, dtype=DTYPE_NAMES[dtype], kv_layout="paged" if paged else "contiguous",
                              has_incomplete_tile=True, **wanted)
    return any_tiles if has_incomplete_tile else full_tiles_twin(FAMILY, any_tiles)


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
            bound also keeps the incomplete-slice code (has_incomplete_tile), since new lengths may end
            mid-slice.
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
        check_host_tensor("seqlens_k", seqlens_k)
        seqlens_k = seqlens_k.tolist()
    lengths = check_seqlens("seqlens_k", seqlens_k)
    check_int("num_heads_kv", num_heads_kv, minimum=1, maximum=GRID_YZ_LIMIT)  # KV heads are the grid's y
    check_int("num_heads_q", num_heads_q, minimum=1)
    if num_heads_q % num_heads_kv:
        raise ValueError(f"num_heads_q: {num_heads_q} must be a multiple of num_heads_kv={num_heads_kv}")
    check_int("q_len", q_len, minimum=1, maximum=MAX_Q_LEN)
    check_int("head_dim", head_dim, minimum=1)
    check_int("window_left", window_left, minimum=-1)
    for name, value in (("page_size", page_size), ("num_sms", num_sms)):
        if value is not None:
            check_int(name, value, minimum=1)
    if (block_table is None) != (num_pages is None):
        given, missing = ("num_pages", "block_table") if block_table is None else ("block_table", "num_pages")
        raise ValueError(f"{given}: given without {missing}; the pages are checked with both or neither")
    if num_pages is not None:
        check_int("num_pages", num_pages, minimum=1)
    device = check_plan_device(device)
    if len(lengths) > GRID_YZ_LIMIT:  # requests are the grid's z
        raise ValueError(f"seqlens_k: {len(lengths)} requests exceed the kernel's grid limit of {GRID_YZ_LIMIT}")
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
    first = _choose_variant(head_dim, dtype, paged, kv_load, tail, True)
    sizes = contract(first).sizes
    slice_keys, warps = sizes["kv_box_rows"], sizes["cta_keys"] // sizes["kv_box_rows"]
    if kv_load is None and paged and page_size % slice_keys:  # boxes of a slice must lie within one page
        first = _choose_variant(head_dim, dtype, paged, "cp_async", tail, True)
    elif kv_load == "tma" and paged and page_size % slice_keys:
        raise ValueError(f"kv_load: TMA loads slices of {slice_keys} keys within a page; page_size={page_size} is "
                         f"not a multiple (use kv_load='cp_async')")
    if block_table is not None:
        _check_block_table_host(block_table, lengths, page_size, num_pages)
    partial_slices = bounded or bool(np.any(lengths % slice_keys))
    row_groups = -(-(q_len * num_heads_q // num_heads_kv) // DECODE_ROWS_PER_BLOCK)
    if num_sms is None:
        num_sms = sm_count()
    tiles = max(int(request_tiles(lengths, q_len=q_len, window_left=window_left, slice_keys=slice_keys,
                                  warps=warps).max(initial=1)),
                max_request_tiles(max_seqlen_k, q_len=q_len, window_left=window_left, slice_keys=slice_keys, warps=warps))
    # One block per SM, though two fit: fewer, longer splits run faster (bench/NOTES.md, GQA decode attention, 3).
    # The split grid then takes the spec's variant of one block per SM, whose shared memory holds more stages.
    items = len(lengths) * num_heads_kv * row_groups  # (request, KV head, row group): the blocks of a single pass
    splits = plan_splits(items, tiles, num_sms=num_sms, blocks_per_sm=1)
    if splits.max_splits * row_groups > GRID_X_LIMIT:
        raise ValueError("plan: the grid's x dimension overflows")
    if not splits.single_pass:  # the same slices and warps, more stages
        try:
            first = _choose_variant(head_dim, dtype, paged, first.param_dict["kv_load"], first.param_dict["tail"], True,
                                    split_of=first)
        except UnsupportedVariantError as exc:
            raise UnsupportedVariantError(
                f"{FAMILY}: a split grid needs a config of min_blocks_per_sm 1 with the tile_n and num_warps of the "
                f"single-pass variant {first.name}, in whose CTA tiles the splits are counted ({exc})") from None
    variant = first if partial_slices else full_tiles_twin(FAMILY, first)
    chosen = variant.param_dict
    recipe = DecodeRecipe.of(num_heads_q=num_heads_q, num_heads_kv=num_heads_kv, head_dim=head_dim, q_len=q_len,
                             dtype=dtype, page_size=page_size, window_left=window_left,
                             max_seqlen_k=max_seqlen_k if bounded else None, kv_load=chosen["kv_load"],
                             tail=chosen["tail"], num_sms=num_sms, seqlens_k=lengths)
    workspace = None if splits.single_pass else \
        _split_workspace(items * splits.max_splits * DECODE_ROWS_PER_BLOCK, head_dim, items)
    plan = DecodePlan(len(lengths), num_heads_q, num_heads_kv, head_dim, q_len, dtype, page_size, window_left,
                      max_seqlen_k, variant, splits, row_groups, recipe, workspace)
    if device is not None:
        if workspace is not None:
            workspace.on(device)
    return plan


def plan_from_recipe(recipe: DecodeRecipe, device: torch.device) -> DecodePlan:
    """The plan ``recipe`` describes (see DecodePlan.recipe), with a workspace of its own on ``device``; made once."""
    key = (recipe, device)
    found = _from_recipe.get(key)
    if found is None:
        found = plan_attention_decode(
            recipe.seqlens_k, num_heads_q=recipe.num_heads_q, num_heads_kv=recipe.num_heads_kv,
            head_dim=recipe.head_dim, q_len=recipe.q_len, dtype=recipe.dtype, page_size=recipe.page_size,
            window_left=recipe.window_left, max_seqlen_k=recipe.max_seqlen_k, kv_load=recipe.kv_load,
            tail=recipe.tail, num_sms=recipe.num_sms)
        if found.workspace is not None:
            with kept_allocations(device):  # the plan, and its workspace, outlive the op call that made them
                found.workspace.on(device)
        found = _from_recipe.put(key, found)
    return found


_from_recipe = SpecPathMemo()


def _check_block_table_host(block_table, lengths: np.ndarray, page_size: int | None, num_pages: int | None) -> None:
    if page_size is None:
        raise ValueError("block_table: given for a contiguous cache (page_size=None)")
    table = _host_table(block_table, len(lengths))
    if table.shape[0] != len(lengths):
        raise ValueError(f"block_table: expected [{len(lengths)}, max_pages], got shape {table.shape}")
    for b, n in enumerate(lengths.tolist()):
        needed = -(-n // page_size)
        if needed > table.shape[1]:
            raise ValueError(f"block_table: request {b} has {n} keys, {needed} pages of {page_size}; the table holds "
                             f"{table.shape[1]} per request")
        used = table[b, :needed]
        if needed and (used.min() < 0 or (num_pages is not None and used.max() >= num_pages)):
            raise ValueError(f"block_table: request {b} names a page outside [0, {num_pages}): {used.tolist()}")


def _host_table(block_table, requests: int) -> np.ndarray:
    """``block_table`` (a tensor, or nested lists of ints) as a 2-D int64 array, or an error naming it."""
    if isinstance(block_table, torch.Tensor):
        if block_table.dtype.is_floating_point or block_table.dtype.is_complex or block_table.dtype == torch.bool:
            raise TypeError(f"block_table: expected integer page numbers, got {block_table.dtype}")
        table = block_table.cpu().numpy()
    else:
        try:
            table = np.array(block_table, dtype=object)
        except ValueError:  # numpy refuses some ragged nestings outright
            table = np.empty(0, dtype=object)
        if table.ndim != 2:
            raise ValueError(f"block_table: expected a 2-D table [{requests}, max_pages] of page numbers, "
                             f"got {type(block_table).__name__} of shape {table.shape} (are its rows of one length?)")
        if not all(isinstance(x, (int, np.integer)) and not isinstance(x, (bool, np.bool_)) for x in table.flat):
            raise TypeError("block_table: expected integer page numbers, got "
                            + next(type(x).__name__ for x in table.flat
                                   if not isinstance(x, (int, np.integer)) or isinstance(x, (bool, np.bool_))))
    if table.ndim != 2:
        raise ValueError(f"block_table: expected a 2-D table [{requests}, max_pages] of page numbers, got shape "
                         f"{tuple(table.shape)}")
    return table.astype(np.int64)
