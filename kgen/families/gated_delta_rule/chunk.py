"""The chunked gated delta rule (Gated DeltaNet) forward: a drop-in for fla's ``chunk_gated_delta_rule``.

Per token t of a sequence, with the state S ``[K, V]`` (fp32) of each v-head:
``S = e^{g_t} S;  u = beta_t (v_t - S^T k_t);  S = S + k_t u^T;  o_t = scale S^T q_t``,
computed in chunks of the kernels' contract (see templates/gated_delta_rule_chunk.cu.j2 for the algebra):

1. ``gated_delta_rule_kkt``: per chunk and v-head, Tbeta = (I + A)^-1 diag(beta), into a workspace.
2. Long sequences split into segments (the plan decides, to fill the GPU):
   ``gated_delta_rule_chunk_summary`` maps each segment but the last of its sequence to
   (M, h) from a zero state; ``gated_delta_rule_chunk_chain`` turns them into every segment's
   exact start state.
3. ``gated_delta_rule_chunk`` (a block per segment and v-head) or ``gated_delta_rule_chunk_slice`` (a block per
   value slice of them; the plan picks): each segment from its start state, writing o and the final states.

This module checks the inputs and launches; the plan (:mod:`.planner`) is built on the host once
per batch layout, so the op never synchronises with the device and can be captured in a CUDA graph.
"""

from __future__ import annotations

import contextlib
import functools
from dataclasses import dataclass
from typing import Callable, NamedTuple

import numpy as np
import torch

from kgen.families.gated_delta_rule.axes import spec_axes
from kgen.families.gated_delta_rule.planner import (CHUNK_FAMILY, NEGLIGIBLE_LOG_DECAY, ChunkGatedDeltaRulePlan,
                                                    fixed_length_plan, plan_chunk_gated_delta_rule)
from kgen.launch import KernelLauncher, current_device
from kgen.runtime import tma
from kgen.runtime.checks import INT32_LIMIT, check_bool, check_dense_rows, check_scale, check_shape, check_tensor
from kgen.runtime.device import GRID_YZ_LIMIT, sm_count
from kgen.runtime.dispatch import DTYPE_NAMES, SpecPathMemo, contract, incomplete_tile_pair, launcher

KKT_FAMILY = "gated_delta_rule_kkt"
#: Chunks per block the KKT kernel may take (a block loads its next chunk's K during a chunk's solve), and a
#: chunk's time in such a block against a one-chunk block's: seed 000's L=1024 batch, 364, 348, 344 and 341 us over
#: 47, 48, 48 and 48 waves' worth of chunks (bench/NOTES.md, twentieth session), on the row-block solve that the
#: doubling solve replaced (not refitted since).
KKT_CHUNK_TIME = {1: 1.0, 2: 0.936, 4: 0.926, 8: 0.917}


