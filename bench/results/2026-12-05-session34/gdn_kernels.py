"""Session 33: each kernel's CUDA time in kgen's GDN fwd + kernel-path bwd step (autograd, KGEN_GDN_BACKWARD=kernel),
by torch.profiler over 10 steps, at 1x32k 16/32 and 8x1k 16/32 (the first line names the kgen imported)."""
import json, os, sys
os.environ["KGEN_GDN_BACKWARD"] = "kernel"
import torch
import kgen
print(json.dumps({"kgen": kgen.__file__}))

from bench_gdn_backward import inputs
from kgen.ops import chunk_gated_delta_rule
for shape in ((1, 32768, 16, 32, "strong"), (8, 1024, 16, 32, "strong")):
    q, k, v, g, beta, do, cu = inputs(shape)
    leaves = [t.requires_grad_() for t in (q, k, v, g, beta)]
    cu = cu.cuda()
    def step():
        o = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)
        o = o[0] if isinstance(o, tuple) else o
        return torch.autograd.grad(o, leaves, do)
    for _ in range(3):
        step()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(10):
            step()
        torch.cuda.synchronize()
    times = {}
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            times[e.name[:60]] = times.get(e.name[:60], 0.0) + e.device_time / 10 / 1000
    print(json.dumps({"tree": sys.argv[1], "shape": list(shape[:4]),
                      "ms": {name: round(t, 4) for name, t in sorted(times.items(), key=lambda x: -x[1])[:12]}}))
