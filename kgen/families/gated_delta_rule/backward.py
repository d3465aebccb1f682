"""The chunked gated delta rule's backward: the gradients of fla's ``chunk_gated_delta_rule``.

Autograd keeps the forward's inputs and :class:`.chunk.ForwardKept` (the KKT kernel's Tbeta and gate cumsums, a
split's segment start states: as FlashQLA keeps its A, gate cumsums and start states), so that the backward runs
neither the KKT kernel nor the split's summaries and chain again (callers of :func:`chunk_gated_delta_rule_bwd`
without ``forward_kept`` do). The backward
1. recomputes the state S^T before every chunk (``gated_delta_rule_chunk_states``: the forward's recurrence,
   its split and chain included, writing 16-bit states instead of o);
2. runs the state gradient's reverse recurrence from each sequence's end (``gated_delta_rule_chunk_reverse``),
   writing every chunk's dS'^T (16-bit) and the gradient of the initial state. Split sequences run their segments
   at once, as in the forward: ``gated_delta_rule_chunk_reverse_summary`` maps each segment but the first of its
   sequence to dS = M dS' + h, and ``gated_delta_rule_chunk_chain`` walks them from the sequence's end into every
   segment's exact end dS' (with the forward's decay-bounded shortcut, unless the plan is exact_split);
3. takes every chunk's dq, dk, dv, dg and dbeta from them: by default with ``gated_delta_rule_chunk_grads``,
   persistent blocks over the (chunk, q/k head) items, each taking its v-heads in turn (wgmma, everything in
   shared memory, dq and dk summed over the group in the kernel; dg's whole-state sum with the states' rounding
   losses, which steps 1 and 2 write for it); with ``per_chunk="torch"`` by :mod:`.local_grads` (batched torch
   products in fp32 over slices of chunks, then dq and dk summed over each GVA group), several times slower;
   then takes the in-kernel l2norm's backward. ``KGEN_GDN_BACKWARD=torch`` makes the torch stage the path of
   every call that does not name one, autograd's included.

Rows past a sequence are zero in every chunk the backward reads, so one sequence's gradients never see
another's data. Nothing here synchronises with the device.
"""

from __future__ import annotations

import numpy as np
import torch

from kgen import config
from kgen.families.gated_delta_rule.chunk import (ForwardKept, checked_inputs, kernels_for_plan, kept_shapes, on_device,
                                                  run_forward)
from kgen.families.gated_delta_rule.planner import NEGLIGIBLE_LOG_DECAY
from kgen.families.gated_delta_rule.local_grads import chunk_grads, chunk_terms
from kgen.runtime.checks import check_dense_rows, check_shape, check_tensor
from kgen.runtime.device import sm_count

#: The eps of fla's in-kernel l2norm, x / sqrt(sum x^2 + eps).
L2NORM_EPS = 1e-6
#: Elements of one [chunk, head, token, feature] fp32 tensor of the per-chunk gradients' slices: bounds the
#: backward's workspace (a few dozen such tensors live at once) whatever the batch.
_SLICE_ELEMENTS = 1 << 26


#: Where the per-chunk gradients are taken (see the module's step 3); the first is the default.
PER_CHUNK = config.GDN_BACKWARD_PATHS


