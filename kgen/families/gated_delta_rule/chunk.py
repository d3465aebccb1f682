"""The chunked gated delta rule (Gated DeltaNet) forward: a drop-in for fla's ``chunk_gated_delta_rule``.

Per token t of a sequence, with the state S ``[K, V]`` (fp32) of each v-head:
``S = e^{g_t} S;  u = beta_t (v_t - S^T k_t);  S = S + k_t u^T;  o_t = scale S^T q_t``,
computed in chunks of 64 tokens (see templates/gated_delta_rule_chunk.cu.j2 for the algebra):

1. ``gated_delta_rule_kkt``: per chunk and v-head, Tbeta = (I + A)^-1 diag(beta), into a workspace.
2. Long sequences split into segments (the plan decides, to fill the GPU):
   ``gated_delta_rule_chunk_summary`` maps each segment but the last of its sequence to
   (M, h) from a zero state; ``gated_delta_rule_chunk_chain`` turns them into every segment's
   exact start state.
3. ``gated_delta_rule_chunk``: each segment from its start state, writing o and the final states.

The plan (:func:`plan_chunk_gated_delta_rule`) is built on the host once per batch layout; with
it the op never synchronises with the device and can be captured in a CUDA graph.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass, field

import numpy as np
import torch

from kgen import registry
from kgen.runtime import tma
from kgen.launch import current_device
from kgen.families.gated_delta_rule.contract import GDN_CHAIN_COLUMNS, GDN_SEGMENT_FIELDS
from kgen.runtime import recipes
from kgen.runtime.checks import (INT32_LIMIT, check_dense_rows, check_int, check_scale, check_shape, check_tensor,
                              cuda_device, seqlens_from_cu)
from kgen.runtime.dispatch import DTYPE_NAMES, DispatchCache, launcher, spec_dtypes, incomplete_tile_pair
from kgen.families.gated_delta_rule.chunk_plan import ChunkSchedule, RecurrenceCosts, plan_chunks

KKT_FAMILY = "gated_delta_rule_kkt"
CHUNK_FAMILY = "gated_delta_rule_chunk"
_MAX_GRID_YZ = 65535  # heads and segments are grid dimensions y and z
_STATE_LAYOUTS = ("kv", "vk")
#: SMs assumed by a plan made without a GPU (the H200's).
DEFAULT_NUM_SMS = 132


@dataclass(frozen=True, eq=False)
class ChunkGatedDeltaRulePlan:
    """The chunk and segment tables of one batch layout, for :func:`chunk_gated_delta_rule`.

    Tables live on the host until first used on a device (or at once with ``device=``); plan
    with ``device=`` before capturing a CUDA graph, since the first use copies them. A captured
    graph reads the tables where they are: keep the plan alive as long as the graph. The op checks
    a plan against its tensors' sequence count and total tokens only (the lengths themselves are
    on the device): a plan made for other lengths with the same totals gives wrong results.
    """

    schedule: ChunkSchedule
    num_heads_v: int
    head_dim: int
    #: The recurrence's value columns per block (the spec's tile_n).
    value_slice: int
    #: int32 [chunks, 2]: first token, tokens (<= 64) of every chunk.
    chunks: np.ndarray
    #: int32 [segments, GDN_SEGMENT_FIELDS]: every segment (empty sequences as segments of 0
    #: chunks, so that their final state is written), the longest first.
    segments: np.ndarray
    #: The rows of ``segments`` whose summary a later segment needs.
    summary_segments: np.ndarray
    #: int32 [sequences split, 3]: sequence, first summary slot, summaries.
    chains: np.ndarray
    num_summaries: int
    #: The plan's inputs as plain ints, its split forced (see kgen.runtime.recipes): num_heads_v, head_dim,
    #: value_slice, segment_chunks, N, then cu_seqlens.
    recipe: tuple = ()
    _tables: dict = field(default_factory=dict, repr=False)

    @property
    def num_seqs(self) -> int:
        return len(self.schedule.chunk_offsets) - 1

    @property
    def has_incomplete_tile(self) -> bool:
        return self.schedule.has_incomplete_tile

    def tables(self, device: torch.device) -> tuple[torch.Tensor, ...]:
        """(chunks, segments, summary segments, chains) on ``device``, copied there on first use."""
        device = cuda_device(device)
        found = self._tables.get(device)
        if found is None:
            found = tuple(torch.from_numpy(np.ascontiguousarray(t)).to(device)
                          for t in (self.chunks, self.segments, self.summary_segments, self.chains))
            self._tables[device] = found
        return found


def _recurrence_shape(head_dim: int, tile_n: int | None) -> tuple[int, int]:
    """(value slice, blocks per SM) of the recurrence: the spec's first tile_n for the head dim, or ``tile_n``."""
    family = registry.current().family(CHUNK_FAMILY)
    slices = family.axis_values("tile_n", head_dim=head_dim)
    if not slices:
        raise ValueError(f"head_dim: {head_dim} is not one the spec offers; supported: {family.supported('head_dim')}")
    if tile_n is None:
        tile_n = slices[0]
    elif tile_n not in slices:
        raise ValueError(f"tile_n: the spec offers {sorted(slices)} at head_dim {head_dim}, got {tile_n!r}")
    return tile_n, family.axis_values("min_blocks_per_sm", head_dim=head_dim, tile_n=tile_n)[0]


