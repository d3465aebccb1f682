"""A small run of every built-in kernel for compute-sanitizer (memcheck, racecheck):

    compute-sanitizer --tool memcheck --report-api-errors no python3 tools/sanitizer_case.py

Attention over a packed batch with tails (each kernel and tail policy, and the no-tail variant on
whole tiles), neighbours poisoned with NaN/Inf, a plan used with cu_seqlens past the tensors (here and
for the gated delta rule), decode attention (each load and tail policy, contiguous
and paged, a request split and merged in the kernel), the gated delta rule's chunked forward (tails, a
split sequence with its summaries and chain, both layouts, l2norm), its backward and decode step, both merge
kernels, the FP8 block quantization and the grouped GEMMs (plain and SwiGLU, each kernel form: clustered and FP8 128 x 128 ones too). Named parts run alone:

    compute-sanitizer --tool racecheck --report-api-errors no python3 tools/sanitizer_case.py moe
"""

import sys
from pathlib import Path
from unittest import mock

import torch

from kgen import config, registry
from kgen.families.gated_delta_rule import backward
from kgen.families.grouped_gemm import op as grouped_gemm_op
from kgen.ops import attention_decode, attention_varlen, merge_attention_states, merge_attention_states_n
from kgen.ops import plan_attention_decode, plan_attention_varlen
from kgen.ops import chunk_gated_delta_rule, chunk_gated_delta_rule_bwd, gated_delta_rule_step, plan_chunk_gated_delta_rule
from kgen.ops import grouped_gemm, grouped_gemm_swiglu, quantize_fp8_blockwise

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from grouped_gemm_kernels import FORMS, FP8_FORMS, taking_clusters  # noqa: E402


