"""Planning a prefill batch: which kernel and tile shape run it, and the plan a call launches from.

The tile schedule itself is :mod:`kgen.families.attention_prefill.plan`'s; this module picks among the
spec's variants for the arch and the batch, and makes the :class:`AttentionPlan` (from the lengths, or
again from its recipe).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from kgen import registry
from kgen.families.attention_prefill.plan import (TileSchedule, check_batch, choose_schedule, packable,
                                                  schedule_packed_tiles, schedule_tiles, validate_window)
from kgen.families.attention_prefill.recipe import AttentionRecipe
from kgen.registry import UnsupportedVariantError, Variant
from kgen.runtime.checks import check_int, check_plan_device, seqlens_from_cu
from kgen.runtime.tables import DeviceTables
from kgen.runtime.dispatch import DTYPE_NAMES, SpecPathMemo, full_tiles_twin, planning_sm, spec_dtypes

FAMILY = "attention_prefill"


@dataclass(frozen=True, eq=False)
class AttentionPlan:
    """What :func:`attention_varlen` needs to launch without looking at device data.

    Build it once per batch layout with :func:`plan_attention_varlen`, on the host (no
    GPU needed). Its work list is copied to the device on first use, or when it is
    made, with ``device=``; a plan's kernel is chosen for one GPU, so a plan placed on
    one device refuses tensors on another.
    """

    def __repr__(self) -> str:
        # A summary: the work list and lengths would fill a screen for a large batch.
        return (f"AttentionPlan({self.num_seqs} sequences, {self.schedule.total_q}/{self.schedule.total_k} query/key "
                f"tokens, {len(self.schedule.work)} query tiles, window={self.window}, {self.variant.name})")


    schedule: TileSchedule
    head_dim: int
    dtype: torch.dtype
    window: tuple[int, int]  # (left, right) with causal folded in; -1 = unbounded
    num_seqs: int
    #: The variant to run: the spec's choice for this head dim, dtype, tail policy and
    #: batch (tile shape), specialised on has_incomplete_tile from the schedule.
    variant: Variant
    #: The work list (int32 [num_work, 6]: sequence, query tile and the sequence's bounds; see
    #: :class:`~kgen.families.attention_prefill.plan.TileSchedule`) and the plan's cu_seqlens_q (int32 [N + 1], by
    #: which a packed tile's rows find their sequences) on the one device the plan runs on.
    tables: DeviceTables = field(repr=False)
    #: The plan's inputs, the chosen kernel's tile shape included: what :func:`plan_from_recipe`
    #: makes the same plan from.
    recipe: AttentionRecipe = AttentionRecipe()
    #: The op's calls made with this plan, checked once each (see
    #: :func:`kgen.families.attention_prefill.op.attention_varlen`); they live as long as the plan.
    _prepared: dict = field(default_factory=dict, repr=False)

    @property
    def has_incomplete_tile(self) -> bool:
        return self.schedule.has_incomplete_tile

    @property
    def work(self) -> torch.Tensor:
        """The work list where it lives: on its device once placed, on the host before."""
        devices = self.tables.devices()
        return self.tables.placed(devices[0])[0] if devices else torch.from_numpy(self.schedule.work)

    def work_on(self, device: torch.device) -> torch.Tensor:
        """The work list on ``device``, copied there on first use (not during a CUDA-graph capture: plan with
        ``device=`` or run once before capturing); an error if the plan lives on another device."""
        return self.tables.on(device)[0]


def tile_candidates(head_dim: int, dtype: torch.dtype, tail: str | None, tile_m: int | None, sm: int,
                    mma: str | None = None, tile_n: int | None = None, rows: str | None = None) -> list[Variant]:
    """The has_incomplete_tile=true variant of each tile shape the spec offers for this call on arch ``sm``, in
    its order of preference (on sm_90 wgmma's shapes, then mma_sync's, which wins short sequences by computing
    fewer padded scores in its smaller tiles, though at a higher cost per score: see choose_schedule); of the
    spec's default ``rows`` unless ``rows`` is given. Memoised per spec path: a plan asks twice (per-sequence and
    packed shapes), and the registry's search is a tenth of a millisecond each."""
    family = registry.current().family(FAMILY)  # first: a changed spec path empties the memo
    key = (head_dim, dtype, tail, tile_m, sm, mma, tile_n, rows)
    found = _candidates.get(key)
    if found is not None:
        return list(found)  # the caller's to extend
    wanted = {"tail": tail} if tail is not None else {}
    if rows is not None:
        wanted["rows"] = rows
    if tile_m is not None:
        wanted["tile_m"] = tile_m
    if tile_n is not None:
        wanted["tile_n"] = tile_n
    if mma is not None:
        wanted["mma"] = mma
    # A tile shape is what the spec's configs set together (kernel, head dim, tiles, warps, occupancy).
    offered = family.preferred(group_by=family.config_axes, head_dim=head_dim, dtype=DTYPE_NAMES[dtype],
                               has_incomplete_tile=True, **wanted)
    runnable = [v for v in offered if v.supports_sm(sm)]
    if not runnable:
        raise UnsupportedVariantError(f"{FAMILY}: no variant for head_dim={head_dim}, dtype={DTYPE_NAMES[dtype]}"
                                      f"{''.join(f', {k}={x}' for k, x in wanted.items())} runs on sm_{sm}: "
                                      f"{offered[0].name} and the others {offered[0].arch_refusal(sm)}")
    return list(_candidates.put(key, tuple(runnable)))


