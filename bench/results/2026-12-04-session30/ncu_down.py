"""kgen's bf16 grouped GEMM and torch's at DeepSeek-V3's down projection, 32768 tokens top-8, balanced (M = 262144,
K = 2048, N = 7168, E = 256), where kgen was 0.89x torch: each called 3 times (ncu takes the last of each);
--time prints their TFLOP/s."""
import sys, torch
sys.path.insert(0, "bench"); sys.path.insert(0, "tests")
from bench_grouped_gemm import group_sizes, torch_grouped
from common import time_cuda
from kgen.ops import grouped_gemm
E, N, K, M = 256, 7168, 2048, 32768 * 8
offs = group_sizes(M, E, "balanced", torch.Generator().manual_seed(0)).cumsum(0).to(torch.int32).cuda()
a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) / 64
fn, _ = torch_grouped()
bt = b.transpose(-2, -1)
calls = {"kgen": lambda: grouped_gemm(a, b, offs), "torch": lambda: fn(a, bt, offs=offs)}
if "--time" in sys.argv:
    for name, call in calls.items():
        print(name, f"{2 * M * N * K / time_cuda(call, warmup_ms=50, rep_ms=300) / 1e9:.0f} TFLOP/s")
torch.cuda.synchronize()
with torch.cuda.nvtx.range("profile"):
    for name, call in calls.items():
        for _ in range(3):
            call()
torch.cuda.synchronize()
