"""Which kernel and tile shape each sweep length wants: every prefill tile shape the spec offers on this GPU,
forced one at a time on seed 000's sweep batches (N = min(4096, 131072 / L) causal sequences of L tokens,
12 heads, D = 128, bf16), against cuDNN on the same sequences as a dense batch, in one process.

The planner's own choice is timed too, so its misses show as a row whose time is above the best
shape's. This is the data the planner's cost model (kgen.families.attention_prefill.plan) is checked against:
an observation, not a bar.

    PYTHONPATH=. python3 bench/bench_attention_kernels.py [--out DIR] [--lengths 64,128,256]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common import default_out_dir, environment, summary_row, time_cuda, time_graph, verdict, write_results
from attention_common import DEVICE, DTYPE, DTYPE_NAME, backend_only, family
from bench_attention_sweep import (GRAPH_BELOW_MS, SWEEP_HEAD_DIM, SWEEP_LENGTHS, cudnn_dense_calls, kgen_calls,
                                   make_batch, sweep_seqs)
from kgen.ops import plan_attention_varlen

NAME = "bench_attention_kernels"
COLUMNS = [("L", "L", None), ("N", "N", None), ("kernel", "kernel (mma tile_m x tile_n)", None),
           ("ms", "ms", ".4f"), ("over_cudnn", "t/t(cuDNN)", ".3f"), ("over_best", "t/t(best shape)", ".3f")]


def offered_shapes() -> list[tuple[str, int, int]]:
    """(mma, tile_m, tile_n) of every shape the spec lists for the sweep's head dim and dtype, in its order."""
    found = {}
    for v in family().variants:
        p = v.param_dict
        if p["head_dim"] == SWEEP_HEAD_DIM and p["dtype"] == DTYPE_NAME:
            found.setdefault((p["mma"], p["tile_m"], p["tile_n"]), None)
    return list(found)


def timed(calls, probe_ms: float) -> float:
    # Short calls are timed as graph replays, where launch overhead does not count.
    if probe_ms < GRAPH_BELOW_MS:
        return time_graph(lambda: [call() for call in calls]) / len(calls)
    return time_cuda(calls[0], warmup_ms=20, rep_ms=100)


def measure(length: int, shapes: list[tuple[str, int, int]]) -> list[dict]:
    gen = torch.Generator(device=DEVICE).manual_seed(7000 + length)
    batch = make_batch(sweep_seqs(length), length, gen)
    cu = batch.cu_host
    rows = []
    with backend_only("cudnn"):
        cudnn_ms = time_cuda(cudnn_dense_calls(batch)[0], warmup_ms=20, rep_ms=100)
    rows.append({"L": length, "N": batch.num_seqs, "kernel": "cuDNN dense", "ms": cudnn_ms})
    plans = {"planner's choice": plan_attention_varlen(cu, cu, head_dim=SWEEP_HEAD_DIM, dtype=DTYPE, causal=True,
                                                        device=DEVICE)}
    for mma, tile_m, tile_n in shapes:
        plans[f"{mma} {tile_m}x{tile_n}"] = plan_attention_varlen(
            cu, cu, head_dim=SWEEP_HEAD_DIM, dtype=DTYPE, causal=True, device=DEVICE, mma=mma, tile_m=tile_m,
            tile_n=tile_n)
    for label, plan in plans.items():
        calls = kgen_calls(batch, plan)
        probe = time_cuda(calls[0], warmup_ms=5, rep_ms=10)
        if label == "planner's choice":
            p = plan.variant.param_dict
            label = f"planner's choice ({p['mma']} {p['tile_m']}x{p['tile_n']})"
        rows.append({"L": length, "N": batch.num_seqs, "kernel": label, "ms": timed(calls, probe)})
    best = min(r["ms"] for r in rows[2:])
    for r in rows:
        r["over_cudnn"] = r["ms"] / cudnn_ms
        r["over_best"] = r["ms"] / best
    return rows


#: The lengths run_all times: each side of the first tile boundaries, where the planner switches kernels.
RUN_ALL_LENGTHS = [64, 65, 128, 129, 256, 257, 512, 1024]
#: The planner's choice may be this much slower than the best shape before the row says FAIL.
PLANNER_MISS_BAR = 1.05


def measure_lengths(lengths: list[int], out_dir: Path) -> list[dict]:
    shapes = offered_shapes()
    rows = []
    for length in lengths:
        found = measure(length, shapes)
        for r in found:
            print(f"L={r['L']:5d} {r['kernel']:40s} {r['ms']:.4f} ms  /cuDNN {r['over_cudnn']:.3f}  /best {r['over_best']:.3f}",
                  flush=True)
        rows += found
    write_results(out_dir, NAME, "Prefill kernels and tile shapes per sweep length", rows, COLUMNS, environment(),
                  notes=[__doc__])
    return rows


def run(out_dir: Path, options: argparse.Namespace) -> list[dict]:
    """run_all's entry: one summary row per length, the planner's choice against the best shape timed."""
    summary = []
    for r in measure_lengths(RUN_ALL_LENGTHS, out_dir):
        if r["kernel"].startswith("planner's choice"):
            summary.append(summary_row("attention kernels", f"sweep L={r['L']}: {r['kernel']} / best shape "
                                       f"({r['ms']:.4f} ms; {r['over_cudnn']:.3f}x cuDNN's time)", r["over_best"],
                                       "x", f"<= {PLANNER_MISS_BAR}", verdict(r["over_best"], PLANNER_MISS_BAR, False)))
    return summary


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--lengths", default=",".join(map(str, SWEEP_LENGTHS)), help="comma-separated L values")
    options = parser.parse_args(argv)
    measure_lengths([int(x) for x in options.lengths.split(",")], options.out or default_out_dir())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
