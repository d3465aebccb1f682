"""attention_decode on the GPU against a float64 reference per request, on fresh random caches.

Outputs are poisoned with NaN first and every element of out and of the LSE is checked. Cache rows
no request may read (past a request's length, pages of no request, block-table entries past a
request's pages) hold NaN/Inf or garbage page indices.
"""

from __future__ import annotations

import math

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from kgen import registry  # noqa: E402
from kgen.ops import attention_decode, plan_attention_decode  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# P is rounded to 16 bits before P V, as in FlashAttention; the error is that rounding.
OUT_TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
GARBAGE_PAGE = 1 << 30  # block-table entries past a request's pages: reading one would fault


def head_dims() -> list[int]:
    return registry.current().family("attention_decode").supported("head_dim")


def reference(q, keys, values, window_left, sink, scale):
    """float64 out [B, Lq, Hq, D] and lse [B, Lq, Hq] from each request's keys/values [L, Hkv, D]."""
    batch, q_len, heads_q, head_dim = q.shape
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((batch, q_len, heads_q), -math.inf, dtype=torch.float64, device=q.device)
    for b in range(batch):
        length = keys[b].shape[0]
        group = heads_q // keys[b].shape[1]
        kb = keys[b].double().repeat_interleave(group, dim=1)
        vb = values[b].double().repeat_interleave(group, dim=1)
        s = torch.einsum("qhd,khd->hqk", q[b].double(), kb) * scale
        pos = (length - q_len + torch.arange(q_len, device=q.device)).view(-1, 1)
        key = torch.arange(length, device=q.device).view(1, -1)
        allowed = key <= pos
        if window_left >= 0:
            allowed &= key >= pos - window_left
        s = s.masked_fill(~allowed, -math.inf)
        if sink is not None:
            s = torch.cat([s, sink.double().view(-1, 1, 1).expand(-1, q_len, 1)], dim=2)
        if s.shape[2] == 0:
            continue
        m = s.amax(dim=2, keepdim=True)
        m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
        p = torch.exp(s - m)
        denom = p.sum(dim=2, keepdim=True)
        o = torch.einsum("hqk,khd->qhd", p[..., :length], vb) / torch.where(denom > 0, denom, 1).permute(1, 0, 2)
        out[b] = o
        lse[b] = torch.where(denom > 0, m + torch.log(denom), -math.inf).squeeze(2).transpose(0, 1)
    return out, lse


