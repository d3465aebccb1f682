"""One figure of the gated delta rule's results, from the JSON files the GDN benchmarks wrote.

Three panels: the chunked forward's kgen/fla ratio per issue shape against its bar, the boundary
sweep's kgen and fla times over L, and the decode step's times against a device copy and fla.
Reads bench_gdn_chunk.json, bench_gdn_sweep.json and bench_gdn_step.json from DIR (any that
exist) and writes DIR/bench_gdn.png. Needs matplotlib (the GPU machine has it).

    python3 bench/plot_gdn.py DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (after choosing the backend)


def rows(folder: Path, name: str) -> list[dict]:
    path = folder / f"{name}.json"
    return json.loads(path.read_text())["rows"] if path.exists() else []


def chunk_panel(ax, chunk: list[dict]) -> None:
    labels = [row["shape"] for row in chunk]
    ax.bar(range(len(chunk)), [row.get("kgen_over_fla", float("nan")) for row in chunk], label="kgen / fla")
    ax.scatter(range(len(chunk)), [float(row["bar"].split()[-1]) for row in chunk], color="red", marker="_",
               s=400, label="bar", zorder=3)
    ax.set_xticks(range(len(chunk)), labels, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("time ratio")
    ax.set_title("chunked forward, K = V = 128")
    ax.legend(fontsize=8)


def sweep_panel(ax, sweep: list[dict]) -> None:
    lengths = [row["L"] for row in sweep]
    ax.plot(lengths, [row["kgen_us"] for row in sweep], "o-", markersize=3, label="kgen")
    ax.plot(lengths, [row.get("fla_us", float("nan")) for row in sweep], "s-", markersize=3, label="fla")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("L (N = min(4096, 131072 / L), H = HV = 12)")
    ax.set_ylabel("us")
    ax.set_title("boundary sweep")
    ax.legend(fontsize=8)


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


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print(__doc__)
        return 2
    folder = Path(argv[0])
    panels = [(panel, data) for panel, data in ((chunk_panel, rows(folder, "bench_gdn_chunk")),
                                                (sweep_panel, rows(folder, "bench_gdn_sweep")),
                                                (step_panel, rows(folder, "bench_gdn_step"))) if data]
    if not panels:
        print(f"no GDN results in {folder}")
        return 1
    fig, axes = plt.subplots(1, len(panels), figsize=(6 * len(panels), 4.8), squeeze=False)
    for ax, (panel, data) in zip(axes[0], panels):
        panel(ax, data)
    fig.tight_layout()
    fig.savefig(folder / "bench_gdn.png", dpi=110)
    print(f"wrote {folder / 'bench_gdn.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
