"""kgen.compat's drop-ins: the peers' signatures, refusals by name, layout and LSE conversions, the plan cache.

The CPU tests replace kgen's ops with float64 torch stand-ins (``FakeOps``) that keep kgen's
conventions (natural-log LSE, ``[H, total_q]`` and dim-0 stacking, fp32 states in ``state_layout``)
and check what they are given, so the conversions are tested without a GPU against references
written in each peer's conventions. The peers are not installed: their signatures are pinned in
tests/compat_signatures.json. The GPU tests (``-m gpu``, skipped without CUDA) compare every element
of each drop-in's result with the native kgen op's on random inputs.
"""

from __future__ import annotations

import inspect
import json
import math
from dataclasses import dataclass
from importlib import import_module
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

import kgen.ops
from kgen.compat import PlanCache
from kgen.compat import fla as compat_fla
from kgen.compat import flash_attn as compat_fa
from kgen.compat import flashinfer as compat_fi

SIGNATURES = json.loads((Path(__file__).parent / "compat_signatures.json").read_text())["functions"]
DROP_INS = {"kgen.compat.flash_attn": compat_fa, "kgen.compat.fla": compat_fla, "kgen.compat.flashinfer": compat_fi}
LN2 = math.log(2.0)

gpu = pytest.mark.gpu
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


# ---------------------------------------------------------------------------------------------
# References, in float64


