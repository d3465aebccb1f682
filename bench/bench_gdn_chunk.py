"""The chunked gated delta rule forward: kgen against FlashQLA and fla, as CUDA graph replays, in one run.

Issue 23's shapes (sequences x length, H/HV), K = V = 128, bf16 q/k/v, fp32 g and beta,
output_final_state=True, k L2-normalised, under two gate regimes:
  - strong: g = logsigmoid(randn), where FlashQLA's split skips the corrections of states that decayed away;
  - flashqla: FlashQLA's own benchmark gates, logsigmoid(randn) / 16 with the first quarter of the v-heads at 0.
kgen runs with a plan made once on the host. The peers (benchmarks only, never dependencies) run in child
processes, one per library, in the same run and on the same inputs: FlashQLA 0.1.3's low-level
``chunk_gated_delta_rule_fwd`` (its split plan is made on the first call and reused, so its replays are
graph-capturable) and fla-core 0.6.0's ``chunk_gated_delta_rule`` (FLA_FLASH_QLA=0). Every library's
result is checked against the float64 chunked reference (tests/gdn_reference.chunked, equal to the
per-token recurrence to 1e-9) on its first 8192 tokens: their o, and the final states of the sequences
they hold whole. Bar (issue 23, to resolve): kgen/FlashQLA <= 1.0 at every shape and regime. Each library's first
call of each shape is timed too, to its synchronisation (kgen's with its plan; a peer's with whatever it compiles for
a shape signature it has not seen, TileLang's or Triton's cache being empty on a fresh machine).

    PYTHONPATH=. python3 bench/bench_gdn_chunk.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Callable, NamedTuple

import torch

from common import (add_peer_rows, environment, gdn_peer, run_standalone, summary_row,
                    time_graph, verdict, write_results)
from kgen.ops import chunk_gated_delta_rule, plan_chunk_gated_delta_rule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import gdn_reference  # noqa: E402

NAME = "bench_gdn_chunk"
HEAD_DIM = 128
#: (sequences, length, H, HV): issue 23's table.
SHAPES = [(1, 32768, 2, 8), (1, 32768, 16, 32), (1, 32768, 16, 64), (1, 8192, 16, 32), (4, 8192, 16, 32),
          (8, 1024, 16, 32), (1, 2048, 32, 32)]
GATES = ("strong", "flashqla")
FLASHQLA_BAR = 1.0
PEERS = ("flashqla", "fla")
COLUMNS = [("shape", "shape", None), ("gates", "gates", None), ("kgen_us", "kgen us", ".1f"),
           ("flashqla_us", "FlashQLA us", ".1f"), ("fla_us", "fla us", ".1f"),
           ("kgen_over_flashqla", "kgen/FlashQLA", ".3f"), ("kgen_over_fla", "kgen/fla", ".3f"),
           ("kgen_first_ms", "kgen first call ms", ".1f"), ("flashqla_first_ms", "FlashQLA first call ms", ".1f"),
           ("fla_first_ms", "fla first call ms", ".1f"), ("segments", "segments", None), ("kgen_rel_rms", "kgen rel RMS", ".1e"),
           ("flashqla_rel_rms", "FlashQLA rel RMS", ".1e"), ("fla_rel_rms", "fla rel RMS", ".1e"),
           ("flashqla_status", "FlashQLA", None), ("fla_status", "fla", None)]


class Case(NamedTuple):
    seqs: int
    length: int
    heads: int
    heads_v: int
    gates: str
    checked_tokens: int = 8192  # the prefix checked against the float64 reference


def flashqla_gates(g: torch.Tensor) -> torch.Tensor:
    """FlashQLA's benchmark gates made from strong ones: divided by 16, the first quarter of the v-heads at 0."""
    g = g / 16
    g[..., : g.shape[-1] // 4] = 0
    return g


def inputs(case: Case) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(case.seqs * case.length + case.heads_v)
    total = case.seqs * case.length
    shape = (1, total, case.heads, HEAD_DIM)
    q = torch.randn(shape, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = gdn_reference.l2norm(torch.randn(shape, generator=gen, device="cuda")).to(torch.bfloat16)
    v = torch.randn(1, total, case.heads_v, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(1, total, case.heads_v, generator=gen, device="cuda"))
    if case.gates == "flashqla":
        g = flashqla_gates(g)
    beta = torch.rand(1, total, case.heads_v, generator=gen, device="cuda")
    cu = torch.arange(case.seqs + 1, dtype=torch.int32) * case.length
    return q, k, v, g, beta, cu


def checked_rel_rms(case: Case, tensors: tuple[torch.Tensor, ...], o: torch.Tensor, final: torch.Tensor) -> float:
    """The larger rel RMS, against the float64 reference, of ``o`` on the case's first ``checked_tokens`` tokens
    (a sequence's prefix is a sequence of its own) and of the final states of the sequences they cover whole."""
    q, k, v, g, beta, _ = tensors
    tokens = min(case.seqs * case.length, case.checked_tokens)
    whole = tokens // case.length  # sequences checked whole; then a prefix of the next one, if any
    checked_cu = [case.length * i for i in range(whole + 1)] + ([tokens] if tokens % case.length else [])
    rows = slice(0, tokens)
    o_ref, s_ref = gdn_reference.chunked(*(t[:, rows] for t in (q, k, v, g, beta)), cu_seqlens=checked_cu)
    error = gdn_reference.rel_rms(o[:, rows], o_ref)
    if whole:
        error = max(error, gdn_reference.rel_rms(final[:whole].float(), s_ref[:whole]))
    return error


def first_call(run: Callable[[], tuple[torch.Tensor, torch.Tensor]]) -> tuple[float, tuple[torch.Tensor, torch.Tensor]]:
    """The wall time of ``run``'s first call, to its synchronisation, in ms, and its result."""
    torch.cuda.synchronize()
    start = time.perf_counter()
    result = run()
    torch.cuda.synchronize()
    return 1e3 * (time.perf_counter() - start), result


def timed(case: Case, tensors: tuple[torch.Tensor, ...], run: Callable[[], tuple[torch.Tensor, torch.Tensor]],
          library: str, first: Callable[[], tuple[torch.Tensor, torch.Tensor]] | None = None) -> dict[str, Any]:
    """``{library}_first_ms``, ``{library}_rel_rms`` and ``{library}_us`` of ``run`` (which returns o and the final
    states); the first call, timed and checked, is ``first``'s where given (one that also makes the plan)."""
    first_ms, (o, final) = first_call(first or run)
    row = {f"{library}_first_ms": first_ms, f"{library}_rel_rms": checked_rel_rms(case, tensors, o, final)}
    del o, final
    torch.cuda.empty_cache()
    row[f"{library}_us"] = 1e3 * time_graph(run, samples=10, replays_per_sample=5)
    return row


def time_kgen(case: Case) -> dict[str, Any]:
    """kgen's row for a case: a plan made once, then checked and timed."""
    tensors = inputs(case)
    q, k, v, g, beta, cu = tensors
    cu_device = cu.cuda()
    plan = None

    def run():
        return chunk_gated_delta_rule(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu_device, plan=plan)

    def plan_and_run():
        nonlocal plan
        plan = plan_chunk_gated_delta_rule(cu, num_heads_v=case.heads_v, head_dim=HEAD_DIM, device="cuda")
        return run()
    row = timed(case, tensors, run, "kgen", plan_and_run)
    return {"segments": len(plan.segments), **row}


def peer_rows(library: str, cases: list[Case]) -> list[dict[str, Any]]:
    """A peer's rows (in a child process: a fault there must not end this run)."""
    fn, status = gdn_peer(library, "chunk_gated_delta_rule_fwd")
    if fn is None:
        return [{f"{library}_status": status}] * len(cases)
    rows = []
    for case in cases:
        tensors = inputs(case)
        q, k, v, g, beta, cu = tensors
        cu_long = cu.to("cuda", torch.long)
        if library == "fla":
            def run():
                return fn(q, k, v, g, beta, output_final_state=True, cu_seqlens=cu_long)
        else:
            def run():  # returns (g cumsum, A, o, h, final state, cp cache)
                results = fn(q, k, v, g, beta, cu_seqlens=cu_long, output_final_state=True)
                return results[2], results[4]
        try:
            rows.append({f"{library}_status": "ok", **timed(case, tensors, run, library)})
        except Exception as exc:
            rows.append({f"{library}_status": f"failed: {type(exc).__name__}: {exc}"[:200]})
        del q, k, v, g, beta, tensors
        torch.cuda.empty_cache()
    return rows


def with_peers(rows: list[dict[str, Any]], cases: list[Case]) -> None:
    """Add each peer's time, error and kgen's ratio to each row (each peer in its own child, after kgen's runs)."""
    torch.cuda.empty_cache()
    for library in PEERS:
        add_peer_rows(rows, library, peer_rows, cases, time_key="us")
    for row in rows:
        print(row, flush=True)


def accuracy_verdict(row: dict[str, Any]) -> str:
    """WRONG where kgen's error is over the bar, or worse than FlashQLA's on the same inputs (beyond 1%)."""
    worse = row.get("flashqla_rel_rms") is not None and row["kgen_rel_rms"] > 1.01 * row["flashqla_rel_rms"]
    return "WRONG" if row["kgen_rel_rms"] > gdn_reference.RMS_BAR or worse else ""


def flashqla_summary(benchmark: str, label: str, row: dict[str, Any]) -> dict[str, Any]:
    """The summary row of kgen/FlashQLA for ``row`` (its bar and verdict; kgen/fla beside it)."""
    if "kgen_over_flashqla" not in row:
        return summary_row(benchmark, f"{label}: kgen {row['kgen_us']:.0f} us; FlashQLA: {row['flashqla_status']}",
                           None, "x")
    fla = f", kgen/fla {row['kgen_over_fla']:.2f}" if "kgen_over_fla" in row else ""
    return summary_row(benchmark, f"{label}: kgen/FlashQLA ({row['kgen_us']:.0f} vs {row['flashqla_us']:.0f} us{fla})",
                       row["kgen_over_flashqla"], "x", f"<= {FLASHQLA_BAR}",
                       accuracy_verdict(row) or verdict(row["kgen_over_flashqla"], FLASHQLA_BAR, False))


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    cases = [Case(*shape, gates) for shape in SHAPES for gates in GATES]
    rows = [{"shape": f"{c.seqs}x{c.length} {c.heads}/{c.heads_v}", "gates": c.gates, **time_kgen(c)} for c in cases]
    with_peers(rows, cases)
    write_results(out_dir, NAME, "Gated delta rule chunked forward", rows, COLUMNS, environment(), notes=[__doc__])
    return [flashqla_summary("gdn chunk", f"{row['shape']} {row['gates']} gates, {row['segments']} segments", row)
            for row in rows]


def main(argv: list[str] | None = None) -> int:
    return run_standalone(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
