"""Which tile shape wins: kgen's wgmma prefill over every tile shape the spec path lists for a head dim,
against cuDNN through SDPA, on the dense cases of bench_attention.py, in one process.

The spec's configs are the candidates, ordered fastest first by hand from this table
(specs/attention_prefill.yaml); extra shapes to try come from a spec folder on
KGEN_SPEC_PATH. Each shape is timed with the kernel forced (tile_m, tile_n) on the
same inputs; FLOPs as in bench_attention.py. An observation, not a bar.

    KGEN_SPEC_PATH=DIR PYTHONPATH=. python3 bench/bench_attention_shapes.py [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

from common import default_out_dir, environment, markdown_table, time_cuda, write_results
from attention_common import DEVICE, DTYPE, DTYPE_NAME, family, sdpa, sdpa_backends
from bench_attention import DENSE_CASES, dense_inputs
from kgen.ops import attention_varlen, plan_attention_varlen

NAME = "bench_attention_shapes"
COLUMNS = [("case", "case", None), ("shape", "kgen tile (m x n)", None), ("kgen_tflops", "kgen TFLOP/s", ".0f"),
           ("cudnn_tflops", "cuDNN TFLOP/s", ".0f"), ("kgen_over_cudnn", "kgen/cuDNN", ".3f"),
           ("spec", "spec file", None)]


def shapes(head_dim: int) -> list[tuple[int, int, str]]:
    """(tile_m, tile_n, spec file) of every wgmma shape listed for ``head_dim``, in search-path order."""
    found = {}
    for v in family().variants:
        p = v.param_dict
        if p["mma"] == "wgmma" and p["head_dim"] == head_dim and p["dtype"] == DTYPE_NAME:
            found.setdefault((p["tile_m"], p["tile_n"]), v.spec_path.name)
    return [(m, n, spec) for (m, n), spec in found.items()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None)
    options = parser.parse_args(argv)
    rows = []
    for index, case in enumerate(DENSE_CASES):
        B, S, D = case.batch, case.seqlen, case.head_dim
        gen = torch.Generator(device=DEVICE).manual_seed(index)
        q, k, v, q_p, k_p, v_p = dense_inputs(case, gen)
        cu_host = [i * S for i in range(B + 1)]
        cu = torch.tensor(cu_host, dtype=torch.int32, device=DEVICE)
        cudnn_ms = time_cuda(lambda: sdpa(sdpa_backends()["cudnn"], q, k, v, case.causal))
        for tile_m, tile_n, spec in shapes(D):
            plan = plan_attention_varlen(cu_host, cu_host, head_dim=D, dtype=DTYPE, causal=case.causal, mma="wgmma",
                                         tile_m=tile_m, tile_n=tile_n)
            out = torch.empty_like(q_p)
            ms = time_cuda(lambda: attention_varlen(q_p, k_p, v_p, cu, cu, causal=case.causal, plan=plan, out=out))
            rows.append({"case": case.name, "shape": f"{tile_m} x {tile_n}", "kgen_tflops": case.flops / ms / 1e9,
                         "cudnn_tflops": case.flops / cudnn_ms / 1e9, "kgen_over_cudnn": cudnn_ms / ms, "spec": spec})
            print(markdown_table(rows[-1:], COLUMNS).splitlines()[-1], flush=True)
    out_dir = options.out or default_out_dir()
    write_results(out_dir, NAME, "kgen wgmma tile shapes against cuDNN", rows, COLUMNS, environment(), notes=[__doc__])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
