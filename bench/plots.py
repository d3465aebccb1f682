"""Figures of benchmark results, from the JSON files the benchmarks wrote into a results folder.

bench_gdn.png: the gated delta rule (the chunked forward's kgen/FlashQLA and kgen/fla ratios per issue
shape and gate regime, the boundary sweep's kgen, FlashQLA and fla times over L, the decode step against
a device copy and fla),
from bench_gdn_chunk.json, bench_gdn_sweep.json and bench_gdn_step.json. bench_attention_decode.png:
decode attention's TB/s per shape for kgen (contiguous, paged 16 and 64), cuDNN, flash and a device
copy, from bench_attention_decode.json. Each figure is drawn from the files that exist. Needs
matplotlib (the GPU machine has it).

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


FIGURES = {
    "bench_gdn": [(chunk_panel, "bench_gdn_chunk"), (sweep_panel, "bench_gdn_sweep"), (step_panel, "bench_gdn_step")],
    "bench_attention_decode": [(decode_panel, "bench_attention_decode")],
}


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    folder = Path(argv[0])
    drawn = 0
    for figure, wanted in FIGURES.items():
        panels = [(panel, data) for panel, name in wanted if (data := rows(folder, name))]
        if not panels:
            continue
        fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels) + 2 * (figure != "bench_gdn"), 4.8),
                                 squeeze=False)
        for ax, (panel, data) in zip(axes[0], panels):
            panel(ax, data)
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
