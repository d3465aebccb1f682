"""Bandwidth of kgen's merge_attention_states(_n) against a device copy of the same bytes, in the same run.

The merge reads every partial's v and lse once and writes one v and one lse, so
its floor is the bytes it moves over the copy bandwidth. For each shape the
merge and a ``dst.copy_(src)`` that moves the same bytes (read + written) are
timed in alternation, twice, and the ratio of their bandwidths is reported.
Bar (an observation, never enforced): merge/copy >= 0.85 once the inputs' v is
at least 256 MB, where launch and tail effects no longer matter.

    PYTHONPATH=. python3 bench/bench_merge_states.py [--out DIR] [--only bf16]
"""

from __future__ import annotations

import argparse
import functools
import itertools
import math
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch

# common first: it puts the repository root on sys.path, so kgen imports without PYTHONPATH.
from common import (SUMMARY_COLUMNS, standalone_parser, Column, default_out_dir, environment, markdown_table, summary_row, time_cuda,
                    verdict, write_results)
from kgen.ops import merge_attention_states, merge_attention_states_n
from kgen.runtime.dispatch import DTYPE_NAMES

RATIO_BAR = 0.85
BAR_MIN_V_BYTES = 256e6  # the bar applies once the inputs' v (all partials) reaches 256 MB
EMPTY_FRACTION = 0.01  # share of partials with lse = -inf (saw no keys)
CHECK_TOKENS = 2048  # tokens compared against the float64 reference before timing
REL_TOL = {torch.bfloat16: 1e-2, torch.float16: 2e-3, torch.float32: 1e-5}


@dataclass(frozen=True)
class Case:
    name: str
    partials: int
    stacked: bool  # merge_attention_states_n on [S, ...] tensors, else the 2-way merge_attention_states
    tokens: int
    heads: int
    head_dim: int
    dtype: torch.dtype

    @property
    def v_bytes_per_partial(self) -> int:
        return self.tokens * self.heads * self.head_dim * self.dtype.itemsize

    @property
    def lse_bytes_per_partial(self) -> int:
        return self.tokens * self.heads * 4

    @property
    def traffic_bytes(self) -> int:
        """Fewest bytes the merge moves: every partial's v and lse read once, one v and one lse written."""
        per_state = self.v_bytes_per_partial + self.lse_bytes_per_partial
        return self.partials * per_state + per_state

    @property
    def bar_applies(self) -> bool:
        return self.partials * self.v_bytes_per_partial >= BAR_MIN_V_BYTES


def _two_way(tokens: int, head_dim: int, dtype: torch.dtype, heads: int = 32, label: str = "") -> Case:
    mib = tokens * heads * head_dim * dtype.itemsize / 2**20
    name = f"2-way {DTYPE_NAMES[dtype]} hd{head_dim} {mib:.0f} MiB/partial{label}"
    return Case(name, 2, False, tokens, heads, head_dim, dtype)


def _n_way(partials: int, tokens: int, head_dim: int = 128, dtype: torch.dtype = torch.bfloat16,
           heads: int = 32) -> Case:
    mib = partials * tokens * heads * head_dim * dtype.itemsize / 2**20
    return Case(f"S={partials} {DTYPE_NAMES[dtype]} hd{head_dim} {mib:.0f} MiB in", partials, True,
                tokens, heads, head_dim, dtype)


CASES = [
    _two_way(8192, 128, torch.bfloat16),      # 64 MiB per partial: under the bar's size
    _two_way(32768, 128, torch.bfloat16),     # 256 MiB
    _two_way(131072, 128, torch.bfloat16),    # 1 GiB
    _two_way(16384, 128, torch.float32),      # 256 MiB
    _two_way(65536, 64, torch.bfloat16),      # 256 MiB
    _two_way(16384, 256, torch.bfloat16),     # 256 MiB
    # 8 heads x 131071 tokens is not a whole number of tiles: the with-tail variant runs.
    _two_way(131071, 128, torch.bfloat16, heads=8, label=" (tail tile)"),
    _n_way(4, 16384),                         # 4 x 128 MiB
    _n_way(8, 8192),                          # 8 x 64 MiB
]

COLUMNS: list[Column] = [
    ("case", "case", None), ("tokens", "tokens", "d"), ("heads", "heads", "d"),
    ("traffic_mb", "MB moved", ".0f"), ("input_sets", "sets", "d"),
    ("merge_ms", "merge ms", ".4f"), ("merge_gbs", "merge GB/s", ".0f"), ("copy_gbs", "copy GB/s", ".0f"),
    ("ratio", "merge/copy", ".3f"), ("spread_pct", "spread %", ".1f"), ("bar", "bar", None),
    ("verdict", "verdict", None), ("v_rel_err", "v rel err", ".1e"), ("correct", "correct", None),
]


def input_sets_needed(working_set_bytes: int, l2_bytes: int) -> int:
    """One set when the data dwarfs L2 (>= 3x); else enough sets that consecutive calls cannot hit in L2."""
    if working_set_bytes >= 3 * l2_bytes:
        return 1
    return max(2, math.ceil(3 * l2_bytes / working_set_bytes))


