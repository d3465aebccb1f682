"""What kgen's machinery costs around the kernels: cold compiles, warm loads, per-call host overhead.

(a) Cold compile: every variant of every family built with ``kgen.jit.build``
    into a fresh, empty cache folder, for the current device's arch.
(b) Warm load in a fresh process: a child process (same cache folder) times
    ``kgen.jit.load(variant)`` plus ``.kernel(entry)`` for each entry: render,
    key, disk read, integrity check, driver load. Bar: <= 2 ms per kernel
    (the mean over the variants after the first, which pays one-time costs).
(c) Host overhead per call of merge_attention_states on tiny tensors (the GPU
    work is negligible) against ``x.add_(y)`` in the same process, as wall time
    over a loop between two synchronisations. Bar: merge / add_ <= 1.0. For
    context: the op's launch replayed raw, and the floor of any op that returns
    two new tensors (two ``new_empty`` plus a launch of an empty kernel).

Bars are observations, printed with PASS/FAIL, never enforced.

    PYTHONPATH=. python3 bench/bench_machinery.py [--out DIR]
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

# common first: it puts the repository root on sys.path, so kgen imports without PYTHONPATH.
from common import (REPO_ROOT, SUMMARY_COLUMNS, Column, default_out_dir, environment, markdown_table, summary_row,
                    time_graph, verdict, write_results)
from kgen import config, jit, registry

WARM_LOAD_BAR_MS = 2.0
HOST_RATIO_BAR = 1.0
CHILD_FLAG = "--child-warm-load"
CHILD_TIMEOUT_S = 300
RAW_LAUNCH = "cuda.core.launch (the op's launch, replayed raw)"
ALLOCATIONS = "the op's two result allocations alone (new_empty x2)"
EMPTY_LAUNCH = "cuda.core.launch of an empty 1-argument kernel"

VARIANT_COLUMNS: list[Column] = [
    ("variant", "variant", None), ("cold_build_ms", "cold build ms", ".1f"), ("nvrtc_ms", "NVRTC ms", ".1f"),
    ("warm_load_ms", "warm load ms", ".3f"), ("warm_kernels_ms", "warm kernel() ms", ".3f"),
    ("warm_per_kernel_ms", "warm ms/kernel", ".3f"),
]
HOST_COLUMNS: list[Column] = [
    ("call", "call", None), ("host_us", "wall us/call", ".2f"), ("ratio_to_add", "vs add_", ".2f"),
    ("gpu_us_graph", "GPU us/call (graph)", ".2f"), ("bar", "bar", None), ("verdict", "verdict", None),
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


# ---- (c) host overhead per call ---------------------------------------------------------------------

def wall_us_per_call(fn: Callable[[], Any], calls: int) -> float:
    """Mean wall time per call of a loop of ``calls``, synchronised at both ends so queued work is counted."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(calls):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def recorded_launch(op_call: Callable[[], Any]) -> Callable[[], Any]:
    """The exact ``cuda.core.launch`` that ``op_call`` makes (stream, config, kernel, arguments), to replay raw.

    Recorded rather than rebuilt, so it follows the op's kernel signature: the
    floor under the op's host path, for context.
    """
    import kgen.launch

    recorded = []
    real_launch = kgen.launch.launch
    kgen.launch.launch = lambda *args: recorded.append(args)  # kgen.launch calls cuda.core's launch by this name
    try:
        op_call()
    finally:
        kgen.launch.launch = real_launch
    if len(recorded) != 1:
        raise RuntimeError(f"expected the op to make one launch, saw {len(recorded)}")
    return functools.partial(real_launch, *recorded[0])


