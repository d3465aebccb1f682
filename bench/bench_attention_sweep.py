"""The seed sweep: kgen's varlen attention over N equal causal sequences of length L, with its peers in the same run.

For each L (around 2^k - 1, 2^k, 2^k + 1 for k = 6..11, and short lengths),
N = min(4096, 131072 // L) sequences, 12 heads, D = 128, bf16, causal:
  - kgen with each tail policy the spec offers (forced with the planner's ``tail=``);
  - kgen on the same N sequences, each padded up to whole tiles of the height that
    policy's plan uses (they run the has_incomplete_tile=false variant);
  - torch's ``varlen_attn`` on the same packed tensors;
  - cuDNN through SDPA on the same sequences as a dense [N, H, L, D] batch (is_causal).
Calls under 50 us are timed as CUDA graph replays over enough input sets to
defeat L2; the rest with the event timer (L2 flushed between repeats).
Bars (observations): tail / padded <= 1.02 at every L for every policy, and
t(2^k - 1) <= 1.01 t(2^k) for k = 6..11, each from its pair timed again alternately
(ABBA, median of per-round ratios; the interleaved per-length times drift by a few percent). Reported without a bar: t(kgen)/t(cuDNN),
t(kgen)/t(varlen_attn) at every L, and the cliff t(2^k + 1)/t(2^k).

Writes bench_attention_sweep.json, .md and .png (skipped with a note without matplotlib).

    PYTHONPATH=. python3 bench/bench_attention_sweep.py [--out DIR] [--attn-only 'sweep L=63'] [--list]
"""

from __future__ import annotations

import argparse
import functools
import math
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

# common first: it puts the repository root on sys.path, so kgen imports without PYTHONPATH.
from common import SUMMARY_COLUMNS, default_out_dir, environment, markdown_table, standalone_parser, time_cuda, time_graph
from attention_common import (DEVICE, DTYPE, DTYPE_NAME, REL_L2_TOL, add_arguments, backend_only, family, plan_for,
                              probe_ms, reference_bhsd, rel_l2, short, mean_and_spread, worst)
from bench_merge_states import input_sets_needed, l2_bytes
import sweep_report
from sweep_report import BOUNDARY_KS, PEERS, boundary_pairs
from kgen.ops import AttentionPlan, attention_varlen

GRAPH_BELOW_MS = 0.05  # kgen calls shorter than this are timed as CUDA graph replays
MAX_INPUT_SETS = 16

SWEEP_LENGTHS = [1, 2, 4, 8, 16, 24, 31, 32, 33, 40, 48, 56, 63, 64, 65, 127, 128, 129, 255, 256, 257,
                 511, 512, 513, 1023, 1024, 1025, 2047, 2048, 2049]
SWEEP_TOKENS = 131072
SWEEP_MAX_SEQS = 4096
SWEEP_HEADS = 12
SWEEP_HEAD_DIM = 128


