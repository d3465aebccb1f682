"""Session 27: the planner's call against cuDNN, sweep lengths and dense shapes (median ms of rounds)."""
import argparse, json, statistics, sys
from pathlib import Path
import torch
import torch.nn.functional as F
import kgen  # noqa: F401
from kgen.ops import plan_attention_varlen, attention_varlen
sys.path.insert(0, str(Path.cwd() / "bench"))
from attention_common import backend_only
from bench_attention_sweep import cudnn_dense_calls, make_batch, sweep_seqs, check_batch
from common import time_cuda

p = argparse.ArgumentParser()
p.add_argument("--lengths", default="65,127,128,129,255,256,257,512,513,1024,1025,2048,2049")
p.add_argument("--dense", default="16x32x8x512x128,8x32x8x1024x128,4x32x8x4096x128,4x32x32x4096x64,8x16x16x2048x128,2x16x16x8192x128")
p.add_argument("--rounds", type=int, default=3)
a = p.parse_args()


def timed(name, kgen_call, cudnn_call, info):
    times = {"kgen": [], "cudnn": []}
    for _ in range(a.rounds):
        for n, c in (("kgen", kgen_call), ("cudnn", cudnn_call)):
            with backend_only(n):
                times[n].append(time_cuda(c))
    t = {n: round(statistics.median(v), 4) for n, v in times.items()}
    print(json.dumps({"case": name, **t, "ratio": round(t["kgen"] / t["cudnn"], 3), "info": info}), flush=True)


gen = torch.Generator(device="cuda").manual_seed(0)
for L in map(int, filter(None, a.lengths.split(","))):
    batch = make_batch(sweep_seqs(L), L, gen)
    q, k, v, out = batch.sets[0]
    plan = plan_attention_varlen(batch.cu_host, batch.cu_host, head_dim=128, causal=True, device="cuda")
    err, ok = check_batch(batch, plan)
    info = f"{plan.variant.name.split('[')[1][:70]} err={err:.4f}{'' if ok else ' FAILED'}"
    timed(f"L={L}", lambda: attention_varlen(q, k, v, batch.cu, batch.cu, causal=True, plan=plan, out=out),
          cudnn_dense_calls(batch)[0], info)
    del batch
for shape in filter(None, a.dense.split(",")):
    B, H, Hkv, S, D = map(int, shape.split("x"))
    qd = torch.randn((B, H, S, D), generator=gen, device="cuda", dtype=torch.bfloat16)
    kd, vd = (torch.randn((B, Hkv, S, D), generator=gen, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    q, k, v = (t.transpose(1, 2).contiguous().view(B * S, t.shape[1], D) for t in (qd, kd, vd))
    kr, vr = (t.repeat_interleave(H // Hkv, dim=1) for t in (kd, vd))
    cu_host = [i * S for i in range(B + 1)]
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    plan = plan_attention_varlen(cu_host, cu_host, head_dim=D, causal=True, device="cuda")
    out = torch.empty_like(q)
    ref = F.scaled_dot_product_attention(qd, kr, vr, is_causal=True)
    attention_varlen(q, k, v, cu, cu, causal=True, plan=plan, out=out)
    diff = (out.view(B, S, H, D).transpose(1, 2).float() - ref.float()).abs().max().item()
    timed(f"dense B{B} H{H}/{Hkv} S{S} hd{D}", lambda: attention_varlen(q, k, v, cu, cu, causal=True, plan=plan, out=out),
          lambda: F.scaled_dot_product_attention(qd, kr, vr, is_causal=True),
          f"{plan.variant.name.split('[')[1][:70]} max|kgen-cudnn|={diff:.4f}")
