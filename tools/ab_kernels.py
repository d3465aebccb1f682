"""Device time of kgen's prefill and chunked gated delta rule at a few shapes, for an A/B of two source trees.

Run it once per tree, alternating (a change's cost is its share of the difference between the trees' times,
which drift together over a run), and compare the JSON lines:

    for tree in before after before after; do PYTHONPATH=$tree python3 tools/ab_kernels.py --label $tree; done

Each line: label, case, median microseconds per call of CUDA-graph replays (bench/common.time_graph).
Inputs and plans are made once per case, outside the timed region; only the ops' public API is used, so
any tree with that API can be measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

# kgen first, from PYTHONPATH's tree (bench/common also adds this checkout's root, after PYTHONPATH's entries).
import kgen
from kgen.ops import attention_varlen, chunk_gated_delta_rule, plan_attention_varlen, plan_chunk_gated_delta_rule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))
from bench_gdn_chunk import flashqla_gates  # noqa: E402
from common import time_graph  # noqa: E402

#: (name, lengths, heads, head_dim, causal)
PREFILL = [("prefill hd128 2x8192 causal", [8192] * 2, 16, 128, True),
           ("prefill hd128 2x8192", [8192] * 2, 16, 128, False),
           ("prefill hd128 8x2048 causal", [2048] * 8, 16, 128, True),
           ("prefill hd64 4x4096 causal", [4096] * 4, 32, 64, True),
           ("prefill hd128 64 short causal", [50 + (37 * i) % 250 for i in range(64)], 16, 128, True),
           # Seed 000's sweep (issue 25): N = min(4096, 131072 // L) causal sequences of L tokens, 12 heads.
           *((f"prefill seed L={n} causal", [n] * min(4096, 131072 // n), 12, 128, True) for n in (32, 64, 65, 128, 129, 256))]
#: (name, lengths, H, HV, weak gates, plan options); exact_split only where the tree has it. Gates are strong,
#: logsigmoid(randn), or weak: FlashQLA's benchmark gates, logsigmoid(randn) / 16 with a quarter of the heads at 0.
EXACT = {"exact_split": True}
GDN = [("gdn 1x32768 2/8", [32768], 2, 8, False, {}), ("gdn 1x32768 2/8 exact_split", [32768], 2, 8, False, EXACT),
       ("gdn 1x32768 2/8 weak", [32768], 2, 8, True, {}),
       ("gdn 1x32768 2/8 weak exact_split", [32768], 2, 8, True, EXACT),
       ("gdn 1x32768 16/32", [32768], 16, 32, False, {}), ("gdn 1x32768 16/32 exact_split", [32768], 16, 32, False, EXACT),
       ("gdn 1x32768 16/32 weak", [32768], 16, 32, True, {}),
       ("gdn 1x32768 16/32 weak exact_split", [32768], 16, 32, True, EXACT),
       ("gdn 1x32768 16/64", [32768], 16, 64, False, {}), ("gdn 1x8192 16/32", [8192], 16, 32, False, {}),
       ("gdn 4x8192 16/32", [8192] * 4, 16, 32, False, {}), ("gdn 8x1024 16/32", [1024] * 8, 16, 32, False, {}),
       ("gdn 1x2048 32/32", [2048], 32, 32, False, {}),
       # Forced splits, for the planner's cost model: each segment length runs the kernel the model picks for it.
       *((f"gdn 1x32768 16/{hv} segment_chunks={n}", [32768], 16, hv, False, {"segment_chunks": n})
         for hv, n in ((32, 128), (32, 256), (64, 256), (64, 512))),
       ("gdn 1x8192 16/32 segment_chunks=32", [8192], 16, 32, False, {"segment_chunks": 32}),
       ("gdn 1x2048 32/32 segment_chunks=8", [2048], 32, 32, False, {"segment_chunks": 8}),
       # Seed 000's sweep (issues 23 and 24): N = min(4096, 131072 // L) sequences of L tokens, H = HV = 12.
       *((f"gdn seed L={n}", [n] * min(4096, 131072 // n), 12, 12, False, {}) for n in (64, 65, 1024))]


def cumulative(lengths: list[int]) -> list[int]:
    return [0, *torch.tensor(lengths).cumsum(0).tolist()]


def prefill_us(lengths, heads, head_dim, causal) -> float:
    cu_host = cumulative(lengths)
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    q, k, v = (torch.randn((cu_host[-1], heads, head_dim), device="cuda", dtype=torch.bfloat16) for _ in range(3))
    plan = plan_attention_varlen(cu_host, cu_host, head_dim=head_dim, causal=causal, device="cuda")
    out = torch.empty_like(q)
    return 1e3 * time_graph(lambda: attention_varlen(q, k, v, cu, cu, causal=causal, plan=plan, out=out))


def gdn_us(lengths, heads, heads_v, weak, options) -> float:
    cu_host = cumulative(lengths)
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    total = cu_host[-1]
    # Unit-norm keys, as the benchmark.
    q, k = (torch.nn.functional.normalize(torch.randn((1, total, heads, 128), device="cuda"), dim=-1).to(torch.bfloat16)
            for _ in range(2))
    v = torch.randn((1, total, heads_v, 128), device="cuda", dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn((1, total, heads_v), device="cuda"))
    if weak:
        g = flashqla_gates(g)
    beta = torch.rand((1, total, heads_v), device="cuda")
    plan = plan_chunk_gated_delta_rule(cu_host, num_heads_v=heads_v, device="cuda", **options)
    out = torch.empty_like(v)
    return 1e3 * time_graph(lambda: chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, plan=plan, out=out,
                                                           output_final_state=True), replays_per_sample=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--label", required=True, help="the tree's name in the output")
    parser.add_argument("--only", default="", help="only the cases whose name contains one of these comma-separated texts")
    args = parser.parse_args()
    torch.manual_seed(0)
    print(json.dumps({"label": args.label, "kgen": str(Path(kgen.__file__).resolve().parent)}), flush=True)
    wanted = args.only.split(",")
    for name, lengths, heads, head_dim, causal in PREFILL:
        if not any(text in name for text in wanted):
            continue
        print(json.dumps({"label": args.label, "case": name, "us": round(prefill_us(lengths, heads, head_dim, causal), 2)}),
              flush=True)
    for name, lengths, heads, heads_v, weak, options in GDN:
        if not any(text in name for text in wanted):
            continue
        try:
            us = round(gdn_us(lengths, heads, heads_v, weak, options), 2)
        except TypeError as exc:  # an option this tree's planner lacks
            us = f"not in this tree: {exc}"
        print(json.dumps({"label": args.label, "case": name, "us": us}), flush=True)


if __name__ == "__main__":
    main()
