"""Each gradient's error against float64 on one gated delta rule backward case: kgen's two per-chunk paths and the
peers (fla, FlashQLA; benchmarks' peers, never dependencies) on the same inputs, in all and per v-head, and dg's per
chunk. The diagnosis bench/NOTES.md's "Fifteenth session" asks for: the case defaults to
tests/test_gdn_chunk_backward_gpu.py's no-decay / strong-decay case, where the kernel's dg missed 1e-2.

    PYTHONPATH=.:tests:bench python3 tools/gdn_backward_errors.py [--peers fla,flashqla] [--seed 3] [--states]

``--states`` also asks where dg's error comes from: dg in float64 (local_grads' algebra) from the 16-bit chunk start
states S and end gradients dS' the backward's kernels recomputed, against the same from the exact ones (rounded to
16 bits, or not), each of S and dS' swapped alone. A float64 model of the kernels' roundings put dg's error at
2-4e-3 on such inputs (bench/NOTES.md, twenty-third session), where the GPU's torch stage measured 9.5e-3.
"""

from __future__ import annotations

import argparse
from unittest import mock

import torch

import gdn_reference as ref
from common import gdn_peer
from gdn_backward_reference import _chunk_forward, _end_state_grads, _start_states
from kgen.families.gated_delta_rule import backward
from kgen.families.gated_delta_rule.backward import PER_CHUNK
from kgen.families.gated_delta_rule.local_grads import chunk_grads
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


def recomputed_states(inputs, initial, d_out, d_final, cu, plan) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """First token of each chunk -> (S, dS') as the backward's kernels recomputed them ([HV, K, V], float64 from their
    16-bit copies, which hold S^T and dS'^T), caught where the torch stage receives them. The chunks table gives a
    chunk's first row of the flattened [B * T] tokens: its token, as packed varlen inputs have B = 1."""
    caught = {}
    torch_grads = backward._torch_grads

    def catch(qf, kf, v, g, beta, states, d_states, *rest):
        chunks = rest[1]
        for c, first in enumerate(chunks[:, 0].tolist()):
            caught[first] = (states[c].double().mT, d_states[c].double().mT)
        return torch_grads(qf, kf, v, g, beta, states, d_states, *rest)

    with mock.patch.object(backward, "_torch_grads", catch):
        chunk_gated_delta_rule_bwd(*inputs, d_out, initial_state=initial, d_final_state=d_final, cu_seqlens=cu,
                                   use_qk_l2norm_in_kernel=True, plan=plan, per_chunk="torch")
    return caught


def exact_states(inputs, initial, d_out, d_final, cu_host) -> dict[int, tuple[torch.Tensor, torch.Tensor]]:
    """First token of each chunk -> (S, dS') in float64 by the reference's serial chains (the split's are equal)."""
    q, k, v, g, beta, scale, seqs, starts0 = ref._prepare(*inputs, None, initial, cu_host, True, "kv")
    out = {}
    for n, (b, start, end) in enumerate(seqs):
        rows = [slice(c0, min(c0 + 64, end)) for c0 in range(start, end, 64)]
        chunks = [tuple(x[b, r].transpose(0, 1) for x in (q, k, v, g, beta)) for r in rows]
        terms = [_chunk_forward(*x) for x in chunks]
        dos = [d_out.double()[b, r].transpose(0, 1) for r in rows]
        starts = _start_states(terms, starts0[n], None)
        ends, _ = _end_state_grads(terms, [x[0] for x in chunks], dos, d_final[n].double(), None, scale)
        for r, s, dh in zip(rows, starts, ends):
            out[r.start] = (s, dh)
    return out


def dg_from_states(inputs, d_out, cu_host, states_of, term_states_of=None) -> torch.Tensor:
    """dg [1, T, HV] in float64 from each chunk's (S, dS') (``states_of``: first token -> the pair); with
    ``term_states_of``, the whole-state term e^{G_L} <S, dS'> from its pair instead (tools/dg_state_term.py)."""
    q, k, v, g, beta, scale, seqs, _ = ref._prepare(*inputs, None, None, cu_host, True, "kv")
    dg = torch.zeros_like(g)
    for b, start, end in seqs:
        for c0 in range(start, end, 64):
            r = slice(c0, min(c0 + 64, end))
            qc, kc, vc, gc, bc = (x[b, r].transpose(0, 1) for x in (q, k, v, g, beta))
            s, dh = states_of(c0)
            terms = _chunk_forward(qc, kc, vc, gc, bc)
            grads = chunk_grads(terms, qc, kc, vc, bc, s, dh, d_out.double()[b, r].transpose(0, 1), scale)
            dg[b, r] = grads[3].transpose(0, 1)
            if term_states_of is not None:  # the term enters the last row's dGamma, so every token's dg (reverse cumsum)
                s_term, dh_term = term_states_of(c0)
                swap = terms["last_decay"] * ((dh_term * s_term).sum((-1, -2)) - (dh * s).sum((-1, -2)))
                dg[b, r] += swap[..., None].transpose(0, 1)
    return dg


def state_sources(inputs, initial, d_out, d_final, cu_host, cu, plan, reference_dg) -> None:
    """dg's error with each combination of recomputed and exact S and dS' (see the module's docstring), against dg
    from the exact ones, which must equal ``reference_dg`` (float64 autograd) to rounding."""
    gpu = recomputed_states(inputs, initial, d_out, d_final, cu, plan)
    exact = exact_states(inputs, initial, d_out, d_final, cu_host)
    rounded = {c: tuple(x.to(inputs[0].dtype).double() for x in pair) for c, pair in exact.items()}
    want = dg_from_states(inputs, d_out, cu_host, exact.__getitem__)
    print(f"dg from exact S, dS' against autograd's: {ref.rel_rms(want, reference_dg):.2e} (float64 rounding expected)")
    for label, pick in (("exact, 16-bit", lambda c: rounded[c]),
                        ("kernels' S, dS'", lambda c: gpu[c]), ("kernels' S only", lambda c: (gpu[c][0], rounded[c][1])),
                        ("kernels' dS' only", lambda c: (rounded[c][0], gpu[c][1]))):
        got = dg_from_states(inputs, d_out, cu_host, pick)
        per_head = " ".join(f"{ref.rel_rms(got[..., h], want[..., h]):.2e}" for h in range(want.shape[-1]))
        print(f"dg from {label:18s} {ref.rel_rms(got, want):.2e}   per head {per_head}")
    for label, index in (("S", 0), ("dS'", 1)):
        errors = [ref.rel_rms(gpu[c][index], exact[c][index]) for c in sorted(exact)]
        print(f"kernels' {label} per chunk, rel RMS against exact: " + " ".join(f"{e:.1e}" for e in errors))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--peers", default="fla,flashqla", help="comma-separated peers (default fla,flashqla)")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--states", action="store_true", help="also dg from recomputed against exact S and dS'")
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
    if args.states:
        state_sources(inputs, initial, d_out, d_final, cu_host, cu, plan, want[3])
    for library in (p.strip() for p in args.peers.split(",") if p.strip()):
        report(library, peer_grads(library, inputs, initial, d_out, d_final, cu), want, cu_host)


if __name__ == "__main__":
    main()
