"""Session 36's probe for ncu: the fused SwiGLU+FP8 at DeepSeek-V3 gate+up, 4096 tokens, balanced (the shape where the
SwiGLU bar asks 86% of copy bandwidth), launched twice: ncu reads the second launch's DRAM bytes, which say whether
a's rows are read from DRAM more than once beside the 15 GB of weights."""
import sys

import torch

sys.path.insert(0, "bench")
from bench_grouped_gemm import group_sizes  # noqa: E402

import kgen  # noqa: E402
from kgen.ops import grouped_gemm_swiglu  # noqa: E402

print("kgen", kgen.__file__)
E, N, K, M = 256, 4096, 7168, 4096 * 8
offs = group_sizes(M, E, "balanced", torch.Generator().manual_seed(0)).cumsum(0).to(torch.int32).cuda()
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) / K ** 0.5
for _ in range(2):
    grouped_gemm_swiglu(a, b, offs, quantize_out=True)
torch.cuda.synchronize()
print("ok")