def plan_attention_varlen(cu_seqlens_q, cu_seqlens_k, *, head_dim: int, dtype: torch.dtype = torch.bfloat16,
                          causal: bool = False, window: tuple[int, int] = (-1, -1),
                          device: torch.device | str | int | None = None, tail: str | None = None,
                          tile_m: int | None = None, tile_n: int | None = None, mma: str | None = None,
                          rows: str | None = None) -> AttentionPlan:
    """Plan a batch on the host: tile shape and schedule (by sequence, the costliest first: see
    :func:`~kgen.families.attention_prefill.plan.plan_tiles`), maximum lengths, has_incomplete_tile.

    ``cu_seqlens_q`` / ``cu_seqlens_k`` are host data (lists or CPU tensors) of
    length N+1. ``head_dim`` and ``dtype`` pick the spec's variants, of the first kernel in
    its order that the arch runs (``KGEN_ARCH``, else ``device``'s or the current GPU's; sm_90
    without a GPU): wgmma's and then mma_sync's on sm_90a, mma_sync's elsewhere. Among the tile
    shapes it lists for them, the first is used unless it computes many more masked or
    padded scores for this batch than another (see
    :func:`kgen.families.attention_prefill.plan.choose_schedule`); ``tile_m`` and ``tile_n`` force a tile size,
    and ``mma`` (``"wgmma"`` or ``"mma_sync"``) one kernel, which must run on the arch.
    The work list is copied to ``device`` now if given, else to the device of the first
    call that uses the plan. ``tail`` (``"tma"`` or ``"cp_async"``) overrides the spec's
    default tail policy (the wgmma kernel loads incomplete tiles by TMA only, so ``"cp_async"``
    runs mma_sync); either way a sequence's output never depends on the rows of another sequence.
    ``rows="packed"`` forces tiles of consecutive tokens (see
    :func:`~kgen.families.attention_prefill.plan.plan_packed_tiles`; self-attention with no window but the causal
    mask), ``"per_sequence"`` forbids them; by default the planner weighs both where the spec offers packing.
    """
    check_int("head_dim", head_dim, minimum=1)
    for name, value in (("tile_m", tile_m), ("tile_n", tile_n)):
        if value is not None:
            check_int(name, value, minimum=1)
    device = check_plan_device(device)
    dtypes = spec_dtypes(FAMILY)
    if dtype not in dtypes:
        raise TypeError(f"dtype: expected one of {[str(d) for d in dtypes]}, got {dtype}")
    seqlens_q = seqlens_from_cu(cu_seqlens_q, "cu_seqlens_q")
    seqlens_k = seqlens_from_cu(cu_seqlens_k, "cu_seqlens_k")
    if len(seqlens_q) != len(seqlens_k):
        raise ValueError(f"cu_seqlens_k: expected {len(seqlens_q) + 1} entries like cu_seqlens_q, got {len(seqlens_k) + 1}")
    merged_window = validate_window(causal, window)
    if rows not in (None, "per_sequence", "packed"):
        raise ValueError(f"rows: expected 'per_sequence', 'packed' or None, got {rows!r}")
    batch = check_batch(seqlens_q, seqlens_k)  # once, for every shape's schedule
    can_pack = packable(batch, merged_window)
    if rows == "packed" and not can_pack:
        raise ValueError(f"rows: 'packed' needs self-attention (seqlens_q equal to seqlens_k) with no window but the "
                         f"causal mask; got window={merged_window}" + ("" if batch.self_attention else
                                                                       " and other key lengths than query lengths"))
    sm = planning_sm(device)
    candidates, no_shape = [], None
    if rows != "packed":
        try:
            candidates = tile_candidates(head_dim, dtype, tail, tile_m, sm, mma, tile_n, "per_sequence")
        except UnsupportedVariantError as exc:
            if not can_pack or rows is not None:  # a spec may offer a head dim packed tiles alone
                raise
            no_shape = exc
    schedules = [schedule_tiles(batch, tile_m=v.param_dict["tile_m"], tile_n=v.param_dict["tile_n"], causal=causal,
                                window=window) for v in candidates]
    if can_pack and rows != "per_sequence":
        packed = _packed_candidates(head_dim, dtype, tail, tile_m, sm, mma, tile_n, required=rows == "packed")
        if not (candidates or packed):
            raise no_shape
        candidates += packed
        # Causal is the merged window's: causal=False with window (-1, 0) is causal too, as the kernel sees it.
        schedules += [schedule_packed_tiles(batch, tile_m=v.param_dict["tile_m"], tile_n=v.param_dict["tile_n"],
                                            causal=merged_window[1] == 0) for v in packed]
    chosen = choose_schedule(schedules, [v.score_cost for v in candidates])
    any_tiles, schedule = candidates[chosen], schedules[chosen]
    variant = any_tiles if schedule.has_incomplete_tile else full_tiles_twin(FAMILY, any_tiles)
    params = variant.param_dict
    recipe = AttentionRecipe.of(head_dim=head_dim, dtype=dtype, causal=causal, window=window, tail=params["tail"],
                                tile_m=params["tile_m"], tile_n=params["tile_n"], mma=params["mma"],
                                rows=params["rows"], seqlens_q=seqlens_q, seqlens_k=seqlens_k)
    work = torch.from_numpy(schedule.work)
    plan_cu = torch.tensor(recipe.cu_seqlens_q, dtype=torch.int32)
    tables = DeviceTables(lambda to: (work.to(to), plan_cu.to(to)), "work list", one_device=True)
    if device is not None:
        tables.on(device)
    return AttentionPlan(schedule, head_dim, dtype, merged_window, len(seqlens_q), variant, tables, recipe)


