"""attention_varlen on the GPU against a float64 reference per sequence, on fresh random batches.

Outputs are preallocated and poisoned with NaN; every element of out and of the
LSE is checked.
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
from kgen.families.attention_prefill import op as prefill_op  # noqa: E402
from kgen.ops import attention_varlen, plan_attention_varlen  # noqa: E402

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16}
# P is rounded to 16 bits before P V, as in FlashAttention; the error is that rounding.
OUT_TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}


def head_dims() -> list[int]:
    return registry.current().family("attention_prefill").supported("head_dim")


def kernels() -> list[tuple[str | None, int, int | None, str]]:
    """(mma, head_dim, tile_m, tail) of every kernel the spec lists, and (None, head_dim, None, tail) for the
    planner's own choice."""
    listed = sorted({(v.param_dict["mma"], v.param_dict["head_dim"], v.param_dict["tile_m"], v.param_dict["tail"])
                     for v in registry.current().family("attention_prefill").variants})
    return listed + [(None, d, None, t) for d, t in sorted({(d, t) for _, d, _, t in listed})]


def packed_shapes() -> list[tuple[int, int]]:
    """(head_dim, tile_n) of every packed variant the spec lists (rows=packed: tiles of consecutive tokens)."""
    return sorted({(v.param_dict["head_dim"], v.param_dict["tile_n"])
                   for v in registry.current().family("attention_prefill").variants if v.param_dict["rows"] == "packed"})


def whole_tile_length(kernel) -> int:
    """The shortest length that is whole query and key tiles of every shape the kernel (or the planner) may run."""
    mma, head_dim, tile_m, _ = kernel
    variants = [v.param_dict for v in registry.current().family("attention_prefill").variants]
    return math.lcm(*(p[t] for p in variants for t in ("tile_m", "tile_n")
                      if p["head_dim"] == head_dim and mma in (None, p["mma"]) and tile_m in (None, p["tile_m"])))


def kernel_id(kernel) -> str:
    return "{}-hd{}-m{}-{}".format(*kernel)


