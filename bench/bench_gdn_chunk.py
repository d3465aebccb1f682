"""The chunked gated delta rule forward: kgen against fla's chunk_gated_delta_rule, as CUDA graph replays.

The issue's shapes (sequences x length, H/HV), K = V = 128, bf16 q/k/v, fp32 g and beta,
output_final_state=True, k L2-normalised. kgen runs with a plan made once on the host; fla
(fla-core 0.6.0, FLA_FLASH_QLA=0, a peer for benchmarks only) runs in a child process, in the
same run, with the same inputs. kgen's result is first checked against the float64 chunked
reference (tests/gdn_reference.chunked, equal to the per-token recurrence to 1e-9) on its first
8192 tokens: their o, and the final states of the sequences they hold whole.
Bars: kgen/fla time at or below the issue's ratio for each shape.

    PYTHONPATH=. python3 bench/bench_gdn_chunk.py [--out DIR]
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

import torch

from common import environment, fla_gated_delta_rule, run_standalone, summary_row, time_graph, verdict, write_results
from kgen.ops import chunk_gated_delta_rule, plan_chunk_gated_delta_rule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import gdn_reference  # noqa: E402

NAME = "bench_gdn_chunk"
HEAD_DIM = 128
#: (sequences, length, H, HV, fla us measured on the H200 by the issue, bar as t(kgen)/t(fla)).
SHAPES = [(1, 32768, 2, 8, 922, 0.45), (1, 32768, 16, 32, 1933, 0.50), (1, 32768, 16, 64, 3407, 0.50),
          (1, 8192, 16, 32, 489, 0.60), (4, 8192, 16, 32, 1748, 0.35), (8, 1024, 16, 32, 458, 0.35),
          (1, 2048, 32, 32, 139, 0.80)]
COLUMNS = [("shape", "shape", None), ("kgen_us", "kgen us", ".1f"), ("fla_us", "fla us", ".1f"),
           ("kgen_over_fla", "kgen/fla", ".3f"), ("bar", "bar", None), ("segments", "segments", None),
           ("kgen_rel_rms", "kgen rel RMS", ".1e"), ("fla_status", "fla", None)]


def inputs(seqs: int, length: int, heads: int, heads_v: int) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seqs * length + heads_v)
    total = seqs * length
    q = torch.randn(1, total, heads, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = gdn_reference.l2norm(torch.randn(1, total, heads, HEAD_DIM, generator=gen, device="cuda")).to(torch.bfloat16)
    v = torch.randn(1, total, heads_v, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(1, total, heads_v, generator=gen, device="cuda") + 4)
    beta = torch.rand(1, total, heads_v, generator=gen, device="cuda")
    cu = torch.arange(seqs + 1, dtype=torch.int32) * length
    return q, k, v, g, beta, cu


def fla_times_us(shapes: list[tuple]) -> list[tuple[float | None, str]]:
    """fla's forward time per shape (in a child process: a fault there must not end this run)."""
    fla_chunk, status = fla_gated_delta_rule("chunk_gated_delta_rule")
    if fla_chunk is None:
        return [(None, status)] * len(shapes)
    results = []
    for seqs, length, heads, heads_v, *_ in shapes:
        q, k, v, g, beta, cu = inputs(seqs, length, heads, heads_v)
        cu_long = cu.to("cuda", torch.long)
        try:
            results.append((1e3 * time_graph(lambda: fla_chunk(q, k, v, g, beta, output_final_state=True,
                                                                cu_seqlens=cu_long), samples=10, replays_per_sample=5),
                            "ok"))
        except Exception as exc:
            results.append((None, f"failed: {type(exc).__name__}: {exc}"[:200]))
        del q, k, v, g, beta
        torch.cuda.empty_cache()
    return results


def time_kgen(seqs: int, length: int, heads: int, heads_v: int, checked_tokens: int = 8192) -> dict[str, Any]:
    """kgen's forward time for a shape (a plan made once, CUDA graph replays), after checking it against the
    float64 reference on its first ``checked_tokens`` tokens: the o of those tokens (a sequence's prefix is a
    sequence of its own), and the final states of the sequences they cover whole."""
    q, k, v, g, beta, cu = inputs(seqs, length, heads, heads_v)
    cu_device = cu.cuda()
    plan = plan_chunk_gated_delta_rule(cu, num_heads_v=heads_v, head_dim=HEAD_DIM, device="cuda")
    row: dict[str, Any] = {"segments": len(plan.segments)}

    def run():
        return chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu_device, plan=plan)
    o, final = run()
    tokens = min(seqs * length, checked_tokens)
    whole = tokens // length  # sequences checked whole; then a prefix of the next one, if any
    checked_cu = [length * i for i in range(whole + 1)] + ([tokens] if tokens % length else [])
    rows = slice(0, tokens)
    o_ref, s_ref = gdn_reference.chunked(*(t[:, rows] for t in (q, k, v, g, beta)), cu_seqlens=checked_cu)
    row["kgen_rel_rms"] = gdn_reference.rel_rms(o[:, rows], o_ref)
    if whole:
        row["kgen_rel_rms"] = max(row["kgen_rel_rms"], gdn_reference.rel_rms(final[:whole], s_ref[:whole]))
    del o, final, o_ref, s_ref
    torch.cuda.empty_cache()
    row["kgen_us"] = 1e3 * time_graph(run, samples=10, replays_per_sample=5)
    return row


def measure(shape: tuple) -> dict[str, Any]:
    seqs, length, heads, heads_v, _, bar = shape
    return {"shape": f"{seqs}x{length} {heads}/{heads_v}", "bar": f"<= {bar}", **time_kgen(seqs, length, heads, heads_v)}


def with_fla(rows: list[dict[str, Any]], shapes: list[tuple]) -> None:
    """Add fla's time and kgen/fla to each row (fla timed in a child process, after kgen's runs)."""
    torch.cuda.empty_cache()
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            fla = pool.submit(fla_times_us, shapes).result()
        except Exception as exc:  # the child died
            fla = [(None, f"failed: {type(exc).__name__}: {exc}"[:200])] * len(shapes)
    for row, (fla_us, status) in zip(rows, fla):
        row["fla_status"] = status
        if fla_us is not None:
            row["fla_us"], row["kgen_over_fla"] = fla_us, row["kgen_us"] / fla_us
        print(row, flush=True)


def summary_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    ok = "" if row["kgen_rel_rms"] <= gdn_reference.RMS_BAR else "WRONG"
    bar = float(row["bar"].split()[-1])
    if "kgen_over_fla" not in row:
        return [summary_row("gdn chunk", f"{row['shape']}: kgen {row['kgen_us']:.0f} us; fla: {row['fla_status']}",
                            None, "x")]
    return [summary_row("gdn chunk", f"{row['shape']}: kgen/fla ({row['kgen_us']:.0f} vs {row['fla_us']:.0f} us, "
                        f"{row['segments']} segments)", row["kgen_over_fla"], "x", row["bar"],
                        ok or verdict(row["kgen_over_fla"], bar, False))]


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    rows = [measure(shape) for shape in SHAPES]
    with_fla(rows, SHAPES)
    write_results(out_dir, NAME, "Gated delta rule chunked forward", rows, COLUMNS, environment(), notes=[__doc__])
    return [s for r in rows for s in summary_rows(r)]


def main(argv: list[str] | None = None) -> int:
    return run_standalone(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
