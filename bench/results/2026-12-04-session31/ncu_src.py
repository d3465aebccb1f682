"""Session 31: one launch each for ncu's SASS-level source counters. `gemm`: kgen's bf16 grouped GEMM at
DeepSeek-V3 down, 32768 tokens balanced (called twice). `gdn`: a kgen fwd + kernel-path bwd at 8x1k 16/32."""
import sys, torch
sys.path.insert(0, "bench"); sys.path.insert(0, "tests")
what = sys.argv[1]
if what == "gemm":
    from bench_grouped_gemm import group_sizes
    from kgen.ops import grouped_gemm
    E, N, K, M = 256, 7168, 2048, 32768 * 8
    offs = group_sizes(M, E, "balanced", torch.Generator().manual_seed(0)).cumsum(0).to(torch.int32).cuda()
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) / 64
    for _ in range(2):
        grouped_gemm(a, b, offs)
elif what == "swiglu":
    from bench_grouped_gemm import group_sizes
    from kgen.ops import grouped_gemm_swiglu
    E, N, K, M = 128, 3072, 4096, 4096 * 8  # Qwen3-MoE gate+up, 4096 tokens balanced: b_gate_up [E, 2I, K], 2I = N
    offs = group_sizes(M, E, "balanced", torch.Generator().manual_seed(0)).cumsum(0).to(torch.int32).cuda()
    a = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(E, N, K, device="cuda", dtype=torch.bfloat16) / 64
    for _ in range(2):
        grouped_gemm_swiglu(a, b, offs, quantize_out=True)
else:
    import os
    os.environ["KGEN_GDN_BACKWARD"] = "kernel"
    from bench_gdn_backward import inputs
    from kgen.ops import chunk_gated_delta_rule
    q, k, v, g, beta, do, cu = inputs((8, 1024, 16, 32, "strong"))
    leaves = [t.requires_grad_() for t in (q, k, v, g, beta)]
    for _ in range(2):
        o = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu.cuda())
        o = o[0] if isinstance(o, tuple) else o
        torch.autograd.grad((o.float() * do.float()).sum(), leaves)
torch.cuda.synchronize()
print("ok")
