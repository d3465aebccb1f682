"""First-call latency of every kgen op on a node that only imported a cache archive, against a cold start.

The deployment of docs/fleet.md, made in a temporary folder: every built-in variant built for this
GPU's arch, ``kgen cache export``, ``kgen cache import`` into an empty folder, then a fresh process
with that folder alone as its cache calls each op once (its plan included) and synchronises
(tests/first_call.py). The same child with an empty cache shows the cold start it replaces. Bar
(observation): <= 50 ms per op with the imported cache, and nothing compiled.

    PYTHONPATH=. python3 bench/bench_first_call.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import environment, run_standalone, summary_row, verdict, write_results

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import first_call  # noqa: E402

NAME = "bench_first_call"
BAR_MS = 50.0
COLUMNS = [("op", "op", None), ("warm_ms", "imported cache ms", ".1f"), ("warm_compiled", "compiled", None),
           ("cold_ms", "empty cache ms", ".0f"), ("cold_compiled", "compiled (cold)", None)]


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as folder:
        warm, cold = first_call.fleet_run(Path(folder))
    rows = [{"op": op, "warm_ms": warm[op]["ms"], "warm_compiled": warm[op]["compiled"], "cold_ms": cold[op]["ms"],
             "cold_compiled": cold[op]["compiled"]} for op in warm]
    write_results(out_dir, NAME, "First call of each op with an imported cache", rows, COLUMNS, environment(),
                  notes=[__doc__])
    return [summary_row("first call", f"{row['op']}: imported cache ({row['warm_compiled']} compiled; empty cache "
                        f"{row['cold_ms']:.0f} ms, {row['cold_compiled']} compiled)", row["warm_ms"], "ms",
                        f"<= {BAR_MS:g}", verdict(row["warm_ms"], BAR_MS, False) if not row["warm_compiled"] else "FAIL")
            for row in rows]


def main(argv: list[str] | None = None) -> int:
    return run_standalone(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
