"""Device time of the prefill at seed 000's sweep lengths for each forced tile shape, beside the planner's own
choice and cuDNN (SDPA on the same sequences as a dense batch), for calibrating the planner's choice of shape.

    KGEN_SPEC_PATH=my_specs python3 tools/prefill_tile_probe.py --lengths 64,65,128 \\
        --shapes wgmma:128:128,wgmma:64:64,mma_sync:64:64

Each line is JSON: length, shape ("plan" for the planner's choice, "cudnn" for the peer), the median ms of
``--rounds`` rounds (each round times every shape once, in the same order, so that drift is shared), and for
kgen's shapes the worst rel L2 against float64 of the first and last sequence with the output poisoned first.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

import kgen  # noqa: F401  (first, from PYTHONPATH's tree: bench/common puts this checkout on sys.path)
from kgen.ops import attention_varlen, plan_attention_varlen

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from attention_common import reference_bhsd, rel_l2  # noqa: E402
from bench_attention_sweep import SWEEP_HEAD_DIM, SWEEP_HEADS, sweep_seqs  # noqa: E402
from common import time_cuda  # noqa: E402


def error_of(out, q, k, v, length, num_seqs) -> float:
    worst = 0.0
    for i in sorted({0, num_seqs - 1}):
        rows = slice(i * length, (i + 1) * length)
        as_bhsd = lambda t: t[rows].transpose(0, 1).unsqueeze(0)  # noqa: E731
        want = reference_bhsd(as_bhsd(q), as_bhsd(k), as_bhsd(v), True)
        worst = max(worst, rel_l2(as_bhsd(out), want))
    return worst


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="32,63,64,65,127,128,129,255,256,257")
    parser.add_argument("--shapes", default="wgmma:128:128,mma_sync:64:64", help="mma:tile_m:tile_n, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    for length in (int(x) for x in args.lengths.split(",")):
        num_seqs = sweep_seqs(length)
        cu_host = [i * length for i in range(num_seqs + 1)]
        cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
        q, k, v = (torch.randn((num_seqs * length, SWEEP_HEADS, SWEEP_HEAD_DIM), generator=gen, device="cuda",
                               dtype=torch.bfloat16) for _ in range(3))
        out = torch.empty_like(q)
        calls, errors = {}, {}
        forced = [dict(zip(("mma", "tile_m", "tile_n"), (m, int(a), int(b))))
                  for m, a, b in (s.split(":") for s in args.shapes.split(","))]
        for name, options in [("plan", {}), *((f"{o['mma']}:{o['tile_m']}:{o['tile_n']}", o) for o in forced)]:
            try:
                plan = plan_attention_varlen(cu_host, cu_host, head_dim=SWEEP_HEAD_DIM, causal=True, device="cuda",
                                             **options)
            except ValueError as exc:  # a shape this tree's spec lacks
                print(json.dumps({"length": length, "shape": name, "error": str(exc)[:200]}), flush=True)
                continue
            call = (lambda plan=plan: attention_varlen(q, k, v, cu, cu, causal=True, plan=plan, out=out))
            out.fill_(math.nan)
            call()
            errors[name] = "NaN left" if out.isnan().any() else round(error_of(out, q, k, v, length, num_seqs), 5)
            calls[name] = call
        dense = [t.view(num_seqs, length, SWEEP_HEADS, SWEEP_HEAD_DIM).transpose(1, 2).contiguous() for t in (q, k, v)]
        from torch.nn.attention import SDPBackend, sdpa_kernel

        def cudnn():
            with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
                return F.scaled_dot_product_attention(*dense, is_causal=True)
        calls["cudnn"] = cudnn
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                times[name].append(time_cuda(call))
        for name, samples in times.items():
            row = {"length": length, "seqs": num_seqs, "shape": name, "ms": round(statistics.median(samples), 4)}
            if name in errors:
                row["rel_l2"] = errors[name]
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