class Cache:
    """A KV cache for ``seqlens``: contiguous [B, Lmax, Hkv, D] or paged [pages, P, Hkv, D] with shuffled pages,
    optionally k and v as views of one interleaved tensor; every row no request owns is NaN (k) / Inf (v).
    ``capacity``: keys per request the cache (or its block table) must have room for, at least the longest."""

    def __init__(self, seqlens, heads_kv, head_dim, dtype, page_size, interleaved, gen, spare_pages=3, capacity=0):
        self.seqlens, self.page_size = list(seqlens), page_size
        batch = len(seqlens)
        capacity = max([1, capacity, *seqlens])
        if page_size is None:
            shape = (batch, capacity)
            self.block_table = None
        else:
            pages_of = [-(-n // page_size) for n in seqlens]
            max_pages = max(max(pages_of) + 1, -(-capacity // page_size))
            total = sum(pages_of) + spare_pages
            order = torch.randperm(total, generator=gen, device="cuda").tolist()
            table = torch.full((batch, max_pages), GARBAGE_PAGE, dtype=torch.int32)
            at = 0
            for b, n in enumerate(pages_of):
                table[b, :n] = torch.tensor(order[at:at + n], dtype=torch.int32)
                at += n
            self.block_table = table.cuda()
            shape = (total, page_size)
        full = (*shape, 2, heads_kv, head_dim) if interleaved else (2, *shape, heads_kv, head_dim)
        kv = torch.randn(full, generator=gen, device="cuda").to(dtype)
        self.k, self.v = (kv[:, :, 0], kv[:, :, 1]) if interleaved else (kv[0], kv[1])
        self.keys = [self._rows(self.k, b).clone() for b in range(batch)]
        self.values = [self._rows(self.v, b).clone() for b in range(batch)]
        self._poison_unowned()

    def _rows(self, t, b):
        n = self.seqlens[b]
        if self.block_table is None:
            return t[b, :n]
        pages = self.block_table[b, :-(-n // self.page_size)].long()
        return t[pages].reshape(-1, *t.shape[2:])[:n]

    def _poison_unowned(self):
        owned = torch.zeros(self.k.shape[:2], dtype=torch.bool, device="cuda")
        for b, n in enumerate(self.seqlens):
            if self.block_table is None:
                owned[b, :n] = True
            else:
                keys = torch.arange(n, device="cuda")
                owned[self.block_table[b, keys // self.page_size].long(), keys % self.page_size] = True
        self.k[~owned] = float("nan")
        self.v[~owned] = float("inf")


def run_case(seqlens, heads_kv, group, head_dim, dtype, q_len, page_size, interleaved, window_left, use_sink, seed,
             kv_load=None, tail=None, num_sms=None, bound_extra=None, plan_with_table=False):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    bound = None if bound_extra is None else max([0, *seqlens]) + bound_extra
    cache = Cache(seqlens, heads_kv, head_dim, dtype, page_size, interleaved, gen, capacity=bound or 0)
    batch, heads_q = len(seqlens), heads_kv * group
    q = torch.randn((batch, q_len, heads_q, head_dim), generator=gen, device="cuda").to(dtype)
    sink = torch.randn((heads_q,), generator=gen, device="cuda") * 2 if use_sink else None
    plan = plan_attention_decode(seqlens, num_heads_q=heads_q, num_heads_kv=heads_kv, head_dim=head_dim, q_len=q_len,
                                 dtype=dtype, page_size=page_size, window_left=window_left, kv_load=kv_load, tail=tail,
                                 num_sms=num_sms, max_seqlen_k=bound, device="cuda",
                                 block_table=cache.block_table.cpu() if plan_with_table else None,
                                 num_pages=cache.k.shape[0] if plan_with_table else None)
    out = torch.full(q.shape, float("nan"), dtype=dtype, device="cuda")
    result, lse = attention_decode(q, cache.k, cache.v, torch.tensor(seqlens, dtype=torch.int32, device="cuda"),
                                   block_table=cache.block_table, window_left=window_left, sink=sink, return_lse=True,
                                   plan=plan, out=out)
    assert result is out
    torch.cuda.synchronize()
    check(out, lse, q, cache, window_left, sink, head_dim)
    return plan


def check(out, lse, q, cache, window_left, sink, head_dim):
    out_ref, lse_ref = reference(q, cache.keys, cache.values, window_left, sink, 1.0 / math.sqrt(head_dim))
    assert not torch.isnan(out).any(), "NaN in out: a row was not written, or a poisoned row was read"
    assert not torch.isnan(lse).any(), "NaN in lse"
    tol = OUT_TOL[out.dtype]
    torch.testing.assert_close(out.double(), out_ref, atol=tol, rtol=tol)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref)), "rows with no keys differ"
    finite = torch.isfinite(lse_ref)
    torch.testing.assert_close(lse.double()[finite], lse_ref[finite], atol=2e-3, rtol=1e-4)


lengths = st.one_of(st.integers(0, 300), st.sampled_from([1, 15, 16, 17, 63, 64, 65, 127, 128, 129, 1000]),
                    st.integers(300, 5000))
page_sizes = st.sampled_from([None, None, 1, 3, 16, 32, 64, 100, 256])
loads = st.sampled_from([(None, None), ("tma", "cp_async"), ("tma", "tma"), ("cp_async", None)])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seqlens=st.lists(lengths, min_size=1, max_size=5), heads_kv=st.sampled_from([1, 2, 3]),
       group=st.sampled_from([1, 2, 4, 5, 8, 16]), head_dim=st.sampled_from(head_dims()),
       dtype=st.sampled_from(list(DTYPES)), q_len=st.sampled_from([1, 1, 2, 4, 8]), page_size=page_sizes,
       interleaved=st.booleans(), window=st.sampled_from([-1, -1, 0, 5, 100, 1000]), use_sink=st.booleans(),
       load=loads, num_sms=st.sampled_from([1, 16, 132, 5000]), bound_extra=st.sampled_from([None, 0, 37, 3000]),
       seed=st.integers(0, 2**31 - 1))
def test_decode_matches_reference(seqlens, heads_kv, group, head_dim, dtype, q_len, page_size, interleaved, window,
                                  use_sink, load, num_sms, bound_extra, seed):
    kv_load, tail = load
    if kv_load == "tma" and page_size is not None and page_size % 16:
        kv_load, tail = "cp_async", None  # TMA needs pages of whole slices (refusal tested below)
    run_case(seqlens, heads_kv, group, head_dim, DTYPES[dtype], q_len, page_size, interleaved, window, use_sink, seed,
             kv_load=kv_load, tail=tail, num_sms=num_sms, bound_extra=bound_extra)


@pytest.mark.parametrize("length", [1, 15, 16, 17, 1023, 1024, 1025, 32768, 70000])
@pytest.mark.parametrize("page_size", [None, 16, 64])
def test_long_requests(length, page_size):
    # One long request next to a short one: many splits, merged by the last CTA of each.
    run_case([length, 5], 2, 4, 128, torch.bfloat16, 1, page_size, False, -1, False, seed=length)


@pytest.mark.parametrize("head_dim", head_dims())
@pytest.mark.parametrize("kv_load", ["tma", "cp_async"])
def test_whole_slices_take_the_full_tiles_variant(head_dim, kv_load):
    plan = run_case([64, 128, 16], 2, 4, head_dim, torch.float16, 1, None, True, -1, True, seed=head_dim,
                    kv_load=kv_load)
    assert plan.has_incomplete_tile is False


@pytest.mark.parametrize("q_len", [1, 3, 8])
def test_every_head_group_and_token_count(q_len):
    for group in range(1, 17):
        run_case([q_len, 40, 300], 2, group, 64, torch.bfloat16, q_len, 16, False, -1, group % 2 == 0, seed=group)


def test_graph_replay_with_new_lengths():
    gen = torch.Generator(device="cuda").manual_seed(7)
    heads_kv, group, head_dim, page_size, q_len = 2, 4, 128, 16, 2
    first, second = [100, 3000, 17], [2999, 1, 640]
    bound = 4096
    # A paged cache with room for the bound: each request owns bound / page_size pages.
    cache = Cache([bound] * 3, heads_kv, head_dim, torch.bfloat16, page_size, False, gen, spare_pages=0)
    plan = plan_attention_decode(first, num_heads_q=heads_kv * group, num_heads_kv=heads_kv, head_dim=head_dim,
                                 q_len=q_len, page_size=page_size, max_seqlen_k=bound, device="cuda")
    q = torch.randn((3, q_len, heads_kv * group, head_dim), generator=gen, device="cuda").to(torch.bfloat16)
    seqlens = torch.tensor(first, dtype=torch.int32, device="cuda")
    out = torch.full(q.shape, float("nan"), dtype=torch.bfloat16, device="cuda")
    lse = None
    attention_decode(q, cache.k, cache.v, seqlens, block_table=cache.block_table, plan=plan, out=out)  # warm up
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        _, lse = attention_decode(q, cache.k, cache.v, seqlens, block_table=cache.block_table, plan=plan, out=out,
                                  return_lse=True)
    for lengths in (first, second, first):
        out.fill_(float("nan"))
        seqlens.copy_(torch.tensor(lengths, dtype=torch.int32))
        graph.replay()
        torch.cuda.synchronize()
        cache.seqlens = lengths
        cache.keys = [cache._rows(cache.k, b) for b in range(3)]
        cache.values = [cache._rows(cache.v, b) for b in range(3)]
        check(out, lse, q, cache, -1, None, head_dim)


def test_runs_are_bitwise_equal():
    gen = torch.Generator(device="cuda").manual_seed(3)
    cache = Cache([20000, 7], 2, 128, torch.bfloat16, None, False, gen)
    q = torch.randn((2, 1, 8, 128), generator=gen, device="cuda").to(torch.bfloat16)
    seqlens = torch.tensor([20000, 7], dtype=torch.int32, device="cuda")
    plan = plan_attention_decode([20000, 7], num_heads_q=8, num_heads_kv=2, head_dim=128, device="cuda")
    assert plan.splits.max_splits > 1
    first = attention_decode(q, cache.k, cache.v, seqlens, plan=plan)
    assert all(torch.equal(first, attention_decode(q, cache.k, cache.v, seqlens, plan=plan)) for _ in range(5))


def test_requests_the_kernel_cannot_compute_get_nan():
    gen = torch.Generator(device="cuda").manual_seed(5)
    cache = Cache([40, 40], 1, 64, torch.bfloat16, 16, False, gen)
    q = torch.randn((2, 1, 2, 64), generator=gen, device="cuda").to(torch.bfloat16)
    plan = plan_attention_decode([40, 40], num_heads_q=2, num_heads_kv=1, head_dim=64, page_size=16, device="cuda")
    table = cache.block_table.clone()
    table[1, 1] = cache.k.shape[0]  # one past the last page
    out = attention_decode(q, cache.k, cache.v, torch.tensor([40, 40], dtype=torch.int32, device="cuda"),
                           block_table=table, plan=plan)
    assert not out[0].isnan().any() and out[1].isnan().all()
    # A length past the cache's capacity (the table's pages) on the device, where the host cannot see it.
    out = attention_decode(q, cache.k, cache.v, torch.tensor([40, 10**6], dtype=torch.int32, device="cuda"),
                           block_table=cache.block_table, plan=plan)
    assert not out[0].isnan().any() and out[1].isnan().all()
    # A plan for whole slices (no incomplete-slice code) given a length that ends mid-slice.
    whole = plan_attention_decode([32, 32], num_heads_q=2, num_heads_kv=1, head_dim=64, page_size=16, device="cuda")
    assert not whole.has_incomplete_tile
    out = attention_decode(q, cache.k, cache.v, torch.tensor([32, 33], dtype=torch.int32, device="cuda"),
                           block_table=cache.block_table, plan=whole)
    assert not out[0].isnan().any() and out[1].isnan().all()


def test_bad_input_is_refused_with_the_argument_named():
    gen = torch.Generator(device="cuda").manual_seed(9)
    cache = Cache([40, 8], 2, 64, torch.bfloat16, 16, False, gen)
    q = torch.randn((2, 4, 64), generator=gen, device="cuda").to(torch.bfloat16)
    seqlens = torch.tensor([40, 8], dtype=torch.int32, device="cuda")
    plan = plan_attention_decode([40, 8], num_heads_q=4, num_heads_kv=2, head_dim=64, page_size=16)
    table = cache.block_table

    def call(**changes):
        args = dict(q=q, k_cache=cache.k, v_cache=cache.v, seqlens_k=seqlens, block_table=table, plan=plan) | changes
        return attention_decode(**args)

    call()
    with pytest.raises(TypeError, match="q"):
        call(q=q.float())
    with pytest.raises(ValueError, match="seqlens_k"):
        call(seqlens_k=seqlens[:1])
    with pytest.raises(TypeError, match="seqlens_k"):
        call(seqlens_k=seqlens.long())
    with pytest.raises(ValueError, match="v_cache"):
        call(v_cache=cache.v[:, :8])
    with pytest.raises(TypeError, match="block_table"):
        call(block_table=table.long())
    with pytest.raises(ValueError, match="plan"):
        call(q=q.repeat(1, 2, 1))  # 8 query heads against a plan for 4
    with pytest.raises(ValueError, match="sink"):
        call(sink=torch.zeros(3, device="cuda"))
    with pytest.raises(RuntimeError, match="no backward"):
        call(q=q.clone().requires_grad_())
    # The host checks a block table it is given: too short for a length, or a page outside the cache.
    with pytest.raises(ValueError, match="block_table"):
        plan_attention_decode([40, 8], num_heads_q=4, num_heads_kv=2, head_dim=64, page_size=16,
                              block_table=table[:, :2].cpu(), num_pages=cache.k.shape[0])
    bad = table.cpu().clone()
    bad[0, 0] = cache.k.shape[0]
    with pytest.raises(ValueError, match="block_table"):
        plan_attention_decode([40, 8], num_heads_q=4, num_heads_kv=2, head_dim=64, page_size=16, block_table=bad,
                              num_pages=cache.k.shape[0])
    with pytest.raises(ValueError, match="kv_load"):
        plan_attention_decode([40, 8], num_heads_q=4, num_heads_kv=2, head_dim=64, page_size=24, kv_load="tma")
    with pytest.raises(ValueError, match="q_len"):
        plan_attention_decode([40, 8], num_heads_q=4, num_heads_kv=2, head_dim=64, q_len=9)
    # A plan for longer requests than the cache holds.
    long_plan = plan_attention_decode([40, 8], num_heads_q=4, num_heads_kv=2, head_dim=64, page_size=16,
                                      max_seqlen_k=10**6)
    with pytest.raises(ValueError, match="block_table: the plan is for requests of up to 1000000 keys"):
        call(plan=long_plan)
