"""kgen's FP8 grouped GEMM TFLOP/s at issue 26's 16 prefill shapes (the bench's inputs), for the tree on PYTHONPATH:
python3 fp8_ab.py LABEL"""
import sys
import torch
import kgen
sys.path.insert(0, "bench")
import bench_grouped_gemm as bg
from common import time_cuda
from fp8_blocks import quantize_weights
from kgen.ops import grouped_gemm, quantize_fp8_blockwise
print("tree", kgen.__file__, flush=True)
for layer in bg.LAYERS:
    model, projection, experts, n, k = layer
    for tokens in bg.TOKENS:
        for routing in bg.ROUTINGS:
            rows = tokens * bg.TOP_K
            gen = torch.Generator().manual_seed(rows + experts)
            offs = bg.group_sizes(rows, experts, routing, gen).cumsum(0).to(torch.int32).cuda()
            torch.manual_seed(rows + experts)
            a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
            b = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
            a8, a_scale = quantize_fp8_blockwise(a)
            b8, b_scale = quantize_weights(b)
            del b
            out = grouped_gemm(a8, b8, offs, a_scale=a_scale, b_scale=b_scale)
            s = time_cuda(lambda: grouped_gemm(a8, b8, offs, a_scale=a_scale, b_scale=b_scale, out=out), warmup_ms=50, rep_ms=200)
            # a cheap agreement check across trees: the checksum of the first rows
            print(f"{sys.argv[1]} {model} {projection} {tokens} {routing}: {2.0 * rows * n * k / s / 1e9:.0f} TFLOP/s "
                  f"sum {out[:256].float().sum().item():.6e}", flush=True)
            del a, a8, b8, out
            torch.cuda.empty_cache()
