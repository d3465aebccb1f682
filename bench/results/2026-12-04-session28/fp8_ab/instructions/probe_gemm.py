"""Grouped GEMM times (FP8 and bf16) at four of issue 26's shapes, balanced routing; one JSON line per shape."""
import json, sys, torch
sys.path.insert(0, "bench"); sys.path.insert(0, "tests")
from bench_grouped_gemm import group_sizes
from common import time_cuda
from fp8_blocks import quantize_weights
from kgen.ops import grouped_gemm, quantize_fp8_blockwise
SHAPES = [("DSV3 gate+up", 256, 4096, 7168, 4096), ("DSV3 gate+up", 256, 4096, 7168, 32768),
          ("Qwen3 gate+up", 128, 3072, 4096, 32768), ("DSV3 down", 256, 7168, 2048, 32768)]
for name, E, N, K, tokens in SHAPES:
    M = tokens * 8
    gen = torch.Generator().manual_seed(0)
    offs = group_sizes(M, E, "balanced", gen).cumsum(0).to(torch.int32).cuda()
    torch.manual_seed(0)
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) / 64
    a8, a_scale = quantize_fp8_blockwise(a)
    b8, b_scale = quantize_weights(b)
    flops = 2 * M * N * K
    out8 = grouped_gemm(a8, b8, offs, a_scale=a_scale, b_scale=b_scale)
    out16 = grouped_gemm(a, b, offs)
    t8 = time_cuda(lambda: grouped_gemm(a8, b8, offs, a_scale=a_scale, b_scale=b_scale, out=out8), warmup_ms=50, rep_ms=300)
    t16 = time_cuda(lambda: grouped_gemm(a, b, offs, out=out16), warmup_ms=50, rep_ms=300)
    # A digest of the results, to see that two trees computed the same values.
    print(json.dumps({"case": f"{name} {tokens}", "fp8_tflops": round(flops / t8 / 1e9, 1), "bf16_tflops": round(flops / t16 / 1e9, 1),
                      "fp8_sum": float(out8.double().sum()), "bf16_sum": float(out16.double().sum())}), flush=True)
    del a, b, a8, b8, out8, out16
    torch.cuda.empty_cache()
