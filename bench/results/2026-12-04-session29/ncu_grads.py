"""One kgen GDN forward + kernel-path backward at 8 x 1024, 16/32 (for ncu on the per-chunk gradients kernel)."""
import sys
import torch
sys.path.insert(0, "bench")
from bench_gdn_backward import inputs, HEAD_DIM
from kgen.ops import chunk_gated_delta_rule, chunk_gated_delta_rule_bwd, plan_chunk_gated_delta_rule
shape = (8, 1024, 16, 32)
q, k, v, g, beta, do, cu = inputs(shape)
cu_device = cu.cuda()
plan = plan_chunk_gated_delta_rule(cu, num_heads_v=shape[3], head_dim=HEAD_DIM, device="cuda")
with torch.no_grad():
    for _ in range(2):
        chunk_gated_delta_rule_bwd(q, k, v, g, beta, do, cu_seqlens=cu_device, plan=plan, per_chunk="kernel")
    torch.cuda.synchronize()
