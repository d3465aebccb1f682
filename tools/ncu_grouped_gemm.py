"""One grouped GEMM op at one of issue 26's prefill shapes, launched twice for Nsight Compute, or timed.

    ncu --clock-control none --set full -k regex:grouped_gemm --launch-skip 1 --launch-count 1 -o OUT \
        python3 tools/ncu_grouped_gemm.py --op swiglu --layer "Qwen3-MoE gate+up" --tokens 32768
    python3 tools/ncu_grouped_gemm.py --op bf16 --layer "Qwen3-MoE gate+up" --tokens 32768 --time

--op: bf16 (kgen.ops.grouped_gemm), swiglu (grouped_gemm_swiglu with quantize_out, b as stacked gate and up
weights of the layer's N rows), fp8 (grouped_gemm on FP8 inputs with block scales). --time prints the op's
TFLOP/s (bench/common.time_cuda, L2 flushed) instead of launching twice.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))
from bench_grouped_gemm import LAYERS, TOP_K, group_sizes  # noqa: E402
from common import time_cuda  # noqa: E402
from fp8_blocks import quantize_weights  # noqa: E402

from kgen.ops import grouped_gemm, grouped_gemm_swiglu, quantize_fp8_blockwise  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--op", choices=("bf16", "swiglu", "fp8"), required=True)
    parser.add_argument("--layer", choices=[f"{model} {projection}" for model, projection, *_ in LAYERS], required=True)
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--routing", choices=("balanced", "zipf"), default="balanced")
    parser.add_argument("--time", action="store_true")
    args = parser.parse_args()
    _, _, experts, n, k = next(layer for layer in LAYERS if f"{layer[0]} {layer[1]}" == args.layer)
    rows = args.tokens * TOP_K
    sizes = group_sizes(rows, experts, args.routing, torch.Generator().manual_seed(rows + experts))
    offs = sizes.cumsum(0).to(torch.int32).cuda()
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    if args.op == "bf16":
        call = lambda: grouped_gemm(a, b, offs)
    elif args.op == "swiglu":
        call = lambda: grouped_gemm_swiglu(a, b, offs, quantize_out=True)
    else:
        a8, a_scale = quantize_fp8_blockwise(a)
        b8, b_scale = quantize_weights(b)
        call = lambda: grouped_gemm(a8, b8, offs, a_scale=a_scale, b_scale=b_scale)
    if args.time:
        print(f"{args.op} {args.layer} {args.tokens} {args.routing}: "
              f"{2.0 * rows * n * k / time_cuda(call, warmup_ms=50, rep_ms=200) / 1e9:.1f} TFLOP/s")
        return
    for _ in range(2):
        call()
    torch.cuda.synchronize()


if __name__ == "__main__":
    main()
