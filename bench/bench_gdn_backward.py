"""The chunked gated delta rule's training step: kgen against FlashQLA and fla, forward and forward + backward
through each library's autograd, with the step's peak memory, in one run.

Issue 24's bar shapes (sequences x length, H/HV: its table, and seed 000's sweep points, N = min(4096, 131072 // L)
sequences of L tokens, 12/12), K = V = 128, bf16 q/k/v, fp32 g and beta, k L2-normalised, no initial state, under
both gate regimes of the forward's issue: strong (logsigmoid(randn)) and FlashQLA's (those / 16, a quarter of the
v-heads at 0). A step is the forward, then ``torch.autograd.grad`` of
sum(o * do) for q, k, v, g and beta; beside it, kgen's forward then ``chunk_gated_delta_rule_bwd`` with
``per_chunk="kernel"``, whose gradients are compared with the autograd step's. Eager (autograd steps cannot be
graph-replayed), timed by bench/common.time_cuda (median, L2 flushed between repeats, at least 10). Peak memory:
the most allocated during a step beyond what was allocated before it (inputs and do). kgen runs with a plan
made once on the host; the peers (benchmarks only, never dependencies) run in child processes, one per library,
on the same inputs: fla-core 0.6.0's ``chunk_gated_delta_rule`` (FLA_FLASH_QLA=0) and FlashQLA 0.1.3's (its
autograd function; it compiles its kernels for each new shape on a fresh machine, several minutes in all, so it
runs last). Rows are printed as they are measured. Each library's gradients are
compared with kgen's (rel RMS of the five, the largest) up to COMPARED_MAX_TOKENS tokens. Bar (issue 24, to resolve): kgen's forward + backward
<= FlashQLA's at every shape.

    PYTHONPATH=. python3 bench/bench_gdn_backward.py [--out DIR] [--gdn-peers fla,flashqla]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Callable

import torch

from common import (add_peer_rows, default_out_dir, environment, gdn_peer, standalone_parser, summary_row,
                    time_cuda, verdict, write_results)
from bench_gdn_chunk import flashqla_gates
from kgen.families.gated_delta_rule.chunk import forward_keeping
from kgen.ops import chunk_gated_delta_rule, chunk_gated_delta_rule_bwd, plan_chunk_gated_delta_rule

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from gdn_backward_reference import chunked_backward  # noqa: E402

NAME = "bench_gdn_backward"
HEAD_DIM = 128
#: (sequences, length, H, HV, gates): issue 24's bar shapes under each gate regime, and a small case (partial last
#: chunks) where every library's gradients are also compared with float64 (tests/gdn_backward_reference.
#: chunked_backward, pinned on the CPU to autograd through the per-token recurrence).
BAR_SHAPES = [(1, 32768, 16, 32), (1, 32768, 2, 8), (4, 8192, 16, 32), (8, 1024, 16, 32),
              *((min(4096, 131072 // n), n, 12, 12) for n in (32, 63, 64, 65, 128, 1024))]
SHAPES = [(*shape, gates) for gates in ("strong", "flashqla") for shape in BAR_SHAPES] + [(2, 1000, 2, 4, "strong")]
F64_MAX_TOKENS = 4096
#: Peers' gradients are compared with kgen's up to this many tokens: the sweep's 131072-token shapes' would carry
#: about 1.2 GB each to the peers' processes.
COMPARED_MAX_TOKENS = 32768
#: Issue 24's accuracy bars: each gradient's rel RMS against float64, and at most this times each peer's.
F64_BAR, F64_PEER_FACTOR = 1e-2, 1.5
PEERS = ("fla", "flashqla")
COLUMNS = [("shape", "shape", None)] + [
    (f"{lib}_{what}", f"{label} {unit}", fmt) for lib, label in (("kgen", "kgen"), ("flashqla", "FlashQLA"), ("fla", "fla"))
    for what, unit, fmt in (("fwd_ms", "fwd ms", ".3f"), ("step_ms", "fwd+bwd ms", ".3f"),
                            ("bwd_ms", "bwd ms (step - fwd)", ".3f"), ("peak_gib", "peak GiB", ".2f"))
] + [("kgen_kernel_step_ms", "kgen fwd+bwd ms, per-chunk kernel", ".3f"),
     ("kgen_kernel_grad_rms", "per-chunk kernel vs torch grads rel RMS", ".1e"),
     ("kgen_over_flashqla", "kgen/FlashQLA fwd+bwd", ".2f"), ("kgen_over_fla", "kgen/fla fwd+bwd", ".2f"),
     ("flashqla_grad_rms", "FlashQLA vs kgen grads rel RMS", ".1e"), ("fla_grad_rms", "fla vs kgen grads rel RMS", ".1e"),
     ("kgen_f64_rms", "kgen vs float64", ".1e"), ("flashqla_f64_rms", "FlashQLA vs float64", ".1e"),
     ("fla_f64_rms", "fla vs float64", ".1e"),
     ("flashqla_status", "FlashQLA", None), ("fla_status", "fla", None)]


def inputs(shape) -> tuple[torch.Tensor, ...]:
    seqs, length, heads, heads_v, gates = shape
    gen = torch.Generator(device="cuda").manual_seed(seqs * length + heads_v)
    total = seqs * length
    q = torch.randn(1, total, heads, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    k = torch.nn.functional.normalize(torch.randn(1, total, heads, HEAD_DIM, generator=gen, device="cuda"), dim=-1)
    v = torch.randn(1, total, heads_v, HEAD_DIM, generator=gen, device="cuda", dtype=torch.bfloat16)
    g = torch.nn.functional.logsigmoid(torch.randn(1, total, heads_v, generator=gen, device="cuda"))
    if gates == "flashqla":
        g = flashqla_gates(g)
    beta = torch.rand(1, total, heads_v, generator=gen, device="cuda")
    do = torch.randn(v.shape, generator=gen, device="cuda", dtype=torch.bfloat16)
    cu = torch.arange(seqs + 1, dtype=torch.int32) * length
    return q, k.to(torch.bfloat16), v, g, beta, do, cu


def _label(shape: tuple) -> str:
    return f"{shape[0]}x{shape[1]} {shape[2]}/{shape[3]} {shape[4]}"


def _step_ms(fn: Callable[[], Any]) -> float:
    return time_cuda(fn, warmup_ms=100, rep_ms=500)


def measured(library: str, forward: Callable[..., torch.Tensor], tensors) -> tuple[dict[str, Any], list[torch.Tensor]]:
    """The library's times and peak memory, and its gradients (to compare)."""
    q, k, v, g, beta, do, _ = tensors
    leaves = [t.detach().clone().requires_grad_() for t in (q, k, v, g, beta)]

    def step():
        o = forward(*leaves)
        return torch.autograd.grad(o, leaves, grad_outputs=do)

    with torch.no_grad():
        fwd_ms = _step_ms(lambda: forward(*leaves))
    grads = step()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    step()
    torch.cuda.synchronize()
    peak = (torch.cuda.max_memory_allocated() - before) / 2**30
    step_ms = _step_ms(step)
    return {f"{library}_fwd_ms": fwd_ms, f"{library}_step_ms": step_ms, f"{library}_bwd_ms": step_ms - fwd_ms,
            f"{library}_peak_gib": peak}, grads


