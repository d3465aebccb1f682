"""kgen's varlen attention prefill on dense shapes against torch SDPA's flash and cuDNN backends.

A batch of B equal sequences of length S, run by kgen as a packed varlen batch
(q [B*S, H, D], plan built once outside the timed region) and by SDPA on
contiguous [B, H, S, D] copies of the same values, under
``sdpa_kernel(SDPBackend.FLASH_ATTENTION)`` and
``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)``, timed in alternation in this
process. FLOPs = 4 B H S^2 D (two matrix products of 2 S^2 D each per head),
half that when causal. Bar (an observation, never enforced): kgen/flash >= 1.0
at every shape, where kgen/flash = flash time / kgen time. Before timing, every
output is checked against a float64 SDPA math reference on two batch entries x
two heads, and kgen's whole output against flash's (cuDNN's if flash refuses):
WRONG if a relative L2 error exceeds 2e-2 or kgen left an output element
unwritten. The sequence-length sweep is bench_attention_sweep.py.

Writes bench_attention.json and bench_attention.md.

    PYTHONPATH=. python3 bench/bench_attention.py [--out DIR] [--attn-only TEXT] [--list]
"""

from __future__ import annotations

import argparse
import functools
import math
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

# common first: it puts the repository root on sys.path, so kgen imports without PYTHONPATH.
from common import (SUMMARY_COLUMNS, Column, default_out_dir, environment, markdown_table, standalone_parser,
                    summary_row, time_cuda, verdict, write_results)
from attention_common import (DEVICE, DTYPE, DTYPE_NAME, REL_L2_TOL, UNSUPPORTED, add_arguments, backend_only,
                              is_unsupported, max_abs, mean_and_spread, plan_for, reference_bhsd, rel_l2, sdpa,
                              sdpa_backends, short, worst)
from kgen.ops import attention_varlen

NAME = "bench_attention"  # bench_attention.json / .md
FLASH_RATIO_BAR = 1.0
FLOPS_NOTE = ("FLOPs = 4 x B x H x S^2 x D for non-causal attention (Q K^T and P V, 2 S^2 D each per head), "
              "half that for causal; TFLOP/s = FLOPs / time / 1e12 with the same count for every implementation.")

# ---- cases -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DenseCase:
    batch: int
    heads: int
    seqlen: int
    head_dim: int
    causal: bool
    heads_kv: int | None = None  # GQA: fewer K/V heads than query heads; None = as many

    @property
    def kv_heads(self) -> int:
        return self.heads if self.heads_kv is None else self.heads_kv

    @property
    def name(self) -> str:
        heads = f"H{self.heads}" if self.heads_kv is None else f"H{self.heads}/{self.heads_kv} (GQA)"
        return f"hd{self.head_dim} B{self.batch} {heads} S{self.seqlen} {'causal' if self.causal else 'non-causal'}"

    @property
    def flops(self) -> int:
        full = 4 * self.batch * self.heads * self.seqlen * self.seqlen * self.head_dim
        return full // 2 if self.causal else full


DENSE_CASES = [
    DenseCase(2, 16, 8192, 128, True),
    DenseCase(2, 16, 8192, 128, False),
    DenseCase(8, 16, 2048, 128, True),
    DenseCase(8, 16, 2048, 128, False),
    DenseCase(4, 32, 4096, 64, True),
    DenseCase(2, 16, 8192, 256, True),
    DenseCase(1, 32, 16384, 128, True, heads_kv=8),
    DenseCase(2, 16, 8192, 96, True),
    DenseCase(2, 16, 8192, 192, True),
    # Issue 25's short dense batches (its bar: kgen/cuDNN >= 1.0; hd64 B4 H32 S4096 causal is above).
    DenseCase(8, 32, 1024, 128, True, heads_kv=8),
    DenseCase(16, 32, 512, 128, True, heads_kv=8),
    DenseCase(4, 32, 4096, 128, True, heads_kv=8),
]



# ---- (1) dense shapes --------------------------------------------------------------------------------

