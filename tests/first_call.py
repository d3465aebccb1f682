"""The first call of every kgen op in a fresh process: its wall time and how many kernels it compiled.

Run as a child process with the cache path the caller chose:

    python3 tests/first_call.py   ->  one JSON line {op: {"ms": first-call wall time, "compiled": kernels}}

Each op is called once on small inputs, its plan made first (planning is part of a first call), and
the device synchronised; the time includes loading its kernels from the cache. :func:`fleet_run`
makes the deployment this measures: every built-in variant built into one cache, exported to an
archive, imported into an empty folder, and a fresh process given that folder alone. Used by
tests/test_fleet_cache_gpu.py (nothing may compile) and bench/bench_first_call.py (the times).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import torch

from kgen import jit

MISSES = [0]
_build = jit.build


def counting_build(*args, **kwargs):
    result = _build(*args, **kwargs)
    MISSES[0] += not result.cache_hit
    return result


def calls() -> dict:
    """op name -> a function making its plan and calling it once, on inputs made beforehand."""
    import kgen.ops as ops

    def bf16(*shape):
        return torch.randn(shape, device="cuda", dtype=torch.bfloat16)

    v, lse = bf16(2, 64, 8, 128), torch.randn(2, 64, 8, device="cuda")
    q, k = bf16(200, 8, 128), bf16(200, 2, 128)
    cu_host = [0, 64, 200]
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    dq, cache = bf16(2, 8, 128), bf16(2, 1000, 2, 128)
    seqlens = torch.tensor([1000, 300], dtype=torch.int32, device="cuda")
    gq, gv = bf16(1, 200, 2, 128), bf16(1, 200, 4, 128)
    g, beta = -torch.rand(1, 200, 4, device="cuda"), torch.rand(1, 200, 4, device="cuda")
    sq, sv, pool = bf16(3, 2, 128), bf16(3, 4, 128), torch.zeros(3, 4, 128, 128, device="cuda")
    experts_b = bf16(2, 64, 1024)
    return {
        "merge_attention_states": lambda: ops.merge_attention_states(v[0], lse[0], v[1], lse[1]),
        "merge_attention_states_n": lambda: ops.merge_attention_states_n(v, lse),
        "attention_varlen": lambda: ops.attention_varlen(
            q, k, k, cu, cu, causal=True, plan=ops.plan_attention_varlen(cu_host, cu_host, head_dim=128, causal=True)),
        "attention_decode": lambda: ops.attention_decode(
            dq, cache, cache, seqlens,
            plan=ops.plan_attention_decode([1000, 300], num_heads_q=8, num_heads_kv=2, head_dim=128)),
        "chunk_gated_delta_rule": lambda: ops.chunk_gated_delta_rule(
            gq, gq, gv, g, beta, cu_seqlens=cu, output_final_state=True,
            plan=ops.plan_chunk_gated_delta_rule(cu_host, num_heads_v=4)),
        "gated_delta_rule_step": lambda: ops.gated_delta_rule_step(sq, sq, sv, g[0, :3], beta[0, :3], pool),
        "quantize_fp8_blockwise": lambda: ops.quantize_fp8_blockwise(q.view(200, 8 * 128)),
        "grouped_gemm": lambda: ops.grouped_gemm(q.view(200, 8 * 128), experts_b, cu[1:]),
        "grouped_gemm_swiglu": lambda: ops.grouped_gemm_swiglu(q.view(200, 8 * 128), experts_b, cu[1:]),
    }


def main() -> None:
    torch.cuda.init()
    torch.empty(1, device="cuda")  # the CUDA context is the process's, not the first op's
    jit.build = counting_build
    results = {}
    for name, call in calls().items():
        MISSES[0] = 0
        torch.cuda.synchronize()
        start = time.perf_counter()
        with torch.no_grad():
            call()
        torch.cuda.synchronize()
        results[name] = {"ms": (time.perf_counter() - start) * 1e3, "compiled": MISSES[0]}
    print(json.dumps(results))


def first_calls(cache_path: Path) -> dict:
    """The child's results in a fresh process whose cache path is ``cache_path`` alone."""
    env = dict(os.environ, KGEN_CACHE_DIR=str(cache_path))
    done = subprocess.run([sys.executable, __file__], env=env, capture_output=True, text=True, timeout=600)
    if done.returncode:
        raise RuntimeError(f"first-call child failed ({done.returncode}):\n{done.stderr[-4000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def fleet_run(folder: Path) -> tuple[dict, dict]:
    """(first calls with an imported cache, first calls with an empty one), the deployment made in ``folder``."""
    built, imported, empty, archive = folder / "built", folder / "imported", folder / "empty", folder / "cubins.tar.gz"

    def kgen(*args: str, cache: Path) -> None:
        done = subprocess.run([sys.executable, "-m", "kgen", *args], env=dict(os.environ, KGEN_CACHE_DIR=str(cache)),
                              capture_output=True, text=True, timeout=600)
        if done.returncode:
            raise RuntimeError(f"kgen {' '.join(args)} failed ({done.returncode}):\n{done.stdout[-3000:]}\n"
                               f"{done.stderr[-3000:]}")
    kgen("build", cache=built)  # for this GPU's arch
    kgen("cache", "export", str(archive), cache=built)
    kgen("cache", "import", str(archive), cache=imported)
    return first_calls(imported), first_calls(empty)


if __name__ == "__main__":
    main()
