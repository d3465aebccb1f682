"""The MoE grouped GEMM (kgen.ops.grouped_gemm, bf16) against torch's grouped GEMM and a dense cuBLAS GEMM of the
same FLOPs, in one run.

Issue 26's shapes: DeepSeek-V3-like (E = 256, K = 7168, N = 4096 gate+up; K = 2048, N = 7168 down) and
Qwen3-MoE-like (E = 128, K = 4096, N = 3072; K = 1536, N = 4096), top-8 routing of 4,096 and 32,768 tokens
(M = tokens x 8), balanced (every expert within one row of M / E) or skewed (Zipf, s = 1.2, over a random
expert order). Times: bench/common.time_cuda (median, L2 flushed). Peers (benchmarks only): torch's
``grouped_mm`` (``torch.nn.functional.grouped_mm``, else ``torch._grouped_mm``; its B is [E, K, N], given as
b's transposed view), and ``torch.mm`` of one dense [M, K] x [K, N] of the same FLOPs (one expert's B: it reads
E times fewer weights, so it is no roofline where reading the experts' weights dominates). kgen's result is
checked against torch's grouped GEMM first: a rel RMS above 1e-2 makes the row's verdict WRONG. Bar (issue 26,
to resolve): kgen >= 1.0x torch's grouped GEMM TFLOP/s at every shape. For the gate+up layers also the fused
SwiGLU with FP8 output (``grouped_gemm_swiglu(..., quantize_out=True)``, b_gate_up [E, 2I, K] stacked) against the
unfused path (torch's grouped GEMM, ``silu(gate) * up`` in torch, then ``kgen.ops.quantize_fp8_blockwise``), its
result checked against the unfused one's; bar: fused <= 0.85x the unfused time. Decode (masked layout, 64 and 256
tokens, each choosing 8 distinct experts at random; M_max the most tokens an expert got; the fused SwiGLU for
gate+up, the plain GEMM for down), CUDA-graph replays,
against the time to read the selected experts' weights at the copy bandwidth this run measures (a 2 GB device
copy of bf16); bar: within 10% of it. On sm_90a the op runs the wgmma kernel (the mma.sync one elsewhere).
FP8 (sm_90a): the same a and b quantized with DeepGEMM's block scales (a by kgen.ops.quantize_fp8_blockwise,
b by tests/fp8_blocks.py), kgen's TFLOP/s
against ``torch._scaled_grouped_mm`` (its own recipe: row-wise scales of a, per-column ones of b) where it runs;
kgen's result checked against float64 of the dequantized inputs on the first experts' rows. Bars: >= 1.0x
torch's scaled grouped GEMM, and >= 1000 TFLOP/s at the prefill shapes; beside them the rate at which reading
the touched experts' FP8 weights, a and the result once at this run's copy bandwidth would run (where the bar
is above it, no kernel reaches the bar). The FP8 counterpart of the dense column:
``torch._scaled_mm`` of one dense [M, K] x [K, N] of the same FLOPs with one scale a tensor (cuBLASLt's plainest
FP8 GEMM), what this card sustains at the shape's M, N and K when the weights are no concern.

    PYTHONPATH=. python3 bench/bench_grouped_gemm.py [--out DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from common import environment, run_standalone, summary_row, time_cuda, time_graph, verdict, write_results
from kgen.ops import grouped_gemm, grouped_gemm_swiglu, quantize_fp8_blockwise

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from fp8_blocks import BLOCK, E4M3_MAX, FP8, dequantized, quantize_weights  # noqa: E402

NAME = "bench_grouped_gemm"
TOP_K = 8
#: (model, projection, experts, N, K)
LAYERS = [("DeepSeek-V3", "gate+up", 256, 4096, 7168), ("DeepSeek-V3", "down", 256, 7168, 2048),
          ("Qwen3-MoE", "gate+up", 128, 3072, 4096), ("Qwen3-MoE", "down", 128, 4096, 1536)]
TOKENS = (4096, 32768)
ROUTINGS = ("balanced", "zipf")
DECODE_TOKENS = (64, 256)
#: kgen against torch's grouped GEMM: both bf16 out of fp32 accumulation, so a few 1e-3 at most.
AGREEMENT = 1e-2
COLUMNS = [("case", "case", None), ("kgen_tflops", "kgen TFLOP/s", ".0f"), ("torch_tflops", "torch grouped TFLOP/s", ".0f"),
           ("dense_tflops", "dense mm (one B) TFLOP/s", ".0f"), ("over_torch", "kgen / torch grouped", ".2f"),
           ("over_dense", "kgen / dense", ".2f"), ("rel_rms", "kgen vs torch rel RMS", ".1e"),
           ("swiglu_ms", "fused SwiGLU+FP8 ms", ".3f"), ("unfused_ms", "unfused ms", ".3f"),
           ("fused_over_unfused", "fused / unfused time", ".2f"), ("swiglu_rel_rms", "fused vs unfused rel RMS", ".1e"),
           ("decode_us", "decode us", ".1f"), ("weights_floor_us", "weights at copy bandwidth us", ".1f"),
           ("over_floor", "decode / weights floor", ".2f"), ("copy_tbs", "copy TB/s", ".2f"), ("fp8_tflops", "kgen FP8 TFLOP/s", ".0f"),
           ("scaled_tflops", "torch scaled grouped TFLOP/s", ".0f"), ("fp8_over_scaled", "kgen FP8 / torch scaled", ".2f"),
           ("fp8_dense_tflops", "dense FP8 mm (one B) TFLOP/s", ".0f"),
           ("fp8_streaming_bound_tflops", "FP8 bound: weights, a, out once at copy bandwidth, TFLOP/s", ".0f"), ("fp8_rel_rms", "kgen FP8 vs float64 rel RMS", ".1e"),
           ("torch_status", "torch grouped", None),
           ("swiglu_status", "unfused SwiGLU peer", None), ("scaled_status", "torch scaled grouped", None),
           ("fp8_dense_status", "dense FP8 mm", None)]
#: Experts whose rows check kgen's FP8 result against float64 (all of them would take tens of GB in float64).
FP8_CHECKED_EXPERTS = 4
FP8_BAR_TFLOPS = 1000.0


def group_sizes(rows: int, experts: int, routing: str, gen: torch.Generator) -> torch.Tensor:
    """Rows per expert summing to ``rows``: balanced, or Zipf-skewed over a random order of the experts."""
    if routing == "balanced":
        weights = torch.ones(experts, dtype=torch.float64)
    else:
        weights = 1.0 / torch.arange(1, experts + 1, dtype=torch.float64) ** 1.2
        weights = weights[torch.randperm(experts, generator=gen)]
    sizes = torch.floor(weights / weights.sum() * rows).long()
    sizes[torch.argsort(weights, descending=True)[: rows - int(sizes.sum())]] += 1  # the remainder, largest first
    return sizes


def torch_grouped() -> tuple[Callable | None, str]:
    fn = getattr(torch.nn.functional, "grouped_mm", None) or getattr(torch, "_grouped_mm", None)
    return (fn, "ok") if fn is not None else (None, "unavailable in this torch")


def rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.float() - want.float()).pow(2).mean().sqrt() / want.float().pow(2).mean().sqrt())


def row(layer, tokens: int, routing: str, bandwidth: float) -> dict[str, Any]:
    model, projection, experts, n, k = layer
    rows = tokens * TOP_K
    gen = torch.Generator().manual_seed(rows + experts)
    sizes = group_sizes(rows, experts, routing, gen)
    offs = sizes.cumsum(0).to(torch.int32).cuda()
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    flops = 2.0 * rows * n * k
    out = grouped_gemm(a, b, offs)
    result: dict[str, Any] = {"case": f"{model} {projection} {tokens} tokens {routing}"}
    if projection == "gate+up":
        result.update(swiglu_columns(a, b, offs))
    if torch.cuda.get_device_capability() == (9, 0):
        result.update(fp8_columns(a, b, offs, flops, bandwidth))
    result["kgen_tflops"] = flops / time_cuda(lambda: grouped_gemm(a, b, offs, out=out), warmup_ms=50, rep_ms=200) / 1e9
    fn, status = torch_grouped()
    result["torch_status"] = status
    if fn is not None:
        try:
            result["rel_rms"] = rel_rms(out, fn(a, b.transpose(-2, -1), offs=offs))
            result["torch_tflops"] = flops / time_cuda(lambda: fn(a, b.transpose(-2, -1), offs=offs), warmup_ms=50,
                                                       rep_ms=200) / 1e9
            result["over_torch"] = result["kgen_tflops"] / result["torch_tflops"]
        except Exception as exc:  # a peer's failure is reported, not fatal
            result["torch_status"] = f"failed: {type(exc).__name__}: {exc}"[:200]
    dense_b = b[0].T.contiguous()  # [K, N]: one GEMM of the same FLOPs
    result["dense_tflops"] = flops / time_cuda(lambda: torch.mm(a, dense_b), warmup_ms=50, rep_ms=200) / 1e9
    result["over_dense"] = result["kgen_tflops"] / result["dense_tflops"]
    return result


def swiglu_columns(a: torch.Tensor, b_gate_up: torch.Tensor, offs: torch.Tensor) -> dict[str, Any]:
    """The fused SwiGLU with FP8 output against the unfused path (torch's grouped GEMM, torch's silu * up, kgen's
    quantizer), with b as stacked gate and up weights; their bf16 results compared."""
    fn, _ = torch_grouped()
    if fn is None:
        return {}
    inner = b_gate_up.shape[1] // 2

    def unfused_swiglu():
        gate_up = fn(a, b_gate_up.transpose(-2, -1), offs=offs)
        return torch.nn.functional.silu(gate_up[:, :inner]) * gate_up[:, inner:]

    out, _, _ = grouped_gemm_swiglu(a, b_gate_up, offs, quantize_out=True)
    fused_ms = time_cuda(lambda: grouped_gemm_swiglu(a, b_gate_up, offs, out=out, quantize_out=True), warmup_ms=50,
                         rep_ms=200)
    try:  # a peer's failure is reported, not fatal
        want = unfused_swiglu()
        unfused_ms = time_cuda(lambda: quantize_fp8_blockwise(unfused_swiglu()), warmup_ms=50, rep_ms=200)
    except Exception as exc:
        return {"swiglu_ms": fused_ms, "swiglu_status": f"failed: {type(exc).__name__}: {exc}"[:200]}
    return {"swiglu_ms": fused_ms, "unfused_ms": unfused_ms, "fused_over_unfused": fused_ms / unfused_ms,
            "swiglu_rel_rms": rel_rms(out, want)}


def fp8_columns(a: torch.Tensor, b: torch.Tensor, offs: torch.Tensor, flops: float, bandwidth: float) -> dict[str, Any]:
    """kgen's FP8 grouped GEMM (block scales) against torch's scaled grouped GEMM (row-wise scales), and the rate
    at which reading the touched experts' weights, a and the result once at the copy bandwidth would run."""
    a8, a_scale = quantize_fp8_blockwise(a)  # the pipeline's own quantizer: its MN-major scales go in as they are
    b8, b_scale = quantize_weights(b)
    out = grouped_gemm(a8, b8, offs, a_scale=a_scale, b_scale=b_scale)
    seconds = time_cuda(lambda: grouped_gemm(a8, b8, offs, a_scale=a_scale, b_scale=b_scale, out=out), warmup_ms=50,
                        rep_ms=200)
    touched = int((torch.diff(offs, prepend=offs.new_zeros(1)) > 0).sum())
    moved = touched * b8[0].numel() + a8.numel() + out.numel() * out.element_size()
    result: dict[str, Any] = {"fp8_tflops": flops / seconds / 1e9, "scaled_status": "ok",
                              "fp8_streaming_bound_tflops": flops / (moved / bandwidth) / 1e12}
    squared_error = squared_want = 0.0
    start = 0
    for e, end in enumerate(offs[:FP8_CHECKED_EXPERTS].tolist()):
        if end > start:
            want = dequantized(a8[start:end], a_scale[start:end], 1) @ dequantized(b8[e], b_scale[e], BLOCK).T
            squared_error += (out[start:end].double() - want).pow(2).sum().item()
            squared_want += want.pow(2).sum().item()
        start = end
    result["fp8_rel_rms"] = (squared_error / max(squared_want, 1e-300)) ** 0.5
    del a8, b8
    scaled = getattr(torch, "_scaled_grouped_mm", None)
    if scaled is None:
        result["scaled_status"] = "unavailable in this torch"
        return result
    try:  # its recipe: a scale per row of a and per (expert, column) of b
        a_rows = a.abs().amax(-1).float().clamp_min(1e-4) / E4M3_MAX
        b_columns = b.abs().amax(-1).float().clamp_min(1e-4) / E4M3_MAX
        a_codes = (a.float() / a_rows[:, None]).to(FP8)
        b_codes = torch.empty(b.shape, dtype=FP8, device=b.device)
        for first in range(0, b.shape[0], 16):  # a few experts at a time: the weights are many GB
            b_codes[first:first + 16] = (b[first:first + 16].float() / b_columns[first:first + 16, :, None]).to(FP8)
        call = lambda: scaled(a_codes, b_codes.transpose(-2, -1), a_rows, b_columns, offs=offs, out_dtype=torch.bfloat16)
        call()
        result["scaled_tflops"] = flops / time_cuda(call, warmup_ms=50, rep_ms=200) / 1e9
        result["fp8_over_scaled"] = result["fp8_tflops"] / result["scaled_tflops"]
    except Exception as exc:  # a peer's failure is reported, not fatal
        result["scaled_status"] = f"failed: {type(exc).__name__}: {exc}"[:200]
    result.update(fp8_dense_column(a, b[0], flops))
    return result


