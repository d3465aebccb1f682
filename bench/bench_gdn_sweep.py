"""Seed 000's boundary sweep for the chunked gated delta rule: kgen against FlashQLA and fla in the same run.

Packed varlen batches of N = min(4096, 131072 / L) sequences of L tokens, H = HV = 12, K = V = 128,
bf16, for L around every power of two from 1 to 2049 (the seed's points), under bench_gdn_chunk's two
gate regimes. fla has cliffs here (seed 000: L=32 5.5 ms, L=64 3.5 ms, L=65 4.8 ms on its GPU).
Bars: kgen <= 1.0x FlashQLA at every L (issue 23, to resolve); kgen/fla <= 0.5 (its goal); t(2^k - 1)
<= 1.01 t(2^k). Reported too: t(2^k + 1) / t(2^k). Each library's output is checked against the
float64 reference before it is timed, on the batch's first 4 sequences and at least its first 4096 tokens: at short
L, 4 sequences were too few tokens to compare two libraries' errors within 1% (bench/NOTES.md, twenty-second
session).

    PYTHONPATH=. python3 bench/bench_gdn_sweep.py [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench_gdn_chunk import GATES, Case, flashqla_summary, time_kgen, with_peers
from common import environment, run_standalone, summary_row, verdict, write_results

NAME = "bench_gdn_sweep"
HEADS = 12
LENGTHS = [1, 2, 4, 8, 16, 24, 31, 32, 33, 40, 48, 56, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513,
           1023, 1024, 1025, 2047, 2048, 2049]
FLA_GOAL, BELOW_BAR = 0.5, 1.01
COLUMNS = [("L", "L", None), ("N", "N", None), ("gates", "gates", None), ("kgen_us", "kgen us", ".1f"),
           ("flashqla_us", "FlashQLA us", ".1f"), ("fla_us", "fla us", ".1f"),
           ("kgen_over_flashqla", "kgen/FlashQLA", ".3f"), ("kgen_over_fla", "kgen/fla", ".3f"),
           ("segments", "segments", None), ("kgen_rel_rms", "kgen rel RMS", ".1e"),
           ("flashqla_rel_rms", "FlashQLA rel RMS", ".1e"), ("fla_rel_rms", "fla rel RMS", ".1e"),
           ("flashqla_status", "FlashQLA", None), ("fla_status", "fla", None)]


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    cases = [Case(min(4096, 131072 // length), length, HEADS, HEADS, gates, checked_tokens=max(4 * length, 4096))
             for gates in GATES for length in LENGTHS]
    rows = [{"L": c.length, "N": c.seqs, "gates": c.gates, **time_kgen(c)} for c in cases]
    with_peers(rows, cases)
    summary = []
    for row in rows:
        summary.append(flashqla_summary("gdn sweep", f"L={row['L']} N={row['N']} {row['gates']} gates", row))
        if "kgen_over_fla" in row:
            summary.append(summary_row("gdn sweep", f"L={row['L']} {row['gates']} gates: kgen/fla (goal)",
                                       row["kgen_over_fla"], "x", f"<= {FLA_GOAL}",
                                       verdict(row["kgen_over_fla"], FLA_GOAL, False)))
    by_length = {row["L"]: row["kgen_us"] for row in rows if row["gates"] == GATES[0]}
    for k in range(1, 12):
        power = 2 ** k
        if power - 1 in by_length and power in by_length and power - 1 > 0:
            ratio = by_length[power - 1] / by_length[power]
            summary.append(summary_row("gdn sweep", f"t({power - 1})/t({power})", ratio, "x", f"<= {BELOW_BAR}",
                                       verdict(ratio, BELOW_BAR, False)))
        if power + 1 in by_length and power in by_length:
            summary.append(summary_row("gdn sweep", f"t({power + 1})/t({power})", by_length[power + 1] / by_length[power],
                                       "x"))
    write_results(out_dir, NAME, "Gated delta rule boundary sweep", rows, COLUMNS, environment(), notes=[__doc__])
    return summary


def main(argv: list[str] | None = None) -> int:
    return run_standalone(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
