"""Per-row 1x128 block quantization to FP8 (kgen.ops.quantize_fp8_blockwise) against a copy of the same bytes and
torch's own form of the recipe, in one run.

Memory-bound: the bar is bandwidth. Bytes moved per call: x read (2 bytes an element for bf16), the codes written
(1 byte) and the scales (4 bytes a block). Times are CUDA-graph replays (bench/common.time_graph, median). The copy
moves as many bytes: a device copy of half that many, read once and written once. The torch peer is DeepGEMM's
reference quantizer written in torch (amax per block, clamp, scale, cast), eager: what a user has without a
kernel. Shapes: MoE activations (tokens x hidden 7168, DeepSeek-V3's), a decode batch, and a wide K. kgen's codes
and scales are checked bitwise against the torch peer's before timing.

    PYTHONPATH=. python3 bench/bench_quantize_fp8.py [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import torch

from common import environment, run_standalone, summary_row, time_graph, verdict, write_results
from kgen.ops import quantize_fp8_blockwise

NAME = "bench_quantize_fp8"
SHAPES = [(4096, 7168), (128, 7168), (16384, 2048), (32768, 7168)]
#: kgen's bandwidth over the copy's (issue 26 names no number for the quantizer: the merge kernel's bar).
BAR = 0.9
COLUMNS = [("shape", "M x K (bf16)", None), ("mbytes", "MB moved", ".1f"), ("kgen_us", "kgen us", ".2f"),
           ("torch_us", "torch us", ".2f"), ("copy_us", "copy us", ".2f"), ("kgen_tbs", "kgen TB/s", ".2f"),
           ("copy_tbs", "copy TB/s", ".2f"), ("over_copy", "kgen / copy bandwidth", ".3f"),
           ("bitwise", "codes and scales = torch's", None)]


def torch_quantize(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The recipe in torch: s = max(amax, 1e-4) / 448, q = e4m3(x * (1 / s)), per row and 128 columns."""
    blocks = x.view(x.shape[0], -1, 128).float()
    amax = blocks.abs().amax(-1, keepdim=True)
    # A tensor divisor: torch's CUDA division by a Python number multiplies by its reciprocal instead.
    scale = torch.where(amax.isnan(), amax, amax.clamp_min(1e-4) / torch.full_like(amax, 448.0))
    codes = (blocks * (1 / scale)).to(torch.float8_e4m3fn)
    return codes.view(x.shape), scale[..., 0]


def row(shape) -> dict[str, Any]:
    rows, columns = shape
    x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
    codes, scales = quantize_fp8_blockwise(x)
    want_codes, want_scales = torch_quantize(x)
    bitwise = torch.equal(codes.view(torch.uint8), want_codes.view(torch.uint8)) and torch.equal(scales, want_scales)
    moved = x.numel() * 2 + codes.numel() + scales.numel() * 4
    half = torch.empty(moved // 2, dtype=torch.uint8, device="cuda")
    other = torch.empty_like(half)
    kgen_ms = time_graph(lambda: quantize_fp8_blockwise(x))
    torch_ms = time_graph(lambda: torch_quantize(x))
    copy_ms = time_graph(lambda: other.copy_(half))
    return {"shape": f"{rows} x {columns}", "mbytes": moved / 1e6, "kgen_us": kgen_ms * 1e3, "torch_us": torch_ms * 1e3,
            "copy_us": copy_ms * 1e3, "kgen_tbs": moved / kgen_ms / 1e9, "copy_tbs": moved / copy_ms / 1e9,
            "over_copy": copy_ms / kgen_ms, "bitwise": "yes" if bitwise else "NO"}


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for shape in SHAPES:
        rows.append(row(shape))
        print(rows[-1], flush=True)
    write_results(out_dir, NAME, "FP8 block quantization", rows, COLUMNS, environment(), notes=[__doc__])
    return [summary_row("quantize fp8", f"{r['shape']}: kgen/copy bandwidth ({r['kgen_tbs']:.2f} TB/s)", r["over_copy"],
                        "x", f">= {BAR}", "WRONG" if r["bitwise"] != "yes" else verdict(r["over_copy"], BAR, True))
            for r in rows]


def main(argv: list[str] | None = None) -> int:
    return run_standalone(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