def plan_chunk_gated_delta_rule(cu_seqlens, *, num_heads_v: int, head_dim: int = 128, num_sms: int | None = None,
                                tile_n: int | None = None, segment_chunks: int | None = None,
                                device: torch.device | str | None = None) -> ChunkGatedDeltaRulePlan:
    """Plan :func:`chunk_gated_delta_rule` for the sequences delimited by ``cu_seqlens``.

    Args:
        cu_seqlens: host data (a list of ints or a CPU tensor), ``[0, n0, n0 + n1, ...]``.
        num_heads_v: HV, the value heads (with the head dim, the blocks per segment).
        head_dim: K = V.
        num_sms: the SMs the split is planned for; default: the current CUDA device's, or 132 without one.
        tile_n: force the recurrence's value slice (default: the spec's first for the head dim).
        segment_chunks: force the split: segments of this many 64-token chunks (default: the
            planner's cost model decides).
        device: copy the tables there now (needed before CUDA-graph capture).
    """
    seqlens = seqlens_from_cu(cu_seqlens, "cu_seqlens")
    check_int("num_heads_v", num_heads_v, minimum=1, maximum=_MAX_GRID_YZ)
    check_int("head_dim", head_dim, minimum=1)
    if num_sms is None:
        num_sms = torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count \
            if torch.cuda.is_available() else DEFAULT_NUM_SMS
    check_int("num_sms", num_sms, minimum=1)
    value_slice, blocks_per_sm = _recurrence_shape(head_dim, tile_n)
    slices = head_dim // value_slice
    # The summary covers K + V = 2 K columns.
    empty = sum(1 for n in seqlens if n == 0)  # a segment row each, besides the planner's
    schedule = plan_chunks(seqlens, chunk=64, parallel_per_segment=num_heads_v * slices,
                           summary_per_segment=2 * num_heads_v * slices,
                           costs=RecurrenceCosts(num_sms=num_sms, blocks_per_sm=blocks_per_sm),
                           segment_chunks=segment_chunks, max_segments=_MAX_GRID_YZ - empty)
    lengths = np.asarray(seqlens, dtype=np.int64)
    starts = np.concatenate([[0], np.cumsum(lengths)])

    chunk_seq = schedule.chunk_indices[:, 0].astype(np.int64)
    first = starts[chunk_seq] + 64 * schedule.chunk_indices[:, 1].astype(np.int64)
    chunks = np.stack([first, np.minimum(starts[chunk_seq + 1] - first, 64)], axis=1).astype(np.int32).reshape(-1, 2)

    # Segments in sequence order: the j-th of a sequence's n gets summary slot base + j (j < n - 1)
    # and start slot base + j - 1 (j >= 1), where the chain writes it.
    segs = schedule.segments
    by_sequence = segs[np.lexsort((segs[:, 1], segs[:, 0]))]
    pieces = np.bincount(by_sequence[:, 0], minlength=len(lengths)) if len(by_sequence) else np.zeros(len(lengths), np.int64)
    base = np.concatenate([[0], np.cumsum(np.maximum(pieces - 1, 0))])
    seq = by_sequence[:, 0].astype(np.int64)
    j = np.arange(len(by_sequence)) - (np.cumsum(pieces) - pieces)[seq]
    last = j == pieces[seq] - 1
    rows = np.stack([seq, starts[seq] + 64 * by_sequence[:, 1], starts[seq + 1],
                     schedule.chunk_offsets[seq] + by_sequence[:, 1], by_sequence[:, 2],
                     np.where(last, -1, base[seq] + j), np.where(j > 0, base[seq] + j - 1, -1),
                     last.astype(np.int64)], axis=1)
    empty = np.flatnonzero(lengths == 0)
    empty_rows = np.stack([empty, starts[empty], starts[empty], np.zeros_like(empty), np.zeros_like(empty),
                           -np.ones_like(empty), -np.ones_like(empty), np.ones_like(empty)], axis=1)
    rows = np.concatenate([rows.reshape(-1, GDN_SEGMENT_FIELDS), empty_rows.reshape(-1, GDN_SEGMENT_FIELDS)])
    rows = rows[np.argsort(-rows[:, 4], kind="stable")].astype(np.int32)  # the longest first
    split = np.flatnonzero(pieces > 1)
    chains = np.stack([split, base[split], pieces[split] - 1], axis=1).astype(np.int32).reshape(-1, 3)
    if len(rows) > _MAX_GRID_YZ:
        raise ValueError(f"cu_seqlens: {len(rows)} segments; the kernels take at most {_MAX_GRID_YZ}")
    plan = ChunkGatedDeltaRulePlan(schedule=schedule, num_heads_v=num_heads_v, head_dim=head_dim,
                                   value_slice=value_slice, chunks=chunks,
                                   segments=rows, summary_segments=rows[rows[:, 5] >= 0], chains=chains,
                                   num_summaries=int(base[-1]),
                                   recipe=(num_heads_v, head_dim, value_slice, schedule.segment_chunks, len(lengths),
                                           *recipes.cumulative(lengths)))
    if device is not None:
        plan.tables(device)
    return plan


