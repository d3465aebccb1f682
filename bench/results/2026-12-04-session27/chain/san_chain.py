"""compute-sanitizer case for chained work items (items_per_block 3): per-sequence and packed 64-row tiles, clean and
with a poisoned sequence, with keys-only and windowed-out items."""
import torch
from kgen.families.attention_prefill import op as prefill_op
from kgen.ops import attention_varlen, plan_attention_varlen
prefill_op.ITEMS_PER_BLOCK, prefill_op.MIN_WAVES = 3, 0
cases = [([63, 65, 200, 1], [63, 65, 200, 1]), ([65] * 5, [65] * 5), ([3, 0, 7, 129, 300], [3, 0, 7, 129, 300]),
         ([70, 130, 5], [0, 200, 1])]
for lq, lk in cases:
    cu_q, cu_k = (torch.tensor([0, *torch.tensor(n).cumsum(0).tolist()], dtype=torch.int32) for n in (lq, lk))
    q = torch.randn((int(cu_q[-1]), 4, 128), device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn((int(cu_k[-1]), 2, 128), device="cuda", dtype=torch.bfloat16) for _ in range(2))
    for poison in (False, True):
        if poison and lk[1]:
            k[cu_k[1]:cu_k[2]] = float("nan")
            v[cu_k[1]:cu_k[2]] = float("inf")
        for tile_n in (64, 80, 96):
            for rows in ("per_sequence", "packed"):
                if rows == "packed" and lq != lk:
                    continue
                for causal, window in ((True, (-1, -1)), (False, (-1, -1)), (False, (16, 3))):
                    if rows == "packed" and window != (-1, -1):
                        continue
                    plan = plan_attention_varlen(cu_q, cu_k, head_dim=128, causal=causal, window=window, mma="wgmma",
                                                 tile_m=64, tile_n=tile_n, rows=rows)
                    out = attention_varlen(q, k, v, cu_q.cuda(), cu_k.cuda(), causal=causal, window=window, plan=plan)
                    assert not out[:lq[0]].isnan().any(), f"NaN in sequence 0 ({lq}, {tile_n}, {rows}, {causal}, {window})"
torch.cuda.synchronize()
print("done")