def new_results_like(v: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The two result allocations merge_attention_states makes (``new_empty`` of v's and lse's shapes)."""
    return v.new_empty(v.shape), lse.new_empty(lse.shape)


def empty_kernel_launch() -> Callable[[], Any]:
    """``cuda.core.launch`` of a kernel with one argument and an empty body, on torch's current stream."""
    from cuda.core import Device, LaunchConfig, Program, ProgramOptions, launch
    from kgen.launch import current_stream

    device = Device(torch.cuda.current_device())
    device.set_current()
    arch = "sm_{}{}".format(*device.compute_capability)
    module = Program('extern "C" __global__ void empty(long long) {}', "c++",
                     ProgramOptions(arch=arch)).compile("cubin")
    return functools.partial(launch, current_stream(torch.cuda.current_device()), LaunchConfig(grid=1, block=32),
                             module.get_kernel("empty"), 1)


def host_overhead(calls: int, rounds: int, warmup_calls: int = 200) -> list[dict[str, Any]]:
    """µs per call of the op (allocating, and with out=), of x.add_(y), and of a raw launch; median over rounds."""
    from kgen.ops import merge_attention_states

    v = torch.randn(2, 1, 8, 128, device="cuda", dtype=torch.bfloat16)  # [S, tokens, heads, head_dim]
    lse = torch.empty(2, 1, 8, device="cuda").uniform_(-5, 5)
    out, lse_out = torch.empty_like(v[0]), torch.empty_like(lse[0])
    x, y = torch.randn(1024, device="cuda"), torch.randn(1024, device="cuda")
    # Bound with functools.partial so every candidate pays the same Python call overhead.
    candidates: dict[str, Callable[[], Any]] = {
        "merge_attention_states": functools.partial(merge_attention_states, v[0], lse[0], v[1], lse[1]),
        "merge_attention_states(out=)": functools.partial(merge_attention_states, v[0], lse[0], v[1], lse[1],
                                                          out=out, lse_out=lse_out),
        "x.add_(y)": functools.partial(x.add_, y),
    }
    try:
        candidates[RAW_LAUNCH] = recorded_launch(candidates["merge_attention_states(out=)"])
    except Exception as exc:  # it leans on kgen.launch's internals; the context is optional
        print(f"  raw launch skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
    # The floor under any op that returns new tensors and launches through cuda.core.
    candidates[ALLOCATIONS] = functools.partial(new_results_like, v[0], lse[0])
    try:
        candidates[EMPTY_LAUNCH] = empty_kernel_launch()
    except Exception as exc:
        print(f"  empty-kernel launch skipped: {type(exc).__name__}: {exc}", file=sys.stderr)
    for fn in candidates.values():
        wall_us_per_call(fn, warmup_calls)  # first use compiles or loads; keep it out
    samples: dict[str, list[float]] = {name: [] for name in candidates}
    for _ in range(rounds):  # interleaved, so drift in clocks or load hits all alike
        for name, fn in candidates.items():
            samples[name].append(wall_us_per_call(fn, calls))
    add_us = statistics.median(samples["x.add_(y)"])
    rows = []
    for name, fn in candidates.items():
        host_us = statistics.median(samples[name])
        gpu_us = None
        # The raw launch is bound to the stream current when it was built, not the capture stream: never capture it.
        if name not in (RAW_LAUNCH, EMPTY_LAUNCH):
            try:
                # The GPU side of the same call: were it close to the wall time, the loop would be device-bound.
                gpu_us = time_graph(fn, replays_per_sample=50, samples=10) * 1e3
            except Exception as exc:
                print(f"  graph timing of {name} failed: {type(exc).__name__}: {exc}", file=sys.stderr)
        is_bar = name == "merge_attention_states"
        rows.append({"call": name, "host_us": host_us, "host_us_rounds": samples[name],
                     "ratio_to_add": host_us / add_us, "gpu_us_graph": gpu_us,
                     "bar": f"<= {HOST_RATIO_BAR}" if is_bar else None,
                     "verdict": verdict(host_us / add_us, HOST_RATIO_BAR, False) if is_bar else None})
    return rows


# ---- the benchmark ----------------------------------------------------------------------------------

def attempt(label: str, errors: list[dict[str, Any]], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None after printing the traceback and noting an ERROR row (the other parts still run)."""
    try:
        return fn(*args)
    except Exception as exc:
        traceback.print_exc()
        errors.append(summary_row("machinery", f"{label} crashed: {type(exc).__name__}: {exc}"[:300], None, "",
                                  "", "ERROR"))
        return None


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
        summary_row("machinery", f"(a) cold compile, {len(cold_ms)} variants: total", sum(cold_ms) / 1e3, "s"),
        summary_row("machinery", "(a) cold compile: mean per variant", statistics.mean(cold_ms), "ms"),
        summary_row("machinery", "(a) cold compile: first variant", cold_ms[0], "ms"),
    ]
    hits = sum(r["cold_cache_hit"] for r in cold)
    if hits:  # the cache folder was fresh, so a hit means the measurement is not what it claims
        out.append(summary_row("machinery", "(a) cold compile: cache hits (should be 0)", hits, "", "0", "FAIL"))
    return out


def summarise_warm_load(stats: dict[str, Any]) -> list[dict[str, Any]]:
    per_kernel = stats["per_kernel_mean_ms_rest"]
    out = [
        summary_row("machinery", "(b) warm load: first kernel (fresh process)", stats["first_kernel_ms"], "ms"),
        summary_row("machinery", "(b) warm load: median of the rest, per variant", stats["rest_median_ms"], "ms"),
        summary_row("machinery", "(b) warm load: mean per kernel (after the first)", per_kernel, "ms",
                    f"<= {WARM_LOAD_BAR_MS}", verdict(per_kernel, WARM_LOAD_BAR_MS, False)),
    ]
    if stats["misses"]:
        out.append(summary_row("machinery", "(b) warm load: cache misses (should be 0)", stats["misses"], "",
                               "0", "FAIL"))
    return out


def summarise_host(host_rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    out = []
    for row in host_rows:
        out.append(summary_row("machinery", f"(c) host: {row['call']}", row["host_us"], "us/call"))
        if row["bar"]:
            out.append(summary_row("machinery", f"(c) host: {row['call']} / x.add_(y)", row["ratio_to_add"], "x",
                                   row["bar"], row["verdict"]))
    by_call = {row["call"]: row for row in host_rows}
    if ALLOCATIONS in by_call and EMPTY_LAUNCH in by_call:
        floor = by_call[ALLOCATIONS]["ratio_to_add"] + by_call[EMPTY_LAUNCH]["ratio_to_add"]
        out.append(summary_row("machinery", "(c) host: floor of an allocating op (empty launch + two allocations) "
                               "/ x.add_(y)", floor, "x"))
    return out


def warm_load_note(child: dict[str, Any], stats: dict[str, Any]) -> str:
    return (f"(b) a fresh process on the same cache: CUDA init {child['cuda_init_ms']:.0f} ms and spec load "
            f"{child['spec_load_ms']:.1f} ms (both outside the timings), then `jit.load` + `.kernel(entry)` for each "
            f"entry. First kernel {_ms(stats['first_kernel_ms'])}, first variant {_ms(stats['first_variant_ms'])}; "
            f"the rest: median {_ms(stats['rest_median_ms'])}, mean {_ms(stats['rest_mean_ms'])} per variant; "
            f"per kernel {_ms(stats['per_kernel_mean_ms_rest'])} (bar <= {WARM_LOAD_BAR_MS} ms), "
            f"{_ms(stats['per_kernel_mean_ms_all'])} with the first; cache misses {stats['misses']}.")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("machinery")
    group.add_argument("--calls", type=int, default=2000, help="calls per host-overhead loop (default 2000)")
    group.add_argument("--host-rounds", type=int, default=5, help="loops per call kind; the median is kept (default 5)")


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    """(a), (b), (c); write machinery_variants.* and machinery_host.*; return the summary rows."""
    errors: list[dict[str, Any]] = []
    summary: list[dict[str, Any]] = []
    env = environment()
    with tempfile.TemporaryDirectory(prefix="kgen-bench-cache-") as tmp:
        cache_dir = Path(tmp) / "cache"
        print(f"(a) cold compile of every variant into {cache_dir}", flush=True)
        cold = attempt("(a) cold compile", errors, cold_compile, cache_dir)
        child = None
        if cold:
            summary += summarise_compile(cold)
            print(f"    {len(cold)} variants, {sum(r['cold_build_ms'] for r in cold) / 1e3:.2f} s", flush=True)
            print("(b) warm load in a fresh process", flush=True)
            child = attempt("(b) warm load", errors, run_child, cache_dir)
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

    print(f"(c) host overhead per call ({options.calls} calls x {options.host_rounds} rounds)", flush=True)
    host_rows = attempt("(c) host overhead", errors, host_overhead, options.calls, max(1, options.host_rounds))
    if host_rows:
        summary += summarise_host(host_rows)
        write_results(out_dir, "machinery_host", "kgen machinery: host overhead per call", host_rows, HOST_COLUMNS,
                      env, [f"Wall time per call over {options.calls} calls between two synchronisations, median "
                            f"of {options.host_rounds} interleaved loops; v [1, 8, 128] bf16. 'GPU us/call' is one "
                            f"call captured in a CUDA graph and replayed (device time, for context). The last two rows "
                            f"are the floor under any op that returns two new tensors and launches through "
                            f"cuda.core: their sum against add_ is the best ratio such an op can reach."])
        print(markdown_table(host_rows, HOST_COLUMNS))
    return summary + errors


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv == [CHILD_FLAG]:
        print(json.dumps(child_warm_load()))
        return 0
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default $OUT or bench/results/latest)")
    add_arguments(parser)
    options = parser.parse_args(argv)
    rows = run(options.out or default_out_dir(), options)
    print(markdown_table(rows, SUMMARY_COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
