"""kgen's GQA decode attention over a KV cache against torch SDPA's cuDNN and flash backends and against a
device copy of the cache's bytes, all as CUDA graph replays in one run.

Hq/Hkv = 32/8, D = 128, bf16; B requests of L keys each (Lmax = L), one new token per request, at B1 L32k,
B8 L8k, B64 L2k, B1 L128k and B256 L1k. kgen runs on a contiguous cache [B, L, Hkv, D] and on paged
caches [B*L/P, P, Hkv, D] with P = 16 and 64, whose pages are handed to the requests in a random
permutation (torch.randperm), so a request's pages lie shuffled in memory. SDPA gets q [B, Hq, 1, D] and
contiguous k/v [B, Hkv, L, D] with enable_gqa=True; a backend that refuses GQA gets k/v repeated to Hq
heads (the status column says so), and is still charged only the Hkv heads' bytes. The bandwidth
reference is ``dst.copy_(k_cache)``: it reads K's bytes and writes as many, the same K+V bytes of traffic
as decode's reads. TB/s = K+V bytes (2 B L Hkv D 2) / time. Where the cache is under 4x L2, each graph
rotates over enough copies of it (of the paged caches, SDPA's k/v and the copy's buffers too) that every
call reads from HBM. Also at B8 L8k (contiguous): 4 new tokens per request (q [8, 4, 32, 128], causal
among themselves) against 1.

Before timing, each kgen configuration's output (NaN-poisoned first) is compared on the first two
requests (one at B = 1) with a float64 softmax(q k^T D^-0.5) v; a relative RMS error over 1e-2 marks its
summary rows WRONG. Bars (observations): t(copy)/t(kgen) >= 0.90 at B1 L32k, B8 L8k and B1 L128k,
>= 0.85 at B64 L2k (none at B256 L1k); t(best SDPA)/t(kgen) >= 1.0 at every shape; t(paged)/t(contiguous)
<= 1.05 at every shape and page size; t(Lq=4)/t(Lq=1) <= 1.15 at B8 L8k.

    PYTHONPATH=. python3 bench/bench_attention_decode.py [--out DIR]
"""

from __future__ import annotations

import argparse
import math
import warnings
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from common import attempt, environment, run_standalone, summary_row, time_graph, verdict, write_results
from attention_common import short
from kgen.ops import attention_decode, plan_attention_decode

NAME = "bench_attention_decode"
BENCHMARK = "attention decode"
HEADS_Q, HEADS_KV, HEAD_DIM, DTYPE = 32, 8, 128, torch.bfloat16
GROUP = HEADS_Q // HEADS_KV
SHAPES = [(1, 32768), (8, 8192), (64, 2048), (1, 131072), (256, 1024)]  # (B, L)
PAGE_SIZES = (16, 64)
COPY_BARS = {(1, 32768): 0.90, (8, 8192): 0.90, (1, 131072): 0.90, (64, 2048): 0.85}
SDPA_BAR, PAGED_BAR = 1.0, 1.05
SPEC_SHAPE, SPEC_Q_LEN, SPEC_BAR = (8, 8192), 4, 1.15  # several new tokens per request (speculative decoding)
CHECK_REQUESTS = 2
RMS_TOL = 1e-2
L2_MULTIPLE = 4  # a graph's calls together read at least this many L2s of cache

COLUMNS = [("shape", "shape", None), ("copies", "copies", None), ("kv_mib", "K+V MiB", ".0f"),
           ("kgen_us", "kgen us", ".1f"), ("kgen_tbs", "kgen TB/s", ".2f"), ("copy_us", "copy us", ".1f"),
           ("copy_tbs", "copy TB/s", ".2f"), ("copy_fraction", "copy/kgen", ".3f"),
           ("paged16_us", "paged-16 us", ".1f"), ("paged16_ratio", "paged-16/contig", ".3f"),
           ("paged64_us", "paged-64 us", ".1f"), ("paged64_ratio", "paged-64/contig", ".3f"),
           ("cudnn_us", "cuDNN us", ".1f"), ("cudnn_tbs", "cuDNN TB/s", ".2f"),
           ("flash_us", "flash us", ".1f"), ("flash_tbs", "flash TB/s", ".2f"),
           ("sdpa_over_kgen", "best SDPA/kgen", ".3f"), ("lq4_ratio", "Lq4/Lq1", ".3f"),
           ("worst_rel_rms", "kgen rel RMS (worst)", ".1e"), ("worst_max_abs", "kgen max abs (worst)", ".1e"),
           ("cudnn_status", "cuDNN", None), ("flash_status", "flash", None)]
# Each kgen configuration: the key prefix of its row fields, and its name in labels.
CONFIGS = {"kgen": "contiguous", **{f"paged{p}": f"paged-{p}" for p in PAGE_SIZES}, "lq4": f"Lq={SPEC_Q_LEN}"}