def l2_bytes() -> int:
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return getattr(props, "L2_cache_size", 0) or 60 * 10**6  # H200: 60 MB


def random_partials(case: Case, gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """v [S, T, H, D] standard normal (never zeros); lse [S, T, H] uniform in [-5, 5] with a few -inf."""
    v = torch.randn((case.partials, case.tokens, case.heads, case.head_dim), generator=gen,
                    device="cuda", dtype=case.dtype)
    lse = torch.empty((case.partials, case.tokens, case.heads), device="cuda").uniform_(-5, 5, generator=gen)
    empty = torch.rand(lse.shape, generator=gen, device="cuda") < EMPTY_FRACTION
    lse.masked_fill_(empty, -math.inf)
    return v, lse


def merge_call(case: Case, v: torch.Tensor, lse: torch.Tensor, out: torch.Tensor,
               lse_out: torch.Tensor) -> Callable[[], Any]:
    """One merge with preallocated outputs, arguments bound ahead so the timed call does no slicing."""
    if case.stacked:
        return functools.partial(merge_attention_states_n, v, lse, out=out, lse_out=lse_out)
    return functools.partial(merge_attention_states, v[0], lse[0], v[1], lse[1], out=out, lse_out=lse_out)


def reference(v: torch.Tensor, lse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """float64 merge of v [S, T, H, D], lse [S, T, H]; partials with lse = -inf contribute nothing."""
    lse64 = lse.double()
    top = lse64.amax(0)
    top = torch.where(torch.isinf(top), torch.zeros_like(top), top)
    weight = torch.exp(lse64 - top)
    total = weight.sum(0)
    v_sum = (weight.unsqueeze(-1) * v.double()).sum(0)
    v_ref = v_sum / torch.where(total > 0, total, torch.ones_like(total)).unsqueeze(-1)
    lse_ref = torch.where(total > 0, top + torch.log(total), torch.full_like(total, -math.inf))
    return v_ref, lse_ref


def check_merge(case: Case, call: Callable[[], Any], v: torch.Tensor, lse: torch.Tensor,
                out: torch.Tensor, lse_out: torch.Tensor) -> tuple[float, bool]:
    """Run once on NaN-poisoned outputs; return (relative error of v on the first tokens, all correct)."""
    out.fill_(math.nan)
    lse_out.fill_(math.nan)
    call()
    torch.cuda.synchronize()
    n = min(case.tokens, CHECK_TOKENS)
    v_ref, lse_ref = reference(v[:, :n], lse[:, :n])
    v_got, lse_got = out[:n].double(), lse_out[:n].double()
    rel_err = (torch.linalg.vector_norm(v_got - v_ref) / torch.linalg.vector_norm(v_ref)).item()
    finite = torch.isfinite(lse_ref)
    lse_ok = (torch.equal(torch.isinf(lse_got), ~finite)
              and torch.allclose(lse_got[finite], lse_ref[finite], rtol=1e-5, atol=1e-5))
    written = not (torch.isnan(out).any().item() or torch.isnan(lse_out).any().item())
    return rel_err, bool(written and lse_ok and rel_err <= REL_TOL[case.dtype])


def measure_case(case: Case, warmup_ms: float, rep_ms: float, rounds: int, seed: int) -> dict[str, Any]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    sets = input_sets_needed(case.traffic_bytes, l2_bytes())
    merges, copies = [], []
    rel_err, correct = math.nan, True
    for i in range(sets):
        v, lse = random_partials(case, gen)
        out = torch.empty(v.shape[1:], dtype=v.dtype, device="cuda")
        lse_out = torch.empty(lse.shape[1:], dtype=torch.float32, device="cuda")
        call = merge_call(case, v, lse, out, lse_out)
        if i == 0:
            rel_err, correct = check_merge(case, call, v, lse, out, lse_out)
        merges.append(call)
        # The copy moves the merge's bytes: half read from src, half written to dst.
        src = torch.randn(case.traffic_bytes // 8, generator=gen, device="cuda")
        copies.append(functools.partial(torch.empty_like(src).copy_, src))
    copy_bytes = 2 * copies[0].args[0].numel() * 4
    next_merge, next_copy = itertools.cycle(merges), itertools.cycle(copies)

    # Alternate merge and copy, and time each more than once: the spread between
    # rounds says how much of a difference is noise.
    merge_ms, copy_ms = [], []
    for _ in range(rounds):
        merge_ms.append(time_cuda(lambda: next(next_merge)(), warmup_ms=warmup_ms, rep_ms=rep_ms))
        copy_ms.append(time_cuda(lambda: next(next_copy)(), warmup_ms=warmup_ms, rep_ms=rep_ms))
    merge_t, copy_t = sum(merge_ms) / rounds, sum(copy_ms) / rounds
    spread = max((max(t) - min(t)) / min(t) for t in (merge_ms, copy_ms)) * 100
    merge_gbs, copy_gbs = case.traffic_bytes / merge_t / 1e6, copy_bytes / copy_t / 1e6
    ratio = merge_gbs / copy_gbs
    bar = f">= {RATIO_BAR}" if case.bar_applies else None
    return {
        "case": case.name, "partials": case.partials, "stacked": case.stacked, "dtype": DTYPE_NAMES[case.dtype],
        "head_dim": case.head_dim, "tokens": case.tokens, "heads": case.heads,
        "v_mib_per_partial": case.v_bytes_per_partial / 2**20, "traffic_mb": case.traffic_bytes / 1e6,
        "copy_mb": copy_bytes / 1e6, "input_sets": sets,
        "merge_ms": merge_t, "merge_ms_rounds": merge_ms, "copy_ms": copy_t, "copy_ms_rounds": copy_ms,
        "merge_gbs": merge_gbs, "copy_gbs": copy_gbs, "ratio": ratio, "spread_pct": spread,
        "bar": bar, "verdict": verdict(ratio, RATIO_BAR, True) if case.bar_applies else None,
        "v_rel_err": rel_err, "correct": "ok" if correct else "WRONG",
    }


def error_row(case: Case, exc: BaseException) -> dict[str, Any]:
    return {"case": case.name, "tokens": case.tokens, "heads": case.heads, "traffic_mb": case.traffic_bytes / 1e6,
            "verdict": "ERROR", "error": f"{type(exc).__name__}: {exc}"}


def selected_cases(only: str | None) -> list[Case]:
    return [c for c in CASES if not only or only.lower() in c.name.lower()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("merge bandwidth")
    group.add_argument("--warmup-ms", type=float, default=25, help="warm-up per timing, ms (default 25)")
    group.add_argument("--rep-ms", type=float, default=100, help="timed repeats per timing, ms (default 100)")
    group.add_argument("--rounds", type=int, default=2, help="times each of merge and copy is timed (default 2)")
    group.add_argument("--only", default=None, help="only cases whose name contains this text")
    group.add_argument("--seed", type=int, default=0)


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    """Time every selected case, write merge_states.{json,md}, return the summary rows."""
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: the merge bandwidth benchmark needs one")
    rows = []
    for case in selected_cases(options.only):
        try:
            row = measure_case(case, options.warmup_ms, options.rep_ms, max(1, options.rounds), options.seed)
        except Exception as exc:  # e.g. out of memory: report it and go on with the other cases
            row = error_row(case, exc)
            print(f"  {case.name}: {row['error']}", flush=True)
        else:
            print(f"  {case.name}: merge {row['merge_gbs']:.0f} GB/s, copy {row['copy_gbs']:.0f} GB/s, "
                  f"ratio {row['ratio']:.3f} {row['verdict'] or ''} ({row['correct']})", flush=True)
        rows.append(row)
        torch.cuda.empty_cache()  # free this case's buffers before the next, larger one
    notes = [f"Bytes moved = S x (v + lse) read + (v + lse) written. The copy reference is `dst.copy_(src)` of "
             f"float32 tensors of half that many bytes, timed alternately with the merge in the same run; GB/s = 1e9 "
             f"bytes/s. Bar: merge/copy >= {RATIO_BAR} where the inputs' v is >= 256 MB (observation only). "
             f"Inputs: v ~ N(0, 1), lse ~ U[-5, 5] with {EMPTY_FRACTION:.0%} -inf; outputs preallocated; L2 flushed "
             f"between repeats; 'spread %' is the largest difference between the {options.rounds} timing rounds; "
             f"'v rel err' is ||out - ref|| / ||ref|| against float64 on the first {CHECK_TOKENS} tokens."]
    write_results(out_dir, "merge_states", "merge_attention_states bandwidth vs device copy", rows, COLUMNS,
                  environment(), notes)
    print(markdown_table(rows, COLUMNS))
    return [merge_summary_row(r) for r in rows
            if r.get("bar") or r.get("verdict") == "ERROR" or r.get("correct") == "WRONG"]


def merge_summary_row(row: dict[str, Any]) -> dict[str, Any]:
    """One line for run_all's summary; a wrong result outranks any speed."""
    metric = f"{row['case']}: merge/copy"
    if "merge_gbs" in row:
        metric += f" ({row['merge_gbs']:.0f} vs {row['copy_gbs']:.0f} GB/s)"
    result = "WRONG" if row.get("correct") == "WRONG" else row.get("verdict") or ""
    return summary_row("merge", metric, row.get("ratio"), "x", row.get("bar") or "", result)

def main(argv: list[str] | None = None) -> int:
    options = standalone_parser(__doc__, add_arguments).parse_args(argv)
    if options.list:
        for case in selected_cases(options.only):
            print(f"{case.name}: {case.traffic_bytes / 1e6:.0f} MB moved, bar {'yes' if case.bar_applies else 'no'}")
        return 0
    print(markdown_table(run(options.out or default_out_dir(), options), SUMMARY_COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
