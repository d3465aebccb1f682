"""One prefill call at seed 000's sweep length L (argv[1]) for ncu: the planner's choice, warmed up first."""
import sys
import torch
sys.path.insert(0, "bench")
from bench_attention_sweep import SWEEP_HEAD_DIM, kgen_calls, make_batch, sweep_seqs
from kgen.ops import plan_attention_varlen
L = int(sys.argv[1])
batch = make_batch(sweep_seqs(L), L, torch.Generator(device="cuda").manual_seed(0))
plan = plan_attention_varlen(batch.cu_host, batch.cu_host, head_dim=SWEEP_HEAD_DIM, causal=True, device="cuda")
print(L, plan.variant.name, flush=True)
call = kgen_calls(batch, plan)[0]
for _ in range(3):
    call()
torch.cuda.synchronize()
torch.cuda.profiler.start()
call()
torch.cuda.synchronize()
torch.cuda.profiler.stop()