def reference(q, k, v, seqlens_q, seqlens_k, window, sink, scale):
    """float64 out [total_q, Hq, D] and lse [Hq, total_q]; window (left, right) with causal folded in."""
    heads_q, heads_kv = q.shape[1], k.shape[1]
    out = torch.zeros(q.shape, dtype=torch.float64, device=q.device)
    lse = torch.full((heads_q, q.shape[0]), -math.inf, dtype=torch.float64, device=q.device)
    q0 = k0 = 0
    for lq, lk in zip(seqlens_q, seqlens_k):
        if lq:
            qi = q[q0:q0 + lq].double()
            ki = k[k0:k0 + lk].double().repeat_interleave(heads_q // heads_kv, dim=1)
            vi = v[k0:k0 + lk].double().repeat_interleave(heads_q // heads_kv, dim=1)
            s = torch.einsum("qhd,khd->hqk", qi, ki) * scale
            rows = torch.arange(lq, device=q.device).view(-1, 1)
            keys = torch.arange(lk, device=q.device).view(1, -1)
            allowed = torch.ones((lq, lk), dtype=torch.bool, device=q.device)
            if window[0] >= 0:
                allowed &= keys >= rows + (lk - lq) - window[0]
            if window[1] >= 0:
                allowed &= keys <= rows + (lk - lq) + window[1]
            s = s.masked_fill(~allowed, -math.inf)
            if sink is not None:
                s = torch.cat([s, sink.double().view(-1, 1, 1).expand(-1, lq, 1)], dim=2)
            if s.shape[2] == 0:  # no keys and no sink: the row stays 0 with LSE -inf
                q0, k0 = q0 + lq, k0 + lk
                continue
            m = s.amax(dim=2, keepdim=True)
            m = torch.where(torch.isinf(m), torch.zeros_like(m), m)
            p = torch.exp(s - m)
            denom = p.sum(dim=2, keepdim=True)
            o = torch.einsum("hqk,khd->qhd", p[..., :lk], vi) / torch.where(denom > 0, denom, 1).permute(1, 0, 2)
            out[q0:q0 + lq] = o
            lse[:, q0:q0 + lq] = torch.where(denom > 0, m + torch.log(denom), -math.inf).squeeze(2)
        q0, k0 = q0 + lq, k0 + lk
    return out, lse


def poison_sequence(q, k, v, seqlens_q, seqlens_k, index):
    """Fill sequence ``index``'s rows with NaN (q, k) and +-Inf (v): no other sequence may see them."""
    q0, k0 = sum(seqlens_q[:index]), sum(seqlens_k[:index])
    q[q0:q0 + seqlens_q[index]] = float("nan")
    k[k0:k0 + seqlens_k[index]] = float("nan")
    v[k0:k0 + seqlens_k[index]] = float("inf")
    v[k0:k0 + seqlens_k[index], :, 1::2] = float("-inf")


def run_case(seqlens_q, seqlens_k, heads_kv, group, head_dim, dtype, causal, window, use_sink, seed, use_plan=True,
             tail=None, tile_m=None, poisoned=None, mma=None, tile_n=None, rows=None):
    """One batch against the float64 reference; with ``poisoned`` (a sequence index), that sequence's
    inputs are NaN/Inf and every other sequence must still match exactly as without it."""
    gen = torch.Generator(device="cuda").manual_seed(seed)
    total_q, total_k, heads_q = sum(seqlens_q), sum(seqlens_k), heads_kv * group
    q = torch.randn((total_q, heads_q, head_dim), generator=gen, device="cuda").to(dtype)
    k = torch.randn((total_k, heads_kv, head_dim), generator=gen, device="cuda").to(dtype)
    v = torch.randn((total_k, heads_kv, head_dim), generator=gen, device="cuda").to(dtype)
    if poisoned is not None:
        poison_sequence(q, k, v, seqlens_q, seqlens_k, poisoned)
    sink = torch.randn((heads_q,), generator=gen, device="cuda") * 2 if use_sink else None
    cu_q = torch.tensor([0] + list(torch.tensor(seqlens_q).cumsum(0).tolist()), dtype=torch.int32)
    cu_k = torch.tensor([0] + list(torch.tensor(seqlens_k).cumsum(0).tolist()), dtype=torch.int32)
    plan = (plan_attention_varlen(cu_q, cu_k, head_dim=head_dim, dtype=dtype, causal=causal, window=window, tail=tail,
                                  tile_m=tile_m, mma=mma, tile_n=tile_n, rows=rows) if use_plan else None)
    for axis, value in (("tile_m", tile_m), ("tile_n", tile_n), ("rows", rows)):
        assert value is None or plan.variant.param_dict[axis] == value, axis
    if mma is not None:
        assert plan.variant.param_dict["mma"] == mma
    out = torch.full((total_q, heads_q, head_dim), float("nan"), dtype=dtype, device="cuda")
    lse = torch.full((heads_q, total_q), float("nan"), dtype=torch.float32, device="cuda")
    scale = 1.0 / math.sqrt(head_dim)
    result = attention_varlen(q, k, v, cu_q.cuda(), cu_k.cuda(), causal=causal, window=window, sink=sink,
                              return_lse=True, plan=plan, out=out, lse_out=lse)
    assert result[0] is out and result[1] is lse
    torch.cuda.synchronize()
    merged = (window[0], 0 if causal else window[1])
    out_ref, lse_ref = reference(q, k, v, seqlens_q, seqlens_k, merged, sink, scale)
    if poisoned is not None:  # only the other sequences' rows are checked
        q0 = sum(seqlens_q[:poisoned])
        keep = torch.ones(total_q, dtype=torch.bool, device="cuda")
        keep[q0:q0 + seqlens_q[poisoned]] = False
        out, out_ref, lse, lse_ref = out[keep], out_ref[keep], lse[:, keep], lse_ref[:, keep]
    assert not torch.isnan(out).any(), "NaN in out: a row was not written"
    assert not torch.isnan(lse).any(), "NaN in lse: a row was not written"
    tol = OUT_TOL[dtype]
    torch.testing.assert_close(out.double(), out_ref, atol=tol, rtol=tol)
    assert torch.equal(torch.isinf(lse), torch.isinf(lse_ref)), "rows with no keys differ"
    finite = torch.isfinite(lse_ref)
    torch.testing.assert_close(lse.double()[finite], lse_ref[finite], atol=2e-3, rtol=1e-4)


lengths = st.one_of(st.integers(0, 200), st.sampled_from([1, 63, 64, 65, 127, 128, 129]))
windows = st.tuples(st.sampled_from([-1, -1, 0, 1, 17, 100]), st.sampled_from([-1, -1, 0, 3, 64]))


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seqs=st.lists(st.tuples(lengths, lengths), min_size=1, max_size=5),
    heads_kv=st.sampled_from([1, 2]), group=st.sampled_from([1, 2, 4]),
    kernel=st.sampled_from(kernels()), dtype=st.sampled_from(list(DTYPES)),
    causal=st.booleans(), window=windows, use_sink=st.booleans(), seed=st.integers(0, 2**31 - 1),
)
def test_attention_matches_reference(seqs, heads_kv, group, kernel, dtype, causal, window, use_sink, seed):
    seqlens_q, seqlens_k = [s[0] for s in seqs], [s[1] for s in seqs]
    mma, head_dim, tile_m, tail = kernel
    run_case(seqlens_q, seqlens_k, heads_kv, group, head_dim, DTYPES[dtype], causal, window, use_sink, seed, tail=tail,
             tile_m=tile_m, mma=mma)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    tiles=st.lists(st.tuples(st.integers(0, 4), st.integers(0, 4)), min_size=1, max_size=4),
    head_dim=st.sampled_from(head_dims()), causal=st.booleans(), seed=st.integers(0, 2**31 - 1),
)
def test_full_tile_batches_use_the_full_tiles_variant(tiles, head_dim, causal, seed):
    # A multiple of every tile size, whichever shape the planner takes.
    tile = math.lcm(*(v.param_dict[axis] for v in registry.current().family("attention_prefill").variants
                      for axis in ("tile_m", "tile_n")))
    seqlens_q, seqlens_k = [tile * a for a, _ in tiles], [tile * b for _, b in tiles]
    cu = [0]
    for n in seqlens_q:
        cu.append(cu[-1] + n)
    cu_k = [0]
    for n in seqlens_k:
        cu_k.append(cu_k[-1] + n)
    assert not plan_attention_varlen(cu, cu_k, head_dim=head_dim, causal=causal).has_incomplete_tile
    run_case(seqlens_q, seqlens_k, 2, 2, head_dim, torch.bfloat16, causal, (-1, -1), False, seed)