def dense_attention(q, k, v, cu_q, cu_k, scale, allowed):
    """out [total_q, Hq, D] and the natural-log LSE [Hq, total_q] (-inf where a row attends no key).

    ``allowed(i, j, lq, lk)`` says whether query i of a sequence may attend its key j.
    """
    total_q, heads_q, head_dim = q.shape
    group = heads_q // k.shape[1]
    out = torch.zeros(total_q, heads_q, head_dim, dtype=torch.float64)
    lse = torch.full((heads_q, total_q), -math.inf, dtype=torch.float64)
    for s in range(len(cu_q) - 1):
        q0, q1, k0, k1 = cu_q[s], cu_q[s + 1], cu_k[s], cu_k[s + 1]
        lq, lk = q1 - q0, k1 - k0
        if not lq or not lk:
            continue
        mask = torch.tensor([[allowed(i, j, lq, lk) for j in range(lk)] for i in range(lq)])
        for h in range(heads_q):
            scores = scale * q[q0:q1, h].double() @ k[k0:k1, h // group].double().T
            scores = scores.masked_fill(~mask, -math.inf)
            row_lse = torch.logsumexp(scores, dim=1)
            keep = torch.isfinite(row_lse)
            p = torch.where(keep[:, None], torch.exp(scores - row_lse[:, None]), torch.zeros_like(scores))
            out[q0:q1, h] = p @ v[k0:k1, h // group].double()
            lse[h, q0:q1] = row_lse
    return out, lse


def kgen_window_mask(causal, window):
    """kgen's attention_varlen mask: window (left, right), -1 unbounded, right = 0 when causal, bottom-right aligned."""
    assert type(causal) is bool and type(window) is tuple and all(type(x) is int and x >= -1 for x in window)
    left, right = window[0], 0 if causal else window[1]

    def allowed(i, j, lq, lk):
        d = i + lk - lq
        return (left < 0 or j >= d - left) and (right < 0 or j <= d + right)
    return allowed


def flash_attn_mask(causal, window_size):
    """flash-attn's documented mask: keys in [i + lk - lq - left, i + lk - lq + right], a negative side unbounded."""
    left, right = window_size

    def allowed(i, j, lq, lk):
        d = i + lk - lq
        if causal and j > d:
            return False
        return (left < 0 or j >= d - left) and (right < 0 or j <= d + right)
    return allowed


def gdn_reference(q, k, v, g, beta, scale, h0, l2norm, cu=None, v_first=False):
    """The gated delta rule, token by token: o [B, T, HV, V] and the final states [N, HV, K, V] ([N, HV, V, K] v-first)."""
    batch, tokens, heads, head_dim = q.shape
    heads_v = v.shape[2]
    q, k, v, g, beta = (t.double() for t in (q, k, v, g, beta))
    if l2norm:
        q = q / torch.sqrt((q * q).sum(-1, keepdim=True) + 1e-6)
        k = k / torch.sqrt((k * k).sum(-1, keepdim=True) + 1e-6)
    head_of = torch.arange(heads_v) // (heads_v // heads)
    seqs = [(b, 0, tokens) for b in range(batch)] if cu is None else [(0, cu[i], cu[i + 1]) for i in range(len(cu) - 1)]
    o = torch.zeros(batch, tokens, heads_v, head_dim, dtype=torch.float64)
    finals = []
    for n, (b, start, end) in enumerate(seqs):
        state = torch.zeros(heads_v, head_dim, head_dim, dtype=torch.float64)  # [HV, K, V]
        if h0 is not None:
            state = h0[n].double().clone()
            if v_first:
                state = state.transpose(-1, -2).clone()
        for t in range(start, end):
            qt, kt = q[b, t, head_of], k[b, t, head_of]  # [HV, K]
            state = state * torch.exp(g[b, t])[:, None, None]
            u = beta[b, t][:, None] * (v[b, t] - torch.einsum("hkv,hk->hv", state, kt))
            state = state + kt[:, :, None] * u[:, None, :]
            o[b, t] = scale * torch.einsum("hkv,hk->hv", state, qt)
        finals.append(state.transpose(-1, -2) if v_first else state)
    return o, torch.stack(finals) if finals else torch.zeros(0, heads_v, head_dim, head_dim, dtype=torch.float64)


def merge_reference_base2(v, s, dim):
    """Merge states stacked on ``dim`` in FlashInfer's terms (base-2 LSE); empty states ignored, all-empty rows 0 / -inf."""
    v64, s64 = v.double(), s.double()
    if v.shape[dim] == 0:
        rows = s64.sum(dim).shape
        return torch.zeros(*rows, v.shape[-1], dtype=torch.float64), torch.full(rows, -math.inf, dtype=torch.float64)
    m = s64.amax(dim, keepdim=True)
    m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
    w = torch.exp2(s64 - m)
    total = w.sum(dim)
    vs = torch.where(w.unsqueeze(-1) > 0, v64, torch.zeros_like(v64))
    out = (w.unsqueeze(-1) * vs).sum(dim) / torch.where(total > 0, total, torch.ones_like(total)).unsqueeze(-1)
    lse = torch.where(total > 0, m.squeeze(dim) + torch.log2(total), torch.full_like(total, -math.inf))
    return out, lse


# ---------------------------------------------------------------------------------------------
# Stand-ins for kgen's ops


@dataclass(frozen=True, eq=False)
class FakePlan:
    args: tuple
    options: tuple


class FakeOps:
    """kgen's ops, as float64 CPU torch math with kgen's conventions; every call recorded as (name, args, kwargs)."""

    def __init__(self):
        self.calls: list[tuple[str, tuple, dict]] = []

    def names(self) -> list[str]:
        return [name for name, _, _ in self.calls]

    def last(self, name: str) -> tuple[tuple, dict]:
        for called, args, kwargs in reversed(self.calls):
            if called == name:
                return args, kwargs
        raise AssertionError(f"{name} was not called; calls: {self.names()}")

    # attention
    def plan_attention_varlen(self, cu_q, cu_k, *, head_dim, dtype, causal=False, window=(-1, -1), device=None):
        self.calls.append(("plan_attention_varlen", (cu_q, cu_k), dict(head_dim=head_dim, dtype=dtype, causal=causal,
                                                                          window=window, device=device)))
        assert all(type(x) is int for x in (*cu_q, *cu_k)), "plans are made from host ints"
        return FakePlan((tuple(cu_q), tuple(cu_k)), (head_dim, dtype, causal, window))

    def attention_varlen(self, q, k, v, cu_q, cu_k, *, causal=False, window=(-1, -1), sink=None, softmax_scale=None,
                         return_lse=False, plan=None, out=None, lse_out=None):
        self.calls.append(("attention_varlen", (q, k, v, cu_q, cu_k), dict(causal=causal, window=window,
                                                                          softmax_scale=softmax_scale,
                                                                          return_lse=return_lse, plan=plan)))
        assert cu_q.dtype == torch.int32 and cu_k.dtype == torch.int32
        cu_q, cu_k = host(cu_q), host(cu_k)
        if plan is not None:
            assert plan.args == (tuple(cu_q), tuple(cu_k)), "the plan is for other lengths"
            assert plan.options == (q.shape[2], q.dtype, causal, window)
        scale = q.shape[2] ** -0.5 if softmax_scale is None else softmax_scale
        o, lse = dense_attention(q, k, v, cu_q, cu_k, scale, kgen_window_mask(causal, window))
        o = o.to(q.dtype)
        return (o, lse.float()) if return_lse else o

    # merge
    def merge_attention_states(self, v_a, lse_a, v_b, lse_b):
        self.calls.append(("merge_attention_states", (v_a, lse_a, v_b, lse_b), {}))
        assert lse_a.dtype == torch.float32 and lse_b.dtype == torch.float32
        out, lse = merge_reference_base2(torch.stack([v_a, v_b]), torch.stack([lse_a, lse_b]) / LN2, 0)
        return out.to(v_a.dtype), (lse * LN2).float()

    def merge_attention_states_n(self, v, lse):
        self.calls.append(("merge_attention_states_n", (v, lse), {}))
        assert v.dim() == 4 and v.is_contiguous() and lse.shape == v.shape[:3] and lse.dtype == torch.float32
        out, merged = merge_reference_base2(v, lse / LN2, 0)
        return out.to(v.dtype), (merged * LN2).float()

    # gated delta rule
    def plan_chunk_gated_delta_rule(self, cu, *, num_heads_v, head_dim=128, device=None):
        self.calls.append(("plan_chunk_gated_delta_rule", (cu,), dict(num_heads_v=num_heads_v, head_dim=head_dim,
                                                                      device=device)))
        assert all(type(x) is int for x in cu), "plans are made from host ints"
        return FakePlan((tuple(cu),), (num_heads_v, head_dim))

    def chunk_gated_delta_rule(self, q, k, v, g, beta, *, scale=None, initial_state=None, output_final_state=False,
                               cu_seqlens=None, use_qk_l2norm_in_kernel=False, state_layout="kv", plan=None,
                               out=None):
        self.calls.append(("chunk_gated_delta_rule", (q, k, v, g, beta),
                           dict(scale=scale, initial_state=initial_state, output_final_state=output_final_state,
                                cu_seqlens=cu_seqlens, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
                                state_layout=state_layout, plan=plan)))
        self._check_gdn(q, k, v, g, beta, initial_state, state_layout, output_final_state, use_qk_l2norm_in_kernel)
        cu = None if cu_seqlens is None else host(cu_seqlens)
        if plan is not None:
            assert plan.args == (tuple(cu),) and plan.options == (v.shape[2], q.shape[3])
        scale = q.shape[3] ** -0.5 if scale is None else scale
        o, final = gdn_reference(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel, cu,
                                 v_first=state_layout == "vk")
        return o.to(v.dtype), final.float() if output_final_state else None

    def gated_delta_rule_step(self, q, k, v, g, beta, state, *, scale=None, state_indices=None, state_layout="kv",
                              use_qk_l2norm_in_kernel=False, out=None):
        self.calls.append(("gated_delta_rule_step", (q, k, v, g, beta, state),
                           dict(scale=scale, state_layout=state_layout, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel)))
        assert q.dim() == 3 and all(t.is_contiguous() for t in (q, k, v, g, beta, state))
        self._check_gdn(q, k, v, g, beta, state, state_layout, False, use_qk_l2norm_in_kernel)
        assert state_indices is None
        scale = q.shape[2] ** -0.5 if scale is None else scale
        o, final = gdn_reference(q[:, None], k[:, None], v[:, None], g[:, None], beta[:, None], scale, state,
                                 use_qk_l2norm_in_kernel, v_first=state_layout == "vk")
        state.copy_(final)
        return o[:, 0].to(v.dtype)

    @staticmethod
    def _check_gdn(q, k, v, g, beta, state, state_layout, output_final_state, l2norm):
        assert g.dtype == torch.float32, f"kgen takes fp32 gates, got {g.dtype}"
        assert beta.dtype in (torch.float32, q.dtype), f"kgen takes fp32 or q's dtype betas, got {beta.dtype}"
        assert state is None or (state.dtype == torch.float32 and state.is_contiguous())
        assert state_layout in ("kv", "vk")
        assert type(output_final_state) is bool and type(l2norm) is bool
        assert all(t.is_contiguous() for t in (q, k, v, g, beta))


FAKED = ("plan_attention_varlen", "attention_varlen", "merge_attention_states", "merge_attention_states_n",
         "plan_chunk_gated_delta_rule", "chunk_gated_delta_rule", "gated_delta_rule_step")


def bound_like(real, stand_in):
    """``stand_in``, after binding each call to ``real``'s signature: a call the real op would not take fails."""
    signature = inspect.signature(real)

    def call(*args, **kwargs):
        signature.bind(*args, **kwargs)
        return stand_in(*args, **kwargs)
    return call


@pytest.fixture
def fake(monkeypatch) -> FakeOps:
    ops = FakeOps()
    for name in FAKED:
        monkeypatch.setattr(kgen.ops, name, bound_like(getattr(kgen.ops, name), getattr(ops, name)))
    monkeypatch.setattr(compat_fa, "plan_cache", PlanCache(maxsize=32))
    monkeypatch.setattr(compat_fla, "plan_cache", PlanCache(maxsize=32))
    return ops


def host(t: torch.Tensor) -> list[int]:
    """The stand-ins' own reading of a tensor, not counted by counting_host_copies."""
    return torch.Tensor.tolist(t)


def test_the_stand_ins_check_calls_against_the_real_ops(fake):
    with pytest.raises(TypeError):
        kgen.ops.attention_varlen(None, None, None, None, None, window_size=(-1, -1))


def counting_host_copies(t: torch.Tensor) -> list[int]:
    """Count ``t.tolist()`` calls (the drop-ins' copy of cu_seqlens to the host)."""
    count = [0]
    original = t.tolist

    def tolist():
        count[0] += 1
        return original()
    t.tolist = tolist
    return count


# ---------------------------------------------------------------------------------------------
# Signatures


@pytest.mark.parametrize("pinned", SIGNATURES, ids=[s["drop_in"] for s in SIGNATURES])
def test_signature_is_the_peers(pinned):
    module, name = pinned["drop_in"].rsplit(".", 1)
    function = getattr(import_module(module), name)
    assert function.__name__ == pinned["function"]
    got = [{"name": p.name, "kind": p.kind.name,
            **({} if p.default is inspect.Parameter.empty else {"default": repr(p.default)})}
           for p in inspect.signature(function).parameters.values()]
    assert got == pinned["parameters"], f"{pinned['drop_in']} differs from {pinned['peer']} {pinned['version']}"


def test_every_drop_in_has_a_pinned_signature():
    pinned = {s["drop_in"] for s in SIGNATURES}
    public = {f"{name}.{f}" for name, module in DROP_INS.items() for f in module.__all__
              if inspect.isfunction(getattr(module, f))}
    assert public == pinned


def test_the_pinned_defaults_are_literals():
    # A default the test compares by repr must be a plain literal, else repr equality means nothing.
    import ast
    for s in SIGNATURES:
        for p in s["parameters"]:
            if "default" in p:
                ast.literal_eval(p["default"])


# ---------------------------------------------------------------------------------------------
# flash-attn


def attention_inputs(lens_q, lens_k, heads_q=4, heads_kv=2, head_dim=8, seed=0, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32)
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32)
    q = torch.randn(int(cu_q[-1]), heads_q, head_dim, generator=gen).to(dtype)
    k = torch.randn(int(cu_k[-1]), heads_kv, head_dim, generator=gen).to(dtype)
    v = torch.randn(int(cu_k[-1]), heads_kv, head_dim, generator=gen).to(dtype)
    return q, k, v, cu_q, cu_k


@pytest.mark.parametrize("causal, window_size", [
    (False, (-1, -1)), (True, (-1, -1)), (False, (3, 2)), (True, (4, -1)), (False, (-7, 1)), (True, (2, 5)),
    (False, [2, -3]),
])
def test_flash_attn_matches_flash_attns_mask_and_lse(fake, causal, window_size):
    # Lq > Lk (rows with no key under causal), Lq < Lk, an empty query and an empty key sequence.
    q, k, v, cu_q, cu_k = attention_inputs([5, 3, 0, 4, 6], [2, 7, 3, 0, 6])
    out, lse, probs = compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 6, 7, causal=causal,
                                                       window_size=window_size, return_attn_probs=True)
    ref_out, ref_lse = dense_attention(q, k, v, cu_q.tolist(), cu_k.tolist(), 8 ** -0.5,
                                       flash_attn_mask(causal, window_size))
    ref_lse = ref_lse.masked_fill(ref_lse == -math.inf, math.inf)  # flash-attn: +inf where no key
    assert probs is None
    assert out.dtype == q.dtype and out.shape == q.shape
    assert lse.dtype == torch.float32 and lse.shape == (q.shape[1], q.shape[0])  # [nheads, total_q]
    torch.testing.assert_close(out.double(), ref_out, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), ref_lse, atol=1e-5, rtol=1e-5)
    assert torch.isposinf(lse).any()  # the empty rows are in this batch
    _, kwargs = fake.last("attention_varlen")
    assert kwargs["window"] == tuple(max(x, -1) for x in window_size)


