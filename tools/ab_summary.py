"""A summary of an A/B of trees run with tools/ab_grouped_gemm_forms.py: one file per tree, ``DIR/ab_<TREE>.jsonl``
(each process's lines appended), and per case and op the base tree's mean TFLOP/s and each other tree's mean as a
ratio to it, and whether every result's float64 sum equals the base tree's (equal sums: most likely equal results).

    python3 tools/ab_summary.py DIR BASE OTHER [OTHER ...]
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

OPS = ("bf16", "fp8", "swiglu_fp8_out")


def measured(path: Path) -> dict[tuple[str, str], list[tuple[float, float]]]:
    """Per (case, op): each process's TFLOP/s and the result's float64 sum."""
    found: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for line in path.read_text().splitlines():
        row = json.loads(line)
        if "case" not in row:  # the line naming the kgen a process imported
            continue
        for op in OPS:
            if op in row:
                found.setdefault((row["case"], op), []).append((row[op], row["sum"][op]))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", type=Path)
    parser.add_argument("base")
    parser.add_argument("others", nargs="+")
    args = parser.parse_args()
    base = measured(args.folder / f"ab_{args.base}.jsonl")
    others = {name: measured(args.folder / f"ab_{name}.jsonl") for name in args.others}
    mean = lambda runs: sum(tflops for tflops, _ in runs) / len(runs)
    for key, runs in base.items():
        cells = [f"{key[0]:40s} {key[1]:15s} {args.base} {mean(runs):7.1f}"]
        for name, found in others.items():
            if key in found:
                same = {total for _, total in runs} == {total for _, total in found[key]}
                cells.append(f"{name} {mean(found[key]) / mean(runs):.3f}{'' if same else ' (results differ)'}")
        print("  ".join(cells))


if __name__ == "__main__":
    main()
