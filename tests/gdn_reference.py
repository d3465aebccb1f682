"""Float64 references for the gated delta rule (Gated DeltaNet), on the host.

``recurrent`` is the definition, token by token. ``chunked`` is the chunked algebra the kernels
compute (chunks of ``chunk`` tokens that never cross a sequence, the last one of a sequence
possibly partial); the tests check it against ``recurrent`` before any kernel relies on it.

Shapes follow fla's ``chunk_gated_delta_rule``: q, k ``[B, T, H, K]``; v ``[B, T, HV, V]``; g
(natural-log gates, <= 0) and beta ``[B, T, HV]``; GVA: v-head i reads q/k head ``i // (HV // H)``.
With ``cu_seqlens`` (B = 1) the batch is packed and each sequence starts from its own state.
States are ``[N, HV, K, V]`` (``"kv"``) or ``[N, HV, V, K]`` (``"vk"``).
"""

from __future__ import annotations

import torch

#: The issue's bar on the kernels' error: relative RMS of o and of the final states against these references.
RMS_BAR = 5e-3
#: fla's epsilon in the in-kernel L2 normalisation of q and k: x / sqrt(sum(x^2) + eps).
L2NORM_EPS = 1e-6


def rel_rms(got: torch.Tensor, want: torch.Tensor) -> float:
    """The relative RMS error of ``got`` against the float64 ``want`` (0 for empty tensors)."""
    assert got.shape == want.shape
    if not want.numel():
        return 0.0
    return (got.double() - want).pow(2).mean().sqrt().item() / max(want.pow(2).mean().sqrt().item(), 1e-300)


def l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def _sequences(total: int, batch: int, cu_seqlens) -> list[tuple[int, int, int]]:
    """(batch index, first token, end) of every sequence."""
    if cu_seqlens is None:
        return [(b, 0, total) for b in range(batch)]
    cu = [int(x) for x in cu_seqlens]
    return [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]


def _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens, use_qk_l2norm, state_layout):
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    heads, heads_v, dk = q.shape[2], v.shape[2], q.shape[3]
    group = heads_v // heads
    # Each v-head's q and k (GVA): [B, T, HV, K].
    q, k = q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)
    scale = dk ** -0.5 if scale is None else scale
    seqs = _sequences(q.shape[1], q.shape[0], cu_seqlens)
    states = []
    for n in range(len(seqs)):
        if initial_state is None:
            states.append(torch.zeros(heads_v, dk, v.shape[3], dtype=torch.float64, device=q.device))
        else:
            s0 = initial_state[n].double()
            states.append(s0.transpose(-1, -2).clone() if state_layout == "vk" else s0.clone())
    return q, k, v, g, beta, scale, seqs, states


def _finish(o, states, state_layout):
    final = torch.stack(states) if states else None
    if final is not None and state_layout == "vk":
        final = final.transpose(-1, -2).contiguous()
    return o, final


def recurrent(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, use_qk_l2norm=False,
              state_layout="kv"):
    """(o [B, T, HV, V], final states) in float64, one token at a time:
    S = e^g S;  u = beta (v - S^T k);  S = S + k u^T;  o = scale S^T q."""
    q, k, v, g, beta, scale, seqs, states = _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                                                     use_qk_l2norm, state_layout)
    o = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    for n, (b, start, end) in enumerate(seqs):
        s = states[n]  # [HV, K, V]
        for t in range(start, end):
            s = s * torch.exp(g[b, t])[:, None, None]
            u = beta[b, t][:, None] * (v[b, t] - torch.einsum("hkv,hk->hv", s, k[b, t]))
            s = s + torch.einsum("hk,hv->hkv", k[b, t], u)
            o[b, t] = scale * torch.einsum("hkv,hk->hv", s, q[b, t])
        states[n] = s
    return _finish(o, states, state_layout)


def _chunk_terms(qc, kc, vc, gc, bc):
    """One chunk's linear maps of its start state S (heads first, [HV, C, ...]), from the chunk's own data:
    O = scale (out_u + out_s S) and S' = trans S + state_u, with out_u = P U, out_s = diag(e^Gamma) Q - P W,
    trans = e^{Gamma_last} I - K^T diag(e^{Gamma_last - Gamma}) W, state_u = K^T diag(e^{Gamma_last - Gamma}) U
    and P = Q K^T * LowerIncl * e^{Gamma_i - Gamma_j} (see ``chunked``)."""
    gamma = gc.cumsum(-1)
    size = gamma.shape[-1]
    diff = gamma[:, :, None] - gamma[:, None, :]
    lower_incl = torch.ones(size, size, dtype=torch.bool, device=qc.device).tril()
    decay = torch.where(lower_incl, diff, torch.zeros_like(diff)).exp() * lower_incl
    a = bc[:, :, None] * (kc @ kc.transpose(-1, -2)) * decay * lower_incl.tril(-1)
    t_inv = torch.linalg.inv(torch.eye(size, dtype=torch.float64, device=qc.device) + a)
    w = t_inv @ ((bc * gamma.exp())[:, :, None] * kc)
    u = t_inv @ (bc[:, :, None] * vc)
    p = (qc @ kc.transpose(-1, -2)) * decay
    last = gamma[:, -1]
    k_decayed = kc.transpose(-1, -2) * (last[:, None] - gamma).exp()[:, None, :]  # K^T diag(e^{Gamma_last - Gamma})
    eye = torch.eye(kc.shape[-1], dtype=torch.float64, device=qc.device)
    return {"out_u": p @ u, "out_s": gamma.exp()[:, :, None] * qc - p @ w,
            "trans": last.exp()[:, None, None] * eye - k_decayed @ w, "state_u": k_decayed @ u}