def test_flash_attn_returns_out_alone_by_default(fake):
    q, k, v, cu_q, cu_k = attention_inputs([4, 2], [4, 2])
    out = compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 4, 0.0, 0.5, True)
    assert isinstance(out, torch.Tensor) and out.shape == q.shape
    _, kwargs = fake.last("attention_varlen")
    assert kwargs["return_lse"] is False and kwargs["softmax_scale"] == 0.5 and kwargs["causal"] is True


@pytest.mark.parametrize("name, value", [
    ("dropout_p", 0.1), ("softcap", 30.0), ("alibi_slopes", torch.ones(4)), ("block_table", torch.zeros(2, 1, dtype=torch.int32)),
])
def test_flash_attn_refuses_what_kgen_cannot_compute_by_name(fake, name, value):
    q, k, v, cu_q, cu_k = attention_inputs([4, 2], [4, 2])
    with pytest.raises(ValueError, match=rf"^{name}:"):
        compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 4, **{name: value})
    assert fake.calls == []


def test_flash_attn_takes_what_changes_nothing(fake):
    # softcap <= 0 is off in flash-attn; deterministic picks its backward, which kgen does not have.
    q, k, v, cu_q, cu_k = attention_inputs([4, 2], [4, 2])
    base = compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 4)
    other = compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 1, 1, dropout_p=0, softcap=-1.0, deterministic=True)
    assert torch.equal(base, other)


