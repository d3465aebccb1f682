"""Session 33 smoke test of the gradients kernel (a hang of its named barriers would otherwise eat a call): one
small backward through per_chunk="kernel" and "torch" on the same inputs, each gradient's rel RMS between them."""
import sys
import torch
from kgen.ops import chunk_gated_delta_rule_bwd, plan_chunk_gated_delta_rule

torch.manual_seed(0)
lengths, heads, group, dim = [130, 64, 7], 2, 2, 128
cu_host = [0, 130, 194, 201]
cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
T = cu_host[-1]
q = torch.randn(1, T, heads, dim, device="cuda", dtype=torch.bfloat16)
k = torch.nn.functional.normalize(torch.randn(1, T, heads, dim, device="cuda"), dim=-1).to(torch.bfloat16)
v = torch.randn(1, T, heads * group, dim, device="cuda", dtype=torch.bfloat16)
g = torch.nn.functional.logsigmoid(torch.randn(1, T, heads * group, device="cuda"))
beta = torch.rand(1, T, heads * group, device="cuda")
do = torch.randn_like(v)
plan = plan_chunk_gated_delta_rule(cu_host, num_heads_v=heads * group, head_dim=dim, device="cuda")
got = {p: chunk_gated_delta_rule_bwd(q, k, v, g, beta, do, cu_seqlens=cu, plan=plan, per_chunk=p) for p in ("kernel", "torch")}
torch.cuda.synchronize()
for name, a, b in zip(("dq", "dk", "dv", "dg", "dbeta"), got["kernel"], got["torch"]):
    a, b = a.double(), b.double()
    print(name, "finite" if torch.isfinite(a).all() else "NOT FINITE",
          f"rel_rms {float((a - b).pow(2).mean().sqrt() / b.pow(2).mean().sqrt()):.3e}")
sys.stdout.flush()