def plan_from_recipe(recipe: tuple, tables: list[torch.Tensor]) -> ChunkGatedDeltaRulePlan:
    """The plan ``recipe`` describes, its tables the device tensors ``tables`` (as ``tables()`` returns them); made once."""
    device = tables[0].device
    key = (recipe, device)
    found = _from_recipe.get(key)
    if found is None:
        heads_v, head_dim, value_slice, segment_chunks, num_seqs, *cu = recipe
        found = plan_chunk_gated_delta_rule(cu, num_heads_v=heads_v, head_dim=head_dim, tile_n=value_slice,
                                            segment_chunks=segment_chunks)
        found._tables[device] = tuple(tables)
        found = _from_recipe.put(key, found)
    return found


_from_recipe = DispatchCache()
_kernels = DispatchCache()
# The recurrence's TMA descriptors, per calling thread (a patch must not race another thread's
# launch) and tensor layout; a tensor at a new address only patches its descriptor.
# A descriptor holds a reference to its tensor, so the table stays small: the few layouts of the
# latest calls.
_maps: dict[tuple, tma.TensorMaps] = {}
_MAX_LAYOUTS = 8


def _tensor_maps(q3, k3, v3, tbeta3) -> tuple:
    key = (threading.get_ident(), q3.device.index, q3.dtype) + tuple(
        (tuple(t.shape), tuple(t.stride())) for t in (q3, k3, v3, tbeta3))
    maps = _maps.get(key)
    if maps is None:
        if len(_maps) >= _MAX_LAYOUTS:  # layouts come and go with batch shapes
            _maps.clear()
        maps = _maps[key] = tma.TensorMaps({role: 64 for role in "qkvt"}, 128)
    return tuple(maps.get(role, t) for role, t in zip("qkvt", (q3, k3, v3, tbeta3)))


