"""The chunked gated delta rule over sequences cut in W contiguous pieces, one a rank.

A piece maps its start state S linearly to its end state, P S + h (state layout kv: S is [K, V], P is
[K, K]), and its outputs likewise, o = o(S = 0) + o(S, v = 0). So each rank runs its piece three times
with the single-GPU op: from S = 0 (o0 and h), from S = I with v = 0 (P, no cancellation), then, once
the ranks' (P, h) are gathered and its exact start state composed from those before it, from that
state with v = 0 (the outputs' correction). The result equals the single-GPU op's up to the rounding
of adding two 16-bit outputs.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from kgen.distributed.shards import check_group, check_rank, even_bounds, rows_of
from kgen.ops import ChunkGatedDeltaRulePlan, chunk_gated_delta_rule, plan_chunk_gated_delta_rule
from kgen.runtime.checks import seqlens_from_cu
from kgen.runtime.recipes import cumulative


@dataclass(frozen=True, eq=False)
class ContextParallelGDNPlan:
    world_size: int
    rank: int
    seqlens: tuple[int, ...]
    #: int64 [N, W + 1]: rank r holds tokens [bounds[i, r], bounds[i, r + 1]) of sequence i (global packed rows).
    bounds: np.ndarray
    #: The single-GPU op's plan of this rank's pieces, packed as a batch of their own.
    local: ChunkGatedDeltaRulePlan
    cu_local: torch.Tensor
    num_heads_v: int
    head_dim: int

    def global_rows(self) -> np.ndarray:
        return rows_of(self.bounds[:, self.rank:self.rank + 2])


def plan_chunk_gated_delta_rule_cp(cu_seqlens, *, world_size: int, rank: int, num_heads_v: int, head_dim: int = 128,
                                   device: torch.device | str | None = None) -> ContextParallelGDNPlan:
    """Rank ``rank``'s plan of the chunked gated delta rule over the sequences of the global ``cu_seqlens``."""
    check_rank(world_size, rank)
    seqlens = seqlens_from_cu(cu_seqlens, "cu_seqlens")
    bounds = np.array([start + even_bounds(n, world_size) for start, n in zip(cumulative(seqlens), seqlens)],
                      dtype=np.int64).reshape(len(seqlens), world_size + 1)
    cu_local = cumulative(bounds[:, rank + 1] - bounds[:, rank])
    local = plan_chunk_gated_delta_rule(cu_local, num_heads_v=num_heads_v, head_dim=head_dim, device=device)
    return ContextParallelGDNPlan(world_size, rank, tuple(seqlens), bounds, local,
                                  torch.tensor(cu_local, dtype=torch.int32, device=device), num_heads_v, head_dim)


def shard_sequences(x: torch.Tensor, plan: ContextParallelGDNPlan) -> torch.Tensor:
    """This rank's pieces of a global packed tensor ``x`` [1, total, ...] (tokens in dim 1)."""
    return x[:, torch.from_numpy(plan.global_rows()).to(x.device)]


def _piece_maps(plan, q, k, v, g, beta, scale, l2norm):
    """(o from a zero state, P, h) of this rank's pieces: end state = P S + h for a start state S (layout kv)."""
    run = dict(cu_seqlens=plan.cu_local.to(q.device), plan=plan.local, scale=scale, output_final_state=True,
               use_qk_l2norm_in_kernel=l2norm)
    o0, h = chunk_gated_delta_rule(q, k, v, g, beta, **run)
    sequences, k_dim = len(plan.seqlens), plan.head_dim
    identity = torch.eye(k_dim, device=q.device).expand(sequences, plan.num_heads_v, k_dim, k_dim).contiguous()
    _, transition = chunk_gated_delta_rule(q, k, torch.zeros_like(v), g, beta, initial_state=identity, **run)
    return o0, transition, h


def _start_state(maps: Sequence[tuple[torch.Tensor, torch.Tensor]], upto: int, first: torch.Tensor) -> torch.Tensor:
    """The state entering rank ``upto``'s pieces: ``first`` carried through the (P, h) of ranks 0 .. upto - 1."""
    state = first
    for transition, h in maps[:upto]:
        state = torch.matmul(transition, state) + h
    return state