def label(batch: int, seqlen: int) -> str:
    return f"B{batch} L{seqlen // 1024}k"


def kv_bytes(batch: int, seqlen: int) -> int:
    return 2 * batch * seqlen * HEADS_KV * HEAD_DIM * DTYPE.itemsize


def cache_copies(nbytes: int) -> int:
    """How many copies of the cache a timed graph rotates over: one if it dwarfs L2, else enough that the
    calls of one graph read L2_MULTIPLE L2s from HBM."""
    l2 = torch.cuda.get_device_properties(torch.cuda.current_device()).L2_cache_size
    return 1 if nbytes >= L2_MULTIPLE * l2 else -(-L2_MULTIPLE * l2 // nbytes)


def reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seqlen: int, requests: int) -> torch.Tensor:
    """float64 decode attention of the first ``requests`` requests, shaped like ``q[:requests]``: q head h
    reads KV head h // GROUP; new token i sits at position seqlen - Lq + i and sees the keys up to it."""
    q4 = q if q.dim() == 4 else q.unsqueeze(1)
    q_len = q4.shape[1]
    positions = seqlen - q_len + torch.arange(q_len, device=q.device)
    hidden = torch.arange(seqlen, device=q.device)[None, :] > positions[:, None]  # [Lq, L]
    outs = []
    for b in range(requests):
        qg = q4[b].double().view(q_len, HEADS_KV, GROUP, HEAD_DIM).permute(1, 2, 0, 3)  # [Hkv, G, Lq, D]
        kb, vb = (t[b, :seqlen].double().transpose(0, 1) for t in (k, v))  # [Hkv, L, D]
        scores = torch.einsum("hgqd,hkd->hgqk", qg, kb) * HEAD_DIM ** -0.5
        weights = scores.masked_fill(hidden, -math.inf).softmax(-1)
        outs.append(torch.einsum("hgqk,hkd->qhgd", weights, vb).reshape(q_len, HEADS_Q, HEAD_DIM))
    ref = torch.stack(outs)
    return ref if q.dim() == 4 else ref[:, 0]


