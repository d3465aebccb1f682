"""Figures of benchmark results, from the JSON files the benchmarks wrote into a results folder.

bench_gdn.png: the gated delta rule (the chunked forward's kgen/FlashQLA and kgen/fla ratios per issue
shape and gate regime, the boundary sweep's kgen, FlashQLA and fla times over L, the decode step against
a device copy and fla),
from bench_gdn_chunk.json, bench_gdn_sweep.json and bench_gdn_step.json. bench_gdn_backward.png: the training
step's kgen/FlashQLA time per shape and gate regime, from bench_gdn_backward.json. bench_attention_decode.png:
decode attention's TB/s per shape for kgen (contiguous, paged 16 and 64), cuDNN, flash and a device
copy, from bench_attention_decode.json. bench_grouped_gemm.png: the MoE grouped GEMM per prefill shape (kgen's bf16
TFLOP/s against torch's grouped GEMM and a dense cuBLAS GEMM of the same FLOPs, kgen's FP8 against torch's scaled
grouped GEMM and the 1000 TFLOP/s bar, the fused SwiGLU+FP8 / unfused time) and the decode time over the selected
weights at copy bandwidth, from bench_grouped_gemm.json. Each figure is drawn from the files that exist, each panel
from the rows that have its key. Needs matplotlib (the GPU machine has it).

    python3 bench/plots.py DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)
import numpy as np  # noqa: E402


def rows(folder: Path, name: str) -> list[dict]:
    path = folder / f"{name}.json"
    return json.loads(path.read_text())["rows"] if path.exists() else []


def chunk_panel(ax, chunk: list[dict]) -> None:
    labels = [f"{row['shape']} {row['gates']}" for row in chunk]
    x = np.arange(len(chunk))
    for offset, key, label in ((-0.2, "kgen_over_flashqla", "kgen / FlashQLA"), (0.2, "kgen_over_fla", "kgen / fla")):
        ax.bar(x + offset, [row.get(key, float("nan")) for row in chunk], width=0.4, label=label)
    ax.axhline(1.0, color="red", linewidth=1, label="bar (FlashQLA)")
    ax.set_xticks(x, labels, rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("time ratio")
    ax.set_title("chunked forward, K = V = 128")
    ax.legend(fontsize=8)


def sweep_panel(ax, sweep: list[dict]) -> None:
    for gates, style in (("strong", "-"), ("flashqla", ":")):
        rows = [row for row in sweep if row.get("gates", "strong") == gates]
        lengths = [row["L"] for row in rows]
        for key, label, marker in (("kgen_us", "kgen", "o"), ("flashqla_us", "FlashQLA", "^"), ("fla_us", "fla", "s")):
            ax.plot(lengths, [row.get(key, float("nan")) for row in rows], marker + style, markersize=3,
                    label=f"{label}, {gates} gates")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("L (N = min(4096, 131072 / L), H = HV = 12)")
    ax.set_ylabel("us")
    ax.set_title("boundary sweep")
    ax.legend(fontsize=6)


def step_panel(ax, step: list[dict]) -> None:
    batches = [row["B"] for row in step]
    for key, label in (("kgen_us", "kgen"), ("copy_us", "device copy of the state bytes"), ("fla_us", "fla")):
        ax.plot(batches, [row.get(key) or float("nan") for row in step], "o-", markersize=3, label=label)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("B (H/HV = 16/32)")
    ax.set_ylabel("us")
    ax.set_title("decode step")
    ax.legend(fontsize=8)


def rate(row: dict, key: str) -> float:
    """A decode row's TB/s for ``key``; the paged caches' from their times (they move the contiguous case's bytes)."""
    if key.startswith("paged"):
        page_us = row.get(key.replace("_tbs", "_us"))
        return row["kgen_tbs"] * row["kgen_us"] / page_us if page_us and row.get("kgen_tbs") else float("nan")
    return row.get(key) or float("nan")


def decode_panel(ax, decode: list[dict]) -> None:
    series = (("kgen_tbs", "kgen contiguous"), ("paged16_tbs", "kgen paged 16"), ("paged64_tbs", "kgen paged 64"),
              ("cudnn_tbs", "SDPA cuDNN"), ("flash_tbs", "SDPA flash"), ("copy_tbs", "device copy"))
    width = 0.8 / len(series)
    for i, (key, label) in enumerate(series):
        ax.bar([x + i * width for x in range(len(decode))], [rate(row, key) for row in decode], width, label=label)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(decode))], [row["shape"] for row in decode], fontsize=8)
    ax.set_ylabel("K+V TB/s")
    ax.set_title("decode attention, GQA 32/8, D = 128, bf16")
    ax.legend(fontsize=7)


def case_label(row: dict) -> str:
    """A grouped GEMM row's model, projection, tokens and routing (or decode tokens), or a GDN training step's shape
    and gates, short enough for a tick."""
    if "case" not in row:
        return row["shape"]
    return row["case"].replace(" tokens", "").replace(" decode", "").replace(" (masked)", "")


