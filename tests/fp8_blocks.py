"""DeepGEMM's FP8 block scaling in torch, for the FP8 grouped GEMM's tests and benchmark: a's 1 x 128 blocks per row,
b's 128 x 128 blocks per expert, s = max(amax, 1e-4) / 448 (kgen.ops.quantize_fp8_blockwise's recipe), and the
float64 values the codes stand for."""

from __future__ import annotations

import torch

FP8, BLOCK, E4M3_MAX = torch.float8_e4m3fn, 128, 448.0


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., K] as e4m3 codes and fp32 scales [..., K / 128], one per row and 128 columns (DeepGEMM's recipe)."""
    blocks = x.float().unflatten(-1, (-1, BLOCK))
    scale = blocks.abs().amax(-1).clamp_min(1e-4) / E4M3_MAX
    return (blocks / scale[..., None]).to(FP8).flatten(-2), scale.contiguous()


def quantize_weights(w: torch.Tensor, experts_at_once: int = 16) -> tuple[torch.Tensor, torch.Tensor]:
    """w [E, N, K] as e4m3 codes and fp32 scales [E, N / 128, K / 128], one per 128 x 128 block (a few experts at
    a time: a benchmark's weights are many GB)."""
    experts, n, k = w.shape
    codes = torch.empty(w.shape, dtype=FP8, device=w.device)
    scales = torch.empty((experts, n // BLOCK, k // BLOCK), dtype=torch.float32, device=w.device)
    for first in range(0, experts, experts_at_once):
        blocks = w[first:first + experts_at_once].float().reshape(-1, n // BLOCK, BLOCK, k // BLOCK, BLOCK)
        scale = blocks.abs().amax((2, 4)).clamp_min(1e-4) / E4M3_MAX
        codes[first:first + experts_at_once] = (blocks / scale[:, :, None, :, None]).to(FP8).reshape(-1, n, k)
        scales[first:first + experts_at_once] = scale
    return codes, scales


def dequantized(codes: torch.Tensor, scale: torch.Tensor, rows_per_scale: int) -> torch.Tensor:
    """float64 values of codes: each times its block's scale (rows_per_scale: 1 for a, 128 for b)."""
    expanded = scale.double().repeat_interleave(BLOCK, dim=-1)
    if rows_per_scale > 1:
        expanded = expanded.repeat_interleave(rows_per_scale, dim=-2)
    return codes.double() * expanded