def _swap_if_vk(state: torch.Tensor | None, state_layout: str) -> torch.Tensor | None:
    """A state between the caller's layout and kv, the one used inside: vk is kv transposed, either way."""
    return state.transpose(-1, -2) if state is not None and state_layout == "vk" else state


def _first_state(initial_state: torch.Tensor | None, state_layout: str, h: torch.Tensor) -> torch.Tensor:
    """The state entering rank 0's pieces, in layout kv and ``h``'s dtype (zero without ``initial_state``)."""
    first = _swap_if_vk(initial_state, state_layout)
    return torch.zeros_like(h) if first is None else first.to(h.dtype)


def _finish_piece(plan, q, k, v, g, beta, o0, start, scale, l2norm):
    """This rank's outputs: those from a zero state plus the start state's share (the op with v = 0)."""
    correction, _ = chunk_gated_delta_rule(q, k, torch.zeros_like(v), g, beta, initial_state=start.contiguous(),
                                           cu_seqlens=plan.cu_local.to(q.device), plan=plan.local, scale=scale,
                                           use_qk_l2norm_in_kernel=l2norm)
    return o0 + correction


def _check_pieces(plan: ContextParallelGDNPlan, q: torch.Tensor) -> None:
    tokens = int((plan.bounds[:, plan.rank + 1] - plan.bounds[:, plan.rank]).sum())
    if q.dim() != 4 or q.shape[0] != 1 or q.shape[1] != tokens:
        raise ValueError(f"q: rank {plan.rank}'s pieces are [1, {tokens}, H, K] (sequences cut in {plan.world_size}); "
                         f"got {tuple(q.shape)}")


def chunk_gated_delta_rule_cp(q, k, v, g, beta, *, group, plan: ContextParallelGDNPlan, scale=None,
                              initial_state=None, output_final_state=False, use_qk_l2norm_in_kernel=False,
                              state_layout="kv"):
    """The chunked gated delta rule of this rank's pieces (:func:`shard_sequences`), exact for the whole sequences:
    returns (o of this rank's tokens, the sequences' final states or None), as fla's op. ``initial_state``
    (every rank passes the same, ``[N, HV, K, V]``) enters at rank 0's pieces."""
    import torch.distributed as dist

    check_group(group, plan)
    _check_pieces(plan, q)
    o0, transition, h = _piece_maps(plan, q, k, v, g, beta, scale, use_qk_l2norm_in_kernel)
    gathered = [torch.empty((2, *h.shape), dtype=h.dtype, device=h.device) for _ in range(plan.world_size)]
    dist.all_gather(gathered, torch.stack([transition, h]), group=group)
    maps = [(m[0], m[1]) for m in gathered]
    first = _first_state(initial_state, state_layout, h)
    o = _finish_piece(plan, q, k, v, g, beta, o0, _start_state(maps, plan.rank, first), scale,
                      use_qk_l2norm_in_kernel)
    final = _swap_if_vk(_start_state(maps, plan.world_size, first), state_layout) if output_final_state else None
    return o, final


def chunk_gated_delta_rule_cp_simulated(q, k, v, g, beta, *, plans: Sequence[ContextParallelGDNPlan], scale=None,
                                        initial_state=None, use_qk_l2norm_in_kernel=False, state_layout="kv"):
    """Every rank's (o, final state) of :func:`chunk_gated_delta_rule_cp` in one process (no NCCL): the lists hold
    rank r's pieces at r."""
    for plan, q_r in zip(plans, q):
        _check_pieces(plan, q_r)
    firsts = [_piece_maps(p, q[p.rank], k[p.rank], v[p.rank], g[p.rank], beta[p.rank], scale, use_qk_l2norm_in_kernel)
              for p in plans]
    maps = [(transition, h) for _, transition, h in firsts]
    first = _first_state(initial_state, state_layout, maps[0][1])
    final = _swap_if_vk(_start_state(maps, len(plans), first), state_layout)
    return [(_finish_piece(p, q[p.rank], k[p.rank], v[p.rank], g[p.rank], beta[p.rank], firsts[p.rank][0],
                           _start_state(maps, p.rank, first), scale, use_qk_l2norm_in_kernel), final) for p in plans]
