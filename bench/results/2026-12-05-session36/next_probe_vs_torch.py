"""Probe (session 36, not a benchmark of record): kgen's FP8 grouped GEMM of the tree on PYTHONPATH against torch's
scaled grouped GEMM in the same process, at issue 26's balanced prefill shapes, via bench_grouped_gemm.fp8_columns.
With the `probe` tree (FP8 without the two-level promotion: timing only, its results are wrong) it measures what
kgen's main loop makes when it does torch's recipe's work; with `old` the same columns as the record."""
import json

import torch

import bench_grouped_gemm as bench
import kgen

print(json.dumps({"kgen": kgen.__file__}), flush=True)  # which tree this process measured
for model, projection, experts, n, k in bench.LAYERS:
    for tokens in bench.TOKENS:
        rows = tokens * bench.TOP_K
        gen = torch.Generator().manual_seed(rows + experts)
        offs = bench.group_sizes(rows, experts, "balanced", gen).cumsum(0).to(torch.int32).cuda()
        a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
        found = bench.fp8_columns(a, b, offs, 2.0 * rows * n * k, 4.27e12)
        print(json.dumps({"case": f"{model} {projection} {tokens} balanced", **{key: found.get(key) for key in
                          ("fp8_tflops", "scaled_tflops", "fp8_dense_tflops", "fp8_rel_rms")}}), flush=True)
        del a, b
        torch.cuda.empty_cache()
