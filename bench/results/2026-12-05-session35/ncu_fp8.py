"""Session 35: one FP8 grouped GEMM launch pair for ncu's source counters: Qwen3-MoE gate+up, 32768 tokens balanced."""
import sys, torch
sys.path.insert(0, "bench"); sys.path.insert(0, "tests")
from bench_grouped_gemm import group_sizes
from fp8_blocks import quantize_weights
from kgen.ops import grouped_gemm, quantize_fp8_blockwise
E, N, K, M = 128, 3072, 4096, 32768 * 8
offs = group_sizes(M, E, "balanced", torch.Generator().manual_seed(0)).cumsum(0).to(torch.int32).cuda()
a8, a_scale = quantize_fp8_blockwise(torch.randn(M, K, device="cuda", dtype=torch.bfloat16))
b8, b_scale = quantize_weights(torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) / 64)
for _ in range(2):
    grouped_gemm(a8, b8, offs, a_scale=a_scale, b_scale=b_scale)
torch.cuda.synchronize()
print("ok")
