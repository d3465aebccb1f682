"""The gated delta rule's decode step: kgen against fla's fused_recurrent_gated_delta_rule used as a
step, and against a device copy of the state's bytes, all as CUDA graph replays in one run (fla in a
child process per batch size, since it faults at B = 1024).

B sequences of one token, H/HV = 16/32, K = V = 128, bf16, fp32 states [B, HV, K, V] (kv) updated in
place by kgen (fla writes its final state to a new tensor). Each graph holds one step per state pool
and rotates over pools that together exceed L2 (32 at B = 1, where a step is shorter than a graph
launch; 1 from B = 64 on), so every step reads its states from HBM, as a server's layers do. The
state is read and written once per step, as a copy of it reads and writes it: bandwidth fraction =
t(copy) / t(kgen). Bars (observations): fraction >= 0.85 at B >= 64; t(kgen)/t(fla) <= 0.80 at B >=
64 and <= 0.6 at B = 1. fla-core is a peer for this benchmark only (FLA_FLASH_QLA=0), never a
dependency.

    PYTHONPATH=. python3 bench/bench_gdn_step.py [--out DIR]
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
from kgen.ops import gated_delta_rule_step

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
import gdn_reference  # noqa: E402  (the float64 recurrence, to check kgen's result before timing it)

NAME = "bench_gdn_step"
BATCHES = [1, 64, 256, 1024]
HEADS, HEADS_V, HEAD_DIM = 16, 32, 128
BANDWIDTH_BAR, FLA_BAR, FLA_BAR_B1 = 0.85, 0.80, 0.6
ROTATION = 32  # the most state pools a timed graph rotates over
COLUMNS = [("B", "B", None), ("state_copies", "pools", None), ("kgen_us", "kgen us", ".2f"), ("fla_us", "fla us", ".2f"),
           ("copy_us", "copy us", ".2f"),
           ("bandwidth_fraction", "copy/kgen", ".3f"), ("kgen_over_fla", "kgen/fla", ".3f"),
           ("kgen_rel_rms", "kgen rel RMS", ".1e"), ("fla_status", "fla", None)]


def state_copies(state_bytes: int) -> int:
    """How many state pools the timed calls rotate over: enough that they do not fit in L2 together (a
    server's step reads a layer's states from HBM), at most ROTATION."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return max(1, min(ROTATION, -(-2 * l2 // state_bytes)))


def inputs(batch: int) -> tuple[torch.Tensor, ...]:
    """q, k (L2-normalised), v, g, beta and the states (``state_copies`` pools, each [B, HV, K, V]), the same
    for a batch size in any process."""
    gen = torch.Generator(device="cuda").manual_seed(batch)
    q = torch.randn(batch, HEADS, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = gdn_reference.l2norm(torch.randn(batch, HEADS, HEAD_DIM, generator=gen, device="cuda")).to(torch.bfloat16)
    v = torch.randn(batch, HEADS_V, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    g = -torch.nn.functional.softplus(torch.randn(batch, HEADS_V, generator=gen, device="cuda"))
    beta = torch.rand(batch, HEADS_V, generator=gen, device="cuda")
    state = torch.randn(batch, HEADS_V, HEAD_DIM, HEAD_DIM, generator=gen, device="cuda")
    copies = state_copies(state.numel() * state.element_size())
    return q, k, v, g, beta, torch.stack([state] * copies)


def fla_time_us(batch: int) -> tuple[float | None, str]:
    """fla's step time at ``batch``, timed like kgen's, or why there is none. Run in a child process:
    fla 0.6.0 faults (illegal address) at B = 1024, and a fault ends every later CUDA call of its process."""
    step, status = fla_gated_delta_rule("fused_recurrent_gated_delta_rule")
    if step is None:
        return None, status
    q, k, v, g, beta, states = inputs(batch)

    def fla_call(i=0):
        return step(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], initial_state=states[i],
                    output_final_state=True)
    try:
        return 1e3 * time_graph(fla_call, calls_per_graph=len(states)), "ok"
    except Exception as exc:
        return None, f"failed: {type(exc).__name__}: {exc}"[:200]


def measure(batch: int) -> dict[str, Any]:
    q, k, v, g, beta, states = inputs(batch)
    state = states[0]
    row: dict[str, Any] = {"B": batch, "state_copies": len(states)}

    # Correctness on these inputs first (one step from a copy of the state).
    checked = state.clone()
    out = torch.full_like(v, float("nan"))
    gated_delta_rule_step(q, k, v, g, beta, checked, out=out)
    o_ref, s_ref = gdn_reference.recurrent(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None],
                                           initial_state=state)
    row["kgen_rel_rms"] = max(gdn_reference.rel_rms(out, o_ref[:, 0]), gdn_reference.rel_rms(checked, s_ref))
    del checked, o_ref, s_ref

    # Small batches: many steps per graph, over states that together exceed L2.
    calls = len(states)
    row["kgen_us"] = 1e3 * time_graph(lambda i=0: gated_delta_rule_step(q, k, v, g, beta, states[i], out=out),
                                      calls_per_graph=calls)
    copy_dst = torch.empty_like(states)
    row["copy_us"] = 1e3 * time_graph(lambda i=0: copy_dst[i].copy_(states[i]), calls_per_graph=calls)
    row["bandwidth_fraction"] = row["copy_us"] / row["kgen_us"]
    del q, k, v, g, beta, state, states, copy_dst
    torch.cuda.empty_cache()  # the child below needs the memory
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        try:
            row["fla_us"], row["fla_status"] = pool.submit(fla_time_us, batch).result()
        except Exception as exc:  # the child died
            row["fla_us"], row["fla_status"] = None, f"failed: {type(exc).__name__}: {exc}"[:200]
    if row["fla_us"] is None:
        del row["fla_us"]
    else:
        row["kgen_over_fla"] = row["kgen_us"] / row["fla_us"]
    return row


def summary_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    b, out = row["B"], []
    ok = "" if row["kgen_rel_rms"] <= gdn_reference.RMS_BAR else "WRONG"
    out.append(summary_row("gdn step", f"B={b}: copy/kgen state bandwidth ({row['kgen_us']:.1f} vs copy "
                           f"{row['copy_us']:.1f} us; rel RMS {row['kgen_rel_rms']:.1e})", row["bandwidth_fraction"],
                           "x", f">= {BANDWIDTH_BAR}" if b >= 64 else "",
                           ok or (verdict(row["bandwidth_fraction"], BANDWIDTH_BAR, True) if b >= 64 else "")))
    if "kgen_over_fla" in row:
        bar = FLA_BAR if b >= 64 else FLA_BAR_B1
        out.append(summary_row("gdn step", f"B={b}: kgen/fla ({row['kgen_us']:.1f} vs {row['fla_us']:.1f} us)",
                               row["kgen_over_fla"], "x", f"<= {bar}", ok or verdict(row["kgen_over_fla"], bar, False)))
    else:
        out.append(summary_row("gdn step", f"B={b}: kgen/fla: {row['fla_status']}", None, "x"))
    return out


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for batch in BATCHES:
        rows.append(measure(batch))
        print(rows[-1], flush=True)
    write_results(out_dir, NAME, "Gated delta rule decode step", rows, COLUMNS, environment(), notes=[__doc__])
    return [s for r in rows for s in summary_rows(r)]


def main(argv: list[str] | None = None) -> int:
    return run_standalone(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