def kgen_row(shape) -> tuple[dict[str, Any], list[torch.Tensor]]:
    tensors = inputs(shape)
    q, k, v, g, beta, do, cu = tensors
    cu_device = cu.cuda()
    plan = plan_chunk_gated_delta_rule(cu, num_heads_v=shape[3], head_dim=HEAD_DIM, device="cuda")

    def forward(q, k, v, g, beta):
        return chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_device, plan=plan)[0]
    row, grads = measured("kgen", forward, tensors)

    def kernel_step():  # the forward, then the backward with its per-chunk gradients by the kernel, as autograd's
        kept = forward_keeping(q, k, v, g, beta, cu_seqlens=cu_device, plan=plan)[2]
        return chunk_gated_delta_rule_bwd(q, k, v, g, beta, do, cu_seqlens=cu_device, plan=plan, per_chunk="kernel",
                                          forward_kept=kept)
    with torch.no_grad():
        row["kgen_kernel_step_ms"] = _step_ms(kernel_step)
        row["kgen_kernel_grad_rms"] = _largest_rel_rms(list(kernel_step()[:5]), grads)
    return row, grads


def _largest_rel_rms(got: list[torch.Tensor], want: list[torch.Tensor]) -> float:
    return max(float((a.double() - b.double()).pow(2).mean().sqrt() / b.double().pow(2).mean().sqrt().clamp_min(1e-30))
               for a, b in zip(got, want))


def reference_grads(shape) -> list[torch.Tensor] | None:
    """float64 gradients of the shape's step (q, k, v, g, beta), on the GPU, where it is small enough."""
    if shape[0] * shape[1] > F64_MAX_TOKENS:
        return None
    q, k, v, g, beta, do, cu = inputs(shape)
    return [x.cpu() for x in chunked_backward(q, k, v, g, beta, do, cu_seqlens=cu.tolist())[:5]]


