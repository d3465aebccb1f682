"""kgen's varlen attention prefill against torch SDPA's flash and cuDNN backends, and its sequence-length sweep.

(1) Dense shapes: a batch of B equal sequences of length S, run by kgen as a
    packed varlen batch (q [B*S, H, D], plan built once outside the timed
    region) and by SDPA on contiguous [B, H, S, D] copies of the same values,
    under ``sdpa_kernel(SDPBackend.FLASH_ATTENTION)`` and
    ``sdpa_kernel(SDPBackend.CUDNN_ATTENTION)``, timed in alternation in this
    process. FLOPs = 4 B H S^2 D (two matrix products of 2 S^2 D each per head),
    half that when causal. Bar (an observation, never enforced): kgen/flash
    >= 1.0 at every shape, where kgen/flash = flash time / kgen time.
    Before timing, every output is checked against a float64 SDPA math
    reference on two batch entries x two heads, and kgen's whole output
    against flash's (cuDNN's if flash refuses): WRONG if a relative L2 error
    exceeds 2e-2 or kgen left an output element unwritten.
(2) Boundary sweep: N = min(4096, 131072 // L) causal sequences of length L,
    12 heads, D = 128, bf16, for each tail policy the spec offers (forced with
    the planner's ``tail=``), against the same N sequences padded to whole
    tiles of the height the planner picks for L (which run the
    has_incomplete_tile=false variant of the default policy). Calls under 50 us are timed as CUDA
    graph replays over enough input sets to defeat L2; the rest with the event
    timer. Bar (observation): t(2^k - 1) <= t(2^k) for k >= 6, from each
    pair timed again alternately (median of per-round ratios).

Writes bench_attention.json, bench_attention.md and bench_attention.png (the
sweep, log-log; skipped with a note without matplotlib).

    PYTHONPATH=. python3 bench/bench_attention.py [--out DIR] [--attn-part dense|sweep|all] [--list]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import math
import statistics
import sys
import time
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import torch
import torch.nn.functional as F

# common first: it puts the repository root on sys.path, so kgen imports without PYTHONPATH.
from common import (SUMMARY_COLUMNS, standalone_parser, Column, default_out_dir, environment, markdown_table, summary_row, time_cuda,
                    time_graph, verdict, write_results)
from bench_merge_states import input_sets_needed, l2_bytes
import kgen
from kgen import registry
from kgen.ops import attention_varlen, plan_attention_varlen

NAME = "bench_attention"  # bench_attention.json / .md / .png
DEVICE = "cuda"  # where inputs are made (a CPU dry run of the flow with stand-ins can point it elsewhere)
FAMILY = "attention_prefill"
DTYPE = torch.bfloat16
DTYPE_NAME = "bf16"
FLASH_RATIO_BAR = 1.0
BOUNDARY_BAR = 1.0  # t(2^k - 1) / t(2^k) <= 1.0
BOUNDARY_MIN_K = 6
REL_L2_TOL = 2e-2  # bf16 operands, P rounded to 16 bits before P V
GRAPH_BELOW_MS = 0.05  # kgen calls shorter than this are timed as CUDA graph replays
MAX_INPUT_SETS = 16
UNSUPPORTED = "UNSUPPORTED"
FLOPS_NOTE = ("FLOPs = 4 x B x H x S^2 x D for non-causal attention (Q K^T and P V, 2 S^2 D each per head), "
              "half that for causal; TFLOP/s = FLOPs / time / 1e12 with the same count for every implementation.")

SWEEP_LENGTHS = [1, 2, 4, 8, 16, 24, 31, 32, 33, 40, 48, 56, 63, 64, 65, 127, 128, 129, 255, 256, 257,
                 511, 512, 513, 1023, 1024, 1025, 2047, 2048, 2049]
SWEEP_TOKENS = 131072
SWEEP_MAX_SEQS = 4096
SWEEP_HEADS = 12
SWEEP_HEAD_DIM = 128


# ---- cases -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class DenseCase:
    batch: int
    heads: int
    seqlen: int
    head_dim: int
    causal: bool

    @property
    def name(self) -> str:
        return (f"hd{self.head_dim} B{self.batch} H{self.heads} S{self.seqlen} "
                f"{'causal' if self.causal else 'non-causal'}")

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
]


def sweep_seqs(length: int) -> int:
    return min(SWEEP_MAX_SEQS, SWEEP_TOKENS // length)


def padded_length(length: int, tile: int) -> int:
    return -(-length // tile) * tile


def sweep_name(length: int) -> str:
    return f"sweep L={length}"


def boundary_pairs(lengths: list[int]) -> list[tuple[int, int, int]]:
    """(k, 2^k - 1, 2^k) for every k >= BOUNDARY_MIN_K with both lengths in ``lengths``."""
    present = set(lengths)
    return [(k, (1 << k) - 1, 1 << k) for k in range(BOUNDARY_MIN_K, 32)
            if (1 << k) in present and (1 << k) - 1 in present]


def family() -> registry.Family:
    return registry.current().family(FAMILY)


def sweep_tile(length: int) -> int:
    """tile_m the planner picks for the sweep's batch at ``length``: the padded baseline rounds L up to it."""
    cu = [i * length for i in range(sweep_seqs(length) + 1)]
    plan = plan_attention_varlen(cu, cu, head_dim=SWEEP_HEAD_DIM, dtype=DTYPE, causal=True, device="cpu")
    return plan.variant.param_dict["tile_m"]