def chunk_gated_delta_rule_bwd(q, k, v, g, beta, d_out, *, scale=None, initial_state=None, d_final_state=None,
                               cu_seqlens=None, use_qk_l2norm_in_kernel=False, state_layout="kv", plan=None,
                               per_chunk=None, forward_kept=None):
    """The gradients (dq, dk, dv, dg, dbeta, d_initial_state) of ``sum(o * d_out) + sum(final * d_final_state)``
    through :func:`kgen.ops.chunk_gated_delta_rule` with the same arguments, for callers with their own autograd.

    ``d_out`` is o's gradient (v's shape and dtype); ``d_final_state`` the final state's (fp32, the state
    layout's shape) or None. dq, dk and dv come in q's dtype, dg in fp32, dbeta in beta's dtype;
    d_initial_state (fp32) is None without an initial state. ``per_chunk``: one of :data:`PER_CHUNK`, or None for
    the ``KGEN_GDN_BACKWARD`` setting (:func:`kgen.config.gdn_backward`). ``forward_kept``: the
    :class:`.chunk.ForwardKept` that :func:`.chunk.forward_keeping` returned for these inputs and plan (kgen's
    autograd passes the forward's), so that the backward does not compute it again; None computes it.
    """
    if per_chunk is None:
        per_chunk = config.gdn_backward()
    if per_chunk not in PER_CHUNK:
        raise ValueError(f"per_chunk: expected one of {PER_CHUNK}, got {per_chunk!r}")
    plan, scale = checked_inputs(q, k, v, g, beta, scale=scale, initial_state=initial_state,
                                 output_final_state=False, cu_seqlens=cu_seqlens,
                                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, state_layout=state_layout, plan=plan)
    check_tensor("d_out", d_out, ndim=4, dtypes=(q.dtype,), device=q.device)
    check_shape("d_out", d_out, v.shape, "[B, T, HV, V] like v")
    check_dense_rows("d_out", d_out)
    state_shape = (plan.num_seqs, v.shape[2], q.shape[3], q.shape[3])
    if d_final_state is not None:
        check_tensor("d_final_state", d_final_state, ndim=4, dtypes=(torch.float32,), device=q.device)
        check_shape("d_final_state", d_final_state, state_shape, f"[N, HV, K, V] ({state_layout})")
        check_dense_rows("d_final_state", d_final_state)
    if forward_kept is not None:
        check_forward_kept(forward_kept, plan, q, v.shape[2])
    if not plan.num_seqs:
        return (torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), torch.zeros_like(g),
                torch.zeros_like(beta), None if initial_state is None else torch.zeros_like(initial_state))
    with on_device(q.device):
        return _backward(plan, q, k, v, g, beta, d_out, scale, initial_state, d_final_state, cu_seqlens,
                         use_qk_l2norm_in_kernel, state_layout, per_chunk, forward_kept)


def check_forward_kept(forward_kept, plan, q: torch.Tensor, heads_v: int) -> None:
    """That ``forward_kept`` is a :class:`.chunk.ForwardKept` of tensors shaped as the forward's for ``plan``, each
    checked by name."""
    if not isinstance(forward_kept, ForwardKept):
        raise TypeError(f"forward_kept: expected a ForwardKept (from chunk.forward_keeping) or None, "
                        f"got {type(forward_kept).__name__}")
    shapes = kept_shapes(len(plan.chunks), plan.num_summaries, heads_v, q.shape[3], plan.schedule.chunk)
    for field, kept, shape, dtype in zip(ForwardKept._fields, forward_kept, shapes, (q.dtype, torch.float32, torch.float32)):
        name = f"forward_kept.{field}"
        check_tensor(name, kept, ndim=len(shape), dtypes=(dtype,), device=q.device)
        if field == "start_states" and kept.shape[0] == 0:  # none kept: the backward runs the summaries again
            shape = (0, *shape[1:])
        check_shape(name, kept, shape, "the forward's for this plan")
        check_dense_rows(name, kept)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)


def l2norm_backward(x: torch.Tensor, dy: torch.Tensor) -> torch.Tensor:
    """The gradient of x from that of y = x / sqrt(|x|^2 + eps): r (dy - y (y . dy)), r = 1 / sqrt(|x|^2 + eps), in
    x's dtype (tests/gdn_backward_reference.py takes it in float64)."""
    r = torch.rsqrt((x * x).sum(-1, keepdim=True) + L2NORM_EPS)
    y = x * r
    return r * (dy - y * (y * dy).sum(-1, keepdim=True))