def _kernels_for(device_index: int, head_dim: int, dtype: torch.dtype, state_layout: str, value_slice: int,
                 has_tail: bool):
    """(kkt, recurrence, summary, chain) launchers."""
    key = (device_index, head_dim, dtype, state_layout, value_slice, has_tail)
    found = _kernels.get(key)
    if found is not None:
        return found
    dtype_name = DTYPE_NAMES[dtype]
    kkt = incomplete_tile_pair(KKT_FAMILY, head_dim=head_dim, dtype=dtype_name)[0 if has_tail else 1]
    chunk = incomplete_tile_pair(CHUNK_FAMILY, head_dim=head_dim, dtype=dtype_name, state_layout=state_layout,
                      tile_n=value_slice)[0 if has_tail else 1]
    return _kernels.put(key, (launcher(kkt, "gated_delta_rule_kkt", device_index),
                              launcher(chunk, "gated_delta_rule_chunk", device_index),
                              launcher(chunk, "gated_delta_rule_chunk_summary", device_index),
                              launcher(chunk, "gated_delta_rule_chunk_chain", device_index)))


def chunk_gated_delta_rule(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
                           scale: float | None = None, initial_state: torch.Tensor | None = None,
                           output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
                           use_qk_l2norm_in_kernel: bool = False, state_layout: str = "kv",
                           plan: ChunkGatedDeltaRulePlan | None = None, out: torch.Tensor | None = None
                           ) -> tuple[torch.Tensor, torch.Tensor | None]:
    """fla's ``chunk_gated_delta_rule`` forward: returns (o ``[B, T, HV, V]``, final state or None).

    Args:
        q, k: ``[B, T, H, K]``; v: ``[B, T, HV, V]`` with V = K and HV a multiple of H (v-head i
            reads q/k head i // (HV / H)); bf16 or fp16, contiguous.
        g: fp32 ``[B, T, HV]``, natural-log gates (<= 0; not checked on the device). beta:
            ``[B, T, HV]``, fp32 or q's dtype.
        cu_seqlens: packed varlen (B = 1): ``[N + 1]`` int32/int64 on q's device. Its values are
            read from ``plan``; without a plan they are copied to the host (a synchronisation).
        initial_state: fp32 ``[N, HV, K, V]`` (``state_layout="kv"``) or ``[N, HV, V, K]`` ("vk").
        output_final_state: also return the states after each sequence, in the same layout.
        use_qk_l2norm_in_kernel: normalise q and k over K first (x / sqrt(sum x^2 + 1e-6)).
        plan: from :func:`plan_chunk_gated_delta_rule` for these sequences.
        out: optional preallocated o (contiguous, v's shape and dtype).
    """
    dtypes = spec_dtypes(CHUNK_FAMILY)
    check_tensor("q", q, ndim=4, dtypes=dtypes)
    device = q.device
    batch, tokens, heads, head_dim = q.shape
    check_tensor("k", k, ndim=4, dtypes=(q.dtype,), device=device)
    check_shape("k", k, q.shape, "[B, T, H, K] like q")
    check_tensor("v", v, ndim=4, dtypes=(q.dtype,), device=device)
    heads_v = v.shape[2]
    check_shape("v", v, (batch, tokens, heads_v, head_dim), "[B, T, HV, V] with V = K")
    if heads == 0 or heads_v == 0 or heads_v % heads:
        raise ValueError(f"v: HV={heads_v} v-heads must be a positive multiple of H={heads} q/k heads")
    if heads_v > _MAX_GRID_YZ:
        raise ValueError(f"v: HV={heads_v} must be at most {_MAX_GRID_YZ} (the kernels' grid)")
    check_tensor("g", g, ndim=3, dtypes=(torch.float32,), device=device)
    check_shape("g", g, (batch, tokens, heads_v), "[B, T, HV]")
    check_tensor("beta", beta, ndim=3, dtypes=(torch.float32, q.dtype), device=device)
    check_shape("beta", beta, (batch, tokens, heads_v), "[B, T, HV]")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_dense_rows(name, t)
    if state_layout not in _STATE_LAYOUTS:
        raise ValueError(f"state_layout: expected one of {_STATE_LAYOUTS}, got {state_layout!r}")
    for name, flag in (("output_final_state", output_final_state), ("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)):
        if not isinstance(flag, bool):
            raise TypeError(f"{name}: expected a bool, got {flag!r}")
    scale = head_dim ** -0.5 if scale is None else check_scale("scale", scale)

    if cu_seqlens is not None:
        if batch != 1:
            raise ValueError(f"cu_seqlens: packed varlen takes B = 1, got B = {batch}")
        check_tensor("cu_seqlens", cu_seqlens, ndim=1, dtypes=(torch.int32, torch.int64), device=device)
    if plan is None:
        if cu_seqlens is not None:  # the lengths are on the device: a synchronisation
            plan = plan_chunk_gated_delta_rule(cu_seqlens.cpu(), num_heads_v=heads_v, head_dim=head_dim)
        else:
            plan = fixed_length_plan(batch, tokens, heads_v, head_dim, device)
    elif not isinstance(plan, ChunkGatedDeltaRulePlan):
        raise TypeError(f"plan: expected a ChunkGatedDeltaRulePlan, got {type(plan).__name__}")
    num_seqs = plan.num_seqs
    expected_seqs = cu_seqlens.numel() - 1 if cu_seqlens is not None else batch
    if (plan.num_heads_v, plan.head_dim, plan.schedule.total_tokens, num_seqs) != (heads_v, head_dim, batch * tokens,
                                                                                    expected_seqs):
        raise ValueError(f"plan: made for {num_seqs} sequences of {plan.schedule.total_tokens} tokens, HV="
                         f"{plan.num_heads_v}, K={plan.head_dim}; these tensors have {expected_seqs} sequences of "
                         f"{batch * tokens} tokens, HV={heads_v}, K={head_dim}")
    if initial_state is not None:
        check_tensor("initial_state", initial_state, ndim=4, dtypes=(torch.float32,), device=device)
        check_shape("initial_state", initial_state, (num_seqs, heads_v, head_dim, head_dim),
                    f"[N, HV, K, V] ({state_layout})")
        check_dense_rows("initial_state", initial_state)

    if out is None:
        out = torch.empty_like(v)
    else:
        check_tensor("out", out, ndim=4, dtypes=(q.dtype,), device=device)
        check_shape("out", out, v.shape, "[B, T, HV, V] like v")
        check_dense_rows("out", out)
    final = q.new_empty((num_seqs, heads_v, head_dim, head_dim), dtype=torch.float32) if output_final_state else None
    if not num_seqs:
        return out, final
    if device.index != current_device():  # descriptors are made on, and for, the current device
        with torch.cuda.device(device.index):
            return _launch(plan, q, k, v, g, beta, initial_state, out, final, scale, state_layout,
                           use_qk_l2norm_in_kernel)
    return _launch(plan, q, k, v, g, beta, initial_state, out, final, scale, state_layout, use_qk_l2norm_in_kernel)


_fixed_plans = DispatchCache()


def fixed_length_plan(batch: int, tokens: int, heads_v: int, head_dim: int, device: torch.device):
    """The plan of B sequences of T tokens, made once (its tables then stay on the device: no copy per call)."""
    key = (batch, tokens, heads_v, head_dim, device.index)
    found = _fixed_plans.get(key)
    if found is None:
        found = _fixed_plans.put(key, plan_chunk_gated_delta_rule([tokens * b for b in range(batch + 1)],
                                                                  num_heads_v=heads_v, head_dim=head_dim,
                                                                  device=device))
    return found


def _launch(plan, q, k, v, g, beta, initial_state, out, final, scale, state_layout, use_qk_l2norm_in_kernel):
    """The kernels of chunk_gated_delta_rule on checked inputs, on q's device (the current one)."""
    device = q.device
    heads, head_dim, heads_v = q.shape[2], q.shape[3], v.shape[2]
    slice_v = plan.value_slice
    kkt, recurrence, summary, chain = _kernels_for(device.index, head_dim, q.dtype, state_layout, slice_v,
                                                   plan.has_incomplete_tile)
    chunks, segments, summary_segments, chains = plan.tables(device)
    num_chunks = len(plan.chunks)
    if max(num_chunks, 1) * heads_v * 64 > INT32_LIMIT:
        raise ValueError(f"q: {num_chunks} chunks x {heads_v} v-heads exceed the kernels' 32-bit row indices")
    tbeta = torch.empty((max(num_chunks, 1), heads_v, 64, 64), device=device, dtype=q.dtype)
    beta_is_fp32 = int(beta.dtype is torch.float32)
    l2norm = int(use_qk_l2norm_in_kernel)
    if num_chunks:
        kkt((num_chunks, heads), k.data_ptr(), g.data_ptr(), beta.data_ptr(), beta_is_fp32, chunks.data_ptr(),
            tbeta.data_ptr(), heads, heads_v, l2norm)
    initial = 0 if initial_state is None else initial_state.data_ptr()
    # Tokens by heads by features for TMA (B x T flattened); Tbeta as rows of 64. With no tokens at all
    # no tile is ever loaded, and the parameters take Tbeta's descriptor (an empty tensor has none).
    tbeta_rows = tbeta.view(-1, 1, 64)
    if num_chunks:
        maps = _tensor_maps(q.view(-1, heads, head_dim), k.view(-1, heads, head_dim), v.view(-1, heads_v, head_dim),
                            tbeta_rows)
    else:
        maps = _tensor_maps(tbeta_rows, tbeta_rows, tbeta_rows, tbeta_rows)
    summaries = starts = None
    if plan.num_summaries:
        summaries = torch.empty((plan.num_summaries, heads_v, head_dim, 2 * head_dim), device=device, dtype=torch.float32)
        starts = torch.empty((plan.num_summaries, heads_v, head_dim, head_dim), device=device, dtype=torch.float32)
        summary((2 * head_dim // slice_v, heads_v, len(plan.summary_segments)), *maps, q.data_ptr(), k.data_ptr(),
                v.data_ptr(), g.data_ptr(), tbeta.data_ptr(), summary_segments.data_ptr(), 0, 0,
                summaries.data_ptr(), 0, 0, heads, heads_v, np.float32(scale), l2norm)
        chain((head_dim // GDN_CHAIN_COLUMNS, heads_v, len(plan.chains)), summaries.data_ptr(), initial,
              starts.data_ptr(), chains.data_ptr(), heads_v)
    recurrence((head_dim // slice_v, heads_v, len(plan.segments)), *maps, q.data_ptr(), k.data_ptr(), v.data_ptr(),
               g.data_ptr(), tbeta.data_ptr(), segments.data_ptr(), initial,
               0 if starts is None else starts.data_ptr(), 0, out.data_ptr(),
               0 if final is None else final.data_ptr(), heads, heads_v, np.float32(scale), l2norm)
    return out, final