DENSE_COLUMNS: list[Column] = [
    ("case", "case", None), ("kgen_ms", "kgen ms", ".3f"), ("flash_ms", "flash ms", ".3f"),
    ("cudnn_ms", "cuDNN ms", ".3f"), ("kgen_tflops", "kgen TFLOP/s", ".0f"), ("flash_tflops", "flash TFLOP/s", ".0f"),
    ("cudnn_tflops", "cuDNN TFLOP/s", ".0f"), ("kgen_over_flash", "kgen/flash", ".3f"),
    ("kgen_over_cudnn", "kgen/cudnn", ".3f"), ("bar", "bar", None), ("verdict", "verdict", None),
    ("spread_pct", "spread %", ".1f"), ("kgen_rel_l2", "kgen rel L2 (fp64)", ".1e"),
    ("flash_rel_l2", "flash rel L2 (fp64)", ".1e"), ("cudnn_rel_l2", "cuDNN rel L2 (fp64)", ".1e"),
    ("kgen_vs_peer_rel_l2", "kgen vs peer rel L2", ".1e"), ("kgen_vs_peer_max_abs", "kgen vs peer max abs", ".1e"),
    ("correct", "correct", None), ("status", "notes", None),
]


def dense_inputs(case: DenseCase, gen: torch.Generator) -> tuple[torch.Tensor, ...]:
    """SDPA's q, k, v (contiguous [B, H, S, D]) and kgen's, the same values packed as [B*S, heads, D].

    Under GQA kgen reads the Hkv K/V heads, and SDPA gets them repeated to H heads (the same math, more bytes read).
    """
    B, H, S, D, Hkv = case.batch, case.heads, case.seqlen, case.head_dim, case.kv_heads
    q = torch.randn((B, H, S, D), generator=gen, device=DEVICE, dtype=DTYPE)
    k_kv, v_kv = (torch.randn((B, Hkv, S, D), generator=gen, device=DEVICE, dtype=DTYPE) for _ in range(2))
    q_p, k_p, v_p = (t.transpose(1, 2).contiguous().view(B * S, t.shape[1], D) for t in (q, k_kv, v_kv))
    k, v = (t.repeat_interleave(H // Hkv, dim=1) if Hkv != H else t for t in (k_kv, v_kv))
    return q, k, v, q_p, k_p, v_p


def measure_dense(case: DenseCase, index: int, options: argparse.Namespace) -> dict[str, Any]:
    B, H, S, D, Hkv = case.batch, case.heads, case.seqlen, case.head_dim, case.kv_heads
    row: dict[str, Any] = {"case": case.name, "batch": B, "heads": H, "heads_kv": Hkv, "seqlen": S, "head_dim": case.head_dim,
                           "causal": case.causal, "dtype": DTYPE_NAME, "flops": case.flops,
                           "bar": f">= {FLASH_RATIO_BAR}"}
    notes: list[str] = []
    gen = torch.Generator(device=DEVICE).manual_seed(options.attn_seed * 1000 + index)
    q, k, v, q_p, k_p, v_p = dense_inputs(case, gen)
    cu_host = [i * S for i in range(B + 1)]
    cu = torch.tensor(cu_host, dtype=torch.int32, device=DEVICE)

    calls: dict[str, Callable[[], Any]] = {}
    outputs: dict[str, torch.Tensor] = {}
    kgen_written = True
    try:
        plan = plan_for(cu_host, D, case.causal)
        row["kgen_variant"] = plan.variant.name
        out = torch.full_like(q_p, math.nan)
        attention_varlen(q_p, k_p, v_p, cu, cu, causal=case.causal, plan=plan, out=out)
        torch.cuda.synchronize()
        kgen_written = not torch.isnan(out).any().item()
        outputs["kgen"] = out.view(B, S, H, D).transpose(1, 2)
        calls["kgen"] = functools.partial(attention_varlen, q_p, k_p, v_p, cu, cu, causal=case.causal, plan=plan,
                                          out=out)
        row["kgen_status"] = "ok"
    except Exception as exc:
        if is_unsupported(exc):
            row["kgen_status"] = "unsupported by the spec"
            notes.append(f"kgen: unsupported by the spec ({short(exc)})")
        else:
            row["kgen_status"] = "error"
            notes.append(f"kgen: {short(exc)}")
    for name, backend in sdpa_backends().items():
        try:
            outputs[name] = sdpa(backend, q, k, v, case.causal)
            torch.cuda.synchronize()
            calls[name] = functools.partial(F.scaled_dot_product_attention, q, k, v, is_causal=case.causal)
            row[f"{name}_status"] = "ok"
        except Exception as exc:
            row[f"{name}_status"] = "refused by SDPA"
            notes.append(f"{name}: refused by SDPA ({short(exc, 300)})")

    # Correctness on these inputs: a float64 math reference on two batch entries x two heads.
    picks_b, picks_h = sorted({0, B - 1}), sorted({0, H - 1})
    errors: dict[str, list[float]] = {name: [] for name in outputs}
    for b in picks_b:
        ref = reference_bhsd(q[b, picks_h], k[b, picks_h], v[b, picks_h], case.causal)
        for name, got in outputs.items():
            errors[name].append(rel_l2(got[b, picks_h], ref))
        del ref
    for name, errs in errors.items():
        row[f"{name}_rel_l2"] = worst(errs)
    peer = next((p for p in ("flash", "cudnn") if p in outputs), None)
    if "kgen" in outputs and peer:
        row["checked_against"] = peer
        row["kgen_vs_peer_rel_l2"] = rel_l2(outputs["kgen"], outputs[peer])
        row["kgen_vs_peer_max_abs"] = max_abs(outputs["kgen"], outputs[peer])
    if "kgen" in outputs:
        kgen_errs = [row["kgen_rel_l2"], row.get("kgen_vs_peer_rel_l2", 0.0)]
        ok = kgen_written and all(e == e and e <= REL_L2_TOL for e in kgen_errs)
        row["correct"] = "ok" if ok else "WRONG"
        if not kgen_written:
            notes.append("kgen left output elements unwritten (NaN poison survived)")
    for name in ("flash", "cudnn"):
        err = row.get(f"{name}_rel_l2")
        if err is not None and not (err <= REL_L2_TOL):
            notes.append(f"{name}: rel L2 {err:.1e} against the fp64 reference exceeds {REL_L2_TOL}")
    outputs.clear()  # SDPA's outputs; kgen's buffer stays alive through its call
    torch.cuda.empty_cache()

    # Time the implementations in alternation, each more than once; SDPA's backend is pinned around its timing.
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(max(1, options.attn_rounds)):
        for name, call in calls.items():
            with backend_only(name):
                times[name].append(time_cuda(call, warmup_ms=options.attn_warmup_ms, rep_ms=options.attn_rep_ms))
    spreads = []
    for name, ts in times.items():
        t, spread = mean_and_spread(ts)
        spreads.append(spread)
        row[f"{name}_ms"], row[f"{name}_ms_rounds"] = t, ts
        row[f"{name}_tflops"] = case.flops / (t * 1e-3) / 1e12
    row["spread_pct"] = max(spreads) if spreads else None
    if "kgen_ms" in row:
        for peer_name in ("flash", "cudnn"):
            if f"{peer_name}_ms" in row:
                row[f"kgen_over_{peer_name}"] = row[f"{peer_name}_ms"] / row["kgen_ms"]
    if row["kgen_status"] == "unsupported by the spec":
        row["verdict"] = UNSUPPORTED
    elif row["kgen_status"] == "error":
        row["verdict"] = "ERROR"
    else:
        row["verdict"] = verdict(row.get("kgen_over_flash"), FLASH_RATIO_BAR, True)
    row["status"] = "; ".join(notes) or None
    return row


def dense_summary_row(row: dict[str, Any]) -> dict[str, Any]:
    """One line per dense shape: kgen/flash with the bar, the TFLOP/s and kgen/cudnn in the metric's text."""
    if row.get("verdict") == "ERROR" and "kgen_status" not in row:  # crashed before anything was measured
        return summary_row("attention", f"{row['case']}: crashed: {row.get('error', '')}"[:300], None, "", "",
                           "ERROR")

    def tflops(name: str) -> str:
        value = row.get(f"{name}_tflops")
        return f"{value:.0f}" if value is not None else row.get(f"{name}_status", "-")

    detail = f"kgen {tflops('kgen')}, flash {tflops('flash')}, cuDNN {tflops('cudnn')} TFLOP/s"
    if row.get("kgen_over_cudnn") is not None:
        detail += f"; kgen/cuDNN {row['kgen_over_cudnn']:.3f}"
    result = "WRONG" if row.get("correct") == "WRONG" else row.get("verdict") or ""
    return summary_row("attention", f"{row['case']}: kgen/flash ({detail})", row.get("kgen_over_flash"), "x",
                       row.get("bar") or "", result)



# ---- output and entry points -------------------------------------------------------------------------

def notes_for(options: argparse.Namespace) -> list[str]:
    return [
        FLOPS_NOTE,
        f"kgen runs B equal sequences packed as [B*S, H, D] with a plan built outside the timed region and a "
        f"preallocated output; SDPA gets contiguous [B, H, S, D] tensors with the same values and allocates its "
        f"output. kgen/flash and kgen/cuDNN are speed ratios (peer time / kgen time, > 1 means kgen is faster). "
        f"Bar: kgen/flash >= {FLASH_RATIO_BAR} at every shape (observation only; {UNSUPPORTED} where the spec has "
        f"no variant for the head dim). Timer: event-based median (bench/common.time_cuda, L2 flushed between "
        f"repeats), {options.attn_rounds} rounds alternating kgen, flash, cuDNN; times are the mean of the rounds "
        f"and 'spread %' the largest difference between rounds.",
        f"Correctness (before timing, on the timed inputs, ~N(0, 1)): 'rel L2 (fp64)' is ||out - ref|| / ||ref|| "
        f"against SDPA's math backend in float64 on batch entries {{0, B-1}} x heads {{0, H-1}}; 'kgen vs peer' "
        f"compares kgen's whole output with flash's (cuDNN's if flash refused). kgen's output is poisoned with NaN "
        f"first. WRONG if a kgen error exceeds {REL_L2_TOL} or an element stays unwritten.",
    ]


def selected_dense(options: argparse.Namespace) -> list[DenseCase]:
    if options.attn_part == "sweep":
        return []
    only = (options.attn_only or "").lower()
    return [c for c in DENSE_CASES if only in c.name.lower()]


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    """Time every selected dense shape; write bench_attention.{json,md}; return the summary rows."""
    cases = selected_dense(options)
    if not cases:
        return []
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: the attention benchmark needs one")
    start = time.perf_counter()
    dense: list[dict[str, Any]] = []
    for index, case in enumerate(cases):
        try:
            row = measure_dense(case, index, options)
        except Exception as exc:  # e.g. out of memory: report it and go on
            row = {"case": case.name, "verdict": "ERROR", "error": short(exc, 300), "status": short(exc, 300)}
            print(f"  {case.name}: {row['error']}", flush=True)
        else:
            def fmt(name: str) -> str:
                value = row.get(f"{name}_tflops")
                return f"{value:.0f}" if value is not None else row.get(f"{name}_status", "-")
            ratio = row.get("kgen_over_flash")
            print(f"  {case.name}: kgen {fmt('kgen')}, flash {fmt('flash')}, cuDNN {fmt('cudnn')} TFLOP/s; "
                  f"kgen/flash {'-' if ratio is None else f'{ratio:.3f}'} {row['verdict']} "
                  f"({row.get('correct', 'not checked')})", flush=True)
        dense.append(row)
        torch.cuda.empty_cache()
    print(f"  dense shapes: {time.perf_counter() - start:.1f} s", flush=True)
    _, md_path = write_results(out_dir, NAME, "kgen attention_varlen prefill vs torch SDPA (flash, cuDNN)", dense,
                               DENSE_COLUMNS, environment(), notes_for(options), {"flops_convention": FLOPS_NOTE})
    print(md_path.read_text().split("\n## Environment")[0], flush=True)
    return [dense_summary_row(r) for r in dense]


def main(argv: list[str] | None = None) -> int:
    options = standalone_parser(__doc__, add_arguments).parse_args(argv)
    if options.list:
        for case in selected_dense(options):
            print(f"{case.name}: {case.flops / 1e12:.3f} TFLOP ({'causal, half of ' if case.causal else ''}"
                  f"4 B H S^2 D)")
        return 0
    print(markdown_table(run(options.out or default_out_dir(), options), SUMMARY_COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
