"""The per-chunk gradients of the chunked gated delta rule, batched over any leading dimensions, in torch.

Given each chunk's start state S and the gradient dS' of its end state (the backward's two recurrences,
run by the chunk family's kernels), every chunk's gradients are independent: these functions take them
for a whole batch of chunks at once (``[..., C, K]`` tensors, C the chunk's tokens, rows past a sequence
zero with g and beta zero there). They run in the caller's dtype: fp32 on the GPU in
:mod:`.backward`, float64 on the host in tests/gdn_backward_reference.py, whose test pins them to autograd
through the token-by-token recurrence.

Per chunk: Gamma = in-chunk inclusive cumsum of g, L its last row, D_ij = e^{Gamma_i - Gamma_j} for
i >= j (else 0), every exponent <= 0:
    A = StrictLower(diag(beta) K K^T * D),  T = (I + A)^-1,  Kb = diag(beta e^Gamma) K,  Vb = diag(beta) V,
    W = T Kb,  U = T Vb,  Vn = U - W S,  P = Q K^T * D,  Kd = diag(e^{Gamma_L - Gamma}) K,
    O = scale (diag(e^Gamma) Q S + P Vn),  S' = e^{Gamma_L} S + Kd^T Vn.
"""

from __future__ import annotations

import torch


def chunk_terms(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, g: torch.Tensor, beta: torch.Tensor
                ) -> dict[str, torch.Tensor]:
    """The forward's intermediates of each chunk, which the backward recomputes rather than stores."""
    gamma = g.cumsum(-1)
    size = gamma.shape[-1]
    lower_incl = torch.ones(size, size, dtype=torch.bool, device=q.device).tril()
    diff = gamma[..., :, None] - gamma[..., None, :]
    # Exponentiate only i >= j: above the diagonal the differences are positive and could overflow.
    decay = torch.where(lower_incl, diff, torch.zeros_like(diff)).exp() * lower_incl
    kk = k @ k.mT
    a = beta[..., :, None] * kk * decay.tril(-1)
    eye = torch.eye(size, dtype=q.dtype, device=q.device)
    t_inv = torch.linalg.solve_triangular(eye + a, eye.expand_as(a), upper=False, unitriangular=True)
    k_beta = (beta * gamma.exp())[..., None] * k
    v_beta = beta[..., None] * v
    last = gamma[..., -1]
    to_last = (last[..., None] - gamma).exp()  # e^{Gamma_L - Gamma}
    qk = q @ k.mT
    return {"gamma": gamma, "decay": decay, "kk": kk, "a": a, "t_inv": t_inv, "k_beta": k_beta, "v_beta": v_beta,
            "w": t_inv @ k_beta, "u": t_inv @ v_beta, "qk": qk, "p": qk * decay, "last_decay": last.exp(),
            "to_last": to_last, "k_decayed": to_last[..., None] * k}


def value_grad(t: dict[str, torch.Tensor], dh: torch.Tensor, do: torch.Tensor, scale: float) -> torch.Tensor:
    """dVn, the gradient of the chunk's new values: scale P^T dO (fla's chunk_bwd_dv_local) + Kd dS'."""
    return scale * t["p"].mT @ do + t["k_decayed"] @ dh


def chunk_grads(t: dict[str, torch.Tensor], q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, beta: torch.Tensor,
                s: torch.Tensor, dh: torch.Tensor, do: torch.Tensor, scale: float
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(dq, dk, dv, dg, dbeta) of each chunk, per v-head, from its terms, start state S ``[..., K, V]``, the
    gradient dS' of its end state and dO."""
    vn = t["u"] - t["w"] @ s
    dvn = value_grad(t, dh, do, scale)
    gamma_exp = t["gamma"].exp()[..., None]
    # O and S' through Q, K and the gates directly (fla's chunk_bwd_dqkwg), with P = QK^T * D.
    dqk = scale * (do @ vn.mT) * t["decay"]  # the gradient of QK^T, masked to i >= j by D
    dq_state = scale * gamma_exp * (do @ s.mT)
    dq = dq_state + dqk @ k
    dk_decayed = vn @ dh.mT  # the gradient of Kd, from S' = ... + Kd^T Vn
    dk = dqk.mT @ q + t["to_last"][..., None] * dk_decayed
    d_gamma = (q * dq_state).sum(-1)
    via_p = dqk * t["qk"]  # dP * P: the gradient of the exponents Gamma_i - Gamma_j in D
    d_gamma = d_gamma + via_p.sum(-1) - via_p.sum(-2)
    via_kd = (t["k_decayed"] * dk_decayed).sum(-1)
    d_gamma = d_gamma - via_kd
    last = via_kd.sum(-1) + t["last_decay"] * (dh * s).sum((-1, -2))
    d_gamma = torch.cat([d_gamma[..., :-1], d_gamma[..., -1:] + last[..., None]], dim=-1)
    # Vn = U - W S: then back through the WY representation W = T Kb, U = T Vb, T = (I + A)^-1.
    dw = -dvn @ s.mT
    t_inv_t = t["t_inv"].mT
    dt = dw @ t["k_beta"].mT + dvn @ t["v_beta"].mT
    da = -(t_inv_t @ dt @ t_inv_t).tril(-1)  # A is strictly lower, and so is its gradient
    dk_beta, dv_beta = t_inv_t @ dw, t_inv_t @ dvn
    # A = diag(beta) (K K^T) * D, strictly lower.
    dkk = da * beta[..., :, None] * t["decay"]
    dk = dk + dkk @ k + dkk.mT @ k
    dbeta = (da * t["kk"] * t["decay"]).sum(-1)
    via_a = da * t["a"]
    d_gamma = d_gamma + via_a.sum(-1) - via_a.sum(-2)
    # Kb = diag(beta e^Gamma) K and Vb = diag(beta) V.
    dk = dk + (beta[..., None] * gamma_exp) * dk_beta
    via_kb = gamma_exp[..., 0] * (k * dk_beta).sum(-1)
    dbeta = dbeta + via_kb + (v * dv_beta).sum(-1)
    d_gamma = d_gamma + beta * via_kb
    dv = beta[..., None] * dv_beta
    # Gamma_i = sum_{j <= i} g_j: dg is the in-chunk reverse cumsum of dGamma.
    dg = d_gamma.flip(-1).cumsum(-1).flip(-1)
    return dq, dk, dv, dg, dbeta