@pytest.mark.parametrize("length", [1, 7, 8, 9, 31, 63, 64, 65, 71, 72, 127, 128, 129, 255, 256, 257, 1023, 1025, 4096])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", [k for k in kernels() if k[2] is not None], ids=kernel_id)
def test_long_sequences(length, causal, kernel):
    mma, head_dim, tile_m, tail = kernel
    run_case([length, 7], [length, 7], 2, 4, head_dim, torch.bfloat16, causal, (-1, -1), False, seed=length,
             tail=tail, tile_m=tile_m, mma=mma)


@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", [k for k in kernels() if k[2] is not None], ids=kernel_id)
def test_every_full_tiles_kernel_on_full_tiles(causal, kernel):
    mma, head_dim, tile_m, tail = kernel
    unit = whole_tile_length(kernel)
    lengths = [2 * unit, unit, 4 * unit]  # whole tiles, so the has_incomplete_tile=false twin runs
    cu = [0, 2 * unit, 3 * unit, 7 * unit]
    plan = plan_attention_varlen(cu, cu, head_dim=head_dim, causal=causal, tail=tail, tile_m=tile_m, mma=mma)
    assert plan.variant.param_dict["has_incomplete_tile"] is False
    run_case(lengths, lengths, 2, 2, head_dim, torch.float16, causal, (-1, -1), True, seed=tile_m + head_dim,
             tail=tail, tile_m=tile_m, mma=mma)


