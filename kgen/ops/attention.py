"""GQA attention prefill over packed varlen batches: a drop-in for ``flash_attn_varlen_func``.

Sequences are packed along the token dimension and delimited by ``cu_seqlens``.
A plan (tile schedule, maximum lengths, and whether any tile is incomplete) is
built on the host from the sequence lengths; with a plan, the op does no
device-to-host synchronisation and can be captured in a CUDA graph.
"""

from __future__ import annotations

import math
import threading
from dataclasses import dataclass

import numpy as np
import torch
from cuda.core.utils import StridedMemoryView

# The swizzle enum is documented with TensorMapDescriptor but cuda.core 1.2 exports it only from here.
from cuda.core._tensor_map import TensorMapSwizzle

from kgen.launch import KernelLauncher
from kgen.ops._checks import check_tensor
from kgen import registry
from kgen.ops._dispatch import DTYPE_NAMES, DispatchCache, launcher, without_tail
from kgen.registry import Variant
from kgen.ops.attention_plan import TileSchedule, choose_schedule, plan_tiles, seqlens_from_cu, validate_window

FAMILY = "attention_prefill"
_DTYPES = (torch.bfloat16, torch.float16)
_LOG2E = 1.4426950408889634


@dataclass(frozen=True)
class AttentionPlan:
    """What :func:`attention_varlen` needs to launch without looking at device data.

    Build it once per batch layout with :func:`plan_attention_varlen`; it holds
    the work list on the device.
    """

    schedule: TileSchedule
    head_dim: int
    dtype: torch.dtype
    window: tuple[int, int]  # (left, right) with causal folded in; -1 = unbounded
    num_seqs: int
    work: torch.Tensor  # int32 [num_work, 2] (sequence, query tile), on the device
    #: The variant to run: the spec's choice for this head dim, dtype, tail policy and
    #: batch (tile shape), specialised on has_incomplete_tile from the schedule.
    variant: Variant

    @property
    def has_incomplete_tile(self) -> bool:
        return self.schedule.has_incomplete_tile


#: What makes one configuration of a head dim: the planner chooses among these per batch,
#: the spec's defaults (the tail policy) within each.
_TILE_SHAPE = ("tile_m", "tile_n", "num_warps", "min_blocks_per_sm")


def _tile_candidates(head_dim: int, dtype: torch.dtype, tail: str | None, tile_m: int | None) -> list[Variant]:
    """The with-tail variant of each tile shape the spec offers for this call, in its order of preference."""
    wanted = {"tail": tail} if tail is not None else {}
    if tile_m is not None:
        wanted["tile_m"] = tile_m
    return registry.current().family(FAMILY).preferred(
        group_by=_TILE_SHAPE, head_dim=head_dim, dtype=DTYPE_NAMES[dtype], has_incomplete_tile=True, **wanted)


def plan_attention_varlen(cu_seqlens_q, cu_seqlens_k, *, head_dim: int, dtype: torch.dtype = torch.bfloat16,
                          causal: bool = False, window: tuple[int, int] = (-1, -1),
                          device: torch.device | str | int | None = None, tail: str | None = None,
                          tile_m: int | None = None) -> AttentionPlan:
    """Plan a batch: tile shape and schedule (longest tiles first), maximum lengths, has_incomplete_tile.

    ``cu_seqlens_q`` / ``cu_seqlens_k`` are host data (lists or CPU tensors) of
    length N+1. ``head_dim`` and ``dtype`` pick the spec's variants; among the tile
    shapes it lists for them, the first is used unless it computes many more masked or
    padded scores for this batch than another (see
    :func:`kgen.ops.attention_plan.choose_schedule`); ``tile_m`` forces one height.
    The work list is copied to ``device`` (default: the current CUDA device).
    ``tail`` (``"tma"`` or ``"cp_async"``) overrides the spec's default tail policy. With
    ``"tma"`` an incomplete tile loads a whole box and masks it, reading the rows that follow
    the sequence in the packed tensors (they must be finite: a NaN there would survive the
    zero weight); ``"cp_async"`` never reads past a sequence.
    """
    if dtype not in _DTYPES:
        raise TypeError(f"dtype: expected one of {[str(d) for d in _DTYPES]}, got {dtype}")
    seqlens_q = seqlens_from_cu(cu_seqlens_q, "cu_seqlens_q")
    seqlens_k = seqlens_from_cu(cu_seqlens_k, "cu_seqlens_k")
    if len(seqlens_q) != len(seqlens_k):
        raise ValueError(f"cu_seqlens_k: expected {len(seqlens_q) + 1} entries like cu_seqlens_q, got {len(seqlens_k) + 1}")
    merged_window = validate_window(causal, window)
    candidates = _tile_candidates(head_dim, dtype, tail, tile_m)
    schedules = [plan_tiles(seqlens_q, seqlens_k, tile_m=v.param_dict["tile_m"], tile_n=v.param_dict["tile_n"],
                            causal=causal, window=window) for v in candidates]
    chosen = choose_schedule(schedules)
    with_tail, schedule = candidates[chosen], schedules[chosen]
    variant = with_tail if schedule.has_incomplete_tile else without_tail(FAMILY, with_tail)
    device = torch.device("cuda", torch.cuda.current_device()) if device is None else torch.device(device)
    work = torch.from_numpy(schedule.work).to(device)
    return AttentionPlan(schedule, head_dim, dtype, merged_window, len(seqlens_q), work, variant)


