"""Session 34: dq and dk's rel RMS against float64 on short GVA cases (the failing one first: one sequence of one
token, group 2, bf16, head dim 128, seed 7920), for kgen's kernel and torch per-chunk paths and fla, beside the
plain 1e-2 bar and the per-v-head allowance (test_gdn_chunk_backward_gpu.assert_close_to_reference)."""
import json, os, sys
os.environ.setdefault("FLA_FLASH_QLA", "0")
import torch
from test_gdn_chunk_backward_gpu import make_case, reference_grads, GRAD_RMS_BAR
import gdn_reference as ref
from kgen.ops import chunk_gated_delta_rule_bwd, plan_chunk_gated_delta_rule
try:
    from fla.ops.gated_delta_rule import chunk_gated_delta_rule as fla_gdn
except Exception as exc:  # noqa: BLE001
    fla_gdn = None
    print(json.dumps({"fla": repr(exc)[:200]}))
rms = lambda x: x.double().pow(2).mean().sqrt().item()
for lengths, group in (([1], 2), ([1], 1), ([2], 2), ([1], 4), ([3], 2), ([1, 1], 2), ([5], 4), ([64], 2)):
    heads, head_dim = 1, 128
    seed = len(lengths) * 7919 + sum(lengths)
    inputs, initial, d_out, d_final = make_case(lengths, heads, group, head_dim, torch.bfloat16, False, False, False, False, "kv", seed)
    cu_host = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    plan = plan_chunk_gated_delta_rule(cu_host, num_heads_v=heads * group, head_dim=head_dim)
    want = reference_grads(inputs, None, d_out, None, cu_host)
    q, k = (x.repeat_interleave(group, dim=2) for x in inputs[:2])
    shares = reference_grads((q, k, *inputs[2:]), None, d_out, None, cu_host)
    row = {"lengths": lengths, "group": group}
    for name, i in (("dq", 0), ("dk", 1)):
        row[f"{name}_allowed"] = max(GRAD_RMS_BAR, GRAD_RMS_BAR * rms(shares[i]) * group ** 0.5 / rms(want[i]))
    for per_chunk in ("kernel", "torch"):
        got = chunk_gated_delta_rule_bwd(*inputs, d_out, cu_seqlens=cu, plan=plan, per_chunk=per_chunk)
        for name, i in (("dq", 0), ("dk", 1), ("dv", 2), ("dg", 3), ("dbeta", 4)):
            row[f"{per_chunk}_{name}"] = ref.rel_rms(got[i], want[i])
    if fla_gdn is not None:
        leaves = [t.detach().clone().requires_grad_() for t in inputs]
        o = fla_gdn(*leaves, cu_seqlens=cu.long())[0]
        grads = torch.autograd.grad(o, leaves, d_out)
        for name, i in (("dq", 0), ("dk", 1), ("dv", 2), ("dg", 3), ("dbeta", 4)):
            row[f"fla_{name}"] = ref.rel_rms(grads[i], want[i])
    print(json.dumps({k: (f"{v:.2e}" if isinstance(v, float) else v) for k, v in row.items()}), flush=True)
