"""Context parallelism over torch.distributed: causal varlen prefill attention with sequences sharded across ranks.

Sharding ("zigzag", load-balanced for causal attention): each sequence is cut into 2W chunks of as equal a
size as its length allows (W ranks); rank r holds chunk r (its "front") and chunk 2W-1-r (its "back"). A
rank's local tokens are the fronts of all sequences, then the backs, each part packed like the global
batch. Ring attention: K/V shards travel round the ring (rank r receives from r-1, sends to r+1) while
each rank attends its queries to the shard it holds, so after W steps every query has seen every key.
With chunks so ordered, the queries and keys of a step relate in one of three ways, each one
attention_varlen call per pair of packed regions: at step 0 (its own shard) fronts causal over fronts,
backs causal over backs and backs over fronts in full; from a rank j < r its fronts and its backs over
j's fronts, in full; from j > r its backs over j's fronts and over j's backs, in full (the other pairs
are all in a query's future). Partial results merge through their LSEs (merge_attention_states).

Plans are made once on the host from the global cu_seqlens, for each rank (:func:`plan_attention_varlen_cp`);
every rank's plan knows every rank's shard sizes, so receive buffers need no size exchange.
:func:`attention_varlen_cp_simulated` runs the same steps for all ranks in one process, without NCCL.
With a window (``window_left``), a pair of chunks far apart needs its own window offset, and only its
first query rows see any key: such pairs become a call per sequence, of those rows.

The gated delta rule (:func:`chunk_gated_delta_rule_cp`) shards each sequence into W contiguous pieces.
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

from kgen.ops import (AttentionPlan, ChunkGatedDeltaRulePlan, attention_varlen, chunk_gated_delta_rule,
                      merge_attention_states, plan_attention_varlen, plan_chunk_gated_delta_rule)
from kgen.runtime.checks import check_int, seqlens_from_cu

#: Regions of a rank's local tokens: the fronts (chunk r of every sequence) and the backs (chunk 2W-1-r),
#: each packed per sequence (so a region is a varlen batch of its own).
FRONT, BACK = "front", "back"


def zigzag_bounds(seqlen: int, world_size: int) -> np.ndarray:
    """The 2W + 1 boundaries of a sequence's chunks: chunk c is tokens [b[c], b[c+1]), sizes within one of each
    other."""
    chunks = 2 * world_size
    return np.array([c * seqlen // chunks for c in range(chunks + 1)], dtype=np.int64)


@dataclass(frozen=True)
class Shard:
    """One rank's tokens: per sequence, the global (start, end) of its front and back chunk."""

    front: np.ndarray  # int64 [N, 2]
    back: np.ndarray  # int64 [N, 2]

    def lengths(self, region: str) -> np.ndarray:
        part = self.front if region == FRONT else self.back
        return part[:, 1] - part[:, 0]

    @property
    def tokens(self) -> int:
        return int(self.lengths(FRONT).sum() + self.lengths(BACK).sum())

    def rows(self, region: str) -> tuple[int, int]:
        """The region's rows in the local tensors: fronts first, then backs."""
        fronts = int(self.lengths(FRONT).sum())
        return (0, fronts) if region == FRONT else (fronts, self.tokens)

    def global_rows(self) -> np.ndarray:
        """The global packed row of each local row, for sharding a global tensor and gathering it back."""
        pieces = [np.arange(a, b) for a, b in self.front] + [np.arange(a, b) for a, b in self.back]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


@dataclass(frozen=True)
class StepCall:
    """One attention_varlen call of a ring step: local query rows [q_rows) over the held shard's rows [k_rows),
    packed per sequence as ``cu_q`` / ``cu_k`` say (on the plan's device). ``causal`` between rows of the same
    chunks, where the sink joins (once per query row); ``window`` as attention_varlen takes it."""

    q_rows: tuple[int, int]
    k_rows: tuple[int, int]
    causal: bool
    window: tuple[int, int]
    plan: AttentionPlan
    cu_q: torch.Tensor
    cu_k: torch.Tensor


