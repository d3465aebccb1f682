"""Shared helpers for kgen's GPU benchmarks: device timers, result files, the run's environment.

Nothing here touches the GPU at import time, and Triton is imported only when
a timer first runs, so the benchmarks import (and their CPU parts run) on a
machine with neither.
"""

from __future__ import annotations

import argparse
import datetime
import importlib
import json
import multiprocessing
import os
import platform
import statistics
import subprocess
import sys
import traceback
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any, Callable, Sequence

import torch

REPO_ROOT = Path(__file__).resolve().parent.parent
# The benchmarks run as scripts: let them import kgen without PYTHONPATH, but last, so that a kgen named on
# PYTHONPATH (another tree, in an A/B) is the one imported. Inserted first, this checkout's kgen shadowed it, and
# A/Bs of two trees ran this one twice (bench/NOTES.md, twenty-ninth session).
if str(REPO_ROOT) not in sys.path:
    sys.path.append(str(REPO_ROOT))
DEFAULT_OUT = REPO_ROOT / "bench" / "results" / "latest"
_L2_FLUSH_BYTES = 256 * 1024 * 1024  # what triton.testing.do_bench writes between repeats

# "triton.testing.do_bench" or "cuda events"; set when a timer first runs.
_timer_in_use: str | None = None
_triton_failed = False
_flush_buffer: torch.Tensor | None = None


def default_out_dir() -> Path:
    """``$OUT`` (the device tool's output folder) if set, else ``bench/results/latest``."""
    return Path(os.environ["OUT"]) if os.environ.get("OUT") else DEFAULT_OUT


def timer_in_use() -> str:
    return _timer_in_use or "not used yet"


def _flush_l2() -> None:
    # Writing a buffer larger than L2 before each repeat evicts the previous repeat's
    # data, so every repeat reads from device memory (as do_bench does).
    global _flush_buffer
    if _flush_buffer is None:
        _flush_buffer = torch.empty(_L2_FLUSH_BYTES, dtype=torch.int8, device="cuda")
    _flush_buffer.zero_()


