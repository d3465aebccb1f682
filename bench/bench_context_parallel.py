"""Context-parallel scaling over several GPUs (kgen.distributed), for the multi-GPU machine.

Causal prefill attention of one 128k and one 512k-token sequence, GQA 32/8, hd128, bf16, on 1, 2, 4 and 8
GPUs; the gated delta rule on 1 x 256k at H/HV 16/32 on 1, 2 and 4. Counts above the GPUs present are
reported as not run. Each count W runs W spawned ranks (NCCL, NVLink multicast off, a 120 s timeout on
every collective); each rank times its call with CUDA events (median of ``REPEATS`` after a warm-up) and
the slowest rank's time counts. W = 1 is the single-GPU op. Scaling efficiency = t(1) / (W t(W)); bar
(observation): >= 0.85 at the largest count that runs. Exposed communication: t(W) minus the same
rank's work with no communication (its steps over buffers of the sizes it would receive; for the gated
delta rule, its three passes with no all-gather); the exchange's whole duration, hidden and exposed, is
not measured apart. Not part of run_all: it is for a machine with several GPUs.

    PYTHONPATH=. python3 bench/bench_context_parallel.py [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from common import environment, run_standalone, summary_row, verdict, write_results

NAME = "bench_context_parallel"
BAR = 0.85
REPEATS = 3
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}
CASES = [("attention", 131072, (1, 2, 4, 8)), ("attention", 524288, (1, 2, 4, 8)), ("gdn", 262144, (1, 2, 4))]
COLUMNS = [("op", "op", None), ("tokens", "tokens", None), ("gpus", "GPUs", None), ("ms", "ms", ".2f"),
           ("compute_ms", "no-comm ms", ".2f"), ("exposed_ms", "exposed comm ms", ".2f"),
           ("efficiency", "scaling efficiency", ".3f"), ("status", "status", None)]


def timed(fn) -> float:
    fn()
    times = []
    for _ in range(REPEATS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)


def attention_calls(tokens: int, world_size: int, rank: int, group):
    """(the timed call, the same rank's work without communication; None for one GPU, which has none)."""
    import kgen.distributed.attention as cp
    from kgen.ops import attention_varlen, plan_attention_varlen

    gen = torch.Generator(device="cuda").manual_seed(rank)
    cu = [0, tokens]
    if world_size == 1:
        q, k, v = (torch.randn(tokens, heads, 128, generator=gen, device="cuda").to(torch.bfloat16)
                   for heads in (32, 8, 8))
        cu_dev = torch.tensor(cu, dtype=torch.int32, device="cuda")
        plan = plan_attention_varlen(cu, cu, head_dim=128, causal=True, device="cuda")
        return (lambda: attention_varlen(q, k, v, cu_dev, cu_dev, causal=True, plan=plan)), None
    plan = cp.plan_attention_varlen_cp(cu, world_size=world_size, rank=rank, head_dim=128, device="cuda")
    n = plan.shard.tokens
    q, k, v = (torch.randn(n, heads, 128, generator=gen, device="cuda").to(torch.bfloat16) for heads in (32, 8, 8))
    held = [torch.randn(plan.shards[plan.source(s)].tokens, 16, 128, generator=gen, device="cuda").to(torch.bfloat16)
            for s in range(world_size)]

    def compute_only():
        out, lse = cp._empty_state(q)
        for s in range(world_size):
            cp._step(plan, s, q, held[s][:, :8], held[s][:, 8:], out, lse, None, None)

    return (lambda: cp.attention_varlen_cp(q, k, v, group=group, plan=plan)), compute_only


def gdn_calls(tokens: int, world_size: int, rank: int, group):
    import kgen.distributed.gated_delta_rule as cp
    from kgen.ops import chunk_gated_delta_rule, plan_chunk_gated_delta_rule

    gen = torch.Generator(device="cuda").manual_seed(rank)
    cu = [0, tokens]
    plan = (plan_chunk_gated_delta_rule(cu, num_heads_v=32, device="cuda") if world_size == 1 else
            cp.plan_chunk_gated_delta_rule_cp(cu, world_size=world_size, rank=rank, num_heads_v=32, device="cuda"))
    n = tokens if world_size == 1 else int(plan.bounds[0, rank + 1] - plan.bounds[0, rank])
    q = torch.randn(1, n, 16, 128, generator=gen, device="cuda").to(torch.bfloat16)
    k = torch.nn.functional.normalize(torch.randn(1, n, 16, 128, generator=gen, device="cuda"), dim=-1)
    k = k.to(torch.bfloat16)
    v = torch.randn(1, n, 32, 128, generator=gen, device="cuda").to(torch.bfloat16)
    g = -torch.rand(1, n, 32, generator=gen, device="cuda") * 0.1
    beta = torch.rand(1, n, 32, generator=gen, device="cuda")
    if world_size == 1:
        cu_dev = torch.tensor(cu, dtype=torch.int32, device="cuda")
        return (lambda: chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_dev, output_final_state=True,
                                               plan=plan)), None

    def compute_only():
        o0, transition, h = cp._piece_maps(plan, q, k, v, g, beta, None, False)
        cp._finish_piece(plan, q, k, v, g, beta, o0, h, None, False)

    return (lambda: cp.chunk_gated_delta_rule_cp(q, k, v, g, beta, group=group, plan=plan,
                                                 output_final_state=True)), compute_only


