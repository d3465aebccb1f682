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
import statistics
import sys
from pathlib import Path

import torch

import kgen  # noqa: F401  (first, from PYTHONPATH's tree: bench/common puts this checkout on sys.path)
from kgen.ops import plan_attention_varlen

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from attention_common import backend_only  # noqa: E402
from bench_attention_sweep import SWEEP_HEAD_DIM, check_batch, cudnn_dense_calls, kgen_calls, make_batch, sweep_seqs  # noqa: E402
from common import time_cuda  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--lengths", default="32,63,64,65,127,128,129,255,256,257")
    parser.add_argument("--shapes", default="wgmma:128:128,mma_sync:64:64", help="mma:tile_m:tile_n, comma-separated")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    gen = torch.Generator(device="cuda").manual_seed(0)
    forced = [dict(zip(("mma", "tile_m", "tile_n"), (m, int(a), int(b))))
              for m, a, b in (s.split(":") for s in args.shapes.split(","))]
    for length in (int(x) for x in args.lengths.split(",")):
        batch = make_batch(sweep_seqs(length), length, gen)
        calls, errors = {}, {}
        shapes = [("plan", {}), *((f"{o['mma']}:{o['tile_m']}:{o['tile_n']}", o) for o in forced)]
        for name, options in shapes:
            try:
                plan = plan_attention_varlen(batch.cu_host, batch.cu_host, head_dim=SWEEP_HEAD_DIM, causal=True,
                                             device="cuda", **options)
            except ValueError as exc:  # a shape this tree's spec lacks
                print(json.dumps({"length": length, "shape": name, "error": str(exc)[:200]}), flush=True)
                continue
            error, ok = check_batch(batch, plan)  # NaN-poisoned output, float64 reference
            errors[name] = round(error, 5) if ok else f"failed: rel L2 {error}, or NaN left"
            calls[name] = kgen_calls(batch, plan)[0]
        calls["cudnn"] = cudnn_dense_calls(batch)[0]
        times = {name: [] for name in calls}
        for _ in range(args.rounds):
            for name, call in calls.items():
                with backend_only(name):  # cuDNN pinned for its SDPA call, nothing for kgen's
                    times[name].append(time_cuda(call))
        for name, samples in times.items():
            row = {"length": length, "seqs": batch.num_seqs, "shape": name, "ms": round(statistics.median(samples), 4)}
            if name in errors:
                row["rel_l2"] = errors[name]
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