@dataclass(frozen=True, eq=False)
class ContextParallelPlan:
    world_size: int
    rank: int
    seqlens: tuple[int, ...]
    #: Every rank's shard (the sizes of what arrives from each).
    shards: tuple[Shard, ...]
    #: steps[s]: the calls of step s, whose keys are rank (rank - s) mod W's shard.
    steps: tuple[tuple[StepCall, ...], ...]
    head_dim: int
    dtype: torch.dtype
    window_left: int

    @property
    def shard(self) -> Shard:
        return self.shards[self.rank]

    def source(self, step: int) -> int:
        return (self.rank - step) % self.world_size


def shard_of(seqlens: Sequence[int], world_size: int, rank: int) -> Shard:
    global_starts = np.concatenate([[0], np.cumsum(np.asarray(seqlens, dtype=np.int64))])
    front, back = [], []
    for start, n in zip(global_starts[:-1], seqlens):
        b = zigzag_bounds(int(n), world_size) + start
        front.append((b[rank], b[rank + 1]))
        back.append((b[2 * world_size - 1 - rank], b[2 * world_size - rank]))
    shape = (len(seqlens), 2)
    return Shard(np.array(front, dtype=np.int64).reshape(shape), np.array(back, dtype=np.int64).reshape(shape))


def _cu(lengths: np.ndarray) -> list[int]:
    return [0, *np.cumsum(lengths).tolist()]


def _full_pair_rows(shard: Shard, held: Shard, q_region: str, k_region: str, window_left: int):
    """Per sequence, for a pair whose keys all precede its queries: (first query row, query rows, key row, keys,
    the kernel's window_left) of the queries some key of the window reaches; the rest see none of these keys."""
    q_part = shard.front if q_region == FRONT else shard.back
    k_part = held.front if k_region == FRONT else held.back
    q_row, k_row = shard.rows(q_region)[0], held.rows(k_region)[0]
    for (a, a_end), (c, c_end) in zip(q_part, k_part):
        lq, lk = int(a_end - a), int(c_end - c)
        # Query row r (global a + r) sees keys from a + r - window_left: local key r + (a - c) - window_left.
        rows = lq if window_left < 0 else max(0, min(lq, lk - int(a - c) + window_left))
        if rows and lk:
            # The kernel aligns windows bottom-right: key >= row + (lk - rows) - left.
            left = -1 if window_left < 0 else window_left - int(a - c) + lk - rows
            yield q_row, rows, k_row, lk, left
        q_row, k_row = q_row + lq, k_row + lk


def plan_attention_varlen_cp(cu_seqlens, *, world_size: int, rank: int, head_dim: int,
                             dtype: torch.dtype = torch.bfloat16, causal: bool = True, window_left: int = -1,
                             device: torch.device | str | None = None) -> ContextParallelPlan:
    """Rank ``rank``'s plan of causal prefill over the sequences of the global ``cu_seqlens`` (host data);
    ``window_left``: keys a query sees before its own position (-1: all)."""
    check_int("world_size", world_size, minimum=1)
    check_int("rank", rank, minimum=0, maximum=world_size - 1)
    check_int("window_left", window_left, minimum=-1)
    if causal is not True:
        raise ValueError("causal: attention_varlen_cp shards for causal attention (zigzag); got causal=False")
    seqlens = seqlens_from_cu(cu_seqlens, "cu_seqlens")
    shards = tuple(shard_of(seqlens, world_size, r) for r in range(world_size))
    mine = shards[rank]

    def call(q_rows, k_rows, lq, lk, is_causal: bool, window: tuple[int, int]) -> StepCall:
        plan = plan_attention_varlen(_cu(lq), _cu(lk), head_dim=head_dim, dtype=dtype, causal=is_causal,
                                     window=window, device=device)
        cu_q, cu_k = (torch.tensor(_cu(n), dtype=torch.int32, device=device) for n in (lq, lk))
        return StepCall(q_rows, k_rows, is_causal, window, plan, cu_q, cu_k)

    def diagonal(region: str) -> list[StepCall]:
        lengths = mine.lengths(region)
        rows = mine.rows(region)
        return [call(rows, rows, lengths, lengths, True, (window_left, -1))] if lengths.sum() else []

    def full(q_region: str, k_region: str, held: Shard) -> list[StepCall]:
        pairs = list(_full_pair_rows(mine, held, q_region, k_region, window_left))
        if window_left < 0:  # every query row sees every key: one call packs the sequences
            lq, lk = mine.lengths(q_region), held.lengths(k_region)
            return [call(mine.rows(q_region), held.rows(k_region), lq, lk, False, (-1, -1))] if pairs else []
        # Each sequence's pair has its own window offset (and visible rows): a call each.
        return [call((q0, q0 + rows), (k0, k0 + keys), np.array([rows]), np.array([keys]), False, (left, -1))
                for q0, rows, k0, keys, left in pairs]

    steps = []
    for step in range(world_size):
        source = (rank - step) % world_size
        held = shards[source]
        if step == 0:
            calls = diagonal(FRONT) + diagonal(BACK) + full(BACK, FRONT, held)
        elif source < rank:
            calls = full(FRONT, FRONT, held) + full(BACK, FRONT, held)
        else:
            calls = full(BACK, FRONT, held) + full(BACK, BACK, held)
        steps.append(tuple(calls))
    return ContextParallelPlan(world_size, rank, tuple(seqlens), shards, tuple(steps), head_dim, dtype, window_left)


