"""GQA attention prefill over packed varlen batches: a drop-in for ``flash_attn_varlen_func``.

Sequences are packed along the token dimension and delimited by ``cu_seqlens``.
A plan (tile schedule, maximum lengths, and whether any tile is incomplete) is
built on the host from the sequence lengths; with a plan, the op does no
device-to-host synchronisation and can be captured in a CUDA graph.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import torch

from kgen import arch, config, registry
from kgen.runtime import tma
from kgen.launch import current_device
from kgen.runtime import recipes
from kgen.runtime.checks import check_rows, check_sink, check_tensor, seqlens_from_cu, softmax_scale_log2
from kgen.runtime.dispatch import DTYPE_NAMES, DispatchCache, cached_launcher, contract, spec_dtypes, full_tiles_twin
from kgen.registry import UnsupportedVariantError, Variant
from kgen.families.attention_prefill.plan import TileSchedule, choose_schedule, plan_tiles, validate_window

FAMILY = "attention_prefill"
_MAX_GRID_Y = 65535  # query heads are the grid's y dimension


@dataclass(frozen=True, eq=False)
class AttentionPlan:
    """What :func:`attention_varlen` needs to launch without looking at device data.

    Build it once per batch layout with :func:`plan_attention_varlen`, on the host (no
    GPU needed). Its work list is copied to the device on first use, or when it is
    made, with ``device=``; a plan bound to one device refuses tensors on another.
    """

    schedule: TileSchedule
    head_dim: int
    dtype: torch.dtype
    window: tuple[int, int]  # (left, right) with causal folded in; -1 = unbounded
    num_seqs: int
    #: The variant to run: the spec's choice for this head dim, dtype, tail policy and
    #: batch (tile shape), specialised on has_incomplete_tile from the schedule.
    variant: Variant
    #: The work list (int32 [num_work, 2]: sequence, query tile) where it lives now: on the
    #: host until the plan is placed on a device.
    _placed: list = field(repr=False)
    #: The plan's inputs as plain ints, the chosen kernel's tile shape included: what
    #: :func:`plan_from_recipe` makes the same plan from (how a plan crosses into torch.ops.kgen).
    recipe: tuple = ()
    #: The calls made with this plan, checked once each (see :func:`attention_varlen`); they live
    #: as long as the plan.
    _prepared: dict = field(default_factory=dict, repr=False)

    @property
    def has_incomplete_tile(self) -> bool:
        return self.schedule.has_incomplete_tile

    @property
    def work(self) -> torch.Tensor:
        return self._placed[0]

    @property
    def device(self) -> torch.device:
        return self._placed[0].device

    def work_on(self, device: torch.device) -> torch.Tensor:
        """The work list on ``device``, copied there on first use; an error if the plan lives on another device.

        The first use copies from host memory, which a CUDA graph capture cannot do:
        plan with ``device=`` (or run once) before capturing.
        """
        work = self._placed[0]
        if work.device == device:
            return work
        if work.device.type != "cpu" or not self._placed[1]:
            raise ValueError(f"plan: its work list is on {work.device}, the tensors on {device}; "
                             f"plan with device={str(device)!r}")
        self._placed[:] = [work.to(device), False]
        return self._placed[0]


#: The arch a plan made without any GPU chooses its kernel for: the one kgen's built-in specs target.
PLANNING_SM_WITHOUT_GPU = 90


def planning_sm(device: torch.device | str | int | None) -> int:
    """The arch number a plan picks its kernel for: ``KGEN_ARCH``'s, else ``device``'s (else the current GPU's)."""
    override = config.arch_override()
    if override:
        return arch.parse(override, "KGEN_ARCH").sm
    if device is not None and torch.device(device).type == "cuda":
        major, minor = torch.cuda.get_device_capability(torch.device(device))
    elif device is None and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
    else:
        return PLANNING_SM_WITHOUT_GPU
    return major * 10 + minor


def _tile_candidates(head_dim: int, dtype: torch.dtype, tail: str | None, tile_m: int | None, sm: int,
                     mma: str | None = None, tile_n: int | None = None) -> list[Variant]:
    """The with-tail variant of each tile shape the spec offers for this call on arch ``sm``, in its order of
    preference (on sm_90 wgmma's shapes, then mma_sync's, which wins short sequences by computing fewer
    padded scores in its smaller tiles, though at a higher cost per score: see choose_schedule)."""
    wanted = {"tail": tail} if tail is not None else {}
    if tile_m is not None:
        wanted["tile_m"] = tile_m
    if tile_n is not None:
        wanted["tile_n"] = tile_n
    if mma is not None:
        wanted["mma"] = mma
    family = registry.current().family(FAMILY)
    # A tile shape is what the spec's configs set together (kernel, head dim, tiles, warps, occupancy).
    offered = family.preferred(group_by=family.config_axes, head_dim=head_dim, dtype=DTYPE_NAMES[dtype],
                               has_incomplete_tile=True, **wanted)
    runnable = [v for v in offered if v.supports_sm(sm)]
    if not runnable:
        raise UnsupportedVariantError(f"{FAMILY}: no variant for head_dim={head_dim}, dtype={DTYPE_NAMES[dtype]}"
                                      f"{''.join(f', {k}={x}' for k, x in wanted.items())} runs on sm_{sm}: "
                                      f"{offered[0].name} and the others {offered[0].arch_refusal(sm)}")
    return runnable


def plan_attention_varlen(cu_seqlens_q, cu_seqlens_k, *, head_dim: int, dtype: torch.dtype = torch.bfloat16,
                          causal: bool = False, window: tuple[int, int] = (-1, -1),
                          device: torch.device | str | int | None = None, tail: str | None = None,
                          tile_m: int | None = None, tile_n: int | None = None, mma: str | None = None
                          ) -> AttentionPlan:
    """Plan a batch on the host: tile shape and schedule (longest tiles first), maximum lengths, has_incomplete_tile.

    ``cu_seqlens_q`` / ``cu_seqlens_k`` are host data (lists or CPU tensors) of
    length N+1. ``head_dim`` and ``dtype`` pick the spec's variants, of the first kernel in
    its order that the arch runs (``KGEN_ARCH``, else ``device``'s or the current GPU's; sm_90
    without a GPU): wgmma's and then mma_sync's on sm_90a, mma_sync's elsewhere. Among the tile
    shapes it lists for them, the first is used unless it computes many more masked or
    padded scores for this batch than another (see
    :func:`kgen.families.attention_prefill.plan.choose_schedule`); ``tile_m`` and ``tile_n`` force a tile size, and ``mma``
    (``"wgmma"`` or ``"mma_sync"``) one kernel, which must run on the arch.
    The work list is copied to ``device`` now if given, else to the device of the first
    call that uses the plan. ``tail`` (``"tma"`` or ``"cp_async"``) overrides the spec's
    default tail policy (the wgmma kernel takes tails by TMA only, so ``"cp_async"`` runs
    mma_sync); either way a sequence's output never depends on the rows of another sequence.
    """
    dtypes = spec_dtypes(FAMILY)
    if dtype not in dtypes:
        raise TypeError(f"dtype: expected one of {[str(d) for d in dtypes]}, got {dtype}")
    seqlens_q = seqlens_from_cu(cu_seqlens_q, "cu_seqlens_q")
    seqlens_k = seqlens_from_cu(cu_seqlens_k, "cu_seqlens_k")
    if len(seqlens_q) != len(seqlens_k):
        raise ValueError(f"cu_seqlens_k: expected {len(seqlens_q) + 1} entries like cu_seqlens_q, got {len(seqlens_k) + 1}")
    merged_window = validate_window(causal, window)
    candidates = _tile_candidates(head_dim, dtype, tail, tile_m, planning_sm(device), mma, tile_n)
    schedules = [plan_tiles(seqlens_q, seqlens_k, tile_m=v.param_dict["tile_m"], tile_n=v.param_dict["tile_n"],
                            causal=causal, window=window) for v in candidates]
    chosen = choose_schedule(schedules, [v.score_cost for v in candidates])
    with_tail, schedule = candidates[chosen], schedules[chosen]
    variant = with_tail if schedule.has_incomplete_tile else full_tiles_twin(FAMILY, with_tail)
    work = torch.from_numpy(schedule.work)
    # [work list, whether it may still move to the first device that uses it]
    placed = [work, True] if device is None else [work.to(torch.device(device)), False]
    chosen = variant.param_dict
    recipe = (head_dim, recipes.code(recipes.DTYPES, dtype), int(causal), *window,
              recipes.code(recipes.TAILS, chosen["tail"]), chosen["tile_m"], chosen["tile_n"],
              recipes.code(recipes.MMAS, chosen["mma"]), len(seqlens_q),
              *recipes.cumulative(seqlens_q), *recipes.cumulative(seqlens_k))
    return AttentionPlan(schedule, head_dim, dtype, merged_window, len(seqlens_q), variant, placed, recipe)


def plan_from_recipe(recipe: tuple, work: torch.Tensor) -> AttentionPlan:
    """The plan ``recipe`` describes (see AttentionPlan.recipe), its work list the device tensor ``work``; made once."""
    key = (recipe, work.device)
    found = _from_recipe.get(key)
    if found is None:
        head_dim, dtype, causal, left, right, tail, tile_m, tile_n, mma, num_seqs, *cu = recipe
        found = plan_attention_varlen(cu[:num_seqs + 1], cu[num_seqs + 1:], head_dim=head_dim,
                                      dtype=recipes.DTYPES[dtype], causal=bool(causal), window=(left, right),
                                      tail=recipes.TAILS[tail], tile_m=tile_m, tile_n=tile_n, mma=recipes.MMAS[mma])
        found._placed[:] = [work, False]
        found = _from_recipe.put(key, found)
    return found


_from_recipe = DispatchCache()


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
            dtype, 16-byte aligned, and fp32 ``[Hq, total_q]``).

    Returns:
        ``out`` ``[total_q, Hq, D]`` in q's dtype, or ``(out, lse)``. Rows with no key to
        attend (and no sink) are 0 with LSE -inf.
    """
    # A call shaped like an earlier one of the same plan (layouts, dtypes, devices, options, calling
    # thread) reuses what the checks established and launches with the new addresses: the hot path of
    # a model. Anything unusual (no plan, options of unusual types) takes the checks every time.
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
    """A checked call's launch: everything but the addresses, and the tensor maps to patch with them."""

    def __init__(self, device_index, launcher, grid, maps, map_roles, work, tail_args, out_shape, lse_shape):
        self.device_index, self.launcher, self.grid, self.maps, self.work = device_index, launcher, grid, maps, work
        self.map_roles, self.tail_args, self.out_shape, self.lse_shape = map_roles, tail_args, out_shape, lse_shape

    def run(self, *args):
        # Descriptors are built and patched on the tensors' device, which need not be the current one.
        if current_device() == self.device_index:
            return self._run(*args)
        with torch.cuda.device(self.device_index):
            return self._run(*args)

    def _run(self, q, k, v, cu_seqlens_q, cu_seqlens_k, sink, out, lse_out, return_lse):
        out = q.new_empty(self.out_shape) if out is None else out
        lse = q.new_empty(self.lse_shape, dtype=torch.float32) if lse_out is None else lse_out
        if self.launcher is not None:
            maps, tensors = self.maps, (q, k, v, out)
            self.launcher(self.grid, *(maps.get(role, tensors[slot]) for role, slot in self.map_roles),
                          q.data_ptr(), k.data_ptr(), v.data_ptr(), out.data_ptr(), lse.data_ptr(),
                          cu_seqlens_q.data_ptr(), cu_seqlens_k.data_ptr(), self.work.data_ptr(),
                          0 if sink is None else sink.data_ptr(), *self.tail_args)
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
    if heads_q > _MAX_GRID_Y:
        raise ValueError(f"q: {heads_q} query heads exceed the kernel's grid limit of {_MAX_GRID_Y}")
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
    work = plan.work_on(q.device)

    out_shape, lse_shape = (total_q, heads_q, head_dim), (heads_q, total_q)
    _check_result("out", out, out_shape, q.dtype, q)
    if out is not None and out.data_ptr() % 16:  # TMA stores whole tiles; rechecked per call
        raise ValueError("out: expected a 16-byte aligned data pointer")
    _check_result("lse_out", lse_out, lse_shape, torch.float32, q)
    num_work = work.shape[0]
    if not (num_work and heads_q):
        return _PreparedCall(q.device.index, None, None, None, (), work, (), out_shape, lse_shape)
    kernel = contract(plan.variant)
    sizes = kernel.sizes
    # The kernel's row strides of out and lse are those of contiguous tensors (checked above, or new).
    tail_args = (heads_q // heads_kv, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1),
                 heads_q * head_dim, head_dim, total_q, scale_log2,
                 *kernel_window(merged_window, plan.schedule.max_seqlen_q, plan.schedule.max_seqlen_k))
    # The kernel's descriptors, map_q, map_k, ... by its parameters: q, k, v, and o where it stores O by TMA;
    # each with its tensor's place in (q, k, v, out).
    map_roles = tuple((role, "qkvo".index(role)) for role in
                      (p.name.removeprefix("map_") for p in kernel.parameters["attention_prefill"]
                       if p.kind == "tensor_map"))
    box_rows = {"q": sizes["q_box_rows"], "k": sizes["kv_box_rows"], "v": sizes["kv_box_rows"],
                "o": sizes["q_box_rows"]}
    # With no keys at all no key tile is ever loaded; the parameter still needs a descriptor.
    maps = tma.TensorMaps({role: box_rows[role] for role, _ in map_roles}, sizes["box_span_bytes"],
                          alias_of={"k": "q", "v": "q"} if not total_k else {})
    return _PreparedCall(q.device.index, cached_launcher(plan.variant, "attention_prefill", q.device.index),
                         (num_work, heads_q), maps, map_roles, work, tail_args, out_shape, lse_shape)


def kernel_window(window: tuple[int, int], max_seqlen_q: int, max_seqlen_k: int) -> tuple[int, int]:
    """The window as the kernel takes it: a side that bounds no key of any sequence becomes -1 (unbounded).

    The kernel adds the window to 32-bit positions: a left side of max_seqlen_k or more, or a
    right side of max_seqlen_q or more, allows every key yet could overflow there.
    """
    left, right = window
    return (-1 if left >= max_seqlen_k else left), (-1 if right >= max_seqlen_q else right)