def attention_and_gated_delta_rule() -> None:
    family = registry.current().family("attention_prefill")
    for lengths in ([63, 65, 200, 1], [128, 256]):
        cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
        total = cu[-1].item()
        # 96 spans one and a half swizzle panels (wgmma only); 192 three.
        for head_dim in (64, 96, 128, 192, 256):
            q = torch.randn((total, 4, head_dim), device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn((total, 2, head_dim), device="cuda", dtype=torch.bfloat16) for _ in range(2))
            k[cu[1]:cu[2]] = float("nan")
            v[cu[1]:cu[2]] = float("inf")
            # Each kernel the spec has for the head dim, with each tail policy it has (wgmma: TMA only).
            kernels = [(mma, tail) for mma in family.axis_values("mma", head_dim=head_dim)
                       for tail in family.axis_values("tail", head_dim=head_dim, mma=mma)]
            for mma, tail in kernels:
                plan = plan_attention_varlen(cu, cu, head_dim=head_dim, causal=True, tail=tail, mma=mma)
                out = attention_varlen(q, k, v, cu.cuda(), cu.cuda(), causal=True, plan=plan)
                first = out[:lengths[0]]
                assert not first.isnan().any(), f"NaN leaked into sequence 0 (hd{head_dim}, {mma}, tail={tail})"
                # The plan with cu_seqlens past the tensors' rows: NaN for the sequences moved, nothing outside.
                past = cu.clone()
                past[1:] += 1000
                out = attention_varlen(q, k, v, past.cuda(), cu.cuda(), causal=True, plan=plan)
                assert out.isnan().all(), "a plan used with other cu_seqlens must give NaN"
    # The gated delta rule's decode step, both state layouts, a padded slot and a pool larger than the batch.
    for layout in ("kv", "vk"):
        q, k = (torch.randn((3, 2, 128), device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v_new = torch.randn((3, 4, 128), device="cuda", dtype=torch.bfloat16)
        g, beta = -torch.rand((3, 4), device="cuda"), torch.rand((3, 4), device="cuda")
        pool = torch.randn((5, 4, 128, 128), device="cuda")
        slots = torch.tensor([4, -1, 1], dtype=torch.int32, device="cuda")
        gated_delta_rule_step(q, k, v_new, g, beta, pool, state_indices=slots, state_layout=layout)
    # The chunked gated delta rule: a split sequence (summaries, chain), tails, an empty sequence, a
    # neighbour of NaN/Inf; then whole chunks only (the no-tail variants). Segments of 4 chunks run in one-slice
    # blocks; of 8, planned for one SM, in wide blocks.
    for lengths, layout, segment_chunks, num_sms in (([700, 65, 0, 1], "kv", 4, None), ([700, 65, 0, 1], "vk", 8, 1),
                                                     ([640, 128], "vk", 8, 1)):
        cu = [0, *torch.tensor(lengths).cumsum(0).tolist()]
        q, k = (torch.randn((1, cu[-1], 2, 128), device="cuda", dtype=torch.bfloat16) for _ in range(2))
        v = torch.randn((1, cu[-1], 4, 128), device="cuda", dtype=torch.bfloat16)
        g, beta = -torch.rand((1, cu[-1], 4), device="cuda"), torch.rand((1, cu[-1], 4), device="cuda")
        v[:, cu[1]:cu[2]] = float("nan")
        k[:, cu[1]:cu[2]] = float("inf")
        # Splits the longer sequences.
        plan = plan_chunk_gated_delta_rule(cu, num_heads_v=4, segment_chunks=segment_chunks, num_sms=num_sms)
        assert plan.wide is (num_sms == 1)
        o, _ = chunk_gated_delta_rule(q, k, v, g, beta, initial_state=torch.randn((len(lengths), 4, 128, 128), device="cuda"),
                                      output_final_state=True, cu_seqlens=torch.tensor(cu, dtype=torch.int32, device="cuda"),
                                      use_qk_l2norm_in_kernel=True, state_layout=layout, plan=plan)
        assert not o[0, :lengths[0]].isnan().any(), "NaN leaked into sequence 0 (gated delta rule)"
        past = torch.tensor(cu, dtype=torch.int64, device="cuda") * 3  # bounds past the tensors: NaN, nothing outside
        o, _ = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=past, plan=plan, state_layout=layout)
        assert o[0, :lengths[0]].isnan().all(), "a plan used with other cu_seqlens must give NaN (gated delta rule)"
        # The backward: the states' recompute (split), the reverse recurrence, a poisoned neighbour.
        d_out = torch.randn_like(v)
        grads = chunk_gated_delta_rule_bwd(q, k, v, g, beta, d_out, initial_state=torch.randn((len(lengths), 4, 128, 128), device="cuda"),
                                           d_final_state=torch.randn((len(lengths), 4, 128, 128), device="cuda"),
                                           cu_seqlens=torch.tensor(cu, dtype=torch.int32, device="cuda"),
                                           use_qk_l2norm_in_kernel=True, state_layout=layout, plan=plan)
        assert not grads[2][0, :lengths[0]].isnan().any(), "NaN leaked into sequence 0 (gated delta rule backward)"
        grads = chunk_gated_delta_rule_bwd(q, k, v, g, beta, d_out, cu_seqlens=torch.tensor(cu, dtype=torch.int32, device="cuda"),
                                           use_qk_l2norm_in_kernel=True, state_layout=layout, plan=plan, per_chunk="kernel")
        assert not grads[2][0, :lengths[0]].isnan().any(), "NaN leaked into sequence 0 (per-chunk gradients kernel)"
        # Its persistent blocks, two for all the items: each block moves on to new items (Q and K loaded ahead).
        with mock.patch.object(backward, "sm_count", lambda device: 2):
            few = chunk_gated_delta_rule_bwd(q, k, v, g, beta, d_out, cu_seqlens=torch.tensor(cu, dtype=torch.int32, device="cuda"),
                                             use_qk_l2norm_in_kernel=True, state_layout=layout, plan=plan, per_chunk="kernel")
        for a, b in zip(few[:5], grads[:5]):  # the poisoned neighbour's NaNs included
            torch.testing.assert_close(a, b, rtol=0, atol=0, equal_nan=True, msg="the gradients kernel's grid changed them")
        grads = chunk_gated_delta_rule_bwd(q, k, v, g, beta, d_out, cu_seqlens=past, plan=plan, state_layout=layout,
                                           per_chunk="kernel")
        assert all(x[0, :lengths[0]].isnan().all() for x in grads[:5]), "a plan used with other cu_seqlens (backward)"
    # Decode: every load and tail policy, contiguous and paged (pages of 16 by TMA, of 5 by cp.async), a
    # request split many ways (merged by its last CTA) beside short ones and an empty one, two tokens a request.
    lengths = [3000, 17, 0, 64]
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    q = torch.randn((4, 2, 8, 128), device="cuda", dtype=torch.bfloat16)
    for page_size, kv_load, tail in ((None, "tma", "cp_async"), (None, "tma", "tma"), (None, "cp_async", None),
                                     (16, "tma", "cp_async"), (5, "cp_async", None)):
        if page_size is None:
            k, v = (torch.randn((4, 3000, 2, 128), device="cuda", dtype=torch.bfloat16) for _ in range(2))
            table = None
        else:
            pages = -(-3000 // page_size)
            k, v = (torch.randn((4 * pages, page_size, 2, 128), device="cuda", dtype=torch.bfloat16) for _ in range(2))
            table = torch.randperm(4 * pages, device="cuda", dtype=torch.int32).view(4, pages)
        plan = plan_attention_decode(lengths, num_heads_q=8, num_heads_kv=2, head_dim=128, q_len=2, page_size=page_size,
                                     kv_load=kv_load, tail=tail, num_sms=132, device="cuda")
        attention_decode(q, k, v, seqlens, block_table=table, plan=plan)
    v = torch.randn((3, 1000, 4, 128), device="cuda", dtype=torch.bfloat16)
    lse = torch.randn((3, 1000, 4), device="cuda")
    merge_attention_states(v[0], lse[0], v[1], lse[1])
    merge_attention_states_n(v, lse)


def moe() -> None:
    # Block quantization to FP8: each dtype, rows that fill the warps and rows that do not (both variants).
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        for rows in (301, 256):
            quantize_fp8_blockwise(torch.randn((rows, 640), device="cuda", dtype=dtype))
    # The forms of tests/grouped_gemm_kernels.py: the op takes each kernel (in clusters of two blocks sharing B tiles
    # or single blocks), and each of FP8's tiles (from spec folders ahead of the built-in one).
    for kernel, clusters in FORMS.values():
        with (mock.patch.object(grouped_gemm_op, "first_runnable", lambda *args, **kwargs: kernel),
              taking_clusters(clusters)):
            grouped_gemms()
    for spec_path, clusters in FP8_FORMS.values():
        with config.overrides(KGEN_SPEC_PATH=spec_path and str(spec_path)), taking_clusters(clusters):
            fp8_grouped_gemms()



def fp8_grouped_gemms() -> None:
    # FP8 inputs (wgmma alone): a group ending at a's last row, rows of no group, offs that pass the end (the
    # scales of rows past a are never read), N of one and of three 128-column blocks, and the masked layout.
    fp8 = torch.float8_e4m3fn
    a = torch.randn((140, 256), device="cuda").to(fp8)
    for n in (256, 384):
        b = torch.randn((3, n, 256), device="cuda").to(fp8)
        for offs in ([0, 5, 135], [70, 60, 900]):
            grouped_gemm(a, b, torch.tensor(offs, dtype=torch.int32, device="cuda"), a_scale=torch.rand((140, 2), device="cuda"),
                         b_scale=torch.rand((3, n // 128, 2), device="cuda"))
    grouped_gemm(torch.randn((4, 150, 128), device="cuda").to(fp8), torch.randn((4, 128, 128), device="cuda").to(fp8),
                 masked_m=torch.tensor([3, 0, 200, -1], dtype=torch.int32, device="cuda"),
                 a_scale=torch.rand((4, 150, 1), device="cuda"), b_scale=torch.rand((4, 1, 1), device="cuda"))
    # More tiles than SMs (152 of 256 columns) with K of five 128-byte steps, more than the stages: persistent blocks
    # take several tiles in turn, one tile's end beside the next one's start.
    grouped_gemm(torch.randn((2100, 640), device="cuda").to(fp8), torch.randn((3, 2048, 640), device="cuda").to(fp8),
                 torch.tensor([900, 1300, 2100], dtype=torch.int32, device="cuda"),
                 a_scale=torch.rand((2100, 5), device="cuda"), b_scale=torch.rand((3, 16, 5), device="cuda"))


def grouped_gemms() -> None:
    # The grouped GEMM: an empty group, rows of no group, tails of N and K (and whole tiles), a group ending at
    # a's last row with a K tail (a's last bytes), offs that decrease, are negative or pass the end; both dtypes.
    for dtype in (torch.bfloat16, torch.float16):
        for n, k, offs in ((136, 40, [0, 5, 135]), (128, 64, [70, 60, 900]), (136, 40, [-5, 80, 140])):
            b = torch.randn((3, n, k), device="cuda", dtype=dtype)
            grouped_gemm(torch.randn((140, k), device="cuda", dtype=dtype), b,
                         torch.tensor(offs, dtype=torch.int32, device="cuda"))
    # More tiles than SMs (152 of 256 columns), so persistent blocks take several in turn, with K of five steps and
    # a tail: one tile's end beside the next one's start.
    grouped_gemm(torch.randn((2100, 264), device="cuda", dtype=torch.bfloat16),
                 torch.randn((3, 2048, 264), device="cuda", dtype=torch.bfloat16),
                 torch.tensor([900, 1300, 2100], dtype=torch.int32, device="cuda"))
    # The masked layout (masked_m clamped into [0, M_max]), plain and quantized SwiGLU.
    masked_m = torch.tensor([3, 0, 200, -1], dtype=torch.int32, device="cuda")
    grouped_gemm(torch.randn((4, 150, 64), device="cuda", dtype=torch.bfloat16),
                 torch.randn((4, 136, 64), device="cuda", dtype=torch.bfloat16), masked_m=masked_m)
    grouped_gemm_swiglu(torch.randn((4, 150, 64), device="cuda", dtype=torch.bfloat16),
                        torch.randn((4, 256, 64), device="cuda", dtype=torch.bfloat16), masked_m=masked_m,
                        quantize_out=True)
    # Its SwiGLU epilogues: plain with tails, quantized on whole 128-column blocks, rows of no group.
    offs = torch.tensor([0, 70, 135], dtype=torch.int32, device="cuda")
    for n, k, quantize_out in ((136, 40, False), (256, 64, True), (128, 40, True)):
        grouped_gemm_swiglu(torch.randn((140, k), device="cuda", dtype=torch.bfloat16),
                            torch.randn((3, 2 * n, k), device="cuda", dtype=torch.bfloat16), offs, quantize_out=quantize_out)


PARTS = {"attention_and_gated_delta_rule": attention_and_gated_delta_rule, "moe": moe}


def main(parts: list[str]) -> None:
    torch.manual_seed(0)
    for name in parts or PARTS:
        PARTS[name]()
    torch.cuda.synchronize()
    print("sanitizer case done")


if __name__ == "__main__":
    main(sys.argv[1:])