def shard_tokens(x: torch.Tensor, plan: ContextParallelPlan) -> torch.Tensor:
    """This rank's rows of a global packed tensor ``x`` [total, ...] (fronts, then backs)."""
    return x[torch.from_numpy(plan.shard.global_rows()).to(x.device)]


def _step(plan: ContextParallelPlan, step: int, q: torch.Tensor, k_held: torch.Tensor, v_held: torch.Tensor,
          out: torch.Tensor, lse: torch.Tensor, sink: torch.Tensor | None, softmax_scale: float | None) -> None:
    """Attend this rank's queries to the shard held at ``step``, merging into the running ``out``, ``lse``."""
    for c in plan.steps[step]:
        (a, b), (ka, kb) = c.q_rows, c.k_rows
        cu_q, cu_k = c.cu_q.to(q.device), c.cu_k.to(q.device)  # no copy when planned with device=
        # The sink joins each row's denominator once: in the call on the row's own diagonal chunk.
        part, part_lse = attention_varlen(q[a:b], k_held[ka:kb], v_held[ka:kb], cu_q, cu_k, causal=c.causal,
                                          window=c.window, sink=sink if c.causal else None,
                                          softmax_scale=softmax_scale, return_lse=True, plan=c.plan)
        merged, merged_lse = merge_attention_states(out[a:b], lse[a:b], part, part_lse.transpose(0, 1))
        out[a:b], lse[a:b] = merged, merged_lse


def _empty_state(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The merge's identity: O = 0, LSE = -inf (a partial that saw no key)."""
    return torch.zeros_like(q), torch.full(q.shape[:2], float("-inf"), dtype=torch.float32, device=q.device)


def _check_local(name: str, t: torch.Tensor, plan: ContextParallelPlan) -> None:
    if t.shape[0] != plan.shard.tokens:
        raise ValueError(f"{name}: rank {plan.rank}'s shard has {plan.shard.tokens} tokens (zigzag over "
                         f"{plan.world_size} ranks); got {t.shape[0]}")


def attention_varlen_cp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, group, plan: ContextParallelPlan,
                        sink: torch.Tensor | None = None, softmax_scale: float | None = None,
                        return_lse: bool = False):
    """Causal attention of this rank's query shard over every rank's keys, the K/V shards passed round ``group``.

    q, k, v: this rank's shard (:func:`shard_tokens` of the global packed tensors). Returns this rank's
    rows of the single-GPU result (and its LSE, ``[tokens, Hq]``). The exchange of step s + 1 runs on its
    own stream while step s computes. Every rank must call it with plans made for the same batch.
    """
    import torch.distributed as dist

    if dist.get_world_size(group) != plan.world_size or dist.get_rank(group) != plan.rank:
        raise ValueError(f"plan: made for rank {plan.rank} of {plan.world_size}; this group has rank "
                         f"{dist.get_rank(group)} of {dist.get_world_size(group)}")
    for name, t in (("q", q), ("k", k), ("v", v)):
        _check_local(name, t, plan)
    out, lse = _empty_state(q)
    held = torch.cat([k, v], dim=1)  # one message per step: K and V of the shard held
    comm = torch.cuda.Stream(device=q.device)
    send_to = dist.get_global_rank(group, (plan.rank + 1) % plan.world_size)
    recv_from = dist.get_global_rank(group, (plan.rank - 1) % plan.world_size)
    heads_kv = k.shape[1]
    for step in range(plan.world_size):
        pending, incoming = [], None
        if step + 1 < plan.world_size:
            # What arrives is the next source's shard, whose size this rank's plan knows.
            incoming = held.new_empty((plan.shards[plan.source(step + 1)].tokens, *held.shape[1:]))
            comm.wait_stream(torch.cuda.current_stream(q.device))
            with torch.cuda.stream(comm):
                pending = dist.batch_isend_irecv([dist.P2POp(dist.isend, held, send_to, group),
                                                  dist.P2POp(dist.irecv, incoming, recv_from, group)])
        _step(plan, step, q, held[:, :heads_kv], held[:, heads_kv:], out, lse, sink, softmax_scale)
        for work in pending:
            work.wait()
        if incoming is not None:
            torch.cuda.current_stream(q.device).wait_stream(comm)
            held.record_stream(comm)
            held = incoming
    return (out, lse) if return_lse else out


