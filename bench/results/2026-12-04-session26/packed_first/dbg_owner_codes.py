import torch, math
from kgen.ops import attention_varlen, plan_attention_varlen
cu = torch.tensor([0, 63, 128], dtype=torch.int32)
q = torch.randn((128, 1, 128), device="cuda", dtype=torch.bfloat16)
k, v = (torch.randn((128, 1, 128), device="cuda", dtype=torch.bfloat16) for _ in range(2))
plan = plan_attention_varlen(cu, cu, head_dim=128, causal=True, tile_n=64, rows="packed")
_, clean = attention_varlen(q, k, v, cu.cuda(), cu.cuda(), causal=True, plan=plan, return_lse=True)
v[63] = float("inf")
out, lse = attention_varlen(q, k, v, cu.cuda(), cu.cuda(), causal=True, plan=plan, return_lse=True)
torch.cuda.synchronize()
code = ((lse - clean) / math.log(2)).round()[0].tolist()
print("codes rows 0..63:", [int(c) if c == c else 'nan' for c in code[:64]])