_launchers = DispatchCache()
_tensor_maps: dict[tuple, list] = {}
_MAX_TENSOR_MAPS = 256


def _dynamic_smem(params: dict, itemsize: int) -> int:
    # Mirrors the template: 1024 bytes of slack to align the tiles for TMA's swizzle, one
    # Q tile, two buffers each of K and V, then three 8-byte mbarriers.
    return 1024 + (params["tile_m"] + 4 * params["tile_n"]) * params["head_dim"] * itemsize + 64


def _launcher(device_index: int, variant: Variant, itemsize: int) -> KernelLauncher:
    key = (device_index, variant.name)
    found = _launchers.get(key)
    if found is not None:
        return found
    smem = _dynamic_smem(variant.param_dict, itemsize)
    with torch.cuda.device(device_index):
        return _launchers.put(key, launcher(variant, "attention_prefill", device_index, smem))


def _tensor_map(role: str, t: torch.Tensor, rows: int):
    """A TMA descriptor for boxes of ``rows`` tokens x 1 head x one swizzle span of the head dim.

    Descriptors are cached by role (q, k, v: one call passes all three at once),
    layout and calling thread (a patch must not race another thread's launch);
    a new address only patches the cached one (about 2 us instead of 7 to build one).
    """
    span_bytes = min(t.shape[2] * t.element_size(), 128)
    key = (role, threading.get_ident(), t.device.index, tuple(t.shape), t.stride(), t.dtype, rows)
    entry = _tensor_maps.get(key)
    if entry is None:
        if len(_tensor_maps) >= _MAX_TENSOR_MAPS:
            _tensor_maps.clear()
        swizzle = TensorMapSwizzle.SWIZZLE_128B if span_bytes == 128 else TensorMapSwizzle.SWIZZLE_64B
        view = StridedMemoryView.from_dlpack(t, stream_ptr=-1)
        entry = _tensor_maps[key] = [view.as_tensor_map(box_dim=(rows, 1, span_bytes // t.element_size()),
                                                        swizzle=swizzle), t.data_ptr()]
    elif entry[1] != t.data_ptr():
        entry[0].replace_address(t)
        entry[1] = t.data_ptr()
    return entry[0]


def _check_rows(name: str, t: torch.Tensor) -> None:
    """cp.async moves 16-byte chunks: the head dim must be contiguous and every row 16-byte aligned."""
    if t.stride(2) != 1:
        raise ValueError(f"{name}: the last dimension must be contiguous, got strides {t.stride()}")
    if t.data_ptr() % 16 or t.stride(0) % 8 or t.stride(1) % 8:
        raise ValueError(f"{name}: rows must start at 16-byte aligned addresses (strides {t.stride()})")


def _check_cu_seqlens(name: str, cu: torch.Tensor, device: torch.device, num_seqs: int | None) -> None:
    check_tensor(name, cu, ndim=1, dtypes=(torch.int32,), device=device)
    if num_seqs is not None and cu.shape[0] != num_seqs + 1:
        raise ValueError(f"{name}: the plan is for {num_seqs} sequences ({num_seqs + 1} entries), got {cu.shape[0]}")
    if not cu.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor")


def _result(name: str, given: torch.Tensor | None, shape: tuple, dtype: torch.dtype, device) -> torch.Tensor:
    if given is None:
        return torch.empty(shape, dtype=dtype, device=device)
    check_tensor(name, given, ndim=len(shape), dtypes=(dtype,), device=device)
    if tuple(given.shape) != shape or not given.is_contiguous():
        raise ValueError(f"{name}: expected a contiguous tensor of shape {shape}, got {tuple(given.shape)}")
    return given


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
            and not capturable in a CUDA graph.
        out, lse_out: optional preallocated results (contiguous ``[total_q, Hq, D]`` in q's
            dtype, and fp32 ``[Hq, total_q]``).

    Returns:
        ``out`` ``[total_q, Hq, D]`` in q's dtype, or ``(out, lse)``. Rows with no key to
        attend (and no sink) are 0 with LSE -inf.
    """
    check_tensor("q", q, ndim=3, dtypes=_DTYPES)
    check_tensor("k", k, ndim=3, dtypes=(q.dtype,), device=q.device)
    check_tensor("v", v, ndim=3, dtypes=(q.dtype,), device=q.device)
    total_q, heads_q, head_dim = q.shape
    total_k, heads_kv, _ = k.shape
    if k.shape[2] != head_dim or v.shape != k.shape:
        raise ValueError(f"k, v: expected [total_k, Hkv, {head_dim}] each, got {tuple(k.shape)} and {tuple(v.shape)}")
    if heads_kv == 0 or heads_q % heads_kv:
        raise ValueError(f"q: Hq={heads_q} must be a multiple of Hkv={heads_kv} (k's heads)")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_rows(name, t)
    if sink is not None:
        check_tensor("sink", sink, ndim=1, dtypes=(torch.float32,), device=q.device)
        if sink.shape[0] != heads_q or not sink.is_contiguous():
            raise ValueError(f"sink: expected a contiguous [{heads_q}] tensor (one logit per query head), got {tuple(sink.shape)}")
    merged_window = validate_window(causal, window)
    if plan is None:
        plan = plan_attention_varlen(cu_seqlens_q.cpu(), cu_seqlens_k.cpu(), head_dim=head_dim, dtype=q.dtype,
                                     causal=causal, window=window, device=q.device)
    elif (plan.head_dim, plan.dtype, plan.window) != (head_dim, q.dtype, merged_window):
        raise ValueError(f"plan: made for head_dim={plan.head_dim}, dtype={plan.dtype}, window={plan.window}; "
                         f"this call has head_dim={head_dim}, dtype={q.dtype}, window={merged_window}")
    if (plan.schedule.total_q, plan.schedule.total_k) != (total_q, total_k):
        raise ValueError(f"q, k: the plan covers {plan.schedule.total_q} query and {plan.schedule.total_k} key tokens; "
                         f"got {total_q} and {total_k}")
    _check_cu_seqlens("cu_seqlens_q", cu_seqlens_q, q.device, plan.num_seqs)
    _check_cu_seqlens("cu_seqlens_k", cu_seqlens_k, q.device, plan.num_seqs)

    out = _result("out", out, (total_q, heads_q, head_dim), q.dtype, q.device)
    lse = _result("lse_out", lse_out, (heads_q, total_q), torch.float32, q.device)
    num_work = plan.work.shape[0]
    if num_work and heads_q:
        scale = 1.0 / math.sqrt(head_dim) if softmax_scale is None else float(softmax_scale)
        if not scale > 0:  # the kernel takes row maxima of unscaled scores
            raise ValueError(f"softmax_scale: expected a positive number, got {softmax_scale}")
        params = plan.variant.param_dict
        map_q = _tensor_map("q", q, params["tile_m"])
        # With no keys at all no key tile is ever loaded; the parameter still needs a descriptor.
        map_k, map_v = ((_tensor_map("k", k, params["tile_n"]), _tensor_map("v", v, params["tile_n"])) if total_k
                        else (map_q, map_q))
        with torch.cuda.device(q.device.index):
            _launcher(q.device.index, plan.variant, q.element_size())(
                   (num_work, heads_q), map_q, map_k, map_v,
                   q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                   cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), plan.work.data_ptr(),
                   0 if sink is None else sink.data_ptr(),
                   heads_q // heads_kv, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                   v.stride(0), v.stride(1), out.stride(0), out.stride(1), lse.stride(0),
                   np.float32(scale * _LOG2E), merged_window[0], merged_window[1])
    return (out, lse) if return_lse else out
