"""The FP8 grouped GEMM's error with and without two-level accumulation (issue 26 asks for both): the same e4m3
codes with unit scales, against float64 of the codes, at issue 26's K values.

- kgen: the tensor core sums 128 of K at a time and each block's sum is added in fp32 (DeepGEMM's two-level
  accumulation), the result rounded to bf16;
- cuBLAS FP8 (``torch._scaled_mm``, a peer) with ``use_fast_accum=True``: the tensor core sums all of K, no
  promotion ("without");
- the same with ``use_fast_accum=False``: cuBLAS's own promotion.

The torch results come in fp32 and are also rounded to bf16, so that the output's rounding is told apart from the
accumulation's. Two kinds of inputs: zero-mean (a running sum that grows like the square root of K) and
non-negative (one that grows like K, where a narrow accumulator loses most). Each JSON line: K, inputs, method, rel
RMS and the largest error over the result's RMS.

    PYTHONPATH=.:tests:bench python3 tools/fp8_accumulation_error.py [--m 2048] [--n 2048] [--seed 0]
"""

from __future__ import annotations

import argparse
import json

import torch

from fp8_blocks import BLOCK, FP8, quantize_rows
from kgen.ops import grouped_gemm

#: Issue 26's K values: the down projections' and the gate+up ones'.
KS = (1536, 2048, 4096, 7168)


def codes(rows: int, k: int, kind: str, gen: torch.Generator) -> torch.Tensor:
    """e4m3 codes as DeepGEMM's 1 x 128 block scaling leaves them (each block's largest at 448)."""
    x = torch.randn(rows, k, generator=gen, dtype=torch.float32)
    return quantize_rows(x.abs() if kind == "non-negative" else x)[0].cuda()


def errors(got: torch.Tensor, want: torch.Tensor) -> dict[str, float]:
    diff = got.double() - want
    scale = want.pow(2).mean().sqrt()
    return {"rel_rms": float(diff.pow(2).mean().sqrt() / scale), "max_over_rms": float(diff.abs().max() / scale)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--m", type=int, default=2048)
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    gen = torch.Generator().manual_seed(args.seed)
    one = torch.ones((), dtype=torch.float32, device="cuda")
    for k in KS:
        for kind in ("zero-mean", "non-negative"):
            a8, b8 = codes(args.m, k, kind, gen), codes(args.n, k, kind, gen)
            want = a8.double() @ b8.double().T
            results = {"kgen two-level (bf16)": grouped_gemm(
                a8, b8[None], torch.tensor([args.m], dtype=torch.int32, device="cuda"),
                a_scale=torch.ones(args.m, k // BLOCK, device="cuda"),
                b_scale=torch.ones(1, args.n // BLOCK, k // BLOCK, device="cuda"))}
            for fast in (True, False):
                name = "cuBLAS " + ("tensor core only" if fast else "promoted")
                try:  # a peer's failure is reported, not fatal
                    out = torch._scaled_mm(a8, b8.T, scale_a=one, scale_b=one, out_dtype=torch.float32, use_fast_accum=fast)
                except Exception as exc:
                    print(json.dumps({"k": k, "inputs": kind, "method": name, "failed": f"{type(exc).__name__}: {exc}"[:200]}))
                    continue
                results[name + " (fp32)"] = out
                results[name + " (bf16)"] = out.to(torch.bfloat16)
            for name, got in results.items():
                print(json.dumps({"k": k, "inputs": kind, "method": name, **errors(got, want)}), flush=True)
            del a8, b8, want, results
            torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