def tflops_bars(ax, shapes: list[dict], series: list[tuple[str, str]]) -> None:
    width = 0.8 / len(series)
    for i, (key, label) in enumerate(series):
        ax.bar([x + i * width for x in range(len(shapes))], [row.get(key) or float("nan") for row in shapes], width,
               label=label)
    ax.set_xticks([x + 0.4 - width / 2 for x in range(len(shapes))], [case_label(row) for row in shapes],
                  rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("TFLOP/s")
    ax.margins(y=0.2)  # room above the bars for the legend


def ratio_bars(ax, shapes: list[dict], key: str, bar: float, bar_label: str) -> None:
    bars = ax.bar(range(len(shapes)), [row.get(key) or float("nan") for row in shapes], width=0.6, label="kgen")
    ax.bar_label(bars, fmt="%.3f", fontsize=7)  # the ratios sit within a few percent of the bar
    ax.axhline(bar, color="red", linewidth=1, label=bar_label)
    ax.set_xticks(range(len(shapes)), [case_label(row) for row in shapes], rotation=40, ha="right", fontsize=7)
    ax.set_ylabel("time ratio")
    ax.margins(y=0.2)
    ax.legend(fontsize=8, loc="upper left", ncols=2)


def grouped_bf16_panel(ax, prefill: list[dict]) -> None:
    series = [("kgen_tflops", "kgen"), ("torch_tflops", "torch grouped_mm")]
    # Older runs lack the dense column; it reads one expert's weights, so it is a roofline only where compute bounds.
    if any("dense_tflops" in row for row in prefill):
        series.append(("dense_tflops", "dense cuBLAS mm, same FLOPs"))
    tflops_bars(ax, prefill, series)
    ax.set_title("grouped GEMM bf16, top-8")
    ax.legend(fontsize=7, loc="upper left", ncols=3)


def grouped_fp8_panel(ax, prefill: list[dict]) -> None:
    series = [("fp8_tflops", "kgen FP8 (block scales)"), ("scaled_tflops", "torch _scaled_grouped_mm")]
    if any("fp8_dense_tflops" in row for row in prefill):  # older runs lack it
        series.append(("fp8_dense_tflops", "dense cuBLAS FP8 mm, same FLOPs"))
    tflops_bars(ax, prefill, series)
    ax.axhline(1000, color="red", linewidth=1, label="bar 1000 TFLOP/s (issue 26)")
    ax.set_title("grouped GEMM FP8, top-8")
    ax.legend(fontsize=7, loc="upper left", ncols=3)


def swiglu_panel(ax, gate_up: list[dict]) -> None:
    ratio_bars(ax, gate_up, "fused_over_unfused", 0.85, "bar 0.85")
    ax.set_title("gate+up: fused SwiGLU+FP8 / unfused time")


def grouped_decode_panel(ax, decode: list[dict]) -> None:
    ratio_bars(ax, decode, "over_floor", 1.10, "bar 1.10")
    ax.set_title("decode, masked (tokens): time / selected weights at copy bandwidth")


def gdn_backward_panel(ax, steps: list[dict]) -> None:
    ratio_bars(ax, steps, "kgen_over_flashqla", 1.0, "bar 1.0 (issue 24)")
    ax.axhline(0.85, color="green", linewidth=1, linestyle="--", label="goal 0.85")
    ax.set_title("GDN training step (fwd + bwd): kgen / FlashQLA time")
    ax.legend(fontsize=8, loc="upper left", ncols=3)


# A figure's panels: (panel, results file, the key a row needs to be drawn in it, None for every row).
FIGURES = {
    "bench_gdn": [(chunk_panel, "bench_gdn_chunk", None), (sweep_panel, "bench_gdn_sweep", None),
                  (step_panel, "bench_gdn_step", None)],
    "bench_gdn_backward": [(gdn_backward_panel, "bench_gdn_backward", "kgen_over_flashqla")],
    "bench_attention_decode": [(decode_panel, "bench_attention_decode", None)],
    "bench_grouped_gemm": [(grouped_bf16_panel, "bench_grouped_gemm", "kgen_tflops"),
                           (grouped_fp8_panel, "bench_grouped_gemm", "fp8_tflops"),
                           (swiglu_panel, "bench_grouped_gemm", "fused_over_unfused"),
                           (grouped_decode_panel, "bench_grouped_gemm", "over_floor")],
}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    folder = Path(argv[0])
    drawn = 0
    for figure, wanted in FIGURES.items():
        panels = [(panel, data) for panel, name, key in wanted
                  if (data := [row for row in rows(folder, name) if key is None or key in row])]
        if not panels:
            continue
        # Up to three panels a row, as even as the rows can be (four as two by two).
        rows_of_panels = -(-len(panels) // 3)
        columns = -(-len(panels) // rows_of_panels)
        fig, axes = plt.subplots(rows_of_panels, columns, squeeze=False,
                                 figsize=(6 * columns + 2 * (figure != "bench_gdn"), 4.8 * rows_of_panels))
        for ax, (panel, data) in zip(axes.flat, panels):
            panel(ax, data)
        for ax in axes.flat[len(panels):]:
            ax.set_visible(False)
        fig.tight_layout()
        fig.savefig(folder / f"{figure}.png", dpi=110)
        plt.close(fig)
        print(f"wrote {folder / figure}.png")
        drawn += 1
    if not drawn:
        print(f"no results to draw in {folder}")
    return 0 if drawn else 1


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
