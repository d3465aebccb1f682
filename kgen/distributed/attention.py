"""Ring attention: causal varlen prefill attention over zigzag shards (:mod:`kgen.distributed.shards`).

K/V shards travel round the ring (rank r receives from r-1, sends to r+1) while each rank attends its queries
to the shard it holds, so after W steps every query has seen every key. With chunks in zigzag order, the
queries and keys of a step relate in one of three ways, each one attention_varlen call per pair of packed
regions: at step 0 (its own shard) fronts causal over fronts, backs causal over backs and backs over fronts in
full; from a rank j < r its fronts and its backs over j's fronts, in full; from j > r its backs over j's
fronts and over j's backs, in full (the other pairs are all in a query's future). Partial results merge
through their LSEs (merge_attention_states).

Plans are made once on the host from the global cu_seqlens, for each rank (:func:`plan_attention_varlen_cp`);
every rank's plan knows every rank's shard sizes, so receive buffers need no size exchange.
:func:`attention_varlen_cp_simulated` runs the same steps for all ranks in one process, without NCCL.
With a window (``window_left``), a pair of chunks far apart needs its own window offset, and only its
first query rows see any key: such pairs become a call per sequence, of those rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import torch

from kgen.distributed.shards import BACK, FRONT, Shard, check_group, check_rank, shard_of
from kgen.ops import AttentionPlan, attention_varlen, merge_attention_states, plan_attention_varlen
from kgen.runtime.checks import check_int, seqlens_from_cu
from kgen.runtime.recipes import cumulative


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
    check_rank(world_size, rank)
    check_int("window_left", window_left, minimum=-1)
    if causal is not True:
        raise ValueError("causal: attention_varlen_cp shards for causal attention (zigzag); got causal=False")
    seqlens = seqlens_from_cu(cu_seqlens, "cu_seqlens")
    shards = tuple(shard_of(seqlens, world_size, r) for r in range(world_size))
    mine = shards[rank]

    def call(q_rows, k_rows, lq, lk, is_causal: bool, window: tuple[int, int]) -> StepCall:
        plan = plan_attention_varlen(cumulative(lq), cumulative(lk), head_dim=head_dim, dtype=dtype,
                                     causal=is_causal, window=window, device=device)
        cu_q, cu_k = (torch.tensor(cumulative(n), dtype=torch.int32, device=device) for n in (lq, lk))
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


def _check_local(plan: ContextParallelPlan, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    for name, t in (("q", q), ("k", k), ("v", v)):
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

    check_group(group, plan)
    _check_local(plan, q, k, v)
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
        _check_local(plan, q_r, k[plan.rank], v[plan.rank])
        out, lse = _empty_state(q_r)
        for step in range(plan.world_size):
            _step(plan, step, q_r, k[plan.source(step)], v[plan.source(step)], out, lse, sink, softmax_scale)
        results.append((out, lse))
    return results