def sweep_seqs(length: int) -> int:
    return min(SWEEP_MAX_SEQS, SWEEP_TOKENS // length)


def padded_length(length: int, tile: int) -> int:
    return -(-length // tile) * tile


def sweep_name(length: int) -> str:
    return f"sweep L={length}"


def tail_policies() -> list[str]:
    """The tail policies the spec offers at hd128 bf16."""
    return [str(p) for p in family().supported("tail", head_dim=SWEEP_HEAD_DIM, dtype=DTYPE_NAME)]


def equal_cu(num_seqs: int, length: int) -> list[int]:
    return [i * length for i in range(num_seqs + 1)]


# ---- inputs and calls --------------------------------------------------------------------------------

@dataclass
class VarlenBatch:
    """``num_seqs`` causal sequences of ``seqlen`` tokens, with ``len(sets)`` independent input sets."""
    num_seqs: int
    seqlen: int
    cu: torch.Tensor
    sets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = field(default_factory=list)  # q k v out

    @property
    def cu_host(self) -> list[int]:
        return equal_cu(self.num_seqs, self.seqlen)

    @property
    def tokens(self) -> int:
        return self.num_seqs * self.seqlen

    @property
    def set_bytes(self) -> int:
        return 4 * self.tokens * SWEEP_HEADS * SWEEP_HEAD_DIM * DTYPE.itemsize

    def add_sets(self, count: int, gen: torch.Generator) -> None:
        shape = (self.tokens, SWEEP_HEADS, SWEEP_HEAD_DIM)
        for _ in range(count):
            q, k, v = (torch.randn(shape, generator=gen, device=DEVICE, dtype=DTYPE) for _ in range(3))
            self.sets.append((q, k, v, torch.empty_like(q)))


def make_batch(num_seqs: int, seqlen: int, gen: torch.Generator) -> VarlenBatch:
    batch = VarlenBatch(num_seqs, seqlen, torch.tensor(equal_cu(num_seqs, seqlen), dtype=torch.int32, device=DEVICE))
    batch.add_sets(1, gen)
    return batch


def kgen_calls(batch: VarlenBatch, plan: AttentionPlan) -> list[Callable[[], Any]]:
    return [functools.partial(attention_varlen, q, k, v, batch.cu, batch.cu, causal=True, plan=plan, out=out)
            for q, k, v, out in batch.sets]


def varlen_attn_calls(batch: VarlenBatch) -> list[Callable[[], Any]]:
    """torch's varlen_attn (flash) on the same packed tensors; causal is window_size=(-1, 0) in its API."""
    from torch.nn.attention.varlen import varlen_attn
    L = batch.seqlen
    return [functools.partial(varlen_attn, q, k, v, batch.cu, batch.cu, L, L, window_size=(-1, 0))
            for q, k, v, _ in batch.sets]


def cudnn_dense_calls(batch: VarlenBatch) -> list[Callable[[], Any]]:
    """SDPA on contiguous [N, H, L, D] copies of each set (cuDNN is pinned around the timing by the caller)."""
    calls = []
    for q, k, v, _ in batch.sets:
        dense = [t.view(batch.num_seqs, batch.seqlen, SWEEP_HEADS, SWEEP_HEAD_DIM).transpose(1, 2).contiguous()
                 for t in (q, k, v)]
        calls.append(functools.partial(F.scaled_dot_product_attention, *dense, is_causal=True))
    return calls


PEER_CALLS: dict[str, Callable[[VarlenBatch], list[Callable[[], Any]]]] = {
    "varlen": varlen_attn_calls, "cudnn": cudnn_dense_calls,
}
assert set(PEER_CALLS) == set(PEERS), "sweep_report.PEERS names the peers this module times"


def as_packed(peer: str, result: torch.Tensor, batch: VarlenBatch) -> torch.Tensor:
    """A peer's output in kgen's packed [N*L, H, D] layout."""
    if peer == "cudnn":
        return result.transpose(1, 2).reshape(batch.tokens, SWEEP_HEADS, SWEEP_HEAD_DIM)
    return result


def check_batch(batch: VarlenBatch, plan: AttentionPlan) -> tuple[float, bool]:
    """Run set 0 on a NaN-poisoned output; (worst rel L2 of the first and last sequence vs float64, all written)."""
    q, k, v, out = batch.sets[0]
    out.fill_(math.nan)
    attention_varlen(q, k, v, batch.cu, batch.cu, causal=True, plan=plan, out=out)
    torch.cuda.synchronize()
    written = not torch.isnan(out).any().item()
    errors = []
    for i in sorted({0, batch.num_seqs - 1}):
        rows = slice(i * batch.seqlen, (i + 1) * batch.seqlen)
        to_bhsd = lambda t: t[rows].transpose(0, 1).unsqueeze(0)  # noqa: E731
        ref = reference_bhsd(to_bhsd(q), to_bhsd(k), to_bhsd(v), True)
        errors.append(rel_l2(to_bhsd(out), ref))
    err = worst(errors)
    return err, bool(written and err <= REL_L2_TOL)


def time_calls(calls: list[Callable[[], Any]], use_graph: bool, options: argparse.Namespace) -> float:
    """ms per call: graph replays of all input sets in turn (per set), or the event timer on set 0."""
    if use_graph:
        return time_graph(lambda: [call() for call in calls]) / len(calls)
    return time_cuda(calls[0], warmup_ms=options.attn_warmup_ms, rep_ms=options.attn_rep_ms)


# ---- one length --------------------------------------------------------------------------------------

def prepare_peers(batch: VarlenBatch, kgen_out: torch.Tensor, row: dict[str, Any]) -> dict[str, list[Callable[[], Any]]]:
    """Each peer's calls, after one checked run against kgen's output; a peer that fails gets a status, not a crash."""
    calls = {}
    for peer, make in PEER_CALLS.items():
        try:
            peer_calls = make(batch)
            with backend_only(peer):
                result = peer_calls[0]()
            torch.cuda.synchronize()
        except ImportError as exc:
            row[f"{peer}_status"] = f"unavailable: {short(exc)}"
            continue
        except Exception as exc:
            row[f"{peer}_status"] = f"refused: {short(exc)}"
            continue
        err = rel_l2(as_packed(peer, result, batch), kgen_out)
        row[f"{peer}_vs_kgen_rel_l2"] = err
        row[f"{peer}_status"] = "ok" if err <= REL_L2_TOL else f"differs from kgen (rel L2 {err:.1e})"
        calls[peer] = peer_calls
    return calls


def measure_length(length: int, policies: list[str], options: argparse.Namespace) -> dict[str, Any]:
    num_seqs = sweep_seqs(length)
    gen = torch.Generator(device=DEVICE).manual_seed(options.attn_seed * 1000 + 100 + length)
    batch = make_batch(num_seqs, length, gen)
    default_plan = plan_for(batch.cu_host, SWEEP_HEAD_DIM, True)
    row: dict[str, Any] = {"L": length, "seqs": num_seqs, "tokens": batch.tokens,
                           "default_tail": default_plan.variant.param_dict["tail"]}
    errors, correct = [], True

    plans: dict[str, AttentionPlan] = {}
    for policy in policies:
        plans[policy] = plan = plan_for(batch.cu_host, SWEEP_HEAD_DIM, True, policy)
        row[f"variant_{policy}"] = plan.variant.name
        row[f"has_incomplete_tile_{policy}"] = plan.has_incomplete_tile
        row[f"tile_m_{policy}"] = plan.variant.param_dict["tile_m"]
        err, ok = check_batch(batch, plan)
        errors.append(err)
        correct &= ok
    # One padded baseline per tile height in use, run with the no-tail twin of the first policy at that height.
    padded: dict[int, tuple[VarlenBatch, AttentionPlan]] = {}
    for policy in policies:
        tile = row[f"tile_m_{policy}"]
        if tile not in padded:
            padded_batch = make_batch(num_seqs, padded_length(length, tile), gen)
            padded_plan = plan_for(padded_batch.cu_host, SWEEP_HEAD_DIM, True, policy, tile_m=tile)
            padded[tile] = (padded_batch, padded_plan)
            row[f"padded_variant_t{tile}"] = padded_plan.variant.name
            row[f"padded_has_incomplete_tile_t{tile}"] = padded_plan.has_incomplete_tile
            err, ok = check_batch(padded_batch, padded_plan)
            errors.append(err)
            correct &= ok
        row[f"padded_len_{policy}"] = padded[tile][0].seqlen
    row["rel_l2"], row["correct"] = worst(errors), "ok" if correct else "WRONG"
    kgen_out = batch.sets[0][3].clone()  # set 0's output of the last policy checked (each was checked above)

    # One timer for the whole length, picked from the default policy's call: graphs when it is short.
    probe = probe_ms(kgen_calls(batch, default_plan)[0])
    use_graph = probe < GRAPH_BELOW_MS
    row["probe_ms"], row["timer"] = probe, "graph" if use_graph else "events"
    if use_graph:  # replays back to back would hit in L2: rotate over enough input sets
        for b in [batch, *(pb for pb, _ in padded.values())]:
            b.add_sets(min(MAX_INPUT_SETS, input_sets_needed(b.set_bytes, l2_bytes())) - 1, gen)
    row["input_sets"] = len(batch.sets)
    peers = prepare_peers(batch, kgen_out, row)
    del kgen_out

    calls: dict[str, list[Callable[[], Any]]] = {f"ms_{p}": kgen_calls(batch, plans[p]) for p in policies}
    calls.update({f"padded_ms_t{tile}": kgen_calls(pb, pp) for tile, (pb, pp) in padded.items()})
    kgen_keys = set(calls)
    calls.update({f"ms_{peer}": peer_calls for peer, peer_calls in peers.items()})
    times: dict[str, list[float]] = {key: [] for key in calls}
    for _ in range(max(1, options.attn_rounds)):  # interleaved, so drift hits every implementation alike
        for key in [k for k in calls if k in times]:
            peer = key.removeprefix("ms_")
            try:
                with backend_only(peer):
                    times[key].append(time_calls(calls[key], use_graph, options))
            except Exception as exc:  # kgen's failures fail the length; a peer's only loses its column
                if key in kgen_keys:
                    raise
                row[f"{peer}_status"] = f"timing failed: {short(exc)}"
                del times[key]
    spreads = []
    for key, ts in times.items():
        row[key], spread = mean_and_spread(ts)
        row[f"{key}_rounds"] = ts
        spreads.append(spread)
    row["spread_pct"] = max(spreads)
    for policy in policies:
        tile = row[f"tile_m_{policy}"]
        row[f"padded_ms_{policy}"] = row[f"padded_ms_t{tile}"]
        row[f"over_padded_unpaired_{policy}"] = row[f"ms_{policy}"] / row[f"padded_ms_t{tile}"]
        # The bar's ratio is timed again in ABBA pairs: lengths timed seconds apart drift by a few percent.
        times_tail, times_padded = paired_times(calls[f"ms_{policy}"][0], calls[f"padded_ms_t{tile}"][0],
                                                options.attn_tail_rounds, options)
        row[f"over_padded_{policy}"] = statistics.median(t / p for t, p in zip(times_tail, times_padded))
    kgen_ms = row[f"ms_{row['default_tail']}"]
    for peer in PEERS:
        if row.get(f"ms_{peer}"):
            row[f"kgen_over_{peer}"] = kgen_ms / row[f"ms_{peer}"]
    return row


# ---- the boundary bar, timed again in pairs ----------------------------------------------------------

def paired_times(below: Callable[[], Any], at: Callable[[], Any], rounds: int,
                 options: argparse.Namespace) -> tuple[list[float], list[float]]:
    """Event timings of two calls alternated over ``rounds`` (ABBA order), so clock drift hits both alike."""
    times_below, times_at = [], []
    for r in range(rounds):
        order = ((below, times_below), (at, times_at))
        for call, times in (order if r % 2 == 0 else order[::-1]):
            times.append(time_cuda(call, warmup_ms=options.attn_warmup_ms, rep_ms=options.attn_boundary_rep_ms))
    return times_below, times_at


def boundary_rows(sweep: list[dict[str, Any]], policies: list[str], options: argparse.Namespace
                  ) -> list[dict[str, Any]]:
    """The bar's pairs, timed again side by side on fresh inputs: the ratio is the median of the per-round ratios."""
    by_length = {r["L"]: r for r in sweep}
    rows = []
    for k, below, at in boundary_pairs(list(by_length)):
        gen = torch.Generator(device=DEVICE).manual_seed(options.attn_seed * 1000 + 900 + k)
        batches = [make_batch(sweep_seqs(length), length, gen) for length in (below, at)]
        wrong = "WRONG" in (by_length[below].get("correct"), by_length[at].get("correct"))
        for policy in policies:
            row: dict[str, Any] = {"policy": policy, "k": k, "below": below, "at": at,
                                   "correct": "WRONG" if wrong else "ok", "rounds": options.attn_boundary_rounds}
            try:
                calls = [kgen_calls(b, plan_for(b.cu_host, SWEEP_HEAD_DIM, True, policy))[0] for b in batches]
                times_below, times_at = paired_times(*calls, options.attn_boundary_rounds, options)
            except Exception as exc:
                rows.append({**row, "ratio": None, "error": short(exc)})
                continue
            ratios = [b / a for b, a in zip(times_below, times_at)]
            rows.append({**row, "ms_below": statistics.median(times_below), "ms_at": statistics.median(times_at),
                         "ratio": statistics.median(ratios), "ratio_min": min(ratios), "ratio_max": max(ratios),
                         "ms_below_rounds": times_below, "ms_at_rounds": times_at})
        for b in batches:
            b.sets.clear()
        torch.cuda.empty_cache()
    return rows


# ---- entry points ------------------------------------------------------------------------------------

def selected_lengths(options: argparse.Namespace) -> list[int]:
    if options.attn_part == "dense":
        return []
    only = (options.attn_only or "").lower()
    return [length for length in SWEEP_LENGTHS if only in sweep_name(length).lower()]


def error_row(length: int, exc: BaseException) -> dict[str, Any]:
    return {"L": length, "seqs": sweep_seqs(length), "tokens": sweep_seqs(length) * length, "error": short(exc, 300)}


def progress_line(row: dict[str, Any], policies: list[str]) -> str:
    times = ", ".join(f"{p} {row[f'ms_{p}']:.4f} ms (/padded {row[f'over_padded_{p}']:.3f})" for p in policies)
    peers = ", ".join(f"{peer} {row[f'ms_{peer}']:.4f} ms" if row.get(f"ms_{peer}") else f"{peer} {row[f'{peer}_status']}"
                      for peer in PEERS)
    return f"  L={row['L']} (N={row['seqs']}, {row['timer']}): {times}; {peers} ({row['correct']})"


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    """Sweep, boundary pairs; write bench_attention_sweep.{json,md,png}; return the summary rows."""
    lengths = selected_lengths(options)
    if not lengths:
        return []
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: the attention sweep needs one")
    start = time.perf_counter()
    policies = tail_policies()
    print(f"  sweep: tail policies {policies}; peers {list(PEERS)}; padded baselines to whole tiles", flush=True)
    sweep: list[dict[str, Any]] = []
    for length in lengths:
        try:
            row = measure_length(length, policies, options)
        except Exception as exc:
            row = error_row(length, exc)
            print(f"  L={length}: {row['error']}", flush=True)
        else:
            print(progress_line(row, policies), flush=True)
        sweep.append(row)
        torch.cuda.empty_cache()
    try:
        bounds = boundary_rows([r for r in sweep if "error" not in r], policies, options)
    except Exception as exc:  # e.g. out of memory: the sweep's numbers still get written
        bounds = [{"policy": "all", "k": 0, "below": 0, "at": 0, "ratio": None, "error": short(exc, 300)}]
    print(f"  sweep and boundary pairs: {time.perf_counter() - start:.1f} s", flush=True)
    md_path = sweep_report.write_outputs(out_dir, sweep, bounds, policies, environment(), options)
    print(md_path.read_text().split("\n## Environment")[0], flush=True)
    return sweep_report.summary_rows(sweep, bounds, policies)


def main(argv: list[str] | None = None) -> int:
    options = standalone_parser(__doc__, add_arguments).parse_args(argv)
    if options.list:
        policies = tail_policies()
        lengths = selected_lengths(options)
        print(f"sweep: tail policies {policies}; peers {list(PEERS)}; boundary pairs (k in {list(BOUNDARY_KS)}) "
              f"{[f'{b} vs {a}' for _, b, a in boundary_pairs(lengths)]}")
        for length in lengths:
            cu = equal_cu(sweep_seqs(length), length)
            tiles = {p: plan_for(cu, SWEEP_HEAD_DIM, True, p, device="cpu").variant.param_dict["tile_m"] for p in policies}
            padded = ", ".join(f"{p}: tile_m {t}, padded L={padded_length(length, t)}" for p, t in tiles.items())
            print(f"{sweep_name(length)}: N={sweep_seqs(length)}, {sweep_seqs(length) * length} tokens; {padded}")
        return 0
    print(markdown_table(run(options.out or default_out_dir(), options), SUMMARY_COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