def kkt_chunks_per_block(num_chunks: int, heads: int, blocks_per_sm: int, num_sms: int) -> int:
    """Chunks per block of the KKT kernel over ``num_chunks`` chunks of ``heads`` q/k heads: the fastest of
    KKT_CHUNK_TIME's by whole waves of ``blocks_per_sm`` blocks an SM (the fewest chunks a block on a tie)."""
    slots = num_sms * blocks_per_sm
    def waves_time(per_block: int) -> float:
        waves = -(-(-(-num_chunks // per_block) * heads) // slots)
        return waves * per_block * KKT_CHUNK_TIME[per_block]
    return min(KKT_CHUNK_TIME, key=waves_time)


@dataclass(frozen=True)
class _Kernels:
    kkt: KernelLauncher
    #: The KKT kernel's resident blocks an SM (its variant's min_blocks_per_sm).
    kkt_blocks_per_sm: int
    recurrence: KernelLauncher
    summary: KernelLauncher
    chain: KernelLauncher
    #: The backward's: S^T before every chunk, the reverse recurrence of the state gradient and its segments'
    #: summaries, and the per-chunk gradients.
    states: KernelLauncher
    reverse: KernelLauncher
    reverse_summary: KernelLauncher
    grads: KernelLauncher
    #: The forward of a plan with one value slice per block (the recurrence's are the whole head dim).
    recurrence_slice: KernelLauncher
    #: Tokens per chunk, and the chain's value columns per block (the contracts' sizes).
    chunk: int
    chain_columns: int
    #: New descriptors for the recurrence's q, k, v and Tbeta, with the contract's boxes.
    new_maps: Callable[[], tma.TensorMaps]


_kernels = SpecPathMemo()
# The recurrence's TMA descriptors, per calling thread and tensor layout.
_descriptors = tma.DescriptorCache()


def _kernels_for(device_index: int, head_dim: int, dtype: torch.dtype, state_layout: str, value_slice: int,
                 chunk: int, has_incomplete_tile: bool) -> _Kernels:
    key = (device_index, head_dim, dtype, state_layout, value_slice, chunk, has_incomplete_tile)
    found = _kernels.get(key)
    if found is not None:
        return found
    pick = 0 if has_incomplete_tile else 1
    dtype_name = DTYPE_NAMES[dtype]
    kkt = incomplete_tile_pair(KKT_FAMILY, head_dim=head_dim, dtype=dtype_name)[pick]
    recurrence = incomplete_tile_pair(CHUNK_FAMILY, head_dim=head_dim, dtype=dtype_name, state_layout=state_layout,
                                      tile_n=value_slice)[pick]
    sizes = contract(recurrence).sizes
    if contract(kkt).sizes["chunk"] != chunk or sizes["chunk"] != chunk:
        raise ValueError(f"plan: made for chunks of {chunk} tokens; the spec's kernels take {sizes['chunk']} "
                         f"({recurrence.name}) and {contract(kkt).sizes['chunk']} ({kkt.name}): plan again")
    boxes = {role: chunk for role in "qkvt"}  # a chunk's tokens of one head, in spans of box_span_bytes
    return _kernels.put(key, _Kernels(
        kkt=launcher(kkt, "gated_delta_rule_kkt", device_index), kkt_blocks_per_sm=kkt.param_dict["min_blocks_per_sm"],
        recurrence=launcher(recurrence, "gated_delta_rule_chunk", device_index),
        summary=launcher(recurrence, "gated_delta_rule_chunk_summary", device_index),
        chain=launcher(recurrence, "gated_delta_rule_chunk_chain", device_index),
        states=launcher(recurrence, "gated_delta_rule_chunk_states", device_index),
        reverse=launcher(recurrence, "gated_delta_rule_chunk_reverse", device_index),
        reverse_summary=launcher(recurrence, "gated_delta_rule_chunk_reverse_summary", device_index),
        grads=launcher(recurrence, "gated_delta_rule_chunk_grads", device_index),
        recurrence_slice=launcher(recurrence, "gated_delta_rule_chunk_slice", device_index),
        chunk=chunk, chain_columns=sizes["chain_columns"],
        new_maps=functools.partial(tma.TensorMaps, boxes, sizes["box_span_bytes"])))


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
        cu_seqlens: packed varlen (B = 1): ``[N + 1]`` int32/int64 on q's device. The kernels address by
            ``plan``'s lengths and check them against these on the device: a sequence whose bounds differ from
            the plan's gets NaN outputs and final state. Without a plan they are copied to the host (a
            synchronisation).
        initial_state: fp32 ``[N, HV, K, V]`` (``state_layout="kv"``) or ``[N, HV, V, K]`` ("vk").
        output_final_state: also return the states after each sequence, in the same layout.
        use_qk_l2norm_in_kernel: normalise q and k over K first (x / sqrt(sum x^2 + 1e-6)).
        plan: from :func:`plan_chunk_gated_delta_rule` for these sequences.
        out: optional preallocated o (contiguous, v's shape and dtype).
    """
    return forward_keeping(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                           output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                           use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout=state_layout, plan=plan,
                           out=out)[:2]


def forward_keeping(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor, *,
                    scale: float | None = None, initial_state: torch.Tensor | None = None,
                    output_final_state: bool = False, cu_seqlens: torch.Tensor | None = None,
                    use_qk_l2norm_in_kernel: bool = False, state_layout: str = "kv",
                    plan: ChunkGatedDeltaRulePlan | None = None, out: torch.Tensor | None = None
                    ) -> tuple[torch.Tensor, torch.Tensor | None, ForwardKept]:
    """:func:`chunk_gated_delta_rule`, also returning what :func:`.backward.chunk_gated_delta_rule_bwd` can take
    instead of computing it again (:class:`ForwardKept`)."""
    plan, scale = checked_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                 output_final_state=output_final_state, cu_seqlens=cu_seqlens,
                                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout=state_layout, plan=plan)
    device = q.device
    num_seqs, head_dim, heads_v = plan.num_seqs, q.shape[3], v.shape[2]
    if out is None:
        out = torch.empty_like(v)
    else:
        check_tensor("out", out, ndim=4, dtypes=(q.dtype,), device=device)
        check_shape("out", out, v.shape, "[B, T, HV, V] like v")
        check_dense_rows("out", out)
    final = q.new_empty((num_seqs, heads_v, head_dim, head_dim), dtype=torch.float32) if output_final_state else None
    if not num_seqs:
        return out, final, kept_outputs(plan, q, heads_v)
    with on_device(device):
        kept = run_forward(plan, q, k, v, g, beta, cu_seqlens, initial_state, out, final, scale, state_layout,
                           use_qk_l2norm_in_kernel)
    return out, final, kept


class ForwardKept(NamedTuple):
    """What kgen's autograd keeps from the forward besides its inputs, so that the backward's recompute runs neither
    the KKT kernel nor a split's summaries and chain (FlashQLA keeps its A, gate cumsums and split start states):
    the KKT kernel's Tbeta (q's dtype, [chunks, HV, chunk, chunk]) and gate cumsums (fp32, log2 units,
    [chunks, HV, chunk]), and the chain's segment start states (fp32 [summaries, HV, K, K]), or none
    ([0, HV, K, K]: none without a split, and none kept, the backward then running the summaries and chain again)."""

    tbeta: torch.Tensor
    gamma_log2: torch.Tensor
    start_states: torch.Tensor


def kept_shapes(num_chunks: int, num_summaries: int, heads_v: int, head_dim: int, chunk: int
                ) -> tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]:
    """The shapes of :class:`ForwardKept`'s tensors (Tbeta and the gate cumsums one chunk's worth with no chunks
    at all)."""
    chunks = max(num_chunks, 1)
    return (chunks, heads_v, chunk, chunk), (chunks, heads_v, chunk), (num_summaries, heads_v, head_dim, head_dim)


def kept_outputs(plan: ChunkGatedDeltaRulePlan, q: torch.Tensor, heads_v: int) -> ForwardKept:
    """Uninitialised tensors of :class:`ForwardKept` for ``plan``."""
    tbeta, gammas, starts = kept_shapes(len(plan.chunks), plan.num_summaries, heads_v, q.shape[3], plan.schedule.chunk)
    return ForwardKept(q.new_empty(tbeta), q.new_empty(gammas, dtype=torch.float32),
                       q.new_empty(starts, dtype=torch.float32))


def on_device(device: torch.device):
    """A context in which ``device`` is current: descriptors are made on, and for, the current device."""
    return torch.cuda.device(device.index) if device.index != current_device() else contextlib.nullcontext()


def checked_inputs(q, k, v, g, beta, *, scale, initial_state, output_final_state, cu_seqlens, use_qk_l2norm_in_kernel,
                   state_layout, plan) -> tuple[ChunkGatedDeltaRulePlan, float]:
    """The plan (made or checked) and the scale of chunk_gated_delta_rule's arguments, every one checked by name."""
    axes = spec_axes(CHUNK_FAMILY)
    check_tensor("q", q, ndim=4, dtypes=axes.dtypes)
    device = q.device
    batch, tokens, heads, head_dim = q.shape
    check_tensor("k", k, ndim=4, dtypes=(q.dtype,), device=device)
    check_shape("k", k, q.shape, "[B, T, H, K] like q")
    check_tensor("v", v, ndim=4, dtypes=(q.dtype,), device=device)
    heads_v = v.shape[2]
    check_shape("v", v, (batch, tokens, heads_v, head_dim), "[B, T, HV, V] with V = K")
    if heads == 0 or heads_v == 0 or heads_v % heads:
        raise ValueError(f"v: HV={heads_v} v-heads must be a positive multiple of H={heads} q/k heads")
    if heads_v > GRID_YZ_LIMIT:
        raise ValueError(f"v: HV={heads_v} must be at most {GRID_YZ_LIMIT} (the kernels' grid)")
    check_tensor("g", g, ndim=3, dtypes=(torch.float32,), device=device)
    check_shape("g", g, (batch, tokens, heads_v), "[B, T, HV]")
    check_tensor("beta", beta, ndim=3, dtypes=(torch.float32, q.dtype), device=device)
    check_shape("beta", beta, (batch, tokens, heads_v), "[B, T, HV]")
    for name, t in (("q", q), ("k", k), ("v", v), ("g", g), ("beta", beta)):
        check_dense_rows(name, t)
    if state_layout not in axes.state_layouts:
        raise ValueError(f"state_layout: expected one of {axes.state_layouts}, got {state_layout!r}")
    check_bool("output_final_state", output_final_state)
    check_bool("use_qk_l2norm_in_kernel", use_qk_l2norm_in_kernel)
    scale = head_dim ** -0.5 if scale is None else check_scale("scale", scale)

    if cu_seqlens is not None:
        if batch != 1:
            raise ValueError(f"cu_seqlens: packed varlen takes B = 1, got B = {batch}")
        check_tensor("cu_seqlens", cu_seqlens, ndim=1, dtypes=(torch.int32, torch.int64), device=device)
        if not cu_seqlens.is_contiguous():  # the kernels read it with unit stride
            raise ValueError("cu_seqlens: expected a contiguous tensor")
    if plan is None:
        if cu_seqlens is not None:  # the lengths are on the device: a synchronisation
            plan = plan_chunk_gated_delta_rule(cu_seqlens.cpu(), num_heads_v=heads_v, head_dim=head_dim)
        else:
            plan = fixed_length_plan(batch, tokens, heads_v, head_dim, device)
    elif not isinstance(plan, ChunkGatedDeltaRulePlan):
        raise TypeError(f"plan: expected a ChunkGatedDeltaRulePlan, got {type(plan).__name__}")
    elif cu_seqlens is None and plan.cu_seqlens != tuple(tokens * b for b in range(batch + 1)):
        # Without cu_seqlens the kernels have no lengths to check the plan's against on the device.
        raise ValueError(f"plan: made for {plan.num_seqs} sequences of other lengths; without cu_seqlens these "
                         f"tensors are {batch} sequences of {tokens} tokens")
    num_seqs = plan.num_seqs
    if cu_seqlens is not None and cu_seqlens.shape[0] != num_seqs + 1:
        raise ValueError(f"cu_seqlens: the plan is for {num_seqs} sequences ({num_seqs + 1} entries), got "
                         f"{cu_seqlens.shape[0]}")
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
    return plan, scale


def kernels_for_plan(plan: ChunkGatedDeltaRulePlan, q: torch.Tensor, state_layout: str) -> _Kernels:
    """The chunk family's kernels for this plan and q's device, head dim and dtype."""
    return _kernels_for(q.device.index, q.shape[3], q.dtype, state_layout, plan.value_slice, plan.schedule.chunk,
                        plan.has_incomplete_tile)


def run_forward(plan, q, k, v, g, beta, cu_seqlens, initial_state, out, final, scale, state_layout,
                use_qk_l2norm_in_kernel, states: bool = False, state_residuals: torch.Tensor | None = None,
                kept: ForwardKept | None = None) -> ForwardKept:
    """The forward's kernels on checked inputs, on q's device (the current one); returns the KKT kernel's Tbeta and
    gate cumsums and the chain's start states (:class:`ForwardKept`), which the backward reads again; given
    ``kept`` (those of an earlier run of the same plan and inputs), runs neither the KKT kernel nor the summaries
    and chain. With ``states``
    (the backward's recompute) ``out`` is [chunks, HV, V, K] in q's dtype and receives S^T before every chunk, and
    ``state_residuals`` (uint8 FP8 codes, the same shape; or None) what rounding it to q's dtype lost."""
    device = q.device
    heads, head_dim, heads_v = q.shape[2], q.shape[3], v.shape[2]
    slice_v = plan.value_slice
    kernels = kernels_for_plan(plan, q, state_layout)
    chunk = kernels.chunk
    chunks, segments, summary_segments, chains = plan.tables.on(device)
    num_chunks = len(plan.chunks)
    if max(num_chunks, 1) * heads_v * chunk > INT32_LIMIT:
        raise ValueError(f"q: {num_chunks} chunks x {heads_v} v-heads exceed the kernels' 32-bit row indices")
    # Tbeta, and each chunk's gate cumsum (log2 units): the recurrence's gates, and their sums the summaries'
    # decay-bounded shortcut; the segments' start states.
    tbeta, gamma_log2, starts = kept_outputs(plan, q, heads_v) if kept is None else kept
    chain_again = plan.num_summaries > 0 and (kept is None or starts.shape[0] == 0)
    if chain_again and starts.shape[0] == 0:
        starts = q.new_empty((plan.num_summaries, heads_v, head_dim, head_dim), dtype=torch.float32)
    shortcut = plan.num_summaries > 0 and not plan.exact_split
    l2norm = int(use_qk_l2norm_in_kernel)
    if num_chunks and kept is None:
        per_block = kkt_chunks_per_block(num_chunks, heads, kernels.kkt_blocks_per_sm, sm_count(device))
        kernels.kkt.launch((-(-num_chunks // per_block), heads), k=k.data_ptr(), g=g.data_ptr(), beta=beta.data_ptr(),
                    beta_is_fp32=int(beta.dtype is torch.float32), chunks=chunks.data_ptr(), num_chunks=num_chunks,
                    chunks_per_block=per_block, tbeta=tbeta.data_ptr(),
                    gamma_log2=gamma_log2.data_ptr(), num_heads=heads, num_heads_v=heads_v, use_qk_l2norm=l2norm)
    initial = 0 if initial_state is None else initial_state.data_ptr()
    # Tokens by heads by features for TMA (B x T flattened); Tbeta as rows of a chunk. With no tokens at
    # all no tile is ever loaded, and the parameters take Tbeta's descriptor (an empty tensor has none).
    tbeta_rows = tbeta.view(-1, 1, chunk)
    tiled = ((q.view(-1, heads, head_dim), k.view(-1, heads, head_dim), v.view(-1, heads_v, head_dim), tbeta_rows)
             if num_chunks else (tbeta_rows,) * 4)
    maps = _descriptors.get((device.index, q.dtype, chunk) + tuple((tuple(t.shape), tuple(t.stride())) for t in tiled),
                            kernels.new_maps)
    summaries = negligible = None
    if chain_again:
        summaries = torch.empty((plan.num_summaries, heads_v, head_dim, 2 * head_dim), device=device, dtype=torch.float32)
        negligible = torch.empty((plan.num_summaries, heads_v), device=device, dtype=torch.int32)
    forward = {
        "map_q": maps.get("q", tiled[0]), "map_k": maps.get("k", tiled[1]), "map_v": maps.get("v", tiled[2]),
        "map_tbeta": maps.get("t", tiled[3]), "q": q.data_ptr(), "k": k.data_ptr(), "v": v.data_ptr(),
        "tbeta": tbeta.data_ptr(), "gamma_log2": gamma_log2.data_ptr(), "segments": segments.data_ptr(),
        "cu_seqlens": 0 if cu_seqlens is None else cu_seqlens.data_ptr(),
        "cu_seqlens_is_int64": int(cu_seqlens is not None and cu_seqlens.dtype is torch.int64), "initial_state": initial,
        "start_states": starts.data_ptr() if plan.num_summaries else 0, "summary": 0, "negligible_summaries": 0,
        "out": out.data_ptr(), "state_residuals": 0 if state_residuals is None else state_residuals.data_ptr(),
        "final_state": 0 if final is None else final.data_ptr(), "num_heads": heads, "num_heads_v": heads_v,
        "scale": np.float32(scale), "use_qk_l2norm": l2norm,
        "negligible_log_decay": np.float32(NEGLIGIBLE_LOG_DECAY if shortcut else -np.inf)}
    if summaries is not None:
        # The summary takes the forward's parameters, with its own segments and its summaries as the only output.
        kernels.summary.launch((2 * head_dim // slice_v, heads_v, len(plan.summary_segments)),
                               **{**forward, "segments": summary_segments.data_ptr(), "initial_state": 0,
                                  "start_states": 0, "summary": summaries.data_ptr(),
                                  "negligible_summaries": negligible.data_ptr(), "out": 0, "state_residuals": 0,
                                  "final_state": 0})
        kernels.chain.launch((head_dim // kernels.chain_columns, heads_v, len(plan.chains)), summary=summaries.data_ptr(),
                      negligible_summaries=negligible.data_ptr(),
                      initial_state=initial, start_states=starts.data_ptr(), chains=chains.data_ptr(),
                      num_heads_v=heads_v, reverse_order=0)
    if states:
        kernels.states.launch((head_dim // slice_v, heads_v, len(plan.segments)), **forward)
    elif plan.wide:
        kernels.recurrence.launch((1, heads_v, len(plan.segments)), **forward)  # a block covers the head dim
    else:
        kernels.recurrence_slice.launch((head_dim // slice_v, heads_v, len(plan.segments)), **forward)
    return ForwardKept(tbeta, gamma_log2, starts)
