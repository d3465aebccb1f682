"""What kgen's machinery costs around the kernels: cold compiles and warm loads (host cost per call: bench_host.py).

(a) Cold compile: every variant of every family built with ``kgen.jit.build``
    into a fresh, empty cache folder, for the current device's arch.
(b) Warm load in a fresh process: a child process (same cache folder) times
    ``kgen.jit.load(variant)`` plus ``.kernel(entry)`` for each entry: render,
    key, disk read, integrity check, driver load. Bar: <= 2 ms per kernel
    (the mean over the variants after the first, which pays one-time costs).
Bars are observations, printed with PASS/FAIL, never enforced.

    PYTHONPATH=. python3 bench/bench_machinery.py [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

# common first: it puts the repository root on sys.path, so kgen imports without PYTHONPATH.
from common import (REPO_ROOT, SUMMARY_COLUMNS, Column, attempt, default_out_dir, environment, markdown_table,
                    summary_row, verdict, write_results)
from kgen import config, jit, registry

BENCHMARK = "machinery"
WARM_LOAD_BAR_MS = 2.0
CHILD_FLAG = "--child-warm-load"
CHILD_TIMEOUT_S = 300

VARIANT_COLUMNS: list[Column] = [
    ("variant", "variant", None), ("cold_build_ms", "cold build ms", ".1f"), ("nvrtc_ms", "NVRTC ms", ".1f"),
    ("warm_load_ms", "warm load ms", ".3f"), ("warm_kernels_ms", "warm kernel() ms", ".3f"),
    ("warm_per_kernel_ms", "warm ms/kernel", ".3f"),
]


def ms_since(start: float) -> float:
    return (time.perf_counter() - start) * 1e3


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f} ms"


# ---- (a) cold compile -------------------------------------------------------------------------------

def cold_compile(cache_dir: Path) -> list[dict[str, Any]]:
    """Build every variant into the empty ``cache_dir``, one at a time, timing each ``jit.build``."""
    variants = registry.current().variants()  # spec parsing stays out of the timings
    rows = []
    with config.overrides(KGEN_CACHE_DIR=str(cache_dir)):
        for variant in variants:
            start = time.perf_counter()
            result = jit.build(variant)  # arch=None: the current device's
            rows.append({"variant": variant.name, "cold_build_ms": ms_since(start),
                         "nvrtc_ms": result.record.compile_ms, "cold_cache_hit": result.cache_hit})
    return rows


# ---- (b) warm load in a fresh process ---------------------------------------------------------------

def child_warm_load() -> dict[str, Any]:
    """Runs in the child: the first kgen loads of a process whose disk cache already holds every cubin."""
    start = time.perf_counter()
    torch.cuda.init()
    torch.ones(1, device="cuda")
    torch.cuda.synchronize()
    cuda_init_ms = ms_since(start)
    start = time.perf_counter()
    variants = registry.current().variants()
    spec_load_ms = ms_since(start)
    rows = []
    for variant in variants:
        start = time.perf_counter()
        module = jit.load(variant)  # render + key + disk read + integrity check
        load_ms = ms_since(start)
        kernel_ms = []
        for entry in variant.family.entries:
            start = time.perf_counter()
            module.kernel(entry)  # the driver loads the cubin at the first entry (cuda.core loads lazily)
            kernel_ms.append(ms_since(start))
        rows.append({"variant": variant.name, "entries": len(kernel_ms), "warm_load_ms": load_ms,
                     "warm_kernel_ms": kernel_ms, "warm_kernels_ms": sum(kernel_ms),
                     "warm_cache_hit": module.result.cache_hit})
    return {"cuda_init_ms": cuda_init_ms, "spec_load_ms": spec_load_ms, "variants": rows}


def run_child(cache_dir: Path) -> dict[str, Any]:
    """Start a fresh interpreter on the populated cache and return what ``child_warm_load`` measured."""
    pythonpath = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, KGEN_CACHE_DIR=str(cache_dir), PYTHONPATH=pythonpath)
    proc = subprocess.run([sys.executable, str(Path(__file__).resolve()), CHILD_FLAG], env=env,
                          capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    if proc.stderr.strip():
        print(proc.stderr.rstrip(), file=sys.stderr)  # its traceback, or warnings such as a corrupt-entry report
    lines = [line for line in proc.stdout.splitlines() if line.startswith("{")]
    if proc.returncode != 0 or not lines:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"warm-load child failed (exit {proc.returncode}): {last}")
    return json.loads(lines[-1])


def warm_load_stats(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The first variant apart (it pays one-time costs: NVRTC version for the key, Jinja setup), then the rest."""
    totals = [r["warm_load_ms"] + r["warm_kernels_ms"] for r in rows]
    rest, rest_entries = totals[1:], sum(r["entries"] for r in rows[1:])
    return {
        "first_kernel_ms": rows[0]["warm_load_ms"] + rows[0]["warm_kernel_ms"][0] if rows else None,
        "first_variant_ms": totals[0] if totals else None,
        "first_variant_name": rows[0]["variant"] if rows else None,
        "rest_median_ms": statistics.median(rest) if rest else None,
        "rest_mean_ms": statistics.mean(rest) if rest else None,
        "per_kernel_mean_ms_rest": sum(rest) / rest_entries if rest_entries else None,
        "per_kernel_mean_ms_all": sum(totals) / sum(r["entries"] for r in rows) if rows else None,
        "misses": sum(not r["warm_cache_hit"] for r in rows),
    }


