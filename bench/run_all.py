"""Every kgen GPU benchmark in one process: machinery, first calls with an imported cache, host cost, merge
bandwidth, attention, the sweep, the kernels per sweep length, decode attention, the gated delta rule's
chunked forward, KKT solve, boundary sweep and decode step; a summary last.

Writes into ``--out`` (default ``$OUT``, else ``bench/results/latest``): each
benchmark's ``*.json`` and ``*.md``, ``summary.json``, ``SUMMARY.md`` and
``run_all.log`` (everything printed). Bars are observations: a FAIL never
changes the exit status; a benchmark that crashes does (exit 1).

    PYTHONPATH=. python3 bench/run_all.py [--out DIR] [--benchmarks "gdn chunk,gdn step"] [--only bf16] [--rep-ms 100]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import traceback
from pathlib import Path
from typing import Any, Callable, TextIO

# common first: it puts the repository root on sys.path, so kgen imports without PYTHONPATH.
import common
import attention_common
import bench_attention
import bench_attention_decode
import bench_attention_kernels
import bench_attention_sweep
import bench_first_call
import bench_gdn_backward
import bench_gdn_chunk
import bench_gdn_kkt
import bench_gdn_step
import bench_gdn_sweep
import bench_host
import bench_machinery
import bench_grouped_gemm
import bench_merge_states
import bench_quantize_fp8

BENCHMARKS: list[tuple[str, Callable[[Path, argparse.Namespace], list[dict[str, Any]]]]] = [
    ("machinery", bench_machinery.run),
    ("first call", bench_first_call.run),
    ("host", bench_host.run),
    ("merge", bench_merge_states.run),
    ("quantize fp8", bench_quantize_fp8.run),
    ("grouped gemm", bench_grouped_gemm.run),
    ("attention", bench_attention.run),
    ("attention sweep", bench_attention_sweep.run),
    ("attention kernels", bench_attention_kernels.run),
    ("attention decode", bench_attention_decode.run),
    ("gdn chunk", bench_gdn_chunk.run),
    ("gdn backward", bench_gdn_backward.run),
    ("gdn kkt", bench_gdn_kkt.run),
    ("gdn sweep", bench_gdn_sweep.run),
    ("gdn step", bench_gdn_step.run),
]


class Tee:
    """A text stream that writes to the console and to a log file."""

    def __init__(self, console: TextIO, log: TextIO):
        self.console, self.log = console, log

    def write(self, text: str) -> int:
        self.log.write(text)
        return self.console.write(text)

    def flush(self) -> None:
        self.console.flush()
        self.log.flush()

    def isatty(self) -> bool:
        return False

    def __getattr__(self, name: str) -> Any:  # fileno, encoding, ...: whatever else a library asks of stdout
        return getattr(self.console, name)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default $OUT or bench/results/latest)")
    parser.add_argument("--benchmarks", default="", help="comma-separated benchmark names to run (default: all of "
                        + ", ".join(name for name, _ in BENCHMARKS) + ")")
    bench_host.add_arguments(parser)
    bench_merge_states.add_arguments(parser)
    bench_gdn_backward.add_arguments(parser)
    attention_common.add_arguments(parser)  # both attention benchmarks' options
    return parser.parse_args(argv)


def run_benchmarks(out_dir: Path, options: argparse.Namespace) -> tuple[list[dict[str, Any]], bool]:
    """Run each benchmark; a crash is reported as an ERROR row and the next benchmark still runs."""
    rows, crashed = [], False
    chosen = [name.strip() for name in options.benchmarks.split(",") if name.strip()]
    unknown = sorted(set(chosen) - {name for name, _ in BENCHMARKS})
    if unknown:
        raise SystemExit(f"--benchmarks: no benchmark named {unknown}; they are {[name for name, _ in BENCHMARKS]}")
    for name, run in BENCHMARKS:
        if chosen and name not in chosen:
            continue
        print(f"== {name}", flush=True)
        start = time.perf_counter()
        try:
            rows += run(out_dir, options)
        except Exception as exc:
            traceback.print_exc()
            rows.append(common.summary_row(name, f"crashed: {type(exc).__name__}: {exc}"[:300], None, "", "", "ERROR"))
            crashed = True
        print(f"== {name} took {time.perf_counter() - start:.1f} s", flush=True)
    return rows, crashed


def write_summary(out_dir: Path, rows: list[dict[str, Any]], env: dict[str, Any], seconds: float) -> str:
    """Write summary.json and SUMMARY.md; return the table for the console."""
    table = common.markdown_table(rows, common.SUMMARY_COLUMNS)
    counts = {v: sum(r["verdict"] == v for r in rows) for v in ("PASS", "FAIL", "WRONG", "ERROR")}
    verdicts = ", ".join(f"{n} {v}" for v, n in counts.items() if n or v in ("PASS", "FAIL"))
    details = sorted(p.name for p in out_dir.glob("*.md") if p.name != "SUMMARY.md")
    (out_dir / "summary.json").write_text(json.dumps({"env": env, "seconds": seconds, "rows": rows}, indent=2,
                                                     default=str) + "\n")
    (out_dir / "SUMMARY.md").write_text(
        f"# kgen GPU benchmarks\n\n{verdicts} (bars are observations, not gates); {seconds:.0f} s in all.\n\n"
        f"{table}\nDetails: {', '.join(details)}; everything printed is in run_all.log.\n\n"
        f"## Environment\n\n{common.environment_lines(env)}")
    return f"{table}{verdicts}\n"


def main(argv: list[str] | None = None) -> int:
    options = parse_args(argv)
    out_dir = options.out or common.default_out_dir()
    out_dir.mkdir(parents=True, exist_ok=True)
    with open(out_dir / "run_all.log", "w") as log:
        sys.stdout, sys.stderr = Tee(sys.__stdout__, log), Tee(sys.__stderr__, log)
        try:
            start = time.perf_counter()
            rows, crashed = run_benchmarks(out_dir, options)
            env = common.environment()
            print(f"\n== summary ({out_dir}; git {env['git_commit'][:12]}, {env['gpu']}, timer: {env['timer']})")
            print(write_summary(out_dir, rows, env, time.perf_counter() - start), flush=True)
        finally:
            sys.stdout, sys.stderr = sys.__stdout__, sys.__stderr__
    return 1 if crashed else 0


if __name__ == "__main__":
    sys.exit(main())