def _time_with_events(fn: Callable[[], Any], warmup_ms: float, rep_ms: float) -> float:
    """Median ms of ``fn`` with one event pair per repeat; sizes the loops from a first estimate like do_bench."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(5):
        _flush_l2()
        fn()
    end.record()
    torch.cuda.synchronize()
    estimate_ms = max(start.elapsed_time(end) / 5, 1e-3)
    for _ in range(max(1, int(warmup_ms / estimate_ms))):
        fn()
    repeats = min(10_000, max(10, int(rep_ms / estimate_ms)))
    pairs = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(repeats)]
    for begin, finish in pairs:
        _flush_l2()
        begin.record()
        fn()
        finish.record()
    torch.cuda.synchronize()
    return statistics.median(begin.elapsed_time(finish) for begin, finish in pairs)


def time_cuda(fn: Callable[[], Any], *, warmup_ms: float = 25, rep_ms: float = 100) -> float:
    """Median device time of one call of ``fn`` in ms: Triton's do_bench if it works here, else CUDA events.

    Both flush L2 between repeats, so the two timers measure the same thing.
    """
    global _timer_in_use, _triton_failed
    if not _triton_failed:
        try:
            import triton.testing
            ms = triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")
            _timer_in_use = "triton.testing.do_bench"
            return float(ms)
        except Exception as exc:  # absent, or its driver helper cannot build here
            _triton_failed = True
            print(f"note: triton.testing.do_bench unavailable ({type(exc).__name__}: {exc}); "
                  f"timing with CUDA events", file=sys.stderr)
    _timer_in_use = "cuda events"
    return _time_with_events(fn, warmup_ms, rep_ms)


def time_graph(fn: Callable[..., Any], replays_per_sample: int = 100, samples: int = 20, calls_per_graph: int = 1) -> float:
    """Median device ms per call of ``fn`` captured in a CUDA graph and replayed back to back.

    Graph replay removes the host's launch cost, so this is the GPU-side time of
    the work (launch gaps included) for work too small to time call by call. For work
    shorter than a graph launch, ``calls_per_graph`` > 1 captures that many calls,
    ``fn(0)`` ... ``fn(n - 1)`` (so that each may use its own buffers), in one graph.
    """
    calls = (lambda: fn()) if calls_per_graph == 1 else (lambda: [fn(i) for i in range(calls_per_graph)])
    # Warm up on a side stream before capture, as torch.cuda.graphs' docs require
    # (lazy init, allocator pools and module loads must not happen during capture).
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            calls()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        calls()
    graph.replay()
    torch.cuda.synchronize()
    per_call = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays_per_sample):
            graph.replay()
        end.record()
        torch.cuda.synchronize()
        per_call.append(start.elapsed_time(end) / (replays_per_sample * calls_per_graph))
    return statistics.median(per_call)


def verdict(value: float | None, bar: float, higher_is_better: bool) -> str:
    """PASS/FAIL of an observation against its bar; bars are reported, never enforced."""
    if value is None or value != value:  # missing or NaN
        return "n/a"
    ok = value >= bar if higher_is_better else value <= bar
    return "PASS" if ok else "FAIL"


def git_commit() -> str:
    """``KGEN_COMMIT`` (the device copy of the tree may have no .git), else ``git rev-parse HEAD``, else "unknown"."""
    if os.environ.get("KGEN_COMMIT"):
        return os.environ["KGEN_COMMIT"]
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO_ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return result.stdout.strip() if result.returncode == 0 and result.stdout.strip() else "unknown"


def environment() -> dict[str, Any]:
    """What a reader needs to compare two runs: GPU, versions, commit, date, timer."""
    env: dict[str, Any] = {
        "date_utc": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "git_commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda or "none",
        "gpu": "none",
        "timer": timer_in_use(),
    }
    try:
        import cuda.core
        env["cuda_core"] = cuda.core.__version__
    except Exception:
        env["cuda_core"] = "unavailable"
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(torch.cuda.current_device())
        env["gpu"] = props.name
        env["sm_count"] = props.multi_processor_count
        env["compute_capability"] = f"{props.major}.{props.minor}"
        env["gpu_memory_gib"] = round(props.total_memory / 2**30, 1)
        env["l2_cache_mb"] = round(getattr(props, "L2_cache_size", 0) / 1e6, 1)
        try:
            from cuda.bindings import driver
            err, version = driver.cuDriverGetVersion()
            ok = err == driver.CUresult.CUDA_SUCCESS
            env["cuda_driver"] = f"{version // 1000}.{version % 1000 // 10}" if ok else "unknown"
        except Exception:
            env["cuda_driver"] = "unknown"
    return env


# A column of a results table: (key in the row dicts, header, format spec or None for str()).
Column = tuple[str, str, str | None]


def _cell(value: Any, fmt: str | None) -> str:
    if value is None:
        return "-"
    if fmt is None or not isinstance(value, (int, float)) or isinstance(value, bool):
        return str(value).replace("|", "\\|").replace("\n", " ")  # keep the table one row per line
    return format(value, fmt)


def markdown_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column]) -> str:
    lines = ["| " + " | ".join(header for _, header, _ in columns) + " |",
             "|" + "|".join(" --- " for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_cell(row.get(key), fmt) for key, _, fmt in columns) + " |")
    return "\n".join(lines) + "\n"


def environment_lines(env: dict[str, Any]) -> str:
    return "".join(f"- {key}: {value}\n" for key, value in env.items())


def write_results(out_dir: Path, name: str, title: str, rows: Sequence[dict[str, Any]],
                  columns: Sequence[Column], env: dict[str, Any], notes: Sequence[str] = (),
                  extra: dict[str, Any] | None = None) -> tuple[Path, Path]:
    """Write ``name.json`` (every field of every row, and ``extra``) and ``name.md`` (the table) into ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    json_path, md_path = out_dir / f"{name}.json", out_dir / f"{name}.md"
    document = {"title": title, "env": env, "notes": list(notes), **(extra or {}), "rows": list(rows)}
    json_path.write_text(json.dumps(document, indent=2, default=str) + "\n")
    notes_md = "".join(f"{note}\n\n" for note in notes)
    md_path.write_text(f"# {title}\n\n{notes_md}{markdown_table(rows, columns)}\n## Environment\n\n"
                       f"{environment_lines(env)}")
    return json_path, md_path


