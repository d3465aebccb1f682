"""Per-kernel time of kgen's GDN forward + kernel-path backward (issue 24), torch.profiler, per shape."""
import sys
from collections import defaultdict
import torch
from torch.profiler import profile, ProfilerActivity
sys.path.insert(0, "bench")
from bench_gdn_backward import inputs, HEAD_DIM
from common import time_cuda
from kgen.ops import chunk_gated_delta_rule, chunk_gated_delta_rule_bwd, plan_chunk_gated_delta_rule

SHAPES = [(1, 32768, 16, 32), (1, 32768, 2, 8), (4, 8192, 16, 32), (8, 1024, 16, 32), (4096, 32, 12, 12), (4096, 64, 12, 12)]
REPS = 5
for shape in SHAPES:
    q, k, v, g, beta, do, cu = inputs(shape)
    cu_device = cu.cuda()
    plan = plan_chunk_gated_delta_rule(cu, num_heads_v=shape[3], head_dim=HEAD_DIM, device="cuda")
    def fwd():
        return chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu_device, plan=plan)
    def step():
        fwd()
        return chunk_gated_delta_rule_bwd(q, k, v, g, beta, do, cu_seqlens=cu_device, plan=plan, per_chunk="kernel")
    with torch.no_grad():
        f_ms = time_cuda(fwd, warmup_ms=100, rep_ms=300)
        s_ms = time_cuda(step, warmup_ms=100, rep_ms=500)
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(REPS):
                step()
            torch.cuda.synchronize()
    totals = defaultdict(float); counts = defaultdict(int)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            name = e.name[:70]
            totals[name] += e.device_time / 1000 / REPS
            counts[name] += 1
    print(f"== {shape}: fwd {f_ms:.3f} ms, fwd+bwd (kernel path) {s_ms:.3f} ms, segments {len(plan.segments)}, summaries {plan.num_summaries}")
    for name, t in sorted(totals.items(), key=lambda x: -x[1])[:16]:
        print(f"  {t:8.3f} ms  x{counts[name]//REPS:3d}  {name}")
    sys.stdout.flush()
    del q, k, v, g, beta, do
    torch.cuda.empty_cache()
