"""compute-sanitizer case for the single-warpgroup prefill tiles (64x64 with two V buffers, 64x80 with one), forced."""
import torch
from kgen.ops import attention_varlen, plan_attention_varlen
for lengths in ([63, 65, 200, 1], [128, 256], [700, 64]):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = cu[-1].item()
    q = torch.randn((total, 4, 128), device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn((total, 2, 128), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    k[cu[1]:cu[2]] = float("nan")
    v[cu[1]:cu[2]] = float("inf")
    for tile_n in (64, 80):
        for causal in (True, False):
            plan = plan_attention_varlen(cu, cu, head_dim=128, causal=causal, mma="wgmma", tile_m=64, tile_n=tile_n)
            assert plan.variant.param_dict["min_blocks_per_sm"] == 3, plan.variant.name
            out = attention_varlen(q, k, v, cu.cuda(), cu.cuda(), causal=causal, plan=plan)
            assert not out[:lengths[0]].isnan().any(), f"NaN leaked into sequence 0 ({tile_n}, causal={causal})"
torch.cuda.synchronize()
print("done")
