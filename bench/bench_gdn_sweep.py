"""Seed 000's boundary sweep for the chunked gated delta rule: kgen against fla in the same run.

Packed varlen batches of N = min(4096, 131072 / L) sequences of L tokens, H = HV = 12, K = V = 128,
bf16, for L around every power of two from 1 to 2049 (the seed's points). fla has cliffs here
(seed 000: L=32 5.5 ms, L=64 3.5 ms, L=65 4.8 ms on its GPU). Bars: kgen <= 0.33x fla at every L;
t(2^k - 1) <= 1.01 t(2^k). Reported too: t(2^k + 1) / t(2^k). kgen's output is checked against
the float64 reference on the first 4 sequences of each batch before it is timed.

    PYTHONPATH=. python3 bench/bench_gdn_sweep.py [--out DIR]
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from bench_gdn_chunk import gdn_reference, time_kgen, with_fla
from common import environment, run_standalone, summary_row, verdict, write_results
NAME = "bench_gdn_sweep"
HEADS = 12
LENGTHS = [1, 2, 4, 8, 16, 24, 31, 32, 33, 40, 48, 56, 63, 64, 65, 127, 128, 129, 255, 256, 257, 511, 512, 513,
           1023, 1024, 1025, 2047, 2048, 2049]
FLA_BAR, BELOW_BAR = 0.33, 1.01
COLUMNS = [("L", "L", None), ("N", "N", None), ("kgen_us", "kgen us", ".1f"), ("fla_us", "fla us", ".1f"),
           ("kgen_over_fla", "kgen/fla", ".3f"), ("segments", "segments", None), ("kgen_rel_rms", "kgen rel RMS", ".1e"),
           ("fla_status", "fla", None)]


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    shapes = [(min(4096, 131072 // length), length, HEADS, HEADS) for length in LENGTHS]
    rows = [{"L": length, "N": seqs, **time_kgen(seqs, length, HEADS, HEADS, checked_tokens=4 * length)}
            for seqs, length, *_ in shapes]
    with_fla(rows, shapes)
    by_length = {row["L"]: row["kgen_us"] for row in rows}
    summary = []
    for row in rows:
        ok = "" if row["kgen_rel_rms"] <= gdn_reference.RMS_BAR else "WRONG"
        if "kgen_over_fla" in row:
            summary.append(summary_row("gdn sweep", f"L={row['L']} N={row['N']}: kgen/fla ({row['kgen_us']:.0f} vs "
                                       f"{row['fla_us']:.0f} us)", row["kgen_over_fla"], "x", f"<= {FLA_BAR}",
                                       ok or verdict(row["kgen_over_fla"], FLA_BAR, False)))
        else:
            summary.append(summary_row("gdn sweep", f"L={row['L']}: kgen {row['kgen_us']:.0f} us; fla: "
                                       f"{row['fla_status']}", None, "x"))
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
