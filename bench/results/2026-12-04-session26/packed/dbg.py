import torch
from kgen.ops import attention_varlen, plan_attention_varlen
torch.manual_seed(0)
def run(lengths, what, causal=True, tile_n=64, heads=(4, 2)):
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    total = cu[-1].item()
    q = torch.randn((total, heads[0], 128), device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn((total, heads[1], 128), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    a, b = cu[1].item(), cu[2].item()
    if "q" in what: q[a:b] = float("nan")
    if "k" in what: k[a:b] = float("nan")
    if "v" in what: v[a:b] = float("inf")
    if "1" in what: v[a] = float("inf")  # one row
    plan = plan_attention_varlen(cu, cu, head_dim=128, causal=causal, tile_n=tile_n, rows="packed")
    out = torch.full_like(q, float("nan"))
    lse = torch.full((heads[0], total), float("nan"), device="cuda")
    attention_varlen(q, k, v, cu.cuda(), cu.cuda(), causal=causal, plan=plan, out=out, lse_out=lse, return_lse=True)
    torch.cuda.synchronize()
    bad = out[:a].isnan().any(dim=2)  # [rows, heads]
    rows = bad.any(dim=1).nonzero().flatten().tolist()
    print(lengths, what, "causal" if causal else "full", tile_n, "NaN rows of seq 0:", rows[:10], len(rows),
          "heads", bad.any(dim=0).tolist(), "lse NaN", lse[:, :a].isnan().any().item(), "work", plan.schedule.work[-1].tolist())
for what in ("", "v1", "v", "k", "q", "qkv"):
    run([63, 65], what)
run([63, 65], "v", causal=False)
run([65, 65, 65], "v", causal=False)