def tail_policies() -> list[str]:
    """The tail policies the spec offers for hd128 bf16 (cp_async; tma where the spec lists it)."""
    return [str(p) for p in family().supported("tail", head_dim=SWEEP_HEAD_DIM, dtype=DTYPE_NAME)]


def default_policy() -> str:
    """The policy the op picks when asked for nothing in particular."""
    return str(family().select(head_dim=SWEEP_HEAD_DIM, dtype=DTYPE_NAME, has_incomplete_tile=True)
               .param_dict["tail"])


def plan_for(cu_host: list[int], head_dim: int, causal: bool, policy: str | None = None) -> Any:
    """kgen's plan for equal q and k lengths; ``policy`` forces a tail policy through the planner's ``tail=``.

    A kgen whose planner takes no ``tail`` can only run its default policy; asking it
    for another raises (the sweep records the error for that length).
    """
    kwargs: dict[str, Any] = {}
    if policy is not None:
        if "tail" in inspect.signature(plan_attention_varlen).parameters:
            kwargs["tail"] = policy
        elif policy != default_policy():
            raise RuntimeError(f"plan_attention_varlen takes no tail=: cannot force tail={policy}")
    return plan_attention_varlen(cu_host, cu_host, head_dim=head_dim, dtype=DTYPE, causal=causal, **kwargs)


def variant_name(plan: Any) -> str | None:
    """The variant a plan runs, where the plan records it."""
    variant = getattr(plan, "variant", None)
    return getattr(variant, "name", None)


def is_unsupported(exc: BaseException) -> bool:
    """kgen's way of saying the spec has no variant for the request."""
    return isinstance(exc, kgen.UnsupportedVariantError) or (
        isinstance(exc, ValueError) and "supported" in str(exc))


# ---- helpers -----------------------------------------------------------------------------------------

