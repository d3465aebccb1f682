"""Context-parallel attention on GPUs: the ring simulated on one GPU with kgen's kernels, and (with two or more
GPUs) real ranks over NCCL, each against the single-GPU op."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
import torch
import torch.multiprocessing as mp

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import kgen.distributed as cp  # noqa: E402
from kgen.ops import (attention_varlen, chunk_gated_delta_rule, plan_attention_varlen,  # noqa: E402
                      plan_chunk_gated_delta_rule)

sys.path.insert(0, str(Path(__file__).parent))
import gdn_reference  # noqa: E402

TOL = 2e-2  # bf16 outputs; the merges run in fp32
# NVLink multicast stays off, in this process and every rank it spawns (the device docs' rule).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


def inputs(seqlens, seed, heads_kv=2, group=4, head_dim=128):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(seqlens)
    q = torch.randn(total, heads_kv * group, head_dim, generator=gen, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn(total, heads_kv, head_dim, generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    sink = torch.randn(heads_kv * group, generator=gen, device="cuda")
    cu = [0]
    for n in seqlens:
        cu.append(cu[-1] + n)
    return q, k, v, sink, cu


def single_gpu(q, k, v, sink, cu, window_left=-1):
    cu_dev = torch.tensor(cu, dtype=torch.int32, device="cuda")
    window = (window_left, -1)
    return attention_varlen(q, k, v, cu_dev, cu_dev, causal=True, window=window, sink=sink, return_lse=True,
                            plan=plan_attention_varlen(cu, cu, head_dim=q.shape[2], causal=True, window=window))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4, 8])
@pytest.mark.parametrize("seqlens", [[4096], [1000, 3, 0, 2047], [130000]])
@pytest.mark.parametrize("window_left", [-1, 300])
def test_simulated_ring_matches_single_gpu(world_size, seqlens, window_left):
    q, k, v, sink, cu = inputs(seqlens, seed=world_size)
    expected, expected_lse = single_gpu(q, k, v, sink, cu, window_left)
    plans = [cp.plan_attention_varlen_cp(cu, world_size=world_size, rank=r, head_dim=128, window_left=window_left,
                                         device="cuda") for r in range(world_size)]
    shards = [[cp.shard_tokens(t, p) for p in plans] for t in (q, k, v)]
    for plan, (out, lse) in zip(plans, cp.attention_varlen_cp_simulated(*shards, plans=plans, sink=sink)):
        torch.testing.assert_close(out.float(), cp.shard_tokens(expected, plan).float(), atol=TOL, rtol=TOL)
        torch.testing.assert_close(lse, cp.shard_tokens(expected_lse.transpose(0, 1), plan), atol=2e-3, rtol=1e-4)


def gdn_inputs(seqlens, seed, heads=2, heads_v=4, head_dim=128):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total = sum(seqlens)
    q = torch.randn(1, total, heads, head_dim, generator=gen, device="cuda").to(torch.bfloat16)
    k = gdn_reference.l2norm(torch.randn(1, total, heads, head_dim, generator=gen, device="cuda")).to(torch.bfloat16)
    v = torch.randn(1, total, heads_v, head_dim, generator=gen, device="cuda").to(torch.bfloat16)
    g = -torch.rand(1, total, heads_v, generator=gen, device="cuda") * 0.2
    beta = torch.rand(1, total, heads_v, generator=gen, device="cuda")
    h0 = torch.randn(len(seqlens), heads_v, head_dim, head_dim, generator=gen, device="cuda") * 0.1
    cu = [0]
    for n in seqlens:
        cu.append(cu[-1] + n)
    return q, k, v, g, beta, h0, cu


def gdn_single_gpu(q, k, v, g, beta, h0, cu):
    return chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                  cu_seqlens=torch.tensor(cu, dtype=torch.int32, device="cuda"),
                                  plan=plan_chunk_gated_delta_rule(cu, num_heads_v=v.shape[2]))


@pytest.mark.parametrize("world_size", [1, 2, 4])
@pytest.mark.parametrize("seqlens", [[8192], [1000, 3, 0, 2047]])
def test_simulated_gdn_pieces_match_single_gpu(world_size, seqlens):
    q, k, v, g, beta, h0, cu = gdn_inputs(seqlens, seed=world_size)
    want_o, want_final = gdn_single_gpu(q, k, v, g, beta, h0, cu)
    plans = [cp.plan_chunk_gated_delta_rule_cp(cu, world_size=world_size, rank=r, num_heads_v=4, device="cuda")
             for r in range(world_size)]
    pieces = [[cp.shard_sequences(t, p) for p in plans] for t in (q, k, v, g, beta)]
    for plan, (o, final) in zip(plans, cp.chunk_gated_delta_rule_cp_simulated(*pieces, plans=plans, initial_state=h0)):
        assert gdn_reference.rel_rms(o, cp.shard_sequences(want_o, plan).double()) <= gdn_reference.RMS_BAR
        assert gdn_reference.rel_rms(final, want_final.double()) <= gdn_reference.RMS_BAR


def _rank(rank: int, world_size: int, port: int, seqlens, failures) -> None:
    os.environ.update(NO_MULTICAST, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.cuda.set_device(rank)
    import torch.distributed as dist
    try:
        # Every collective times out rather than hanging, and a failed rank's exit ends the others' waits.
        dist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=timedelta(seconds=60),
                                device_id=torch.device("cuda", rank))
        q, k, v, sink, cu = inputs(seqlens, seed=world_size)
        expected, _ = single_gpu(q, k, v, sink, cu)
        plan = cp.plan_attention_varlen_cp(cu, world_size=world_size, rank=rank, head_dim=128, device="cuda")
        out = cp.attention_varlen_cp(*(cp.shard_tokens(t, plan) for t in (q, k, v)), group=dist.group.WORLD,
                                     plan=plan, sink=sink)
        torch.testing.assert_close(out.float(), cp.shard_tokens(expected, plan).float(), atol=TOL, rtol=TOL)
        q, k, v, g, beta, h0, cu = gdn_inputs(seqlens, seed=world_size)
        want_o, want_final = gdn_single_gpu(q, k, v, g, beta, h0, cu)
        gdn_plan = cp.plan_chunk_gated_delta_rule_cp(cu, world_size=world_size, rank=rank, num_heads_v=4, device="cuda")
        o, final = cp.chunk_gated_delta_rule_cp(*(cp.shard_sequences(t, gdn_plan) for t in (q, k, v, g, beta)),
                                                group=dist.group.WORLD, plan=gdn_plan, initial_state=h0,
                                                output_final_state=True)
        assert gdn_reference.rel_rms(o, cp.shard_sequences(want_o, gdn_plan).double()) <= gdn_reference.RMS_BAR
        assert gdn_reference.rel_rms(final, want_final.double()) <= gdn_reference.RMS_BAR
    except Exception as exc:  # reported by the parent; the process group's timeout stops the other ranks
        failures.put(f"rank {rank}: {type(exc).__name__}: {exc}")
        raise
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


@pytest.mark.parametrize("world_size", [2, 4])
def test_ranks_over_nccl_match_single_gpu(world_size):
    if torch.cuda.device_count() < world_size:
        pytest.skip(f"needs {world_size} GPUs")
    os.environ.update(NO_MULTICAST)
    failures = mp.get_context("spawn").SimpleQueue()
    mp.start_processes(_rank, args=(world_size, 29500 + world_size, [70000, 5, 1000], failures), nprocs=world_size,
                       join=True, start_method="spawn")
    assert failures.empty()