@pytest.mark.parametrize("window_size", [(1,), (1, 2, 3), (1.5, 2), "ab", None])
def test_flash_attn_window_size_errors_name_it(fake, window_size):
    q, k, v, cu_q, cu_k = attention_inputs([4], [4])
    with pytest.raises(TypeError, match=r"^window_size:"):
        compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 4, window_size=window_size)


def test_flash_attn_plans_each_layout_once(fake):
    q, k, v, cu_q, cu_k = attention_inputs([5, 3], [5, 3])
    copies_q, copies_k = counting_host_copies(cu_q), counting_host_copies(cu_k)
    for _ in range(4):
        compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 5, causal=True)
    plans = [kwargs["plan"] for name, _, kwargs in fake.calls if name == "attention_varlen"]
    assert fake.names().count("plan_attention_varlen") == 1
    assert all(p is plans[0] for p in plans) and isinstance(plans[0], FakePlan)
    assert (copies_q[0], copies_k[0]) == (4, 4)  # one copy of each, every call (documented)
    assert compat_fa.plan_cache.info()[:3] == (3, 1, 1)

    # Other options or other lengths: another plan. Back to the first: no new one.
    compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 5, causal=False)
    q2, k2, v2, cu_q2, cu_k2 = attention_inputs([4, 4], [4, 4])
    compat_fa.flash_attn_varlen_func(q2, k2, v2, cu_q2, cu_k2, 4, 4, causal=True)
    compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 5, 5, causal=True)
    assert fake.names().count("plan_attention_varlen") == 3


def test_flash_attn_copies_a_shared_cu_seqlens_once(fake):
    q, k, v, cu, _ = attention_inputs([5, 3], [5, 3])
    copies = counting_host_copies(cu)
    compat_fa.flash_attn_varlen_func(q, k, v, cu, cu, 5, 5)
    assert copies[0] == 1


def test_flash_attn_plan_cache_is_bounded(fake, monkeypatch):
    monkeypatch.setattr(compat_fa, "plan_cache", PlanCache(maxsize=2))
    layouts = [attention_inputs([n], [n]) for n in (2, 3, 4)]
    for q, k, v, cu_q, cu_k in layouts + layouts[:1]:  # the fourth call: the first layout, evicted by the third
        compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 4)
    assert fake.names().count("plan_attention_varlen") == 4
    assert len(compat_fa.plan_cache) == 2


def test_flash_attn_leaves_odd_arguments_to_the_op(fake):
    # cu_seqlens of the wrong dtype: no host copy, no plan; the op (kgen's checks) says what is wrong.
    q, k, v, cu_q, cu_k = attention_inputs([4, 2], [4, 2])
    with pytest.raises(AssertionError):  # the stand-in's check of the dtype
        compat_fa.flash_attn_varlen_func(q, k, v, cu_q.long(), cu_k, 4, 4)
    assert "plan_attention_varlen" not in fake.names()
    assert fake.last("attention_varlen")[1]["plan"] is None


def test_flash_attn_planning_errors_are_left_to_the_op(fake, monkeypatch):
    def refuse(*args, **kwargs):
        raise ValueError("head_dim: not offered")
    monkeypatch.setattr(kgen.ops, "plan_attention_varlen", refuse)
    q, k, v, cu_q, cu_k = attention_inputs([4, 2], [4, 2])
    compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, 4, 4)
    assert fake.last("attention_varlen")[1]["plan"] is None  # the op plans (and here raises) itself
    assert len(compat_fa.plan_cache) == 0


def test_plan_cache_is_least_recently_used():
    cache = PlanCache(maxsize=2)
    made = []

    def make(key):
        return lambda: made.append(key) or f"plan {key}"
    assert cache.get("a", make("a")) == "plan a"
    cache.get("b", make("b"))
    cache.get("a", make("a"))      # a is now the most recent
    cache.get("c", make("c"))      # evicts b
    cache.get("a", make("a"))
    cache.get("b", make("b"))
    assert made == ["a", "b", "c", "b"]
    assert cache.info() == (2, 4, 2, 2)
    cache.clear()
    assert cache.info() == (0, 0, 0, 2)
    with pytest.raises(ValueError, match="^maxsize:"):
        PlanCache(0)


# ---------------------------------------------------------------------------------------------
# FlashInfer


def merge_inputs(shape, empty_fraction=0.25, seed=0, dtype=torch.bfloat16):
    gen = torch.Generator().manual_seed(seed)
    v = torch.randn(*shape, generator=gen).to(dtype)
    s = torch.empty(shape[:-1]).uniform_(-12, 12, generator=gen)
    empty = torch.rand(shape[:-1], generator=gen) < empty_fraction
    s[empty] = -math.inf
    v[empty.unsqueeze(-1).expand_as(v)] = float("nan")  # never read
    return v, s


