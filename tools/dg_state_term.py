"""How much of dg's 16-bit error comes from the whole-state inner product e^{G_L} <S, dS'> of each chunk (CPU,
float64; bench/NOTES.md, thirty-second session).

    PYTHONPATH=. python3 tools/dg_state_term.py [--seeds 3,4,5]

On inputs of the kind of tests/test_gdn_chunk_backward_gpu.py's no-decay case (lengths 130, 64, 7; 2 q/k heads,
GVA 2, head dim 128, a head without decay and one at about e^-20 a token; l2norm, initial state, final-state
gradient), made on the CPU: dg from each chunk's exact start state S and end-state gradient dS', against dg with
both rounded to bf16 everywhere, everywhere but in that term, only in that term, and everywhere with the term from
the bf16 copies plus their rounding losses kept as FP8 e5m2 (tiles.cuh's store_residual_rows).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tools"), str(ROOT / "bench")]
import gdn_reference as ref  # noqa: E402
from gdn_backward_errors import dg_from_states, exact_states  # noqa: E402


def cpu_case(lengths, heads, group, head_dim, seed):
    """The GPU test's make_case on the CPU (bf16 q, k, v, dO and beta)."""
    gen = torch.Generator().manual_seed(seed)
    total, heads_v = sum(lengths), heads * group
    q, k = (torch.randn(1, total, heads, head_dim, generator=gen) for _ in range(2))
    v = torch.randn(1, total, heads_v, head_dim, generator=gen)
    decay = torch.rand(heads_v, generator=gen) * 16
    decay[0], decay[-1] = 0.0, 16.0
    g = -decay * torch.nn.functional.softplus(0.5 * torch.randn(1, total, heads_v, generator=gen) + 1)
    beta = torch.rand(1, total, heads_v, generator=gen).to(torch.bfloat16)
    initial = torch.randn(len(lengths), heads_v, head_dim, head_dim, generator=gen)
    d_out = torch.randn(v.shape, generator=gen).to(torch.bfloat16)
    d_final = torch.randn(len(lengths), heads_v, head_dim, head_dim, generator=gen)
    return (q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta), initial, d_out, d_final


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", default="3,4,5")
    args = parser.parse_args()
    lengths = [130, 64, 7]
    cu_host = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    for seed in map(int, args.seeds.split(",")):
        inputs, initial, d_out, d_final = cpu_case(lengths, 2, 2, 128, seed)
        exact = exact_states(inputs, initial, d_out, d_final, cu_host)
        rounded = {c: tuple(x.to(torch.bfloat16).double() for x in pair) for c, pair in exact.items()}
        want = dg_from_states(inputs, d_out, cu_host, exact.__getitem__)
        # The term from bf16 copies plus their rounding losses as FP8 e5m2 (x 4096), as the kernel path keeps them.
        with_losses = {c: tuple(x.to(torch.bfloat16).double() + ((x - x.to(torch.bfloat16).double()) * 4096).float()
                                .clamp(-57344, 57344).to(torch.float8_e5m2).double() / 4096 for x in pair)
                       for c, pair in exact.items()}
        cases = (("bf16 everywhere", rounded, rounded), ("bf16 but the term", rounded, exact),
                 ("bf16 in the term only", exact, rounded), ("bf16 + e5m2 losses in the term", rounded, with_losses))
        print(f"seed {seed}: " + " | ".join(
            f"{label} {ref.rel_rms(dg_from_states(inputs, d_out, cu_host, a.__getitem__, b.__getitem__), want):.2e}"
            for label, a, b in cases))


if __name__ == "__main__":
    main()
