"""Session 33: kgen's GDN fwd + kernel-path bwd step (autograd, KGEN_GDN_BACKWARD=kernel) at a few shapes, for an
A/B of two trees (the first line names the kgen imported). Each line: tree, shape, ms (bench/common.time_cuda)."""
import json, os, sys
os.environ["KGEN_GDN_BACKWARD"] = "kernel"
import torch
import kgen
print(json.dumps({"kgen": kgen.__file__}))

from bench_gdn_backward import inputs
from common import time_cuda
from kgen.ops import chunk_gated_delta_rule
for shape in ((1, 32768, 16, 32, "strong"), (8, 1024, 16, 32, "strong"), (2048, 64, 12, 12, "strong")):
    q, k, v, g, beta, do, cu = inputs(shape)
    leaves = [t.requires_grad_() for t in (q, k, v, g, beta)]
    cu = cu.cuda()
    def step():
        o = chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu)
        o = o[0] if isinstance(o, tuple) else o
        return torch.autograd.grad(o, leaves, do)
    grads = step()
    ms = time_cuda(step, warmup_ms=50, rep_ms=400)
    print(json.dumps({"tree": sys.argv[1], "shape": list(shape[:4]), "ms": round(ms, 4),
                      "sums": [float(x.double().sum()) for x in grads]}))