def attention_varlen_cp_simulated(q: Sequence[torch.Tensor], k: Sequence[torch.Tensor], v: Sequence[torch.Tensor],
                                  *, plans: Sequence[ContextParallelPlan], sink: torch.Tensor | None = None,
                                  softmax_scale: float | None = None) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Every rank's result of :func:`attention_varlen_cp`, the ring simulated in one process (no NCCL):
    rank r's step s reads rank (r - s)'s shard directly. ``q[r]``, ``k[r]``, ``v[r]``, ``plans[r]``: rank r's."""
    results = []
    for plan, q_r in zip(plans, q):
        for name, t in (("q", q_r), ("k", k[plan.rank]), ("v", v[plan.rank])):
            _check_local(name, t, plan)
        out, lse = _empty_state(q_r)
        for step in range(plan.world_size):
            _step(plan, step, q_r, k[plan.source(step)], v[plan.source(step)], out, lse, sink, softmax_scale)
        results.append((out, lse))
    return results


# ---- the gated delta rule ------------------------------------------------------------------------


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
        pieces = [np.arange(b[self.rank], b[self.rank + 1]) for b in self.bounds]
        return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int64)


def plan_chunk_gated_delta_rule_cp(cu_seqlens, *, world_size: int, rank: int, num_heads_v: int, head_dim: int = 128,
                                   device: torch.device | str | None = None) -> ContextParallelGDNPlan:
    """Rank ``rank``'s plan of the chunked gated delta rule over the sequences of the global ``cu_seqlens``."""
    check_int("world_size", world_size, minimum=1)
    check_int("rank", rank, minimum=0, maximum=world_size - 1)
    seqlens = seqlens_from_cu(cu_seqlens, "cu_seqlens")
    starts = np.concatenate([[0], np.cumsum(np.asarray(seqlens, dtype=np.int64))])
    bounds = np.array([[start + r * n // world_size for r in range(world_size + 1)]
                       for start, n in zip(starts[:-1], seqlens)], dtype=np.int64).reshape(len(seqlens), world_size + 1)
    cu_local = _cu(bounds[:, rank + 1] - bounds[:, rank])
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

    if dist.get_world_size(group) != plan.world_size or dist.get_rank(group) != plan.rank:
        raise ValueError(f"plan: made for rank {plan.rank} of {plan.world_size}; this group has rank "
                         f"{dist.get_rank(group)} of {dist.get_world_size(group)}")
    _check_pieces(plan, q)
    o0, transition, h = _piece_maps(plan, q, k, v, g, beta, scale, use_qk_l2norm_in_kernel)
    gathered = [torch.empty((2, *h.shape), dtype=h.dtype, device=h.device) for _ in range(plan.world_size)]
    dist.all_gather(gathered, torch.stack([transition, h]), group=group)
    maps = [(m[0], m[1]) for m in gathered]
    first = _swap_if_vk(initial_state, state_layout)
    first = torch.zeros_like(h) if first is None else first.to(h.dtype)
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
    first = _swap_if_vk(initial_state, state_layout)
    first = torch.zeros_like(maps[0][1]) if first is None else first.to(maps[0][1].dtype)
    final = _swap_if_vk(_start_state(maps, len(plans), first), state_layout)
    return [(_finish_piece(p, q[p.rank], k[p.rank], v[p.rank], g[p.rank], beta[p.rank], firsts[p.rank][0],
                           _start_state(maps, p.rank, first), scale, use_qk_l2norm_in_kernel), final) for p in plans]
