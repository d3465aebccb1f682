"""The gated delta rule's KKT solve in isolation (gated_delta_rule_kkt), by chunks per block.

T = 32768 tokens in one sequence, K = 128, bf16, over seed 002's five head configurations
(hk2_hv8, hk8_hv32, hk16_hv32, hk16_hv64, hk32_hv32), with each block taking 1, 2, 4 and 8 chunks
(kgen.families.gated_delta_rule.chunk.KKT_CHUNK_TIME; the host's choice is marked), as CUDA graph
replays of the kernel alone. (Seed 002 found 8 resident blocks best on the B200; the spec's 4 is what
a block's registers and two K tiles allow.)

    PYTHONPATH=. python3 bench/bench_gdn_kkt.py [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from common import environment, run_standalone, summary_row, time_graph, write_results
from kgen import registry
from kgen.families.gated_delta_rule.chunk import KKT_CHUNK_TIME, kkt_chunks_per_block
from kgen.ops import plan_chunk_gated_delta_rule
from kgen.runtime.device import sm_count
from kgen.runtime.dispatch import launcher

NAME = "bench_gdn_kkt"
TOKENS, HEAD_DIM = 32768, 128
HEADS = [(2, 8), (8, 32), (16, 32), (16, 64), (32, 32)]
COLUMNS = [("heads", "hk/hv", None), ("chunks_per_block", "chunks a block", None), ("chosen", "host's choice", None),
           ("us", "us", ".1f"), ("over_best", "/best", ".3f")]


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    variant = registry.current().family("gated_delta_rule_kkt").select(head_dim=HEAD_DIM, dtype="bf16",
                                                                       has_incomplete_tile=False)
    kernel = launcher(variant, "gated_delta_rule_kkt", torch.cuda.current_device())
    plan = plan_chunk_gated_delta_rule([0, TOKENS], num_heads_v=1, head_dim=HEAD_DIM, device="cuda")
    chunks = plan.tables.on(torch.device("cuda"))[0]
    num_chunks = len(plan.chunks)
    rows = []
    for heads, heads_v in HEADS:
        gen = torch.Generator(device="cuda").manual_seed(heads_v)
        k = torch.nn.functional.normalize(torch.randn(TOKENS, heads, HEAD_DIM, generator=gen, device="cuda"), dim=-1)
        k = k.to(torch.bfloat16)
        g = torch.nn.functional.logsigmoid(torch.randn(TOKENS, heads_v, generator=gen, device="cuda") + 4)
        beta = torch.rand(TOKENS, heads_v, generator=gen, device="cuda")
        tbeta = torch.empty(num_chunks, heads_v, 64, 64, device="cuda", dtype=torch.bfloat16)
        gamma_log2 = torch.empty(num_chunks, heads_v, 64, device="cuda", dtype=torch.float32)
        chosen = kkt_chunks_per_block(num_chunks, heads, variant.param_dict["min_blocks_per_sm"], sm_count())
        group = []
        for per_block in KKT_CHUNK_TIME:
            def call(per_block=per_block):
                kernel((-(-num_chunks // per_block), heads), k=k.data_ptr(), g=g.data_ptr(), beta=beta.data_ptr(),
                       beta_is_fp32=1, chunks=chunks.data_ptr(), num_chunks=num_chunks, chunks_per_block=per_block,
                       tbeta=tbeta.data_ptr(), gamma_log2=gamma_log2.data_ptr(), num_heads=heads,
                       num_heads_v=heads_v, use_qk_l2norm=0)
            group.append({"heads": f"hk{heads}_hv{heads_v}", "chunks_per_block": per_block,
                          "chosen": "yes" if per_block == chosen else "", "us": 1e3 * time_graph(call)})
        best = min(r["us"] for r in group)
        for r in group:
            r["over_best"] = r["us"] / best
            print(r, flush=True)
        rows += group
    write_results(out_dir, NAME, "Gated delta rule KKT solve", rows, COLUMNS, environment(), notes=[__doc__])
    return [summary_row("gdn kkt", f"{r['heads']} {r['chunks_per_block']} chunks a block{' (chosen)' if r['chosen'] else ''}: "
                        f"{r['us']:.1f} us", r["over_best"], "x of best") for r in rows]


def main(argv: list[str] | None = None) -> int:
    return run_standalone(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