def with_f64_error(library: str, row: dict[str, Any], grads, reference) -> dict[str, Any]:
    """``row`` with the library's largest rel RMS against float64 over the five gradients, where there is one."""
    if reference is not None:
        row[f"{library}_f64_rms"] = _largest_rel_rms(grads, [r.cuda() for r in reference])
    return row


def peer_rows(library: str, shapes: list[tuple], comparisons: list[tuple[list[torch.Tensor] | None, list[torch.Tensor] | None]]
              ) -> list[dict[str, Any]]:
    """A peer's rows (in a child process: a fault there must not end this run)."""
    fn, status = gdn_peer(library, "chunk_gated_delta_rule")
    if fn is None:
        return [{f"{library}_status": status}] * len(shapes)
    rows = []
    for shape, (want, reference) in zip(shapes, comparisons):
        tensors = inputs(shape)
        cu_long = tensors[-1].to("cuda", torch.long)

        def forward(q, k, v, g, beta):
            return fn(q, k, v, g, beta, cu_seqlens=cu_long)[0]
        try:
            row, grads = measured(library, forward, tensors)
            if want is not None:
                row[f"{library}_grad_rms"] = _largest_rel_rms(grads, [w.cuda() for w in want])
            rows.append({f"{library}_status": "ok", **with_f64_error(library, row, grads, reference)})
        except Exception as exc:
            rows.append({f"{library}_status": f"failed: {type(exc).__name__}: {exc}"[:200]})
        print(shape, rows[-1], flush=True)
        torch.cuda.empty_cache()
    return rows


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    peers = [p.strip() for p in options.gdn_peers.split(",") if p.strip()]
    if set(peers) - set(PEERS):
        raise ValueError(f"--gdn-peers: expected names from {PEERS}, got {options.gdn_peers!r}")
    shapes = [shape for shape in SHAPES if options.gdn_backward_shapes in _label(shape)]
    rows, comparisons = [], []
    for shape in shapes:
        row, grads = kgen_row(shape)
        reference = reference_grads(shape)
        rows.append({"shape": _label(shape), **with_f64_error("kgen", row, grads, reference)})
        print(rows[-1], flush=True)
        comparisons.append(([x.cpu() for x in grads] if shape[0] * shape[1] <= COMPARED_MAX_TOKENS else None, reference))
        torch.cuda.empty_cache()
    for library in peers:
        add_peer_rows(rows, library, peer_rows, shapes, comparisons, time_key="step_ms")
    for row in rows:
        print(row, flush=True)
    write_results(out_dir, NAME, "Gated delta rule training step (forward + backward)", rows, COLUMNS, environment(),
                  notes=[__doc__])
    summary = []
    for row in rows:
        ratio = row.get("kgen_over_flashqla")
        label = f"{row['shape']}: kgen/FlashQLA fwd+bwd ({row['kgen_step_ms']:.2f} ms"
        label += f" vs {row['flashqla_step_ms']:.2f} ms)" if ratio is not None else f"; FlashQLA: {row['flashqla_status']})"
        summary.append(summary_row("gdn backward", label, ratio, "x", "<= 1.0",
                                   verdict(ratio, 1.0, False) if ratio is not None else ""))
        if "kgen_f64_rms" in row:
            error = row["kgen_f64_rms"]
            peers = [row[f"{p}_f64_rms"] for p in PEERS if f"{p}_f64_rms" in row]
            within = error <= F64_BAR and all(error <= F64_PEER_FACTOR * e for e in peers)
            summary.append(summary_row("gdn backward", f"{row['shape']}: kgen gradients vs float64 (largest of five; "
                                       f"peers {', '.join(f'{e:.1e}' for e in peers) or 'none'})", error, "rel RMS",
                                       f"<= {F64_BAR} and <= {F64_PEER_FACTOR}x each peer's",
                                       "ok" if within else "WRONG"))
    return summary


def add_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("gdn backward")
    group.add_argument("--gdn-peers", default=",".join(PEERS),
                       help=f"comma-separated peers of the training step, in order (default {','.join(PEERS)}; empty: "
                            "kgen alone). A fresh machine compiles FlashQLA's kernels for minutes: one peer a device "
                            "call fits its limit")
    group.add_argument("--gdn-backward-shapes", default="", metavar="TEXT",
                       help="only the shapes whose label (such as '4096x32 12/12 strong') contains TEXT")


def main(argv: list[str] | None = None) -> int:
    options = standalone_parser(__doc__, add_arguments).parse_args(argv)
    run(options.out or default_out_dir(), options)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