@pytest.mark.parametrize("full_tiles", [False, True], ids=["incomplete-tiles", "full-tiles"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("kernel", kernels(), ids=kernel_id)
def test_poisoned_neighbours_never_reach_a_sequence(kernel, causal, full_tiles):
    """The issue's batch (lengths 63, 65, 200, 1, the second poisoned), and a batch of whole tiles
    (the has_incomplete_tile=false variant), for every kernel and tail policy."""
    mma, head_dim, tile_m, tail = kernel
    unit = whole_tile_length(kernel)
    lengths = [unit, 2 * unit, unit, unit] if full_tiles else [63, 65, 200, 1]
    for poisoned in (1, 2):
        run_case(lengths, lengths, 2, 2, head_dim, torch.bfloat16, causal, (-1, -1), False, seed=head_dim + poisoned,
                 tail=tail, tile_m=tile_m, poisoned=poisoned, mma=mma)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seqs=st.lists(st.tuples(lengths, lengths), min_size=2, max_size=5), data=st.data(),
    kernel=st.sampled_from(kernels()), causal=st.booleans(), window=windows, seed=st.integers(0, 2**31 - 1),
)
def test_poisoned_neighbours_on_random_batches(seqs, data, kernel, causal, window, seed):
    seqlens_q, seqlens_k = [s[0] for s in seqs], [s[1] for s in seqs]
    poisoned = data.draw(st.integers(0, len(seqs) - 1), label="poisoned")
    mma, head_dim, tile_m, tail = kernel
    run_case(seqlens_q, seqlens_k, 1, 2, head_dim, torch.float16, causal, window, True, seed, tail=tail,
             tile_m=tile_m, poisoned=poisoned, mma=mma)


self_lengths = st.one_of(st.integers(0, 200), st.sampled_from([1, 2, 31, 32, 33, 63, 64, 65, 127, 128, 129]))


# (causal, window) pairs packed tiles run: causal, none, and causal given as the window (-1, 0).
PACKED_MASKS = [(True, (-1, -1)), (False, (-1, -1)), (False, (-1, 0))]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    seqlens=st.lists(self_lengths, min_size=1, max_size=8), shape=st.sampled_from(packed_shapes()),
    heads_kv=st.sampled_from([1, 2]), group=st.sampled_from([1, 2, 4]), dtype=st.sampled_from(list(DTYPES)),
    mask=st.sampled_from(PACKED_MASKS), use_sink=st.booleans(), seed=st.integers(0, 2**31 - 1),
)
def test_packed_tiles_match_reference(seqlens, shape, heads_kv, group, dtype, mask, use_sink, seed):
    head_dim, tile_n = shape
    causal, window = mask
    run_case(seqlens, seqlens, heads_kv, group, head_dim, DTYPES[dtype], causal, window, use_sink, seed,
             tile_n=tile_n, rows="packed")