def rel_l2(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    return (torch.linalg.vector_norm(got - ref) / torch.linalg.vector_norm(ref)).item()


def worst(errors: list[float]) -> float:
    """The largest error, NaN if any is NaN (plain max() would skip it)."""
    return math.nan if any(e != e for e in errors) else max(errors)


def max_abs(got: torch.Tensor, ref: torch.Tensor) -> float:
    return (got.double() - ref.double()).abs().max().item()


def short(exc: BaseException, limit: int = 200) -> str:
    return f"{type(exc).__name__}: {exc}".replace("\n", " ")[:limit]


def sdpa_backends() -> dict[str, Any]:
    from torch.nn.attention import SDPBackend
    return {"flash": SDPBackend.FLASH_ATTENTION, "cudnn": SDPBackend.CUDNN_ATTENTION}


def sdpa(backend: Any, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """One SDPA call restricted to ``backend``; a refusal raises with torch's reasons (its warnings) attached."""
    from torch.nn.attention import sdpa_kernel
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with sdpa_kernel(backend):
                return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
        except Exception as exc:  # torch raises RuntimeError("No available kernel...") and warns the reasons
            reasons = "; ".join(str(w.message).replace("\n", " ") for w in caught)[:400]
            raise RuntimeError(f"{exc} {reasons}".strip()) from exc


def backend_only(name: str) -> contextlib.AbstractContextManager:
    """``sdpa_kernel(backend)`` for an SDPA peer's name; nothing for kgen."""
    if name not in sdpa_backends():
        return contextlib.nullcontext()
    from torch.nn.attention import sdpa_kernel
    return sdpa_kernel(sdpa_backends()[name])


def reference_bhsd(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """float64 SDPA math backend on [b, h, s, d] inputs."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel(SDPBackend.MATH):
        return F.scaled_dot_product_attention(q.double(), k.double(), v.double(), is_causal=causal)


def probe_ms(fn: Callable[[], Any], calls: int = 20) -> float:
    """Wall-ish device time per call of ``fn`` launched back to back: the longer of host launch and kernel."""
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def mean_and_spread(times: list[float]) -> tuple[float, float]:
    return sum(times) / len(times), (max(times) - min(times)) / min(times) * 100


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


def measure_dense(case: DenseCase, index: int, options: argparse.Namespace) -> dict[str, Any]:
    B, H, S, D = case.batch, case.heads, case.seqlen, case.head_dim
    row: dict[str, Any] = {"case": case.name, "batch": B, "heads": H, "seqlen": S, "head_dim": case.head_dim,
                           "causal": case.causal, "dtype": DTYPE_NAME, "flops": case.flops,
                           "bar": f">= {FLASH_RATIO_BAR}"}
    notes: list[str] = []
    gen = torch.Generator(device=DEVICE).manual_seed(options.attn_seed * 1000 + index)
    # SDPA's operands, contiguous [B, H, S, D]; kgen's hold the same values packed as [B*S, H, D].
    q, k, v = (torch.randn((B, H, S, D), generator=gen, device=DEVICE, dtype=DTYPE) for _ in range(3))
    q_p, k_p, v_p = (t.transpose(1, 2).contiguous().view(B * S, H, D) for t in (q, k, v))
    cu_host = [i * S for i in range(B + 1)]
    cu = torch.tensor(cu_host, dtype=torch.int32, device=DEVICE)

    calls: dict[str, Callable[[], Any]] = {}
    outputs: dict[str, torch.Tensor] = {}
    kgen_written = True
    try:
        plan = plan_for(cu_host, D, case.causal)
        row["kgen_variant"] = variant_name(plan)
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


# ---- (2) boundary sweep ------------------------------------------------------------------------------

@dataclass
class VarlenBatch:
    """``num_seqs`` causal sequences of ``seqlen`` tokens, with ``len(sets)`` independent input sets."""
    num_seqs: int
    seqlen: int
    cu_host: list[int]
    cu: torch.Tensor
    sets: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]]  # (q, k, v, out)

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
    cu_host = [i * seqlen for i in range(num_seqs + 1)]
    batch = VarlenBatch(num_seqs, seqlen, cu_host, torch.tensor(cu_host, dtype=torch.int32, device=DEVICE), [])
    batch.add_sets(1, gen)
    return batch


def kgen_calls(batch: VarlenBatch, plan: Any) -> list[Callable[[], Any]]:
    return [functools.partial(attention_varlen, q, k, v, batch.cu, batch.cu, causal=True, plan=plan, out=out)
            for q, k, v, out in batch.sets]


def check_batch(batch: VarlenBatch, plan: Any) -> tuple[float, bool]:
    """Run set 0 on a NaN-poisoned output; (worst rel L2 of the first and last sequence vs float64, all written)."""
    q, k, v, out = batch.sets[0]
    out.fill_(math.nan)
    attention_varlen(q, k, v, batch.cu, batch.cu, causal=True, plan=plan, out=out)
    torch.cuda.synchronize()
    written = not torch.isnan(out).any().item()
    errors = []
    for i in sorted({0, batch.num_seqs - 1}):
        rows = slice(batch.cu_host[i], batch.cu_host[i + 1])
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


def sweep_columns(policies: list[str]) -> list[Column]:
    return [("L", "L", "d"), ("seqs", "N", "d"), ("tokens", "tokens", "d"), ("tile_m", "tile_m", "d"),
            ("timer", "timer", None),
            *[(f"ms_{p}", f"{p} ms", ".4f") for p in policies],
            ("padded_len", "padded L", "d"), ("padded_ms", "padded ms", ".4f"),
            *[(f"over_padded_{p}", f"{p}/padded", ".3f") for p in policies],
            ("input_sets", "sets", "d"), ("spread_pct", "spread %", ".1f"), ("rel_l2", "rel L2 (fp64)", ".1e"),
            ("correct", "correct", None), ("error", "error", None)]


BOUNDARY_COLUMNS: list[Column] = [
    ("policy", "policy", None), ("k", "k", "d"), ("lengths", "L", None), ("ms_below", "t(2^k-1) ms", ".4f"),
    ("ms_at", "t(2^k) ms", ".4f"), ("ratio", "t(2^k-1)/t(2^k)", ".3f"), ("ratio_min", "min", ".3f"),
    ("ratio_max", "max", ".3f"), ("rounds", "rounds", "d"), ("bar", "bar", None),
    ("verdict", "verdict", None), ("correct", "correct", None), ("error", "error", None),
]


def measure_length(length: int, policies: list[str], options: argparse.Namespace) -> dict[str, Any]:
    tile = sweep_tile(length)
    num_seqs, padded = sweep_seqs(length), padded_length(length, tile)
    gen = torch.Generator(device=DEVICE).manual_seed(options.attn_seed * 1000 + 100 + length)
    row: dict[str, Any] = {"L": length, "seqs": num_seqs, "tokens": num_seqs * length, "tile_m": tile,
                           "padded_len": padded, "padded_tokens": num_seqs * padded}
    batch, padded_batch = make_batch(num_seqs, length, gen), make_batch(num_seqs, padded, gen)
    errors, correct = [], True

    plans: dict[str, Any] = {}
    for policy in policies:
        plans[policy] = plan_for(batch.cu_host, SWEEP_HEAD_DIM, True, policy)
        row[f"variant_{policy}"] = variant_name(plans[policy])
        err, ok = check_batch(batch, plans[policy])
        errors.append(err)
        correct &= ok
        row[f"has_incomplete_tile_{policy}"] = plans[policy].has_incomplete_tile
    padded_plan = plan_for(padded_batch.cu_host, SWEEP_HEAD_DIM, True)  # the spec's default policy
    row["padded_variant"] = variant_name(padded_plan)
    row["padded_has_incomplete_tile"] = padded_plan.has_incomplete_tile
    err, ok = check_batch(padded_batch, padded_plan)
    errors.append(err)
    correct &= ok
    row["rel_l2"], row["correct"] = worst(errors), "ok" if correct else "WRONG"

    # One timer for the whole length, picked from the first policy's call: graphs when it is short.
    probe = probe_ms(kgen_calls(batch, plans[policies[0]])[0])
    use_graph = probe < GRAPH_BELOW_MS
    row["probe_ms"], row["timer"] = probe, "graph" if use_graph else "events"
    if use_graph:  # replays back to back would hit in L2: rotate over enough input sets
        l2 = l2_bytes()
        for b in (batch, padded_batch):
            b.add_sets(min(MAX_INPUT_SETS, input_sets_needed(b.set_bytes, l2)) - 1, gen)
    row["input_sets"] = len(batch.sets)
    row["padded_input_sets"] = len(padded_batch.sets)

    times: dict[str, list[float]] = {p: [] for p in [*policies, "padded"]}
    for _ in range(max(1, options.attn_rounds)):
        for policy in policies:
            times[policy].append(time_calls(kgen_calls(batch, plans[policy]), use_graph, options))
        times["padded"].append(time_calls(kgen_calls(padded_batch, padded_plan), use_graph, options))
    spreads = []
    for key, ts in times.items():
        t, spread = mean_and_spread(ts)
        spreads.append(spread)
        name = "padded_ms" if key == "padded" else f"ms_{key}"
        row[name], row[f"{name}_rounds"] = t, ts
    row["spread_pct"] = max(spreads)
    for policy in policies:
        row[f"over_padded_{policy}"] = row[f"ms_{policy}"] / row["padded_ms"]
    return row


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
    """The bar's pairs, timed again side by side: the ratio is the median of the per-round ratios."""
    by_length = {r["L"]: r for r in sweep}
    rows = []
    for k, below, at in boundary_pairs(list(by_length)):
        gen = torch.Generator(device=DEVICE).manual_seed(options.attn_seed * 1000 + 900 + k)
        batches = [make_batch(sweep_seqs(length), length, gen) for length in (below, at)]
        wrong = "WRONG" in (by_length[below].get("correct"), by_length[at].get("correct"))
        for policy in policies:
            row: dict[str, Any] = {"policy": policy, "k": k, "lengths": f"{below} vs {at}", "bar": f"<= {BOUNDARY_BAR}",
                                   "correct": "WRONG" if wrong else "ok", "rounds": options.attn_boundary_rounds}
            try:
                calls = [kgen_calls(b, plan_for(b.cu_host, SWEEP_HEAD_DIM, True, policy))[0] for b in batches]
                times_below, times_at = paired_times(*calls, options.attn_boundary_rounds, options)
            except Exception as exc:
                rows.append({**row, "ratio": None, "verdict": "ERROR", "error": short(exc)})
                continue
            ratios = [b / a for b, a in zip(times_below, times_at)]
            ratio = statistics.median(ratios)
            rows.append({**row, "ms_below": statistics.median(times_below), "ms_at": statistics.median(times_at),
                         "ratio": ratio, "ratio_min": min(ratios), "ratio_max": max(ratios),
                         "ms_below_rounds": times_below, "ms_at_rounds": times_at,
                         "verdict": verdict(ratio, BOUNDARY_BAR, False)})
        for b in batches:
            b.sets.clear()
        torch.cuda.empty_cache()
    return rows


def boundary_summary_row(row: dict[str, Any]) -> dict[str, Any]:
    metric = f"sweep {row['policy']}: t(L={row['lengths'].replace(' vs ', ')/t(L=')})"
    if row["ratio"] is not None:
        metric += f" ({row['ms_below']:.4f} vs {row['ms_at']:.4f} ms)"
    result = "WRONG" if row["correct"] == "WRONG" else row["verdict"]
    return summary_row("attention", metric, row["ratio"], "x", row["bar"], result)


def save_plot(path: Path, sweep: list[dict[str, Any]], policies: list[str]) -> str:
    """Latency vs L, log-log, one line per policy and one for the padded baseline; returns a note."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        import matplotlib.ticker
    except ImportError as exc:
        return f"Plot skipped: matplotlib is not importable here ({short(exc)})."
    fig, ax = plt.subplots(figsize=(9, 5.5))
    series = [(f"ms_{p}", f"kgen, tail={p}", "o-") for p in policies] + [
        ("padded_ms", "kgen on sequences padded to whole tiles", "s--")]
    for key, label, style in series:
        points = [(r["L"], r[key]) for r in sweep if r.get(key) is not None]
        if points:
            ax.plot(*zip(*points), style, label=label, markersize=4)
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_formatter(matplotlib.ticker.ScalarFormatter())
    ax.set_yscale("log")
    ax.set_xlabel("sequence length L (N = min(4096, 131072 // L) causal sequences, 12 heads, D = 128, bf16)")
    ax.set_ylabel("latency per call (ms)")
    ax.set_title("kgen attention_varlen: boundary sweep")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return f"Plot: {path.name} (latency vs L, log-log)."


# ---- output -------------------------------------------------------------------------------------------

def notes_for(options: argparse.Namespace, policies: list[str]) -> list[str]:
    return [
        FLOPS_NOTE,
        f"Dense: kgen runs B equal sequences packed as [B*S, H, D] with a plan built outside the timed region and a "
        f"preallocated output; SDPA gets contiguous [B, H, S, D] tensors with the same values and allocates its "
        f"output. kgen/flash and kgen/cuDNN are speed ratios (peer time / kgen time, > 1 means kgen is faster). "
        f"Bar: kgen/flash >= {FLASH_RATIO_BAR} at every shape (observation only; UNSUPPORTED where the spec has no "
        f"variant for the head dim). Timer: event-based median (bench/common.time_cuda, L2 flushed between repeats), "
        f"{options.attn_rounds} rounds alternating kgen, flash, cuDNN; times are the mean of the rounds and "
        f"'spread %' the largest difference between rounds.",
        f"Correctness (before timing, on the timed inputs, ~N(0, 1)): 'rel L2 (fp64)' is ||out - ref|| / ||ref|| "
        f"against SDPA's math backend in float64 on batch entries {{0, B-1}} x heads {{0, H-1}}; 'kgen vs peer' "
        f"compares kgen's whole output with flash's (cuDNN's if flash refused). kgen's output is poisoned with NaN "
        f"first. WRONG if a kgen error exceeds {REL_L2_TOL} or an element stays unwritten.",
        f"Sweep: N = min({SWEEP_MAX_SEQS}, {SWEEP_TOKENS} // L) causal sequences of length L (q and k lengths "
        f"equal), Hq = Hk = Hv = {SWEEP_HEADS}, D = {SWEEP_HEAD_DIM}, bf16. Tail policies offered by the spec for "
        f"hd{SWEEP_HEAD_DIM} bf16: {policies}, each forced with plan_attention_varlen(tail=...). Padded baseline: the "
        f"same N sequences of L rounded up to whole tiles of the height the planner picks for L (column tile_m), "
        f"planned with the spec's default policy; they run the has_incomplete_tile=false variant (the JSON records each plan's "
        f"variant). Calls "
        f"shorter than {GRAPH_BELOW_MS * 1e3:.0f} us (probed back to back) are timed as CUDA graph replays rotating "
        f"over enough input sets to exceed 3x L2 ('graph'), others with the event timer ('events'); the padded "
        f"baseline uses the same timer as its L. Correctness: first and last sequence vs float64, output "
        f"NaN-poisoned first. Bar: t(2^k - 1) <= t(2^k) for k >= {BOUNDARY_MIN_K} (observation only), "
        f"from a second, paired measurement: each pair's two lengths timed alternately (ABBA, event timer, "
        f"{options.attn_boundary_rounds} rounds of {options.attn_boundary_rep_ms:g} ms) on fresh inputs; the "
        f"ratio is the median of the per-round ratios (min and max shown), its times the medians.",
    ]


def write_outputs(out_dir: Path, dense: list[dict[str, Any]], sweep: list[dict[str, Any]],
                  bounds: list[dict[str, Any]], policies: list[str], env: dict[str, Any],
                  options: argparse.Namespace) -> Path:
    """bench_attention.json (every field) and bench_attention.md (dense, sweep and boundary tables); the plot."""
    out_dir.mkdir(parents=True, exist_ok=True)
    notes = notes_for(options, policies)
    if sweep:
        try:
            notes.append(save_plot(out_dir / f"{NAME}.png", sweep, policies))
        except Exception as exc:  # a broken plot must not lose the numbers
            notes.append(f"Plot failed: {short(exc)}.")
    extra = {"flops_convention": FLOPS_NOTE, "tail_policies": policies,
             "sweep": sweep, "sweep_boundary": bounds}
    _, md_path = write_results(out_dir, NAME, "kgen attention_varlen prefill vs torch SDPA (flash, cuDNN)", dense,
                               DENSE_COLUMNS, env, notes, extra)
    # write_results renders one table; add the sweep's two before the environment section.
    sweep_md = ""
    if sweep:
        sweep_md = (f"## Boundary sweep: latency vs L\n\n{markdown_table(sweep, sweep_columns(policies))}\n"
                    f"## Boundary bar: t(2^k - 1) <= t(2^k)\n\n{markdown_table(bounds, BOUNDARY_COLUMNS)}\n")
    text = md_path.read_text()
    marker = "\n## Environment\n"
    md_path.write_text(text.replace(marker, f"\n{sweep_md}## Environment\n", 1) if sweep_md else text)
    return md_path


def collect_summary(dense: list[dict[str, Any]], sweep: list[dict[str, Any]],
                    bounds: list[dict[str, Any]]) -> list[dict[str, Any]]:
    rows = [dense_summary_row(r) for r in dense]
    rows += [boundary_summary_row(r) for r in bounds]
    in_bar = {length for r in bounds for length in map(int, r["lengths"].split(" vs "))}
    for r in sweep:  # lengths outside the bar that were wrong or crashed still reach the summary
        if r["L"] not in in_bar and (r.get("correct") == "WRONG" or r.get("error")):
            result = "ERROR" if r.get("error") else "WRONG"
            what = f"crashed: {r['error']}" if r.get("error") else f"wrong output (rel L2 {r.get('rel_l2', 0):.1e})"
            rows.append(summary_row("attention", f"sweep L={r['L']}: {what}"[:300], None, "", "", result))
    return rows


# ---- entry points ------------------------------------------------------------------------------------

def selected_dense(options: argparse.Namespace) -> list[DenseCase]:
    if options.attn_part == "sweep":
        return []
    only = (options.attn_only or "").lower()
    return [c for c in DENSE_CASES if only in c.name.lower()]


def selected_lengths(options: argparse.Namespace) -> list[int]:
    if options.attn_part == "dense":
        return []
    only = (options.attn_only or "").lower()
    return [length for length in SWEEP_LENGTHS if only in sweep_name(length).lower()]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("attention prefill")
    group.add_argument("--attn-part", choices=("all", "dense", "sweep"), default="all",
                       help="dense shapes, boundary sweep, or both (default all)")
    group.add_argument("--attn-only", default=None,
                       help="only dense cases / sweep entries ('sweep L=63') whose name contains this text")
    group.add_argument("--attn-warmup-ms", type=float, default=25, help="warm-up per event timing, ms (default 25)")
    group.add_argument("--attn-rep-ms", type=float, default=100,
                       help="timed repeats per event timing, ms (default 100)")
    group.add_argument("--attn-rounds", type=int, default=2, help="times each implementation is timed (default 2)")
    group.add_argument("--attn-seed", type=int, default=0)
    group.add_argument("--attn-boundary-rounds", type=int, default=15,
                       help="alternated timings of each boundary pair (default 15)")
    group.add_argument("--attn-boundary-rep-ms", type=float, default=40,
                       help="event-timer repetitions per boundary timing, ms (default 40)")


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    """(1) and (2); write bench_attention.{json,md,png}; return the summary rows."""
    if not torch.cuda.is_available():
        raise RuntimeError("no CUDA device: the attention benchmark needs one")
    start = time.perf_counter()
    dense: list[dict[str, Any]] = []
    for index, case in enumerate(selected_dense(options)):
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
    if dense:
        print(f"  dense part: {time.perf_counter() - start:.1f} s", flush=True)

    sweep: list[dict[str, Any]] = []
    lengths = selected_lengths(options)
    policies = tail_policies()
    sweep_start = time.perf_counter()
    if lengths:
        print(f"  sweep: tail policies {policies}, padded baseline to whole tiles", flush=True)
    for length in lengths:
        try:
            row = measure_length(length, policies, options)
        except Exception as exc:
            row = {"L": length, "seqs": sweep_seqs(length), "tokens": sweep_seqs(length) * length,
                   "error": short(exc, 300)}
            print(f"  L={length}: {row['error']}", flush=True)
        else:
            times = ", ".join(f"{p} {row[f'ms_{p}']:.4f} ms" for p in policies)
            ratios = ", ".join(f"{row[f'over_padded_{p}']:.3f}" for p in policies)
            print(f"  L={length} (N={row['seqs']}, {row['timer']}): {times}; padded L={row['padded_len']} "
                  f"{row['padded_ms']:.4f} ms; t(L)/t(padded) {ratios} ({row['correct']})", flush=True)
        sweep.append(row)
        torch.cuda.empty_cache()
    bounds = boundary_rows(sweep, policies, options)
    if lengths:
        print(f"  sweep part: {time.perf_counter() - sweep_start:.1f} s", flush=True)

    md_path = write_outputs(out_dir, dense, sweep, bounds, policies, environment(), options)
    print(md_path.read_text().split("\n## Environment")[0], flush=True)
    return collect_summary(dense, sweep, bounds)


def main(argv: list[str] | None = None) -> int:
    options = standalone_parser(__doc__, add_arguments).parse_args(argv)
    if options.list:
        for case in selected_dense(options):
            print(f"{case.name}: {case.flops / 1e12:.3f} TFLOP ({'causal, half of ' if case.causal else ''}"
                  f"4 B H S^2 D)")
        policies = tail_policies()
        lengths = selected_lengths(options)
        if lengths:
            print(f"sweep: tail policies {policies}; boundary pairs "
                  f"{[f'{b} vs {a}' for _, b, a in boundary_pairs(lengths)]}")
        for length in lengths:
            tile = sweep_tile(length)
            padded = padded_length(length, tile)
            print(f"{sweep_name(length)}: N={sweep_seqs(length)}, {sweep_seqs(length) * length} tokens; tile_m "
                  f"{tile}, padded L={padded}, {sweep_seqs(length) * padded} tokens")
        return 0
    print(markdown_table(run(options.out or default_out_dir(), options), SUMMARY_COLUMNS))
    return 0


if __name__ == "__main__":
    sys.exit(main())
