"""Session 27: items_per_block (the single warpgroup's chain of work items) 1..4 against cuDNN, sweep and dense."""
import argparse, json, statistics, sys
from pathlib import Path
import torch
import torch.nn.functional as F
import kgen  # noqa: F401
from kgen.families.attention_prefill import op as prefill_op
from kgen.ops import plan_attention_varlen, attention_varlen
sys.path.insert(0, str(Path.cwd() / "bench"))
from attention_common import backend_only
from bench_attention_sweep import SWEEP_HEAD_DIM, cudnn_dense_calls, make_batch, sweep_seqs, check_batch
from common import time_cuda

p = argparse.ArgumentParser()
p.add_argument("--lengths", default="65,128,129,256,257,512,513,1024,1025,2048")
p.add_argument("--dense", default="16x512,8x1024,4x4096")
p.add_argument("--ks", default="1,2,3,4")
p.add_argument("--rounds", type=int, default=3)
a = p.parse_args()
ks = [int(x) for x in a.ks.split(",")]


def prepared_calls(q, k, v, cu, plan, out):
    calls = {}
    for per in ks:
        prefill_op.ITEMS_PER_BLOCK = per
        plan._prepared.clear()
        attention_varlen(q, k, v, cu, cu, causal=True, plan=plan, out=out)
        (prep,) = plan._prepared.values()
        calls[f"k{per}"] = (lambda prep=prep: prep.run(q, k, v, cu, cu, None, out, None, False)), prep.grid
    plan._prepared.clear()
    prefill_op.ITEMS_PER_BLOCK = 1
    return calls


def run_case(name, q, k, v, cu, cu_host, cudnn_call, check):
    plan = plan_attention_varlen(cu_host, cu_host, head_dim=q.shape[2], causal=True, device="cuda")
    out = torch.full_like(q, float("nan"))
    calls = prepared_calls(q, k, v, cu, plan, out)
    outs = {}
    for n, (c, grid) in calls.items():
        out.fill_(float("nan"))
        c()
        torch.cuda.synchronize()
        outs[n] = out.clone()
    same = {n: bool(torch.equal(o, outs["k1"])) for n, o in outs.items()}
    info = {"variant": plan.variant.name.split("[")[1][:60], "grids": {n: g for n, (c, g) in calls.items()}, "bitwise_as_k1": same}
    if check is not None:
        info["check"] = check(plan)
    timed = {n: c for n, (c, g) in calls.items()}
    timed["cudnn"] = cudnn_call
    times = {n: [] for n in timed}
    for _ in range(a.rounds):
        for n, c in timed.items():
            with backend_only(n):
                times[n].append(time_cuda(c))
    print(json.dumps({"case": name, **{n: round(statistics.median(t), 4) for n, t in times.items()}, "info": info}), flush=True)


gen = torch.Generator(device="cuda").manual_seed(0)
for L in map(int, filter(None, a.lengths.split(","))):
    batch = make_batch(sweep_seqs(L), L, gen)
    q, k, v, _ = batch.sets[0]
    def check(plan, batch=batch):
        err, ok = check_batch(batch, plan)
        return f"err={err:.4f}{'' if ok else ' FAILED'}"
    run_case(f"L={L}", q, k, v, batch.cu, batch.cu_host, cudnn_dense_calls(batch)[0], check)
    del batch
for shape in filter(None, a.dense.split(",")):
    B, S = map(int, shape.split("x"))
    H, Hkv, D = 32, 8, 128
    qd = torch.randn((B, H, S, D), generator=gen, device="cuda", dtype=torch.bfloat16)
    kd, vd = (torch.randn((B, Hkv, S, D), generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q, k, v = (t.transpose(1, 2).contiguous().view(B * S, t.shape[1], D) for t in (qd, kd, vd))
    kr, vr = (t.repeat_interleave(H // Hkv, dim=1) for t in (kd, vd))
    cu_host = [i * S for i in range(B + 1)]
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    run_case(f"dense B{B} S{S} 32/8", q, k, v, cu, cu_host,
             lambda: F.scaled_dot_product_attention(qd, kr, vr, is_causal=True), None)
