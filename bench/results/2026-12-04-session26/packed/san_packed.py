"""compute-sanitizer case for packed prefill tiles (rows=packed), clean and with a poisoned sequence (the guard's slow path)."""
import torch
from kgen.ops import attention_varlen, plan_attention_varlen
for lengths in ([63, 65, 200, 1], [65] * 5, [1] * 70, [3, 0, 7, 129]):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = cu[-1].item()
    q = torch.randn((total, 4, 128), device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn((total, 2, 128), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for poison in (False, True):
        if poison:
            k[cu[1]:cu[2]] = float("nan")
            v[cu[1]:cu[2]] = float("inf")
        for tile_n in (64, 80, 96):
            for causal in (True, False):
                plan = plan_attention_varlen(cu, cu, head_dim=128, causal=causal, tile_n=tile_n, rows="packed")
                out = attention_varlen(q, k, v, cu.cuda(), cu.cuda(), causal=causal, plan=plan)
                assert not out[:lengths[0]].isnan().any(), f"NaN leaked into sequence 0 ({lengths}, {tile_n}, causal={causal})"
torch.cuda.synchronize()
print("done")