def _packed_candidates(head_dim, dtype, tail, tile_m, sm, mma, tile_n, *, required: bool) -> list[Variant]:
    """The spec's packed tile shapes for this call, none where it offers none (an error where they are required)."""
    registry.current()  # first: a changed spec path empties the memos
    key = (head_dim, dtype, tail, tile_m, sm, mma, tile_n)
    if not required and _no_packed.get(key):
        return []
    try:
        return tile_candidates(head_dim, dtype, tail, tile_m, sm, mma, tile_n, "packed")
    except UnsupportedVariantError:
        if required:
            raise
        _no_packed.put(key, True)
        return []


def plan_from_recipe(recipe: AttentionRecipe, work: torch.Tensor, plan_cu_seqlens: torch.Tensor) -> AttentionPlan:
    """The plan ``recipe`` describes, its tables the device tensors ``work`` and ``plan_cu_seqlens``; made once per
    recipe and device."""
    key = (recipe, work.device)
    found = _from_recipe.get(key)
    if found is None:
        found = plan_attention_varlen(recipe.cu_seqlens_q, recipe.cu_seqlens_k, head_dim=recipe.head_dim,
                                      dtype=recipe.dtype, causal=recipe.causal, window=recipe.window,
                                      tail=recipe.tail, tile_m=recipe.tile_m, tile_n=recipe.tile_n, mma=recipe.mma,
                                      rows=recipe.rows)
        found.tables.adopt(work.device, (work, plan_cu_seqlens))
        found = _from_recipe.put(key, found)
    return found


_from_recipe = SpecPathMemo()
_candidates = SpecPathMemo()
_no_packed = SpecPathMemo()  # the calls for which the spec path offers no packed shape