def fp8_dense_column(a: torch.Tensor, b0: torch.Tensor, flops: float) -> dict[str, Any]:
    """One dense FP8 GEMM of the same FLOPs (a against the first expert's weights), per-tensor scales."""
    dense = getattr(torch, "_scaled_mm", None)
    if dense is None:
        return {"fp8_dense_status": "unavailable in this torch"}
    try:  # a peer's failure is reported, not fatal
        a_codes, b_codes = a.to(FP8), b0.to(FP8)  # [M, K] row-major, [N, K] row-major: its transpose is column-major
        one = torch.ones((), dtype=torch.float32, device=a.device)
        call = lambda: dense(a_codes, b_codes.T, scale_a=one, scale_b=one, out_dtype=torch.bfloat16)
        call()
        return {"fp8_dense_tflops": flops / time_cuda(call, warmup_ms=50, rep_ms=200) / 1e9, "fp8_dense_status": "ok"}
    except Exception as exc:
        return {"fp8_dense_status": f"failed: {type(exc).__name__}: {exc}"[:200]}


def copy_bandwidth() -> float:
    """Bytes a second a device copy moves (read + written), over 2 GB."""
    # Timed call by call, not in a CUDA graph: captured, copy_ becomes a graph memcpy node, which measured 2.71 TB/s
    # on the H200 in every record up to session 37 (a copy engine's rate, it seems), where the same copy_ timed
    # as a kernel (the merge bench) moves 4.1-4.2 TB/s; that lower rate made the decode floor and the FP8 streaming
    # bound too lenient by about 1.55x.
    source = torch.empty(1 << 29, dtype=torch.bfloat16, device="cuda")
    target = torch.empty_like(source)
    return 2 * source.numel() * source.element_size() / (time_cuda(lambda: target.copy_(source), warmup_ms=50, rep_ms=200) / 1e3)