def test_merge_state_converts_base_2_both_ways(fake):
    v_a, s_a = merge_inputs((16, 4, 8), seed=1)
    v_b, s_b = merge_inputs((16, 4, 8), seed=2)
    s_b[:2] = -math.inf  # rows where both states are empty
    s_a[:2] = -math.inf
    v, s = compat_fi.merge_state(v_a, s_a, v_b, s_b)
    ref_v, ref_s = merge_reference_base2(torch.stack([v_a, v_b]), torch.stack([s_a, s_b]), 0)
    torch.testing.assert_close(v.double(), ref_v, atol=1e-2, rtol=1e-2, equal_nan=False)
    torch.testing.assert_close(s.double(), ref_s, atol=1e-5, rtol=1e-6)
    assert v.dtype == v_a.dtype and s.dtype == torch.float32
    assert torch.isneginf(s[:2]).all() and (v[:2] == 0).all()
    (_, lse_a, _, lse_b), _ = fake.last("merge_attention_states")
    torch.testing.assert_close(lse_a, s_a * LN2, atol=0, rtol=0)  # natural log in
    torch.testing.assert_close(lse_b, s_b * LN2, atol=0, rtol=0)


@pytest.mark.parametrize("states", [0, 1, 3])
def test_merge_states_stacks_on_dim_1(fake, states):
    v, s = merge_inputs((10, states, 4, 8), seed=3)
    out, lse = compat_fi.merge_states(v, s)
    ref_v, ref_s = merge_reference_base2(v, s, 1)
    assert out.shape == (10, 4, 8) and lse.shape == (10, 4)
    torch.testing.assert_close(out.double(), ref_v, atol=1e-2, rtol=1e-2)
    torch.testing.assert_close(lse.double(), ref_s, atol=1e-5, rtol=1e-6)
    (v_n, lse_n), _ = fake.last("merge_attention_states_n")
    assert v_n.shape == (states, 10, 4, 8) and lse_n.shape == (states, 10, 4)  # kgen's dim-0 stacking
    torch.testing.assert_close(v_n, v.transpose(0, 1), atol=0, rtol=0, equal_nan=True)
    torch.testing.assert_close(lse_n, s.transpose(0, 1) * LN2, atol=0, rtol=0)


def test_merge_states_copies_no_v_for_one_state_or_token(fake):
    for shape in ((10, 1, 4, 8), (1, 3, 4, 8)):
        v, s = merge_inputs(shape)
        compat_fi.merge_states(v, s)
        (v_n, _), _ = fake.last("merge_attention_states_n")
        assert v_n.data_ptr() == v.data_ptr()


def test_merge_states_takes_any_float_s(fake):
    v, s = merge_inputs((6, 2, 4, 8), empty_fraction=0)
    out, lse = compat_fi.merge_states(v, s.to(torch.bfloat16))
    ref_v, ref_s = merge_reference_base2(v, s.to(torch.bfloat16).float(), 1)
    torch.testing.assert_close(lse.double(), ref_s, atol=1e-5, rtol=1e-6)


@pytest.mark.parametrize("call, name", [
    (lambda v, s: compat_fi.merge_states(v[0], s), "v"),
    (lambda v, s: compat_fi.merge_states(v, s[:, :1]), "s"),
    (lambda v, s: compat_fi.merge_states(v, s.long()), "s"),
    (lambda v, s: compat_fi.merge_states(v, None), "s"),
    (lambda v, s: compat_fi.merge_state(v[:, 0], s[:, 0], v[:, 1], s[:, 1, :2]), "s_b"),
    (lambda v, s: compat_fi.merge_state(v[:, 0], s[:, 0, :2], v[:, 1], s[:, 1]), "s_a"),
    (lambda v, s: compat_fi.merge_state(v[0, 0], s[:, 0], v[:, 1], s[:, 1]), "v_a"),
])
def test_merge_errors_name_the_argument(fake, call, name):
    v, s = merge_inputs((6, 2, 4, 8))
    with pytest.raises((ValueError, TypeError), match=rf"^{name}:"):
        call(v, s)
    assert fake.calls == []


@pytest.mark.parametrize("call, message", [
    (lambda v, s: compat_fi.merge_state(v[:, 0].to("meta"), s[:, 0], v[:, 1], s[:, 1]), r"^s_a: on cpu, v_a on meta"),
    (lambda v, s: compat_fi.merge_states(v.to("meta"), s), r"^s: on cpu, v on meta"),
])
def test_merge_device_errors_name_the_states_too(fake, call, message):
    v, s = merge_inputs((6, 2, 4, 8))
    with pytest.raises(ValueError, match=message):
        call(v, s)
    assert fake.calls == []


# ---------------------------------------------------------------------------------------------
# fla


def gdn_inputs(batch, tokens, heads=2, heads_v=4, head_dim=8, seed=0, dtype=torch.bfloat16, gate_dtype=torch.bfloat16,
               num_states=None):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(batch, tokens, heads, head_dim, generator=gen).to(dtype)
    k = F.normalize(torch.randn(batch, tokens, heads, head_dim, generator=gen), dim=-1).to(dtype)
    v = torch.randn(batch, tokens, heads_v, head_dim, generator=gen).to(dtype)
    g = F.logsigmoid(torch.randn(batch, tokens, heads_v, generator=gen)).to(gate_dtype)
    beta = torch.rand(batch, tokens, heads_v, generator=gen).to(dtype)
    h0 = torch.randn(num_states or batch, heads_v, head_dim, head_dim, generator=gen).to(dtype)
    return q, k, v, g, beta, h0