def chunked(q, k, v, g, beta, *, scale=None, initial_state=None, cu_seqlens=None, use_qk_l2norm=False,
            state_layout="kv", chunk: int = 64):
    """``recurrent``'s result by chunks, as the kernels compute it. Per chunk (Gamma: the in-chunk
    inclusive cumsum of g; every exponent is a gate difference i >= j, or Gamma itself, so <= 0):
        A = StrictLower(diag(beta) K K^T * e^{Gamma_i - Gamma_j}),  T = (I + A)^-1,
        W = T diag(beta e^Gamma) K,  U = T diag(beta) V,  Vn = U - W S,
        O = scale (diag(e^Gamma) Q S + (Q K^T * LowerIncl * e^{Gamma_i - Gamma_j}) Vn),
        S <- e^{Gamma_last} S + K^T diag(e^{Gamma_last - Gamma}) Vn."""
    q, k, v, g, beta, scale, seqs, states = _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                                                     use_qk_l2norm, state_layout)
    o = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    for n, (b, start, end) in enumerate(seqs):
        s = states[n]
        for c0 in range(start, end, chunk):
            rows = slice(c0, min(c0 + chunk, end))
            t = _chunk_terms(*(x[b, rows].transpose(0, 1) for x in (q, k, v, g, beta)))
            o[b, rows] = (scale * (t["out_u"] + t["out_s"] @ s)).transpose(0, 1)
            s = t["trans"] @ s + t["state_u"]
        states[n] = s
    return _finish(o, states, state_layout)


def segmented(q, k, v, g, beta, *, segments, scale=None, initial_state=None, cu_seqlens=None,
              use_qk_l2norm=False, state_layout="kv", chunk: int = 64):
    """``chunked``'s result with sequences split into ``segments`` ((sequence, first chunk, chunks) rows,
    as kgen.families.gated_delta_rule.schedule plans them), computed as the kernels will: every segment from a zero state,
    with its transition M (S_end = M S_start + h); then the true start states by the chain
    S_{j+1} = M_j S_j + h_j, and each chunk's output corrected by its linear term in the start state."""
    q, k, v, g, beta, scale, seqs, states = _prepare(q, k, v, g, beta, scale, initial_state, cu_seqlens,
                                                     use_qk_l2norm, state_layout)
    o = torch.zeros(v.shape, dtype=torch.float64, device=v.device)
    by_sequence: dict[int, list[tuple[int, int]]] = {}
    for n, first, count in (tuple(int(x) for x in row) for row in segments):
        by_sequence.setdefault(n, []).append((first, count))
    for n, (b, start, end) in enumerate(seqs):
        summaries = []
        # Pass 1, all segments independent: from a zero state, the outputs, the end state h and M.
        for first, count in sorted(by_sequence.get(n, [])):
            h = torch.zeros_like(states[n])
            m = torch.eye(h.shape[1], dtype=torch.float64, device=v.device).expand(h.shape[0], -1, -1)
            terms = []
            for c in range(first, first + count):
                rows = slice(start + c * chunk, min(start + (c + 1) * chunk, end))
                t = _chunk_terms(*(x[b, rows].transpose(0, 1) for x in (q, k, v, g, beta)))
                o[b, rows] = (scale * (t["out_u"] + t["out_s"] @ h)).transpose(0, 1)
                terms.append((rows, t, m))  # m: this chunk's start state as a function of the segment's
                h, m = t["trans"] @ h + t["state_u"], t["trans"] @ m
            summaries.append((terms, h, m))
        # Pass 2, along the sequence: each segment's true start state, and its outputs' correction.
        s = states[n]
        for terms, h, m in summaries:
            for rows, t, m_start in terms:
                o[b, rows] += (scale * (t["out_s"] @ (m_start @ s))).transpose(0, 1)
            s = m @ s + h
        states[n] = s
    return _finish(o, states, state_layout)
