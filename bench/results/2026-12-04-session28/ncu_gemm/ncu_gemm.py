"""One FP8 and one bf16 grouped GEMM at Qwen3-MoE gate+up, 32768 tokens top-8, balanced (M = 262144, K = 4096,
N = 3072, E = 128), each called 3 times (ncu takes the last of each kernel); prints their times too."""
import sys, torch
sys.path.insert(0, "bench"); sys.path.insert(0, "tests")
from bench_grouped_gemm import group_sizes
from common import time_cuda
from fp8_blocks import quantize_weights
from kgen.ops import grouped_gemm, quantize_fp8_blockwise
E, N, K, M = 128, 3072, 4096, 32768 * 8
gen = torch.Generator().manual_seed(0)
offs = group_sizes(M, E, "balanced", gen).cumsum(0).to(torch.int32).cuda()
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) / 64
a8, a_scale = quantize_fp8_blockwise(a)
b8, b_scale = quantize_weights(b)
flops = 2 * M * N * K
if "--time" in sys.argv:
    t8 = time_cuda(lambda: grouped_gemm(a8, b8, offs, a_scale=a_scale, b_scale=b_scale), warmup_ms=50, rep_ms=300)
    t16 = time_cuda(lambda: grouped_gemm(a, b, offs), warmup_ms=50, rep_ms=300)
    print(f"fp8 {flops / t8 / 1e9:.0f} TFLOP/s  bf16 {flops / t16 / 1e9:.0f} TFLOP/s")
for _ in range(3):
    grouped_gemm(a8, b8, offs, a_scale=a_scale, b_scale=b_scale)
for _ in range(3):
    grouped_gemm(a, b, offs)
torch.cuda.synchronize()
