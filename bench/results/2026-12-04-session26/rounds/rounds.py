"""Session 26: does kgen's prefill slow down round after round? Per-round ms of kgen's planned call and cuDNN,
interleaved (as the sweep does), kgen alone, or with cuCtxResetPersistingL2Cache before each timing."""
import argparse, json, subprocess, sys
from pathlib import Path
import torch
import kgen  # noqa: F401
from kgen.ops import plan_attention_varlen
sys.path.insert(0, str(Path.cwd() / "bench"))
from attention_common import backend_only
from bench_attention_sweep import SWEEP_HEAD_DIM, kgen_calls, cudnn_dense_calls, make_batch, sweep_seqs
from common import time_cuda

def gpu_state():
    out = subprocess.run(["nvidia-smi", "--query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw",
                          "--format=csv,noheader,nounits"], capture_output=True, text=True).stdout.strip()
    return out

def reset_l2():
    from cuda.bindings import driver
    (err,) = driver.cuCtxResetPersistingL2Cache()
    assert int(err) == 0, err

p = argparse.ArgumentParser()
p.add_argument("--lengths", default="256,512,1024")
p.add_argument("--rounds", type=int, default=5)
p.add_argument("--mode", choices=("interleaved", "alone", "reset"), default="interleaved")
a = p.parse_args()
gen = torch.Generator(device="cuda").manual_seed(0)
for L in map(int, a.lengths.split(",")):
    batch = make_batch(sweep_seqs(L), L, gen)
    plan = plan_attention_varlen(batch.cu_host, batch.cu_host, head_dim=SWEEP_HEAD_DIM, causal=True, device="cuda")
    calls = {"kgen": kgen_calls(batch, plan)[0], "cudnn": cudnn_dense_calls(batch)[0]}
    order = ([("kgen", r) for r in range(a.rounds)] + [("cudnn", r) for r in range(a.rounds)]) if a.mode == "alone" \
        else [(n, r) for r in range(a.rounds) for n in calls]
    times = {n: [] for n in calls}
    states = []
    for name, r in order:
        if a.mode == "reset":
            reset_l2()
        with backend_only(name):
            times[name].append(round(time_cuda(calls[name]), 4))
        states.append(gpu_state())
    print(json.dumps({"L": L, "mode": a.mode, "tile": f"{plan.schedule.tile_m}x{plan.schedule.tile_n}",
                      **times, "gpu(sm,mem,temp,W)": states}), flush=True)