def check_gdn(o, final, q, k, v, g, beta, h0, cu=None, v_first=False, l2norm=False, scale=None):
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    ref_o, ref_final = gdn_reference(q, k, v, g.float(), beta.float(), scale, None if h0 is None else h0.float(),
                                     l2norm, cu, v_first)
    assert o.dtype == v.dtype and o.shape == v.shape
    torch.testing.assert_close(o.double(), ref_o, atol=2e-2, rtol=2e-2)
    if final is not None:
        assert final.dtype == torch.float32
        torch.testing.assert_close(final.double(), ref_final, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("state_v_first", [False, True])
def test_chunk_converts_gates_and_states_to_fp32(fake, state_v_first):
    q, k, v, g, beta, h0 = gdn_inputs(2, 5)
    o, final = compat_fla.chunk_gated_delta_rule(q, k, v, g, beta, 0.3, h0, True, True, state_v_first=state_v_first)
    args, kwargs = fake.last("chunk_gated_delta_rule")
    assert args[3].dtype == torch.float32 and torch.equal(args[3], g.float())
    assert args[4] is beta or torch.equal(args[4], beta)  # q's dtype: taken as it is
    assert kwargs["initial_state"].dtype == torch.float32 and torch.equal(kwargs["initial_state"], h0.float())
    assert kwargs["state_layout"] == ("vk" if state_v_first else "kv")
    assert kwargs["scale"] == 0.3 and kwargs["use_qk_l2norm_in_kernel"] is True and kwargs["plan"] is None
    check_gdn(o, final, q, k, v, g, beta, h0, v_first=state_v_first, l2norm=True, scale=0.3)


def test_chunk_takes_transpose_state_layout_as_fla_does(fake):
    q, k, v, g, beta, h0 = gdn_inputs(1, 4)
    with pytest.warns(DeprecationWarning, match="transpose_state_layout"):
        o, final = compat_fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                     transpose_state_layout=True)
    assert fake.last("chunk_gated_delta_rule")[1]["state_layout"] == "vk"
    check_gdn(o, final, q, k, v, g, beta, h0, v_first=True)
    with pytest.raises(ValueError, match="^transpose_state_layout:"):
        compat_fla.chunk_gated_delta_rule(q, k, v, g, beta, state_v_first=True, transpose_state_layout=True)


def test_chunk_beta_of_another_dtype_becomes_fp32(fake):
    q, k, v, g, beta, _ = gdn_inputs(1, 4, gate_dtype=torch.float32)
    o, _ = compat_fla.chunk_gated_delta_rule(q, k, v, g, beta.half())
    args, _ = fake.last("chunk_gated_delta_rule")
    assert args[3] is g and args[4].dtype == torch.float32


@pytest.mark.parametrize("neg", [False, True])
def test_chunk_beta_sigmoid_and_gate_as_fla_computes_them(fake, neg):
    q, k, v, g, beta, h0 = gdn_inputs(1, 6)
    gen = torch.Generator().manual_seed(5)
    A_log, dt_bias = torch.randn(4, generator=gen), torch.randn(4, generator=gen).to(torch.bfloat16)
    raw_beta = torch.randn_like(beta.float()).to(torch.bfloat16)
    o, final = compat_fla.chunk_gated_delta_rule(q, k, v, g, raw_beta, initial_state=h0, output_final_state=True,
                                                 use_beta_sigmoid_in_kernel=True, allow_neg_eigval=neg,
                                                 use_gate_in_kernel=True, A_log=A_log, dt_bias=dt_bias)
    gate = -A_log.exp() * F.softplus(g.float() + dt_bias.float())
    expected_beta = torch.sigmoid(raw_beta.float()) * (2 if neg else 1)
    args, _ = fake.last("chunk_gated_delta_rule")
    torch.testing.assert_close(args[3], gate)
    torch.testing.assert_close(args[4], expected_beta)
    check_gdn(o, final, q, k, v, gate, expected_beta, h0)


def test_chunk_varlen_plans_each_layout_once(fake):
    cu_list = [0, 3, 3, 9]
    q, k, v, g, beta, h0 = gdn_inputs(1, 9, num_states=3)
    cu = torch.tensor(cu_list, dtype=torch.int64)
    copies = counting_host_copies(cu)
    for _ in range(3):
        o, final = compat_fla.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True,
                                                     cu_seqlens=cu)
    check_gdn(o, final, q, k, v, g, beta, h0, cu=cu_list)
    assert fake.names().count("plan_chunk_gated_delta_rule") == 1 and copies[0] == 3
    plan = fake.last("chunk_gated_delta_rule")[1]["plan"]
    assert isinstance(plan, FakePlan) and plan.args == (tuple(cu_list),)

    # cu_seqlens_cpu spares the copy, and finds the same plan.
    compat_fla.chunk_gated_delta_rule(q, k, v, g, beta, cu_seqlens=cu, cu_seqlens_cpu=torch.tensor(cu_list))
    assert copies[0] == 3 and fake.names().count("plan_chunk_gated_delta_rule") == 1
    assert fake.last("chunk_gated_delta_rule")[1]["plan"] is plan


def test_chunk_fixed_length_needs_no_plan_of_ours(fake):
    q, k, v, g, beta, _ = gdn_inputs(2, 5)
    compat_fla.chunk_gated_delta_rule(q, k, v, g, beta)
    assert "plan_chunk_gated_delta_rule" not in fake.names()  # kgen caches fixed-length plans itself


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(head_first=True), ValueError, "head_first"),
    (dict(cp_context=object()), ValueError, "cp_context"),
    (dict(allow_neg_eigval=True), ValueError, "allow_neg_eigval"),
    (dict(chunk_size=128), ValueError, "chunk_size"),
    (dict(use_gate_in_kernel=True), ValueError, "A_log"),
    (dict(output_attentions=True), TypeError, "chunk_gated_delta_rule: unexpected keyword argument.*output_attentions"),
])
def test_chunk_refusals_name_the_argument(fake, kwargs, error, name):
    q, k, v, g, beta, _ = gdn_inputs(1, 4)
    with pytest.raises(error, match=rf"^{name}"):
        compat_fla.chunk_gated_delta_rule(q, k, v, g, beta, **kwargs)
    assert fake.calls == []


def test_chunk_takes_what_changes_nothing(fake):
    q, k, v, g, beta, _ = gdn_inputs(1, 4)
    base, _ = compat_fla.chunk_gated_delta_rule(q, k, v, g, beta)
    other, _ = compat_fla.chunk_gated_delta_rule(q, k, v, g, beta, head_first=False, chunk_size=16)
    assert torch.equal(base, other)