@pytest.mark.parametrize("lengths", [[65] * 6, [1] * 70, [3, 1, 7, 60, 2, 0, 64, 1, 5], [129, 130, 1, 2, 200]],
                         ids=["65s", "1s", "mixed", "long"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", packed_shapes(), ids=lambda s: f"hd{s[0]}-n{s[1]}")
def test_packed_tiles_keep_poisoned_neighbours_out(lengths, causal, shape):
    """Tiles of several sequences: each poisoned sequence in turn (NaN q and k, +-Inf v) must reach no other row,
    though P V multiplies every row of a tile by every V row of it (the kernel's guard zeroes those rows)."""
    head_dim, tile_n = shape
    for poisoned in sorted({0, 1, len(lengths) // 2, len(lengths) - 1}):
        run_case(lengths, lengths, 2, 2, head_dim, torch.bfloat16, causal, (-1, -1), False, seed=poisoned,
                 tile_n=tile_n, poisoned=poisoned, rows="packed")


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seqlens=st.lists(self_lengths, min_size=2, max_size=8), data=st.data(), shape=st.sampled_from(packed_shapes()),
       causal=st.booleans(), seed=st.integers(0, 2**31 - 1))
def test_packed_tiles_keep_poisoned_neighbours_out_on_random_batches(seqlens, data, shape, causal, seed):
    # A poisoned empty sequence would test nothing.
    poisoned = data.draw(st.sampled_from([i for i, n in enumerate(seqlens) if n] or [0]), label="poisoned")
    head_dim, tile_n = shape
    run_case(seqlens, seqlens, 1, 2, head_dim, torch.float16, causal, (-1, -1), True, seed, tile_n=tile_n,
             poisoned=poisoned, rows="packed")


@pytest.mark.parametrize("value", [float("inf"), float("nan")], ids=["inf", "nan"])
@pytest.mark.parametrize("where", ["first", "last"])
@pytest.mark.parametrize("causal", [False, True])
@pytest.mark.parametrize("shape", packed_shapes(), ids=lambda s: f"hd{s[0]}-n{s[1]}")
def test_packed_tiles_keep_one_nonfinite_value_to_its_sequence(shape, causal, where, value):
    """One element of V (the last column of the second kv head, at a sequence's first or last token) is Inf or
    NaN, q and k finite: every other sequence's rows are bitwise those of the clean run, and the token's own row
    shows it in that column for the query heads of that kv head (the guard zeroes the row for the others and
    must mark its own sequence's rows; a scan that missed a span or a head would let it through or hide it)."""
    head_dim, tile_n = shape
    lengths = [63, 65, 70, 1, 65]
    cu = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    plan = plan_attention_varlen(cu, cu, head_dim=head_dim, causal=causal, tile_n=tile_n, rows="packed")
    gen = torch.Generator(device="cuda").manual_seed(tile_n)
    q = torch.randn((cu[-1], 4, head_dim), generator=gen, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn((cu[-1], 2, head_dim), generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    cu_d = torch.tensor(cu, dtype=torch.int32, device="cuda")
    clean, clean_lse = attention_varlen(q, k, v, cu_d, cu_d, causal=causal, plan=plan, return_lse=True)
    for owner in range(len(lengths)):
        token = cu[owner] if where == "first" else cu[owner + 1] - 1
        bad = v.clone()
        bad[token, 1, head_dim - 1] = value
        out, lse = attention_varlen(q, k, bad, cu_d, cu_d, causal=causal, plan=plan, return_lse=True)
        torch.cuda.synchronize()
        others = torch.ones(cu[-1], dtype=torch.bool, device="cuda")
        others[cu[owner]:cu[owner + 1]] = False
        assert torch.equal(out[others], clean[others]) and torch.equal(lse[:, others], clean_lse[:, others]), owner
        assert not torch.isfinite(out[token, 2:, head_dim - 1]).any(), f"sequence {owner}'s own row hides the value"
        assert torch.equal(out[token, :2], clean[token, :2]), "the other kv head's query heads must not see it"


def test_without_a_plan_the_op_plans_for_itself():
    run_case([100, 0, 33], [90, 5, 70], 2, 2, 64, torch.float16, True, (-1, -1), True, seed=3, use_plan=False)


def test_cuda_graph_capture_and_replay():
    seqlens = [130, 64, 1]
    cu = torch.tensor([0, 130, 194, 195], dtype=torch.int32)
    plan = plan_attention_varlen(cu, cu, head_dim=128, causal=True)
    q = torch.randn((195, 8, 128), device="cuda").to(torch.bfloat16)
    k = torch.randn((195, 2, 128), device="cuda").to(torch.bfloat16)
    v = torch.randn((195, 2, 128), device="cuda").to(torch.bfloat16)
    out = torch.empty_like(q)
    cu_d = cu.cuda()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        attention_varlen(q, k, v, cu_d, cu_d, causal=True, plan=plan, out=out)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        attention_varlen(q, k, v, cu_d, cu_d, causal=True, plan=plan, out=out)
    for _ in range(2):
        for t in (q, k, v):
            t.copy_(torch.randn(t.shape, device="cuda").to(t.dtype))
        out.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        ref, _ = reference(q, k, v, seqlens, seqlens, (-1, 0), None, 1 / math.sqrt(128))
        torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)


def test_bad_inputs_name_the_argument():
    q = torch.randn((10, 4, 64), device="cuda").to(torch.bfloat16)
    k = torch.randn((10, 2, 64), device="cuda").to(torch.bfloat16)
    cu = torch.tensor([0, 10], dtype=torch.int32, device="cuda")
    with pytest.raises(ValueError, match="multiple of Hkv"):
        attention_varlen(q, k[:, :1].expand(10, 3, 64).contiguous(), k[:, :1].expand(10, 3, 64).contiguous(), cu, cu)
    with pytest.raises(TypeError, match="k: expected dtype"):
        attention_varlen(q, k.half(), k.half(), cu, cu)
    with pytest.raises(ValueError, match="supported"):
        w = torch.randn((10, 2, 72), device="cuda").to(torch.bfloat16)
        attention_varlen(w, w, w, cu, cu)
    with pytest.raises(ValueError, match="last dimension must be contiguous"):
        attention_varlen(torch.randn((10, 64, 4), device="cuda").to(torch.bfloat16).transpose(1, 2), k, k, cu, cu)
    with pytest.raises(TypeError, match="cu_seqlens_q"):
        attention_varlen(q, k, k, cu.long(), cu)
    with pytest.raises(ValueError, match="non-decreasing"):
        attention_varlen(q, k, k, torch.tensor([0, 6, 4, 10], dtype=torch.int32, device="cuda"), torch.tensor([0, 3, 6, 10], dtype=torch.int32, device="cuda"))


def test_one_plan_over_new_tensors_patches_every_address():
    """Later calls of one plan reuse its checked launch and patch the tensor maps: each must see its own tensors."""
    seqlens = [70, 129, 1]
    cu = torch.tensor([0, 70, 199, 200], dtype=torch.int32)
    plan = plan_attention_varlen(cu, cu, head_dim=64, causal=True)
    for seed in range(3):
        gen = torch.Generator(device="cuda").manual_seed(seed)
        q = torch.randn((200, 4, 64), generator=gen, device="cuda").to(torch.bfloat16)
        k, v = (torch.randn((200, 2, 64), generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
        out, lse = attention_varlen(q, k, v, cu.cuda(), cu.cuda(), causal=True, plan=plan, return_lse=True)
        ref, lse_ref = reference(q, k, v, seqlens, seqlens, (-1, 0), None, 64 ** -0.5)
        torch.testing.assert_close(out.double(), ref, atol=2e-2, rtol=2e-2)
        torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)
    misaligned = torch.empty((200 * 4 * 64 + 1,), device="cuda", dtype=torch.bfloat16)[1:].view(200, 4, 64)
    misaligned.copy_(q)
    with pytest.raises(ValueError, match="q: rows must start at 16-byte aligned addresses"):
        attention_varlen(misaligned, k, v, cu.cuda(), cu.cuda(), causal=True, plan=plan)


@pytest.mark.parametrize("window, equivalent", [((-1, 2**31 - 1), (-1, -1)), ((2**31 - 1, 0), (-1, 0)),
                                                ((2**31 - 1, 2**31 - 1), (-1, -1))])
def test_windows_wider_than_any_sequence_equal_unbounded(window, equivalent):
    """A window side up to 2^31 - 1 must not overflow the kernel's 32-bit positions."""
    run_case([70, 200, 1], [90, 200, 5], 2, 2, 128, torch.bfloat16, False, window, False, seed=11)
    run_case([70, 200, 1], [90, 200, 5], 2, 2, 128, torch.bfloat16, False, equivalent, False, seed=11)



@pytest.mark.parametrize("kernel", [k for k in kernels() if k[2] is not None] + [(None, d, None, "packed") for d, _ in packed_shapes()],
                         ids=kernel_id)
def test_two_runs_are_bitwise_equal(kernel):
    mma, head_dim, tile_m, tail = kernel
    lengths = [300, 1, 129, 700]
    cu = torch.tensor([0, 300, 301, 430, 1130], dtype=torch.int32)
    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    q, k, v = (torch.randn((1130, 4, head_dim), generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    rows = "packed" if tail == "packed" else "per_sequence"
    plan = plan_attention_varlen(cu, cu, head_dim=head_dim, causal=True, tail=None if rows == "packed" else tail,
                                 tile_m=tile_m, mma=mma, rows=rows)
    assert mma in (None, plan.variant.param_dict["mma"]) and sum(lengths) == 1130
    first = attention_varlen(q, k, v, cu.cuda(), cu.cuda(), causal=True, plan=plan, return_lse=True)
    second = attention_varlen(q, k, v, cu.cuda(), cu.cuda(), causal=True, plan=plan, return_lse=True)
    assert torch.equal(first[0], second[0]) and torch.equal(first[1], second[1])


@pytest.mark.parametrize("kernel", [k for k in kernels() if k[2] is not None] + [(None, d, None, "packed") for d, _ in packed_shapes()],
                         ids=kernel_id)
def test_heads_fastest_and_slowest_block_orders_agree_bitwise(kernel, monkeypatch):
    """The op picks the order its blocks take (work item, head) in; either must compute every row of every head once,
    the same way (5 query heads over 1 K/V head, so that no grid size is a multiple of another)."""
    mma, head_dim, tile_m, tail = kernel
    lengths = [300, 1, 129, 0, 700, 64]
    cu = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    q = torch.randn((cu[-1], 5, head_dim), generator=gen, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn((cu[-1], 1, head_dim), generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    rows = "packed" if tail == "packed" else "per_sequence"
    plan = plan_attention_varlen(cu, cu, head_dim=head_dim, causal=True, tail=None if rows == "packed" else tail,
                                 tile_m=tile_m, mma=mma, rows=rows)
    cu_d = torch.tensor(cu, dtype=torch.int32, device="cuda")
    results = []
    for fastest in (False, True):
        monkeypatch.setattr(prefill_op, "heads_fastest", lambda max_seqlen_k, heads_per_kv, fastest=fastest: fastest)
        plan._prepared.clear()  # a prepared call keeps its launch arguments
        out = torch.full_like(q, float("nan"))
        lse = torch.full((5, cu[-1]), float("nan"), device="cuda")
        attention_varlen(q, k, v, cu_d, cu_d, causal=True, plan=plan, return_lse=True, out=out, lse_out=lse)
        results.append((out, lse))
    (slow_out, slow_lse), (fast_out, fast_lse) = results
    assert not slow_out.isnan().any() and not slow_lse.isnan().any()
    assert torch.equal(slow_out, fast_out) and torch.equal(slow_lse, fast_lse)


# A plan used with cu_seqlens other than its own: (planned lengths, the call's cu_seqlens_q and cu_seqlens_k).
_PLAN_MISUSES = {
    # Same total, one boundary moved: the two sequences on either side of it.
    "moved-boundary": ([70, 200, 1, 129], [0, 70, 180, 271, 400], [0, 70, 180, 271, 400]),
    # Lengths that decrease.
    "decreasing": ([70, 200, 1, 129], [0, 70, 30, 271, 400], [0, 70, 30, 271, 400]),
    # A total past q's and k's rows: the last sequence.
    "past-the-end": ([70, 200, 1, 129], [0, 70, 270, 271, 500], [0, 70, 270, 271, 500]),
    # Keys alone moved.
    "keys-only": ([70, 200, 1, 129], [0, 70, 270, 271, 400], [0, 70, 260, 271, 400]),
}


@pytest.mark.parametrize("misuse", sorted(_PLAN_MISUSES))
@pytest.mark.parametrize("kernel", kernels(), ids=kernel_id)
def test_a_plan_used_with_other_cu_seqlens_gives_nan_to_the_moved_sequences_alone(kernel, misuse):
    mma, head_dim, tile_m, tail = kernel
    check_misuse(misuse, head_dim, tail=tail, tile_m=tile_m, mma=mma, rows="per_sequence")


@pytest.mark.parametrize("misuse", sorted(_PLAN_MISUSES))
@pytest.mark.parametrize("shape", packed_shapes(), ids=lambda s: f"hd{s[0]}-n{s[1]}")
def test_a_packed_plan_used_with_other_cu_seqlens_gives_nan_to_the_moved_sequences_alone(shape, misuse):
    head_dim, tile_n = shape
    check_misuse(misuse, head_dim, tile_n=tile_n, rows="packed")


def check_misuse(misuse, head_dim, **plan_options):
    lengths, call_q, call_k = _PLAN_MISUSES[misuse]
    planned = [0, *torch.tensor(lengths).cumsum(0).tolist()]
    plan = plan_attention_varlen(planned, planned, head_dim=head_dim, causal=True, **plan_options)
    assert plan.variant.param_dict["rows"] == plan_options["rows"]
    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    q, k, v = (torch.randn((planned[-1], 4, head_dim), generator=gen, device="cuda").to(torch.bfloat16) for _ in range(3))
    right = attention_varlen(q, k, v, *(torch.tensor(planned, dtype=torch.int32, device="cuda"),) * 2, causal=True,
                             plan=plan, return_lse=True)
    # Poisoned with zeros, not NaN: the moved sequences must be written NaN, the others their results.
    out, lse = torch.zeros_like(q), torch.zeros((4, planned[-1]), device="cuda")
    attention_varlen(q, k, v, torch.tensor(call_q, dtype=torch.int32, device="cuda"),
                     torch.tensor(call_k, dtype=torch.int32, device="cuda"), causal=True, plan=plan, return_lse=True,
                     out=out, lse_out=lse)
    moved = [i for i in range(len(lengths))
             if (call_q[i], call_q[i + 1], call_k[i], call_k[i + 1]) != (planned[i], planned[i + 1]) * 2]
    assert moved, "the case must move some sequence"
    for i in range(len(lengths)):
        rows = slice(planned[i], planned[i + 1])
        if i in moved:
            assert out[rows].isnan().all() and lse[:, rows].isnan().all(), f"sequence {i} moved: its rows must be NaN"
        else:  # bitwise what the right cu_seqlens give
            assert torch.equal(out[rows], right[0][rows]) and torch.equal(lse[:, rows], right[1][:, rows]), f"sequence {i}"