def _backward(plan, q, k, v, g, beta, d_out, scale, initial_state, d_final_state, cu_seqlens, l2norm, state_layout,
              per_chunk, forward_kept):
    heads, head_dim, heads_v = q.shape[2], q.shape[3], v.shape[2]
    dtype = q.dtype
    # The kernels take q and k normalised (rounded to their dtype); the per-chunk gradients the fp32 ones.
    qf, kf = (_l2norm(q), _l2norm(k)) if l2norm else (q, k)
    q_in, k_in = (qf.to(dtype), kf.to(dtype)) if l2norm else (q, k)
    num_chunks = len(plan.chunks)
    states = q.new_empty((num_chunks, heads_v, head_dim, head_dim))
    d_states = torch.empty_like(states)
    # The gradients kernel's whole-state sum of dg also reads what rounding S and dS' to 16 bits lost (its terms
    # cancel: bench/NOTES.md, thirty-second session), a byte an element.
    residuals = [torch.empty(states.shape, dtype=torch.uint8, device=q.device) if per_chunk == "kernel" else None
                 for _ in range(2)]
    d_initial = None if initial_state is None else torch.empty_like(initial_state)
    kernels = kernels_for_plan(plan, q, state_layout)
    tbeta, gamma_log2, _ = run_forward(plan, q_in, k_in, v, g, beta, cu_seqlens, initial_state, states, None, scale,
                                       state_layout, False, states=True, state_residuals=residuals[0], kept=forward_kept)
    chunks, segments, _, chains = plan.tables.on(q.device)
    reverse = {"q": q_in.data_ptr(), "k": k_in.data_ptr(), "g": g.data_ptr(), "tbeta": tbeta.data_ptr(),
               "d_out": d_out.data_ptr(), "d_final_state": 0 if d_final_state is None else d_final_state.data_ptr(),
               "cu_seqlens": 0 if cu_seqlens is None else cu_seqlens.data_ptr(),
               "cu_seqlens_is_int64": int(cu_seqlens is not None and cu_seqlens.dtype is torch.int64),
               "segments": segments.data_ptr(), "gamma_log2": gamma_log2.data_ptr(), "end_states": 0, "summary": 0,
               "negligible_summaries": 0, "d_states": d_states.data_ptr(),
               "d_state_residuals": 0 if residuals[1] is None else residuals[1].data_ptr(),
               "d_initial_state": 0 if d_initial is None else d_initial.data_ptr(), "num_heads": heads,
               "num_heads_v": heads_v, "scale": np.float32(scale),
               "negligible_log_decay": np.float32(-np.inf if plan.exact_split else NEGLIGIBLE_LOG_DECAY)}
    if plan.num_summaries:
        # The forward's slots, walked back: segment j's summary goes to its start slot, and the chain writes its
        # end dS' to its summary slot.
        summaries = q.new_empty((plan.num_summaries, heads_v, head_dim, 2 * head_dim), dtype=torch.float32)
        ends = q.new_empty((plan.num_summaries, heads_v, head_dim, head_dim), dtype=torch.float32)
        negligible = q.new_empty((plan.num_summaries, heads_v), dtype=torch.int32)
        kernels.reverse_summary.launch((2 * head_dim // plan.value_slice, heads_v, len(plan.segments)),
                                       **{**reverse, "summary": summaries.data_ptr(),
                                          "negligible_summaries": negligible.data_ptr(), "d_states": 0,
                                          "d_state_residuals": 0,
                                          "d_initial_state": 0})
        kernels.chain.launch((head_dim // kernels.chain_columns, heads_v, len(plan.chains)),
                             summary=summaries.data_ptr(), negligible_summaries=negligible.data_ptr(),
                             initial_state=reverse["d_final_state"],
                             start_states=ends.data_ptr(), chains=chains.data_ptr(), num_heads_v=heads_v,
                             reverse_order=1)
        reverse["end_states"] = ends.data_ptr()
    kernels.reverse.launch((head_dim // plan.value_slice, heads_v, len(plan.segments)), **reverse)

    if per_chunk == "kernel":
        dq, dk, dv, dg, dbeta = _kernel_grads(kernels, q_in, k_in, v, g, beta, tbeta, states, d_states, residuals,
                                              d_out, chunks, scale)
    else:
        dq, dk, dv, dg, dbeta = _torch_grads(qf, kf, v, g, beta, states, d_states, d_out, chunks, scale, kernels.chunk)
    if l2norm:
        dq, dk = l2norm_backward(q.float(), dq), l2norm_backward(k.float(), dk)
    return dq.to(dtype), dk.to(dtype), dv.to(dtype), dg, dbeta.to(beta.dtype), d_initial


def _kernel_grads(kernels, q, k, v, g, beta, tbeta, states, d_states, residuals, d_out, chunks, scale):
    """dq, dk (fp32, summed over each GVA group in the kernel), dv, dg and dbeta (fp32) by
    gated_delta_rule_chunk_grads: persistent blocks, one an SM, over the (chunk, q/k head) items."""
    heads, heads_v = q.shape[2], v.shape[2]
    dq = q.new_empty(q.shape, dtype=torch.float32)
    dk, dv = torch.empty_like(dq), torch.empty_like(v)
    dg = torch.empty_like(g)
    dbeta = g.new_empty(g.shape)
    if len(chunks):
        blocks = min(len(chunks) * heads, sm_count(q.device))
        kernels.grads.launch((blocks,), q=q.data_ptr(), k=k.data_ptr(), v=v.data_ptr(), g=g.data_ptr(),
                             beta=beta.data_ptr(), beta_is_fp32=int(beta.dtype is torch.float32),
                             chunks=chunks.data_ptr(), num_chunks=len(chunks), tbeta=tbeta.data_ptr(),
                             states=states.data_ptr(), state_residuals=residuals[0].data_ptr(),
                             d_state_residuals=residuals[1].data_ptr(),
                             d_states=d_states.data_ptr(), d_out=d_out.data_ptr(), dq=dq.data_ptr(), dk=dk.data_ptr(),
                             dv=dv.data_ptr(), dg=dg.data_ptr(), dbeta=dbeta.data_ptr(), num_heads=heads,
                             num_heads_v=heads_v, scale=np.float32(scale))
    return dq, dk, dv, dg, dbeta


def _torch_grads(qf, kf, v, g, beta, states, d_states, d_out, chunks, scale, chunk):
    """dq, dk (summed over each GVA group), dv, dg and dbeta, fp32, by :mod:`.local_grads` over slices of chunks."""
    batch, tokens, heads, head_dim = qf.shape
    heads_v, total, num_chunks = v.shape[2], batch * tokens, len(chunks)
    group = heads_v // heads
    device = qf.device
    # Every chunk's rows (padded ones masked), and each token's place among the chunks' rows.
    offsets = torch.arange(chunk, device=device, dtype=torch.int64)
    first, valid = chunks[:, 0].long(), chunks[:, 1].long()
    inside = offsets < valid[:, None]  # [chunks, chunk]
    rows = torch.where(inside, first[:, None] + offsets, 0)
    token_chunk = torch.searchsorted(first.contiguous(), torch.arange(total, device=device), right=True) - 1
    token_place = token_chunk * chunk + torch.arange(total, device=device) - first[token_chunk]
    sources = [x.reshape(total, -1, x.shape[-1] if x.dim() == 4 else 1) for x in (qf, kf, v, d_out, g, beta)]

    def by_chunk(x, part):  # [total, h, f] -> [chunks of part, h, chunk, f], fp32, rows past a sequence zero
        picked = x[rows[part]].float()
        return torch.where(inside[part][:, :, None, None], picked, 0.0).transpose(1, 2)

    # Per chunk, in the chunks' order: dq and dk per q/k head, dv per v-head, dg and dbeta.
    dq = v.new_empty((num_chunks, heads, chunk, head_dim), dtype=torch.float32)
    dk, dv = torch.empty_like(dq), v.new_empty((num_chunks, heads_v, chunk, head_dim), dtype=torch.float32)
    dg = v.new_empty((num_chunks, heads_v, chunk), dtype=torch.float32)
    dbeta = torch.empty_like(dg)
    step = max(1, _SLICE_ELEMENTS // (heads_v * chunk * head_dim))
    for c0 in range(0, num_chunks, step):
        part = slice(c0, c0 + step)
        qc, kc, vc, dc, gc, bc = (by_chunk(x, part) for x in sources)
        qc, kc = qc.repeat_interleave(group, dim=1), kc.repeat_interleave(group, dim=1)
        gc, bc = gc[..., 0], bc[..., 0]
        s, dh = states[part].float().mT, d_states[part].float().mT  # the kernels write S^T and dS'^T
        grads = chunk_grads(chunk_terms(qc, kc, vc, gc, bc), qc, kc, vc, bc, s, dh, dc, scale)
        size = grads[0].shape[0]
        # GVA: a q/k head's gradient sums those of the v-heads that read it.
        dq[part], dk[part] = (x.view(size, heads, group, chunk, head_dim).sum(2) for x in grads[:2])
        dv[part], dg[part], dbeta[part] = grads[2:]

    def by_token(x):  # [chunks, h, chunk, f...] -> [B, T, h, f...]
        x = x.transpose(1, 2)
        return x.reshape(num_chunks * chunk, *x.shape[2:])[token_place].reshape(batch, tokens, *x.shape[2:])

    return tuple(by_token(x) for x in (dq, dk, dv, dg, dbeta))