# The rows every benchmark hands to run_all's summary.
SUMMARY_COLUMNS: list[Column] = [
    ("benchmark", "benchmark", None), ("metric", "metric", None), ("value", "value", ".4g"),
    ("unit", "unit", None), ("bar", "bar", None), ("verdict", "verdict", None),
]


def summary_row(benchmark: str, metric: str, value: float | None, unit: str,
                bar: str = "", result: str = "") -> dict[str, Any]:
    return {"benchmark": benchmark, "metric": metric, "value": value, "unit": unit, "bar": bar, "verdict": result}


def attempt(benchmark: str, label: str, errors: list[dict[str, Any]], fn: Callable[..., Any], *args: Any) -> Any:
    """``fn(*args)``, or None after printing the traceback and adding an ERROR row to ``errors``.

    A benchmark wraps each measured part in this, so one crash costs that part's
    numbers and never the rest of a GPU run.
    """
    try:
        return fn(*args)
    except Exception as exc:
        traceback.print_exc()
        errors.append(summary_row(benchmark, f"{label} crashed: {type(exc).__name__}: {exc}"[:300], None, "", "",
                                  "ERROR"))
        return None


def standalone_parser(doc: str | None, add_arguments: Callable[[argparse.ArgumentParser], None]) -> argparse.ArgumentParser:
    """The command line of a benchmark run on its own: --out, --list, and its own options."""
    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=None, help="results folder (default $OUT or bench/results/latest)")
    parser.add_argument("--list", action="store_true", help="print the cases and exit")
    add_arguments(parser)
    return parser


def run_standalone(doc: str | None, run: Callable[[Path, argparse.Namespace], Any], argv: list[str] | None = None) -> int:
    """A benchmark with no options of its own, run on its own: ``run(out_dir, options)``."""
    options = standalone_parser(doc, lambda parser: None).parse_args(argv)
    run(options.out or default_out_dir(), options)
    return 0


def peer_function(module: str, name: str) -> tuple[Callable | None, str]:
    """``<module>.<name>`` of a benchmark peer (never a dependency), or None and the reason it is not there."""
    try:
        found = importlib.import_module(module)
    except Exception as exc:  # not installed, or it fails to import on this machine
        return None, f"unavailable: {type(exc).__name__}: {exc}"[:200]
    return getattr(found, name), "ok"


def add_peer_rows(rows: list[dict[str, Any]], library: str, rows_of: Callable[..., list[dict[str, Any]]], *args: Any,
                  time_key: str) -> None:
    """Each of ``rows`` updated with the peer's row from ``rows_of(library, *args)``, run in a spawned child process
    (a peer's fault there must not end this run; then the rows say how the child died), and kgen's time over the
    peer's as ``kgen_over_<library>`` where the peer has ``<library>_<time_key>``."""
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            found = pool.submit(rows_of, library, *args).result()
        except Exception as exc:  # the child died
            found = [{f"{library}_status": f"failed: {type(exc).__name__}: {exc}"[:200]}] * len(rows)
    for row, peer in zip(rows, found):
        row.update(peer)
        if f"{library}_{time_key}" in peer:
            row[f"kgen_over_{library}"] = row[f"kgen_{time_key}"] / peer[f"{library}_{time_key}"]


def gdn_peer(library: str, flashqla_name: str) -> tuple[Callable | None, str]:
    """A GDN benchmark's peer function: fla's ``chunk_gated_delta_rule``, or FlashQLA's ``flashqla_name``."""
    if library == "fla":
        return fla_gated_delta_rule("chunk_gated_delta_rule")
    return peer_function("flash_qla", flashqla_name)


def fla_gated_delta_rule(name: str) -> tuple[Callable | None, str]:
    """``fla.ops.gated_delta_rule.<name>`` (fla-core; FLA_FLASH_QLA=0 keeps fla 0.6 from dispatching to FlashQLA)."""
    os.environ.setdefault("FLA_FLASH_QLA", "0")
    return peer_function("fla.ops.gated_delta_rule", name)
