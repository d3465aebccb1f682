"""Each gradient's error against float64 on one gated delta rule backward case: kgen's two per-chunk paths and the
peers (fla, FlashQLA; benchmarks' peers, never dependencies) on the same inputs, in all and per v-head, and dg's per
chunk. The diagnosis bench/NOTES.md's "Fifteenth session" asks for: the case defaults to
tests/test_gdn_chunk_backward_gpu.py's no-decay / strong-decay case, where the kernel's dg missed 1e-2.

    PYTHONPATH=.:tests:bench python3 tools/gdn_backward_errors.py [--peers fla,flashqla] [--seed 3]
"""

from __future__ import annotations

import argparse

import torch

import gdn_reference as ref
from common import gdn_peer
from kgen.families.gated_delta_rule.backward import PER_CHUNK
from kgen.ops import chunk_gated_delta_rule_bwd, plan_chunk_gated_delta_rule
from test_gdn_backward_algebra import GRADIENTS
from test_gdn_chunk_backward_gpu import make_case, reference_grads

LENGTHS = [130, 64, 7]
HEADS, GROUP, HEAD_DIM = 2, 2, 128


def peer_grads(library, inputs, initial, d_out, d_final, cu):
    """The peer's gradients through its autograd (q, k, v, g, beta, initial state), or the reason there are none."""
    fn, status = gdn_peer(library, "chunk_gated_delta_rule")
    if fn is None:
        return status
    leaves = [t.clone().requires_grad_() for t in (*inputs, initial)]
    try:
        o, final = fn(*leaves[:5], initial_state=leaves[5], output_final_state=True, cu_seqlens=cu.long(),
                      use_qk_l2norm_in_kernel=True)
        loss = (o.float() * d_out.float()).sum() + (final.float() * d_final).sum()
        return torch.autograd.grad(loss, leaves)
    except Exception as exc:  # a peer's failure is reported, not fatal
        return f"failed: {type(exc).__name__}: {exc}"[:200]


def report(label, got, want, cu) -> None:
    if isinstance(got, str):
        print(f"{label:16s} {got}")
        return
    print(f"{label:16s} " + "  ".join(f"{n} {ref.rel_rms(a, b):.2e}" for n, a, b in zip(GRADIENTS, got, want)))
    heads_v = want[3].shape[2]
    for name, index in (("dq", 0), ("dk", 1), ("dv", 2), ("dg", 3), ("dbeta", 4)):
        a, b = got[index], want[index]
        per_head = [ref.rel_rms(a[:, :, h], b[:, :, h]) for h in range(a.shape[2])]
        print(f"{'':16s}   {name} per head " + " ".join(f"{e:.2e}" for e in per_head))
    dg, dg_want = got[3][0], want[3][0]
    for h in range(heads_v):
        pieces = []
        for n in range(len(cu) - 1):
            for c0 in range(cu[n], cu[n + 1], 64):
                rows = slice(c0, min(c0 + 64, cu[n + 1]))
                error = (dg[rows, h].double() - dg_want[rows, h]).abs().max().item()
                pieces.append(f"{error:.1e}/{dg_want[rows, h].abs().max().item():.1e}")
        print(f"{'':16s}   dg head {h}, per chunk max |error| / max |dg|: " + " ".join(pieces))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", default="fla,flashqla", help="comma-separated peers (default fla,flashqla)")
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    inputs, initial, d_out, d_final = make_case(LENGTHS, HEADS, GROUP, HEAD_DIM, torch.bfloat16, True, True, True,
                                                True, "kv", args.seed)
    cu_host = [0, *torch.tensor(LENGTHS).cumsum(0).tolist()]
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    want = reference_grads(inputs, initial, d_out, d_final, cu_host, use_qk_l2norm=True)
    plan = plan_chunk_gated_delta_rule(cu_host, num_heads_v=HEADS * GROUP, head_dim=HEAD_DIM, segment_chunks=1)
    for per_chunk in PER_CHUNK:
        got = chunk_gated_delta_rule_bwd(*inputs, d_out, initial_state=initial, d_final_state=d_final, cu_seqlens=cu,
                                         use_qk_l2norm_in_kernel=True, plan=plan, per_chunk=per_chunk)
        report(f"kgen {per_chunk}", got, want, cu_host)
    for library in (p.strip() for p in args.peers.split(",") if p.strip()):
        report(library, peer_grads(library, inputs, initial, d_out, d_final, cu), want, cu_host)


if __name__ == "__main__":
    main()
