"""Float64 reference for the backward of the chunked gated delta rule (Gated DeltaNet), on the host.

``chunked_backward`` is the algebra the backward computes, in the decomposition of fla and
FlashQLA, for tests/gdn_reference.py's ``chunked`` forward (its shapes, chunks, varlen packing,
GVA, state layouts and in-kernel L2 normalisation). The forward keeps no intermediates: per chunk
the backward recomputes W, U and the start state S, runs the reverse recurrence of the state's
gradient dS over chunks, and then takes each chunk's gradients from (S, dS after the chunk, dO).
With ``segments`` the two chains (S forwards, dS backwards) run split as the kernels will: every
segment from zero, then corrected exactly by the segments' transitions.

Per chunk, heads first ([HV, C, ...]); Gamma is the in-chunk inclusive cumsum of g, L the last row,
D_ij = e^{Gamma_i - Gamma_j} for i >= j (else 0), and every exponent is <= 0:
    A = StrictLower(diag(beta) K K^T * D),  T = (I + A)^-1,  Kb = diag(beta e^Gamma) K,  Vb = diag(beta) V,
    W = T Kb,  U = T Vb,  Vn = U - W S,  P = Q K^T * D,  Kd = diag(e^{Gamma_L - Gamma}) K,
    O = scale (diag(e^Gamma) Q S + P Vn),  S' = e^{Gamma_L} S + Kd^T Vn.
"""

from __future__ import annotations

import torch

from gdn_reference import _prepare
from kgen.families.gated_delta_rule.backward import l2norm_backward
from kgen.families.gated_delta_rule.local_grads import chunk_grads, chunk_terms, value_grad


def _chunk_forward(qc, kc, vc, gc, bc) -> dict[str, torch.Tensor]:
    """One chunk's forward intermediates (heads first), with the chunk's transition ``trans``
    (S' = trans S + Kd^T U) for the split chains."""
    t = chunk_terms(qc, kc, vc, gc, bc)
    eye = torch.eye(kc.shape[-1], dtype=torch.float64, device=qc.device)
    t["trans"] = t["last_decay"][:, None, None] * eye - t["k_decayed"].transpose(-1, -2) @ t["w"]
    return t


def _advance(t, s):
    """The state after the chunk from the state before it (fla's chunk_fwd_h step):
    S' = e^{Gamma_L} S + Kd^T (U - W S)."""
    return t["last_decay"][:, None, None] * s + t["k_decayed"].transpose(-1, -2) @ (t["u"] - t["w"] @ s)


def _retreat(t, qc, dh, do, scale):
    """dS before the chunk from dS' after it (fla's chunk_bwd_dhu step):
    dS = e^{Gamma_L} dS' + scale (diag(e^Gamma) Q)^T dO - W^T dVn,
    i.e. trans^T dS' + scale out_s^T dO with gdn_reference._chunk_terms' maps."""
    q_gated = t["gamma"].exp()[:, :, None] * qc
    return (t["last_decay"][:, None, None] * dh + scale * q_gated.transpose(-1, -2) @ do
            - t["w"].transpose(-1, -2) @ value_grad(t, dh, do, scale))


def _pieces_in_order(pieces, count):
    """A sequence's (first chunk, chunks) pieces in order, checked to tile its ``count`` chunks."""
    pieces = sorted(pieces)
    firsts = [sum(n for _, n in pieces[:i]) for i in range(len(pieces) + 1)]
    assert [f for f, _ in pieces] == firsts[:-1] and firsts[-1] == count, (pieces, count)
    return pieces


def _start_states(terms, s0, pieces):
    """The state before each chunk. Unsplit (pieces None): the serial recurrence from s0. Split: as
    gdn_reference.segmented, every piece from a zero state with its transition M, then the chain
    S_{j+1} = M_j S_j + h_j and each chunk's state corrected by M(piece start -> chunk) S_j."""
    if pieces is None:
        starts, s = [], s0
        for t in terms:
            starts.append(s)
            s = _advance(t, s)
        return starts
    eye = torch.eye(s0.shape[-2], dtype=torch.float64, device=s0.device).expand(s0.shape[0], -1, -1)
    summaries = []
    for first, count in _pieces_in_order(pieces, len(terms)):  # pass 1, pieces independent
        h, m, local = torch.zeros_like(s0), eye, []
        for t in terms[first:first + count]:
            local.append((h, m))
            h, m = _advance(t, h), t["trans"] @ m
        summaries.append((local, h, m))
    starts, s = [], s0
    for local, h, m in summaries:  # pass 2, the chain along the sequence
        starts += [h_c + m_c @ s for h_c, m_c in local]
        s = m @ s + h
    return starts