def decode_row(layer, tokens: int, bandwidth: float) -> dict[str, Any]:
    model, projection, experts, n, k = layer
    gen = torch.Generator().manual_seed(tokens + experts)
    chosen = torch.stack([torch.randperm(experts, generator=gen)[:TOP_K] for _ in range(tokens)])
    counts = torch.bincount(chosen.flatten(), minlength=experts)
    m_max = int(counts.max())
    a = torch.randn(experts, m_max, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16) / k ** 0.5
    masked_m = counts.to(torch.int32).cuda()
    # What decode runs: the fused SwiGLU for gate+up (b as stacked gate and up weights), the plain GEMM for down.
    call = grouped_gemm_swiglu if projection == "gate+up" else grouped_gemm
    out = call(a, b, masked_m=masked_m)
    rows = torch.arange(m_max, device="cuda")[None, :] < masked_m[:, None]
    want = torch.bmm(a, b.transpose(1, 2))
    if projection == "gate+up":
        want = torch.nn.functional.silu(want[..., :n // 2]) * want[..., n // 2:]
    decode_ms = time_graph(lambda: call(a, b, masked_m=masked_m, out=out))
    floor_ms = int((counts > 0).sum()) * n * k * b.element_size() / bandwidth * 1e3
    return {"case": f"{model} {projection} decode {tokens} tokens (masked)", "rel_rms": rel_rms(out[rows], want[rows]),
            "decode_us": decode_ms * 1e3, "weights_floor_us": floor_ms * 1e3, "over_floor": decode_ms / floor_ms,
            "copy_tbs": bandwidth / 1e12}


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    bandwidth = copy_bandwidth()
    for layer in LAYERS:
        for tokens in DECODE_TOKENS:
            rows.append(decode_row(layer, tokens, bandwidth))
            print(rows[-1], flush=True)
            torch.cuda.empty_cache()
    for layer in LAYERS:
        for tokens in TOKENS:
            for routing in ROUTINGS:
                rows.append(row(layer, tokens, routing, bandwidth))
                print(rows[-1], flush=True)
                torch.cuda.empty_cache()  # the shape's tensors (up to 15 GB of weights) are gone
    write_results(out_dir, NAME, "MoE grouped GEMM, bf16 and FP8", rows, COLUMNS, environment(), notes=[__doc__])
    summary = [summary_row("grouped gemm", f"{r['case']}: kgen/torch grouped TFLOP/s", r.get("over_torch"), "x",
                           ">= 1.0", "WRONG" if r.get("rel_rms", 0.0) > AGREEMENT else verdict(r.get("over_torch"), 1.0, True))
               for r in rows if "over_floor" not in r]
    summary += [summary_row("grouped gemm", f"{r['case']}: time / selected weights at copy bandwidth", r["over_floor"],
                            "x", "<= 1.10", "WRONG" if r["rel_rms"] > AGREEMENT else verdict(r["over_floor"], 1.10, False))
                for r in rows if "over_floor" in r]
    # FP8: against float64 of its own dequantized inputs, so only its accumulation and bf16 rounding show.
    summary += [summary_row("grouped gemm", f"{r['case']}: FP8 kgen/torch scaled grouped TFLOP/s", r.get("fp8_over_scaled"),
                            "x", ">= 1.0", "WRONG" if r["fp8_rel_rms"] > AGREEMENT else verdict(r.get("fp8_over_scaled"), 1.0, True))
                for r in rows if "fp8_tflops" in r]
    summary += [summary_row("grouped gemm", f"{r['case']}: FP8 TFLOP/s", r["fp8_tflops"], "TFLOP/s", f">= {FP8_BAR_TFLOPS:.0f}",
                            "WRONG" if r["fp8_rel_rms"] > AGREEMENT else verdict(r["fp8_tflops"], FP8_BAR_TFLOPS, True))
                for r in rows if "fp8_tflops" in r]
    # The unfused path rounds gate and up to bf16 first: the two bf16 results agree to a few 1e-3.
    summary += [summary_row("grouped gemm", f"{r['case']}: fused SwiGLU+FP8 / unfused time", r["fused_over_unfused"],
                            "x", "<= 0.85", "WRONG" if r["swiglu_rel_rms"] > AGREEMENT else verdict(r["fused_over_unfused"],
                                                                                              0.85, False))
                for r in rows if "fused_over_unfused" in r]
    return summary


def main(argv: list[str] | None = None) -> int:
    return run_standalone(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