def errors(got: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    """(relative RMS error, max abs error) of ``got`` against the float64 ``ref``; NaN if any output is NaN."""
    diff = got.double() - ref
    return (torch.linalg.vector_norm(diff) / torch.linalg.vector_norm(ref)).item(), diff.abs().max().item()


def paged(caches: list[tuple], page_size: int, gen: torch.Generator) -> list[tuple]:
    """The contiguous caches' keys and values as paged caches [B*L/P, P, Hkv, D] with one block table: request
    b's j-th page is page perm[b * L/P + j] of a random permutation, so its pages lie shuffled in memory."""
    batch, seqlen = caches[0][0].shape[:2]
    pages = batch * seqlen // page_size
    perm = torch.randperm(pages, generator=gen, device="cuda")
    table = perm.view(batch, seqlen // page_size).to(torch.int32)
    result = []
    for k, v, _ in caches:
        k_pages, v_pages = (torch.empty((pages, page_size, HEADS_KV, HEAD_DIM), dtype=DTYPE, device="cuda")
                            for _ in range(2))
        k_pages[perm] = k.view(pages, page_size, HEADS_KV, HEAD_DIM)
        v_pages[perm] = v.view(pages, page_size, HEADS_KV, HEAD_DIM)
        result.append((k_pages, v_pages, table))
    return result


def kgen_case(q: torch.Tensor, caches: list[tuple], seqlens: torch.Tensor, ref: torch.Tensor,
              page_size: int | None = None) -> dict[str, Any]:
    """kgen on ``caches`` ((k, v, block table or None) per copy): checked on NaN-poisoned output, then timed."""
    plan = plan_attention_decode(seqlens.tolist(), num_heads_q=HEADS_Q, num_heads_kv=HEADS_KV, head_dim=HEAD_DIM,
                                 q_len=1 if q.dim() == 3 else q.shape[1], dtype=DTYPE, page_size=page_size,
                                 device="cuda")
    out = torch.full_like(q, math.nan)
    k, v, table = caches[0]
    attention_decode(q, k, v, seqlens, block_table=table, plan=plan, out=out)
    rel_rms, max_abs = errors(out[:len(ref)], ref)

    def call(i=0):
        k, v, table = caches[i]
        return attention_decode(q, k, v, seqlens, block_table=table, plan=plan, out=out)
    return {"us": 1e3 * time_graph(call, calls_per_graph=len(caches)), "rel_rms": rel_rms, "max_abs": max_abs,
            "variant": plan.variant.name, "splits": plan.splits.max_splits}


def copy_us(caches: list[tuple]) -> float:
    """``dst.copy_(k)`` per cache copy: K's bytes read and as many written, decode's K+V bytes of traffic."""
    sources = [k for k, _, _ in caches]
    targets = [torch.empty_like(k) for k in sources]
    return 1e3 * time_graph(lambda i=0: targets[i].copy_(sources[i]), calls_per_graph=len(sources))


def sdpa_checked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gqa: bool) -> torch.Tensor:
    """One SDPA call; a refusal raises with torch's reasons (the warnings it gives) attached."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            return F.scaled_dot_product_attention(q, k, v, enable_gqa=gqa)
        except Exception as exc:
            reasons = "; ".join(str(w.message) for w in caught)
            raise RuntimeError(f"{short(exc, 300)} {reasons}".strip()) from exc


def sdpa_case(backend: Any, q: torch.Tensor, caches: list[tuple], ref: torch.Tensor) -> dict[str, Any]:
    """SDPA restricted to ``backend`` on q [B, Hq, 1, D] and k/v [B, Hkv, L, D] (repeated to Hq heads if the
    backend refuses GQA), checked against ``ref``, then timed."""
    from torch.nn.attention import sdpa_kernel
    q_s = q.unsqueeze(2).contiguous()
    kv = [(k.transpose(1, 2).contiguous(), v.transpose(1, 2).contiguous()) for k, v, _ in caches]
    with sdpa_kernel(backend):
        try:
            out, gqa, status = sdpa_checked(q_s, *kv[0], True), True, "ok (enable_gqa)"
        except Exception as exc:
            kv = [(k.repeat_interleave(GROUP, 1), v.repeat_interleave(GROUP, 1)) for k, v in kv]
            out, gqa = sdpa_checked(q_s, *kv[0], False), False
            status = f"k/v expanded to {HEADS_Q} heads (bytes counted for {HEADS_KV}); GQA refused: {short(exc, 200)}"
        rel_rms, _ = errors(out[:len(ref), :, 0], ref)
        del out

        def call(i=0):
            return F.scaled_dot_product_attention(q_s, *kv[i], enable_gqa=gqa)
        return {"us": 1e3 * time_graph(call, calls_per_graph=len(kv)), "status": status, "rel_rms": rel_rms}


def measure(batch: int, seqlen: int, seed: int, failures: list[dict[str, Any]]) -> dict[str, Any]:
    from torch.nn.attention import SDPBackend
    name, nbytes = label(batch, seqlen), kv_bytes(batch, seqlen)
    copies = cache_copies(nbytes)
    row: dict[str, Any] = {"shape": name, "B": batch, "L": seqlen, "copies": copies, "kv_mib": nbytes / 2**20}
    gen = torch.Generator(device="cuda").manual_seed(seed)

    def randn(*shape):
        return torch.randn(shape, generator=gen, device="cuda", dtype=DTYPE)
    q = randn(batch, HEADS_Q, HEAD_DIM)
    caches = [(randn(batch, seqlen, HEADS_KV, HEAD_DIM), randn(batch, seqlen, HEADS_KV, HEAD_DIM), None)
              for _ in range(copies)]
    seqlens = torch.full((batch,), seqlen, dtype=torch.int32, device="cuda")
    checked = min(CHECK_REQUESTS, batch)
    ref = reference(q, caches[0][0], caches[0][1], seqlen, checked)

    def record(prefix: str, result: dict[str, Any] | None) -> None:
        if result is not None:
            row.update({f"{prefix}_{key}": value for key, value in result.items()})

    record("kgen", attempt(BENCHMARK, f"{name} kgen contiguous", failures, kgen_case, q, caches, seqlens, ref))
    row["copy_us"] = attempt(BENCHMARK, f"{name} copy", failures, copy_us, caches)
    if (batch, seqlen) == SPEC_SHAPE:
        q4 = randn(batch, SPEC_Q_LEN, HEADS_Q, HEAD_DIM)
        ref4 = reference(q4, caches[0][0], caches[0][1], seqlen, checked)
        record("lq4", attempt(BENCHMARK, f"{name} kgen Lq={SPEC_Q_LEN}", failures, kgen_case, q4, caches, seqlens,
                              ref4))
        del q4, ref4
    for page_size in PAGE_SIZES:
        pages = attempt(BENCHMARK, f"{name} paged-{page_size} cache", failures, paged, caches, page_size, gen)
        if pages is not None:
            record(f"paged{page_size}", attempt(BENCHMARK, f"{name} kgen paged-{page_size}", failures, kgen_case, q,
                                                pages, seqlens, ref, page_size))
        del pages
        torch.cuda.empty_cache()
    for peer, backend in (("cudnn", SDPBackend.CUDNN_ATTENTION), ("flash", SDPBackend.FLASH_ATTENTION)):
        try:
            record(peer, sdpa_case(backend, q, caches, ref))
        except Exception as exc:  # refused even with k/v expanded, or failed while timed
            row[f"{peer}_status"] = f"failed: {short(exc, 300)}"
        torch.cuda.empty_cache()

    for prefix in ("kgen", "cudnn", "flash"):
        if row.get(f"{prefix}_us") is not None:
            row[f"{prefix}_tbs"] = nbytes / (row[f"{prefix}_us"] * 1e-6) / 1e12
    if row["copy_us"] is not None:
        row["copy_tbs"] = nbytes / (row["copy_us"] * 1e-6) / 1e12
    if row.get("kgen_us") is not None:
        t = row["kgen_us"]
        if row["copy_us"] is not None:
            row["copy_fraction"] = row["copy_us"] / t
        for page_size in PAGE_SIZES:
            if row.get(f"paged{page_size}_us") is not None:
                row[f"paged{page_size}_ratio"] = row[f"paged{page_size}_us"] / t
        peers = [row[f"{p}_us"] for p in ("cudnn", "flash") if row.get(f"{p}_us") is not None]
        if peers:
            row["sdpa_over_kgen"] = min(peers) / t
        if row.get("lq4_us") is not None:
            row["lq4_ratio"] = row["lq4_us"] / t
    checks = [(row[f"{c}_rel_rms"], row[f"{c}_max_abs"]) for c in CONFIGS if f"{c}_rel_rms" in row]
    if checks:
        row["worst_rel_rms"] = worst([e for e, _ in checks])
        row["worst_max_abs"] = worst([e for _, e in checks])
    return row


def worst(values: list[float]) -> float:
    """The largest, NaN if any is NaN (max() would skip it)."""
    return math.nan if any(x != x for x in values) else max(values)


def wrong(row: dict[str, Any], config: str) -> bool:
    """Whether ``config``'s output missed the reference (NaN, or relative RMS error over RMS_TOL)."""
    err = row.get(f"{config}_rel_rms")
    return err is not None and not err <= RMS_TOL


def summary_rows(row: dict[str, Any]) -> list[dict[str, Any]]:
    name, key, out = row["shape"], (row["B"], row["L"]), []

    def us(prefix: str) -> str:
        value = row.get(f"{prefix}_us")
        return f"{value:.1f} us" if value is not None else "not measured"

    def add(metric: str, value: float | None, bar: float | None, higher_is_better: bool, config: str) -> None:
        bar_text = "" if bar is None else f"{'>=' if higher_is_better else '<='} {bar}"
        result = "WRONG" if wrong(row, config) else "" if bar is None else verdict(value, bar, higher_is_better)
        if wrong(row, config):
            metric += f"; {CONFIGS[config]} rel RMS {row[f'{config}_rel_rms']:.1e}"
        out.append(summary_row(BENCHMARK, f"{name}: {metric}", value, "x", bar_text, result))

    tbs = f"{row['kgen_tbs']:.2f} TB/s" if "kgen_tbs" in row else "-"
    copy_tbs = f"{row['copy_tbs']:.2f} TB/s" if "copy_tbs" in row else "-"
    add(f"copy/kgen bandwidth (kgen {us('kgen')}, {tbs}; copy {us('copy')}, {copy_tbs})",
        row.get("copy_fraction"), COPY_BARS.get(key), True, "kgen")
    peers = "; ".join(f"{p} {us(p)} ({row.get(f'{p}_status', '-')})" for p in ("cudnn", "flash"))
    add(f"best SDPA/kgen (kgen {us('kgen')}; {peers})", row.get("sdpa_over_kgen"), SDPA_BAR, True, "kgen")
    for page_size in PAGE_SIZES:
        add(f"paged-{page_size}/contiguous ({us(f'paged{page_size}')} vs {us('kgen')})",
            row.get(f"paged{page_size}_ratio"), PAGED_BAR, False, f"paged{page_size}")
    if key == SPEC_SHAPE:
        add(f"Lq={SPEC_Q_LEN}/Lq=1 ({us('lq4')} vs {us('kgen')})", row.get("lq4_ratio"), SPEC_BAR, False, "lq4")
    return out


def run(out_dir: Path, options: argparse.Namespace) -> list[dict[str, Any]]:
    rows, failures = [], []
    for index, (batch, seqlen) in enumerate(SHAPES):
        row = attempt(BENCHMARK, label(batch, seqlen), failures, measure, batch, seqlen, index, failures)
        torch.cuda.empty_cache()  # this shape's caches are gone; the next shape may be larger
        if row is not None:
            rows.append(row)
            print(row, flush=True)
    write_results(out_dir, NAME, "GQA decode attention over a KV cache", rows, COLUMNS, environment(),
                  notes=[__doc__])
    return [s for r in rows for s in summary_rows(r)] + failures


def main(argv: list[str] | None = None) -> int:
    return run_standalone(__doc__, run, argv)


if __name__ == "__main__":
    raise SystemExit(main())
