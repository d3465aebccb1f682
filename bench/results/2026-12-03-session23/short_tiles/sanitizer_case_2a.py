"""compute-sanitizer case for the 2a variant (wgmma 64x64, two blocks an SM): tails, a NaN/Inf neighbour, both has_incomplete_tile."""
import torch
from kgen.ops import attention_varlen, plan_attention_varlen
for lengths in ([63, 65, 200, 1], [128, 256]):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = cu[-1].item()
    q = torch.randn((total, 4, 128), device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn((total, 2, 128), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k[cu[1]:cu[2]] = float("nan"); v[cu[1]:cu[2]] = float("inf")
    for causal in (True, False):
        plan = plan_attention_varlen(cu, cu, head_dim=128, causal=causal, mma="wgmma", tile_m=64, tile_n=64)
        out = attention_varlen(q, k, v, cu.cuda(), cu.cuda(), causal=causal, plan=plan)
        assert not out[:lengths[0]].isnan().any(), "NaN leaked into sequence 0"
torch.cuda.synchronize()
print("2a sanitizer case done")
