"""Session 26: packed tiles against per-sequence ones and cuDNN at seed 000's sweep lengths (median ms of rounds)."""
import argparse, json, statistics, sys
from pathlib import Path
import torch
import kgen  # noqa: F401
from kgen.ops import plan_attention_varlen
sys.path.insert(0, str(Path.cwd() / "bench"))
from attention_common import backend_only
from bench_attention_sweep import SWEEP_HEAD_DIM, kgen_calls, cudnn_dense_calls, make_batch, sweep_seqs, check_batch
from common import time_cuda

p = argparse.ArgumentParser()
p.add_argument("--lengths", default="16,32,33,64,65,96,128,129,160,256,257")
p.add_argument("--rounds", type=int, default=3)
p.add_argument("--arms", default="plan,per_sequence,packed:64,packed:80,packed:96")
a = p.parse_args()
gen = torch.Generator(device="cuda").manual_seed(0)
for L in map(int, a.lengths.split(",")):
    batch = make_batch(sweep_seqs(L), L, gen)
    calls, info = {}, {}
    for arm in a.arms.split(","):
        opts = {}
        if arm == "per_sequence":
            opts = {"rows": "per_sequence"}
        elif arm.startswith("packed"):
            opts = {"rows": "packed", "tile_n": int(arm.split(":")[1])}
        try:
            plan = plan_attention_varlen(batch.cu_host, batch.cu_host, head_dim=SWEEP_HEAD_DIM, causal=True, device="cuda", **opts)
        except (TypeError, ValueError) as exc:
            print(json.dumps({"L": L, "arm": arm, "error": str(exc)[:120]}), flush=True)
            continue
        err, ok = check_batch(batch, plan)
        d = plan.variant.param_dict
        info[arm] = f"{d['tile_m']}x{d['tile_n']}:{d.get('rows', '-')} err={err:.4f}{'' if ok else ' FAILED'}"
        calls[arm] = kgen_calls(batch, plan)[0]
    calls["cudnn"] = cudnn_dense_calls(batch)[0]
    times = {n: [] for n in calls}
    for _ in range(a.rounds):
        for n, c in calls.items():
            with backend_only(n):
                times[n].append(time_cuda(c))
    print(json.dumps({"L": L, **{n: round(statistics.median(t), 4) for n, t in times.items()}, "info": info}), flush=True)
