"""The gated delta rule's KKT solve in isolation (gated_delta_rule_kkt), by min_blocks_per_sm.

T = 32768 tokens in one sequence, K = 128, bf16, over seed 002's five head configurations
(hk2_hv8, hk8_hv32, hk16_hv32, hk16_hv64, hk32_hv32), for each min_blocks_per_sm the spec lists
(seed 002 found 8 best on the B200; the spec now lists 4 alone: a block's two K tiles leave
shared memory for 5), as CUDA graph replays of the kernel alone.

    PYTHONPATH=. python3 bench/bench_gdn_kkt.py [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from common import environment, run_standalone, summary_row, time_graph, write_results
from kgen import registry
from kgen.ops import plan_chunk_gated_delta_rule
from kgen.runtime.dispatch import launcher

NAME = "bench_gdn_kkt"
TOKENS, HEAD_DIM = 32768, 128
HEADS = [(2, 8), (8, 32), (16, 32), (16, 64), (32, 32)]
COLUMNS = [("heads", "hk/hv", None), ("min_blocks_per_sm", "min blocks", None), ("us", "us", ".1f"),
           ("over_best", "/best", ".3f")]


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    family = registry.current().family("gated_delta_rule_kkt")
    plan = plan_chunk_gated_delta_rule([0, TOKENS], num_heads_v=1, head_dim=HEAD_DIM, device="cuda")
    chunks = plan.tables.on(torch.device("cuda"))[0]
    rows = []
    for heads, heads_v in HEADS:
        gen = torch.Generator(device="cuda").manual_seed(heads_v)
        k = torch.nn.functional.normalize(torch.randn(TOKENS, heads, HEAD_DIM, generator=gen, device="cuda"), dim=-1)
        k = k.to(torch.bfloat16)
        g = torch.nn.functional.logsigmoid(torch.randn(TOKENS, heads_v, generator=gen, device="cuda") + 4)
        beta = torch.rand(TOKENS, heads_v, generator=gen, device="cuda")
        tbeta = torch.empty(len(plan.chunks), heads_v, 64, 64, device="cuda", dtype=torch.bfloat16)
        group = []
        for blocks in family.supported("min_blocks_per_sm"):
            variant = family.select(head_dim=HEAD_DIM, dtype="bf16", has_incomplete_tile=False, min_blocks_per_sm=blocks)
            kernel = launcher(variant, "gated_delta_rule_kkt", torch.cuda.current_device())

            def call():
                kernel((len(plan.chunks), heads), k=k.data_ptr(), g=g.data_ptr(), beta=beta.data_ptr(), beta_is_fp32=1,
                       chunks=chunks.data_ptr(), tbeta=tbeta.data_ptr(), num_heads=heads, num_heads_v=heads_v,
                       use_qk_l2norm=0)
            group.append({"heads": f"hk{heads}_hv{heads_v}", "min_blocks_per_sm": blocks, "us": 1e3 * time_graph(call)})
        best = min(r["us"] for r in group)
        for r in group:
            r["over_best"] = r["us"] / best
            print(r, flush=True)
        rows += group
    write_results(out_dir, NAME, "Gated delta rule KKT solve", rows, COLUMNS, environment(), notes=[__doc__])
    return [summary_row("gdn kkt", f"{r['heads']} min_blocks {r['min_blocks_per_sm']}: {r['us']:.1f} us", r["over_best"],
                        "x of best") for r in rows]


def main(argv: list[str] | None = None) -> int:
    return run_standalone(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