@pytest.mark.parametrize("state_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("state_v_first", [False, True])
def test_fused_recurrent_one_token_runs_the_step_on_a_copy(fake, state_v_first, state_dtype):
    q, k, v, g, beta, h0 = gdn_inputs(3, 1)
    h0 = h0.to(state_dtype)  # fp32: the very tensor kgen's step would update, but for the copy
    h0_before = h0.clone()
    o, final = compat_fla.fused_recurrent_gated_delta_rule(q, k, v, g, None, None, beta, None, h0, True,
                                                           state_v_first=state_v_first)
    assert fake.names() == ["gated_delta_rule_step"]
    args, kwargs = fake.last("gated_delta_rule_step")
    assert args[0].shape == (3, 2, 8) and kwargs["state_layout"] == ("vk" if state_v_first else "kv")
    assert torch.equal(h0, h0_before)  # fla leaves initial_state as it was
    check_gdn(o, final, q, k, v, g, beta, h0, v_first=state_v_first)


def test_fused_recurrent_packed_decode_runs_the_step(fake):
    q, k, v, g, beta, h0 = gdn_inputs(1, 4, num_states=4)
    cu = torch.arange(5)
    o, final = compat_fla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=h0,
                                                           output_final_state=True, cu_seqlens=cu)
    assert fake.names() == ["gated_delta_rule_step"]
    check_gdn(o, final, q, k, v, g, beta, h0, cu=cu.tolist())


def test_fused_recurrent_step_without_initial_state(fake):
    q, k, v, g, beta, _ = gdn_inputs(2, 1)
    o, final = compat_fla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta)
    assert final is None and fake.names() == ["gated_delta_rule_step"]
    check_gdn(o, None, q, k, v, g, beta, None)
    with pytest.raises(ValueError, match="^initial_state:"):
        compat_fla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=torch.zeros(1, 4, 8, 8))


@pytest.mark.parametrize("varlen", [False, True])
def test_fused_recurrent_many_tokens_runs_the_chunked_form(fake, varlen):
    if varlen:
        cu_list = [0, 2, 7]
        q, k, v, g, beta, h0 = gdn_inputs(1, 7, num_states=2)
        cu = torch.tensor(cu_list)
    else:
        cu_list = cu = None
        q, k, v, g, beta, h0 = gdn_inputs(2, 6)
    for _ in range(2):
        o, final = compat_fla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=h0,
                                                               output_final_state=True, cu_seqlens=cu,
                                                               use_qk_l2norm_in_kernel=True)
    assert set(fake.names()) <= {"chunk_gated_delta_rule", "plan_chunk_gated_delta_rule"}
    assert fake.names().count("plan_chunk_gated_delta_rule") == (1 if varlen else 0)
    check_gdn(o, final, q, k, v, g, beta, h0, cu=cu_list, l2norm=True)


def test_fused_recurrent_defaults_no_gate_and_unit_beta(fake):
    q, k, v, g, beta, _ = gdn_inputs(1, 5)
    o, _ = compat_fla.fused_recurrent_gated_delta_rule(q, k, v)
    args, _ = fake.last("chunk_gated_delta_rule")
    assert torch.equal(args[3], torch.zeros(1, 5, 4)) and torch.equal(args[4], torch.ones(1, 5, 4))
    check_gdn(o, None, q, k, v, torch.zeros(1, 5, 4), torch.ones(1, 5, 4), None)


def test_fused_recurrent_gate_in_kernel(fake):
    q, k, v, g, beta, _ = gdn_inputs(1, 5)
    A_log, dt_bias = torch.randn(4), torch.randn(4)
    o, _ = compat_fla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, use_gate_in_kernel=True, A_log=A_log,
                                                       dt_bias=dt_bias)
    gate = -A_log.exp() * F.softplus(g.float() + dt_bias)
    torch.testing.assert_close(fake.last("chunk_gated_delta_rule")[0][3], gate)


@pytest.mark.parametrize("kwargs, error, name", [
    (dict(gk=torch.zeros(1, 4, 4, 8)), ValueError, "gk"),
    (dict(gv=torch.zeros(1, 4, 4, 8)), ValueError, "gv"),
    (dict(beta=torch.ones(1, 4, 4, 8)), ValueError, "beta"),
    (dict(head_first=True), ValueError, "head_first"),
    (dict(allow_neg_eigval=True), ValueError, "allow_neg_eigval"),
    (dict(use_gate_in_kernel=True), ValueError, "A_log"),
    (dict(g=None, use_gate_in_kernel=True, A_log=torch.zeros(4)), ValueError, "g"),
    (dict(use_exp2=True), TypeError, "fused_recurrent_gated_delta_rule: unexpected keyword argument.*use_exp2"),
])
def test_fused_recurrent_refusals_name_the_argument(fake, kwargs, error, name):
    q, k, v, g, beta, _ = gdn_inputs(1, 4)
    kwargs = {"g": g, **kwargs}
    with pytest.raises(error, match=rf"^{name}\b"):
        compat_fla.fused_recurrent_gated_delta_rule(q, k, v, **kwargs)
    assert fake.calls == []


# ---------------------------------------------------------------------------------------------
# GPU: each drop-in against the native kgen op, every element


@gpu
@needs_cuda
@pytest.mark.parametrize("causal, window_size", [(False, (-1, -1)), (True, (-1, -1)), (False, (40, 7)),
                                                 (True, (64, -5))])
