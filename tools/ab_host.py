"""Eager host cost per call of the ops bench_host.py bars, for an A/B of two source trees.

bench_host.py times each call kind in its own block; across processes its ratios moved by up to a third, more
than any change to the ops' host path. This script interleaves the ops and the torch baseline loop by loop in
one process, and is meant to be run once per tree, alternating, each process pinned to the same core:

    for r in 1 2 3 4 5; do for tree in before after; do
        PYTHONPATH=$tree taskset -c 3 python3 tools/ab_host.py --label $tree; done; done

Each line: label, call, median microseconds per call over the loops, and its ratio to ``torch.add(x, y)``
measured between the same loops. Only the public API is used, so any tree with that API can be measured.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch

# kgen from PYTHONPATH's tree.
from kgen.ops import attention_varlen, merge_attention_states, merge_attention_states_n, plan_attention_varlen

HEADS, HEAD_DIM, SEQS, SEQ_LEN = 8, 128, 4, 64


def calls() -> dict:
    """The barred out= calls of bench_host.py, on its shapes, and its baseline ``torch.add(x, y)``."""
    v = torch.randn(4, 1, HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    lse = torch.empty(4, 1, HEADS, device="cuda").uniform_(-5, 5)
    out, lse_out = torch.empty_like(v[0]), torch.empty_like(lse[0])
    cu_host = [i * SEQ_LEN for i in range(SEQS + 1)]
    plan = plan_attention_varlen(cu_host, cu_host, head_dim=HEAD_DIM, dtype=torch.bfloat16, causal=True, device="cuda")
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    q, k, vv = (torch.randn(cu_host[-1], HEADS, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    q_out, q_lse = torch.empty_like(q), torch.empty(HEADS, cu_host[-1], device="cuda")
    x, y = v[0], v[1]
    return {
        "torch.add(x, y)": lambda: torch.add(x, y),
        "merge op(out=)": lambda: merge_attention_states(v[0], lse[0], v[1], lse[1], out=out, lse_out=lse_out),
        "merge_n op(out=)": lambda: merge_attention_states_n(v, lse, out=out, lse_out=lse_out),
        "varlen op(out=)": lambda: attention_varlen(q, k, vv, cu, cu, causal=True, plan=plan, return_lse=True,
                                                     out=q_out, lse_out=q_lse),
    }


def loop_us(fn, count: int) -> float:
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(count):
        fn()
    torch.cuda.synchronize()
    return 1e6 * (time.perf_counter() - start) / count


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--label", required=True)
    parser.add_argument("--calls", type=int, default=2000, help="calls per loop (default 2000)")
    parser.add_argument("--loops", type=int, default=15, help="loops of each call, interleaved (default 15)")
    options = parser.parse_args()
    with torch.no_grad():
        table = calls()
        for fn in table.values():  # first calls: compiles, caches, allocator
            loop_us(fn, 200)
        times: dict[str, list[float]] = {name: [] for name in table}
        for _ in range(options.loops):
            for name, fn in table.items():
                times[name].append(loop_us(fn, options.calls))
    baseline = times["torch.add(x, y)"]
    for name, values in times.items():
        ratios = [value / base for value, base in zip(values, baseline)]
        print(json.dumps({"label": options.label, "call": name, "us": round(statistics.median(values), 3),
                          "ratio_to_add": round(statistics.median(ratios), 4)}), flush=True)


if __name__ == "__main__":
    main()