# ---- the benchmark ----------------------------------------------------------------------------------

def variant_rows(cold: list[dict[str, Any]], child: dict[str, Any] | None) -> list[dict[str, Any]]:
    """One row per variant: its cold build and, when (b) ran, its warm load."""
    warm = {r["variant"]: r for r in child["variants"]} if child else {}
    rows = []
    for row in cold:
        merged = {**row, **warm.get(row["variant"], {})}
        if "warm_load_ms" in merged:
            merged["warm_per_kernel_ms"] = (merged["warm_load_ms"] + merged["warm_kernels_ms"]) / merged["entries"]
        rows.append(merged)
    return rows


def summarise_compile(cold: list[dict[str, Any]]) -> list[dict[str, Any]]:
    cold_ms = [r["cold_build_ms"] for r in cold]
    out = [
        summary_row(BENCHMARK, f"(a) cold compile, {len(cold_ms)} variants: total", sum(cold_ms) / 1e3, "s"),
        summary_row(BENCHMARK, "(a) cold compile: mean per variant", statistics.mean(cold_ms), "ms"),
        summary_row(BENCHMARK, "(a) cold compile: first variant", cold_ms[0], "ms"),
    ]
    hits = sum(r["cold_cache_hit"] for r in cold)
    if hits:  # the cache folder was fresh, so a hit means the measurement is not what it claims
        out.append(summary_row(BENCHMARK, "(a) cold compile: cache hits (should be 0)", hits, "", "0", "FAIL"))
    return out


def summarise_warm_load(stats: dict[str, Any]) -> list[dict[str, Any]]:
    per_kernel = stats["per_kernel_mean_ms_rest"]
    out = [
        summary_row(BENCHMARK, "(b) warm load: first kernel (fresh process)", stats["first_kernel_ms"], "ms"),
        summary_row(BENCHMARK, "(b) warm load: median of the rest, per variant", stats["rest_median_ms"], "ms"),
        summary_row(BENCHMARK, "(b) warm load: mean per kernel (after the first)", per_kernel, "ms",
                    f"<= {WARM_LOAD_BAR_MS}", verdict(per_kernel, WARM_LOAD_BAR_MS, False)),
    ]
    if stats["misses"]:
        out.append(summary_row(BENCHMARK, "(b) warm load: cache misses (should be 0)", stats["misses"], "",
                               "0", "FAIL"))
    return out


def warm_load_note(child: dict[str, Any], stats: dict[str, Any]) -> str:
    return (f"(b) a fresh process on the same cache: CUDA init {child['cuda_init_ms']:.0f} ms and spec load "
            f"{child['spec_load_ms']:.1f} ms (both outside the timings), then `jit.load` + `.kernel(entry)` for each "
            f"entry. First kernel {_ms(stats['first_kernel_ms'])}, first variant {_ms(stats['first_variant_ms'])}; "
            f"the rest: median {_ms(stats['rest_median_ms'])}, mean {_ms(stats['rest_mean_ms'])} per variant; "
            f"per kernel {_ms(stats['per_kernel_mean_ms_rest'])} (bar <= {WARM_LOAD_BAR_MS} ms), "
            f"{_ms(stats['per_kernel_mean_ms_all'])} with the first; cache misses {stats['misses']}.")


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    """(a) and (b); write machinery_variants.{json,md}; return the summary rows."""
    errors: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    env = environment()
    with tempfile.TemporaryDirectory(prefix="kgen-bench-cache-") as tmp:
        cache_dir = Path(tmp) / "cache"
        print(f"(a) cold compile of every variant into {cache_dir}", flush=True)
        cold = attempt(BENCHMARK, "(a) cold compile", errors, cold_compile, cache_dir)
        child = None
        if cold:
            summary += summarise_compile(cold)
            print(f"    {len(cold)} variants, {sum(r['cold_build_ms'] for r in cold) / 1e3:.2f} s", flush=True)
            print("(b) warm load in a fresh process", flush=True)
            child = attempt(BENCHMARK, "(b) warm load", errors, run_child, cache_dir)
    if cold:
        notes = ["(a) `jit.build` per variant into an empty cache folder (arch from the device)."]
        extra = {}
        if child:
            stats = warm_load_stats(child["variants"])
            summary += summarise_warm_load(stats)
            notes.append(warm_load_note(child, stats))
            extra = {"warm_load": stats, "child_cuda_init_ms": child["cuda_init_ms"],
                     "child_spec_load_ms": child["spec_load_ms"]}
        write_results(out_dir, "machinery_variants", "kgen machinery: cold compile and warm load per variant",
                      variant_rows(cold, child), VARIANT_COLUMNS, env, notes, extra)
    return summary + errors


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == [CHILD_FLAG]:
        print(json.dumps(child_warm_load()))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default $OUT or bench/results/latest)")
    options = parser.parse_args(argv)
    rows = run(options.out or default_out_dir(), options)
    print(markdown_table(rows, SUMMARY_COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