def test_gpu_flash_attn_matches_attention_varlen(causal, window_size):
    gen = torch.Generator(device="cuda").manual_seed(11)
    lens_q, lens_k = [100, 1, 257, 0, 64, 300], [100, 33, 257, 5, 0, 129]   # Lq > Lk: rows with no key
    cu_q = torch.tensor([0, *torch.tensor(lens_q).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    cu_k = torch.tensor([0, *torch.tensor(lens_k).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    q = torch.randn(sum(lens_q), 8, 128, device="cuda", generator=gen).to(torch.bfloat16)
    k, v = (torch.randn(sum(lens_k), 2, 128, device="cuda", generator=gen).to(torch.bfloat16) for _ in range(2))
    window = tuple(max(x, -1) for x in window_size)
    out, lse = kgen.ops.attention_varlen(q, k, v, cu_q, cu_k, causal=causal, window=window, return_lse=True)
    lse = lse.masked_fill(lse == -math.inf, math.inf)
    hits = compat_fa.plan_cache.info().hits
    for _ in range(2):  # the second call takes the cached plan
        got_out, got_lse, probs = compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k),
                                                                   causal=causal, window_size=window_size,
                                                                   return_attn_probs=True)
        assert probs is None
        assert torch.equal(got_out, out)
        assert torch.equal(got_lse, lse)
        only = compat_fa.flash_attn_varlen_func(q, k, v, cu_q, cu_k, max(lens_q), max(lens_k), causal=causal,
                                                window_size=window_size)
        assert torch.equal(only, out)
    assert compat_fa.plan_cache.info().hits >= hits + 3


def gpu_gdn_inputs(batch, tokens, heads=4, heads_v=8, head_dim=128, num_states=None, seed=0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(batch, tokens, heads, head_dim, device="cuda", generator=gen).to(torch.bfloat16)
    k = F.normalize(torch.randn(batch, tokens, heads, head_dim, device="cuda", generator=gen), dim=-1).to(torch.bfloat16)
    v = torch.randn(batch, tokens, heads_v, head_dim, device="cuda", generator=gen).to(torch.bfloat16)
    g = F.logsigmoid(torch.randn(batch, tokens, heads_v, device="cuda", generator=gen)).to(torch.bfloat16)
    beta = torch.rand(batch, tokens, heads_v, device="cuda", generator=gen).to(torch.bfloat16)
    h0 = torch.randn(num_states or batch, heads_v, head_dim, head_dim, device="cuda", generator=gen).to(torch.bfloat16)
    return q, k, v, g, beta, h0


@gpu
@needs_cuda
@pytest.mark.parametrize("state_v_first", [False, True])
@pytest.mark.parametrize("varlen", [False, True])
def test_gpu_fla_chunk_matches_chunk_gated_delta_rule(state_v_first, varlen):
    cu_list = [0, 100, 164, 165, 1000] if varlen else None
    q, k, v, g, beta, h0 = gpu_gdn_inputs(1 if varlen else 2, 1000 if varlen else 300, num_states=4 if varlen else None)
    cu = torch.tensor(cu_list, device="cuda") if varlen else None
    layout = "vk" if state_v_first else "kv"
    want_o, want_final = kgen.ops.chunk_gated_delta_rule(q, k, v, g.float(), beta, initial_state=h0.float(),
                                                         output_final_state=True, cu_seqlens=cu,
                                                         use_qk_l2norm_in_kernel=True, state_layout=layout)
    for _ in range(2):
        o, final = compat_fla.chunk_gated_delta_rule(q, k, v, g, beta, None, h0, True, True,
                                                     state_v_first=state_v_first, cu_seqlens=cu)
        assert torch.equal(o, want_o) and torch.equal(final, want_final)
        o, final = compat_fla.fused_recurrent_gated_delta_rule(q, k, v, g, beta=beta, initial_state=h0,
                                                               output_final_state=True, use_qk_l2norm_in_kernel=True,
                                                               state_v_first=state_v_first, cu_seqlens=cu)
        assert torch.equal(o, want_o) and torch.equal(final, want_final)


@gpu
@needs_cuda
@pytest.mark.parametrize("state_v_first", [False, True])
@pytest.mark.parametrize("packed", [False, True])
def test_gpu_fla_fused_recurrent_one_token_matches_the_step(state_v_first, packed):
    n = 6
    q, k, v, g, beta, h0 = gpu_gdn_inputs(1 if packed else n, n if packed else 1, num_states=n)
    layout = "vk" if state_v_first else "kv"
    state = h0.float().clone()
    flat = [t.reshape(n, *t.shape[2:]) for t in (q, k, v, g, beta)]
    want_o = kgen.ops.gated_delta_rule_step(flat[0], flat[1], flat[2], flat[3].float(), flat[4], state,
                                            state_layout=layout)
    before = h0.clone()
    o, final = compat_fla.fused_recurrent_gated_delta_rule(
        q, k, v, g, beta=beta, initial_state=h0, output_final_state=True, state_v_first=state_v_first,
        cu_seqlens=torch.arange(n + 1, device="cuda") if packed else None)
    assert torch.equal(o, want_o.view(v.shape)) and torch.equal(final, state)
    assert torch.equal(h0, before)


@gpu
@needs_cuda
def test_gpu_flashinfer_merges_match_the_native_ops():
    gen = torch.Generator(device="cuda").manual_seed(3)
    tokens, states, heads, head_dim = 257, 3, 8, 128
    v = torch.randn(tokens, states, heads, head_dim, device="cuda", generator=gen).to(torch.bfloat16)
    s = torch.empty(tokens, states, heads, device="cuda").uniform_(-20, 20, generator=gen)
    s[torch.rand(s.shape, device="cuda", generator=gen) < 0.2] = -math.inf
    s[:3] = -math.inf  # rows with every state empty

    want_v, want_lse = kgen.ops.merge_attention_states_n(v.transpose(0, 1).contiguous(), (s * LN2).transpose(0, 1))
    got_v, got_s = compat_fi.merge_states(v, s)
    assert torch.equal(got_v, want_v) and torch.equal(got_s, want_lse * (1 / LN2))
    ref_v, ref_s = merge_reference_base2(v.cpu(), s.cpu(), 1)
    torch.testing.assert_close(got_s.cpu().double(), ref_s, atol=1e-4, rtol=1e-5)
    torch.testing.assert_close(got_v.cpu().double(), ref_v, atol=1e-2, rtol=1e-2)

    v_a, v_b = v[:, 0].contiguous(), v[:, 1].contiguous()
    s_a, s_b = s[:, 0], s[:, 1]
    want_v, want_lse = kgen.ops.merge_attention_states(v_a, s_a * LN2, v_b, s_b * LN2)
    got_v, got_s = compat_fi.merge_state(v_a, s_a, v_b, s_b)
    assert torch.equal(got_v, want_v) and torch.equal(got_s, want_lse * (1 / LN2))