def _end_state_grads(terms, qcs, dos, dht, pieces, scale):
    """dS' after each chunk, and dS0 before the first. Unsplit (pieces None): the reverse recurrence from
    dht. Split: every piece from a zero gradient at its end, with its transposed transition M^T; then the
    chain backwards dS_j = M_j^T dS_{j+1} + dh_j (dS_j at piece j's start, dS_{last+1} = dht) and each
    chunk's dS' corrected by R^T dS_{j+1}, R mapping the state after the chunk to the piece's end state."""
    if pieces is None:
        ends, dh = [None] * len(terms), dht
        for c in reversed(range(len(terms))):
            ends[c] = dh
            dh = _retreat(terms[c], qcs[c], dh, dos[c], scale)
        return ends, dh
    eye = torch.eye(dht.shape[-2], dtype=torch.float64, device=dht.device).expand(dht.shape[0], -1, -1)
    summaries = []
    for first, count in _pieces_in_order(pieces, len(terms)):  # pass 1, pieces independent
        dh, r, local = torch.zeros_like(dht), eye, []
        for c in reversed(range(first, first + count)):
            local.append((dh, r))
            dh, r = _retreat(terms[c], qcs[c], dh, dos[c], scale), terms[c]["trans"].transpose(-1, -2) @ r
        summaries.append((local[::-1], dh, r))
    ends, ds = [], dht
    for local, dh, r in reversed(summaries):  # pass 2, the chain backwards along the sequence
        ends = [dh_c + r_c @ ds for dh_c, r_c in local] + ends
        ds = r @ ds + dh
    return ends, ds


def chunked_backward(q, k, v, g, beta, do, *, scale=None, initial_state=None, dht=None, cu_seqlens=None,
                     use_qk_l2norm=False, state_layout="kv", chunk: int = 64, segments=None):
    """(dq, dk, dv, dg, dbeta, dh0) in float64: the gradients of sum(o * do) + sum(final * dht) through
    gdn_reference.chunked with the same arguments (dht None: no gradient on the final state; dh0 None
    without an initial state). ``segments``: (sequence, first chunk, chunks) rows, as
    kgen.families.gated_delta_rule.schedule plans them, to run both chains split."""
    qn, kn, v, g, beta, scale, seqs, states = _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                                                       use_qk_l2norm, state_layout)
    do = do.double()
    heads_v, dk_dim, dv_dim = v.shape[2], qn.shape[3], v.shape[3]
    by_sequence: dict[int, list[tuple[int, int]]] = {}
    for n, first, count in (tuple(int(x) for x in row) for row in (segments if segments is not None else [])):
        by_sequence.setdefault(n, []).append((first, count))
    dq = torch.zeros_like(qn)
    dk = torch.zeros_like(kn)
    dv, dg, dbeta = torch.zeros_like(v), torch.zeros_like(g), torch.zeros_like(beta)
    dh0 = []
    for n, (b, start, end) in enumerate(seqs):
        if dht is None:
            seed = torch.zeros(heads_v, dk_dim, dv_dim, dtype=torch.float64, device=v.device)
        else:
            seed = dht[n].double().transpose(-1, -2) if state_layout == "vk" else dht[n].double()
        rows = [slice(c0, min(c0 + chunk, end)) for c0 in range(start, end, chunk)]
        inputs = [tuple(x[b, r].transpose(0, 1) for x in (qn, kn, v, g, beta)) for r in rows]
        dos = [do[b, r].transpose(0, 1) for r in rows]
        terms = [_chunk_forward(*x) for x in inputs]
        pieces = by_sequence.get(n, []) if segments is not None else None
        starts = _start_states(terms, states[n], pieces)
        ends, ds0 = _end_state_grads(terms, [x[0] for x in inputs], dos, seed, pieces, scale)
        dh0.append(ds0)
        for r, (qc, kc, vc, _, bc), t, s, dh, d in zip(rows, inputs, terms, starts, ends, dos):
            grads = chunk_grads(t, qc, kc, vc, bc, s, dh, d, scale)
            for out, grad in zip((dq, dk, dv, dg, dbeta), grads):
                out[b, r] = grad.transpose(0, 1)
    # GVA: a q/k head's gradient sums those of the v-heads that read it.
    heads = q.shape[2]
    dq = dq.reshape(*dq.shape[:2], heads, heads_v // heads, dk_dim).sum(3)
    dk = dk.reshape(*dk.shape[:2], heads, heads_v // heads, dk_dim).sum(3)
    if use_qk_l2norm:
        dq, dk = l2norm_backward(q.double(), dq), l2norm_backward(k.double(), dk)
    if initial_state is None:
        return dq, dk, dv, dg, dbeta, None
    dh0 = torch.stack(dh0)
    return dq, dk, dv, dg, dbeta, dh0.transpose(-1, -2).contiguous() if state_layout == "vk" else dh0