def _rank(rank: int, world_size: int, op: str, tokens: int, port: int, results) -> None:
    os.environ.update(NO_MULTICAST, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    import torch.distributed as dist
    dist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=timedelta(seconds=120),
                            device_id=torch.device("cuda", rank))
    try:
        with torch.no_grad():
            call, compute_only = (attention_calls if op == "attention" else gdn_calls)(tokens, world_size, rank,
                                                                                        dist.group.WORLD)
            dist.barrier()
            total = timed(call)
            alone = timed(compute_only) if compute_only is not None else total
        results.put((rank, total, alone))
    finally:
        dist.destroy_process_group()


def measure(op: str, tokens: int, world_size: int) -> dict[str, Any]:
    os.environ.update(NO_MULTICAST)
    results = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_rank, args=(world_size, op, tokens, 29600 + world_size, results), nprocs=world_size,
                       join=True, start_method="spawn")
    times = [results.get() for _ in range(world_size)]
    slowest = max(times, key=lambda t: t[1])
    return {"ms": slowest[1], "compute_ms": slowest[2], "exposed_ms": max(0.0, slowest[1] - slowest[2])}


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    gpus = torch.cuda.device_count()
    rows, summary = [], []
    for op, tokens, counts in CASES:
        base = None
        for world_size in counts:
            row: dict[str, Any] = {"op": op, "tokens": tokens, "gpus": world_size}
            if world_size > gpus:
                row["status"] = f"not run: {gpus} GPU(s) here"
            else:
                try:
                    row.update(measure(op, tokens, world_size), status="ok")
                except Exception as exc:  # one count's failure keeps the others' numbers
                    row["status"] = f"failed: {type(exc).__name__}: {exc}"[:200]
            if row.get("ms"):
                base = base if base is not None else (row["ms"] if world_size == 1 else None)
                if base is not None:
                    row["efficiency"] = base / (world_size * row["ms"])
            rows.append(row)
        ran = [r for r in rows if r["op"] == op and r["tokens"] == tokens and "efficiency" in r and r["gpus"] > 1]
        if ran:
            top = ran[-1]
            summary.append(summary_row("context parallel", f"{op} {tokens // 1024}k on {top['gpus']} GPUs: scaling "
                                       f"({top['ms']:.1f} ms, exposed comm {top['exposed_ms']:.1f} ms)",
                                       top["efficiency"], "x", f">= {BAR}", verdict(top["efficiency"], BAR, True)))
        else:
            summary.append(summary_row("context parallel", f"{op} {tokens // 1024}k: needs 2+ GPUs ({gpus} here)",
                                       None, "x"))
    write_results(out_dir, NAME, "Context-parallel scaling", rows, COLUMNS, environment(), notes=[__doc__])
    return summary


def main(argv: list[str] | None = None) -> int:
    return run_standalone(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
