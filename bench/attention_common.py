"""What the two attention benchmarks share: the dtype, the float64 reference, SDPA calls, kgen plans, options.

bench_attention.py (dense shapes against SDPA's flash and cuDNN backends) and
bench_attention_sweep.py (the seed sweep of sequence lengths, with its peers)
both import this; nothing here touches the GPU at import time.
"""

from __future__ import annotations

import argparse
import contextlib
import math
import warnings
from typing import Any, Callable

import torch
import torch.nn.functional as F

import common  # noqa: F401  (first: it puts the repository root on sys.path, so kgen imports)
import kgen
from kgen import registry
from kgen.ops import AttentionPlan, plan_attention_varlen

DEVICE = "cuda"
FAMILY = "attention_prefill"
DTYPE = torch.bfloat16
DTYPE_NAME = "bf16"
REL_L2_TOL = 2e-2  # bf16 operands, P rounded to 16 bits before P V
UNSUPPORTED = "UNSUPPORTED"


def family() -> registry.Family:
    return registry.current().family(FAMILY)


def plan_for(cu_host: list[int], head_dim: int, causal: bool, policy: str | None = None,
             tile_m: int | None = None, device: str | None = None) -> AttentionPlan:
    """kgen's plan for equal q and k lengths; ``policy`` forces a tail policy, ``tile_m`` a tile height.

    ``device`` is where the work list goes (default: the current CUDA device; "cpu" to plan without a GPU).
    """
    return plan_attention_varlen(cu_host, cu_host, head_dim=head_dim, dtype=DTYPE, causal=causal, tail=policy,
                                 tile_m=tile_m, device=device)


def is_unsupported(exc: BaseException) -> bool:
    """kgen's way of saying the spec has no variant for the request."""
    return isinstance(exc, kgen.UnsupportedVariantError)


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
    """``sdpa_kernel(backend)`` for an SDPA peer's name; nothing for any other implementation."""
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
    """Device time per call of ``fn`` launched back to back: the longer of host launch and kernel."""
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
    """Mean, and the largest difference between rounds in percent of the fastest."""
    return sum(times) / len(times), (max(times) - min(times)) / min(times) * 100


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The options of both attention benchmarks (one group: run_all adds it once)."""
    group = parser.add_argument_group("attention prefill")
    group.add_argument("--attn-part", choices=("all", "dense", "sweep"), default="all",
                       help="dense shapes, the sequence-length sweep, or both (default all)")
    group.add_argument("--attn-only", default=None,
                       help="only dense cases / sweep entries ('sweep L=63') whose name contains this text")
    group.add_argument("--attn-warmup-ms", type=float, default=25, help="warm-up per event timing, ms (default 25)")
    group.add_argument("--attn-rep-ms", type=float, default=100,
                       help="timed repeats per event timing, ms (default 100)")
    group.add_argument("--attn-rounds", type=int, default=2, help="times each implementation is timed (default 2)")
    group.add_argument("--attn-seed", type=int, default=0)
    group.add_argument("--attn-tail-rounds", type=int, default=7,
                       help="ABBA rounds of each length's tail/padded pair (default 7)")
    group.add_argument("--attn-boundary-rounds", type=int, default=15,
                       help="alternated timings of each boundary pair (default 15)")
    group.add_argument("--attn-boundary-rep-ms", type=float, default=40,
                       help="event-timer repetitions per boundary timing, ms (default 40)")
