"""kgen.ops.grouped_gemm on the GPU, every element against float64: random group sizes (0 and 1 rows, sizes that
are no multiple of the tile), out poisoned with NaN first and its rows of no group left so, N and K tails, each
variant, NaN kept to its group, offs that decrease or pass M (clamped; that nothing outside a is read is the
sanitizer case's to check), offsets past 2^31 elements, a CUDA graph replayed with new group sizes,
torch.compile."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

import kgen.ops  # noqa: E402
from grouped_gemm_kernels import FORMS, kernel  # noqa: E402,F401  (each test runs on every kernel form)
from kgen.families.grouped_gemm import op as grouped_gemm_op  # noqa: E402

DTYPES = {"bf16": (torch.bfloat16, 2.0 ** -8), "fp16": (torch.float16, 2.0 ** -11)}  # and their unit roundoff
#: fp32 accumulation over K: a bound's share of sum_k |a b| (K at most a few hundred here).
ACCUMULATION = 2.0 ** -14


def groups_of(offs: list[int], rows: int) -> list[tuple[int, int]]:
    """Each expert's rows as the kernel reads offs: [end of the previous group, offs[e]), clamped into [start, rows]."""
    out, start = [], 0
    for end in offs:
        end = min(max(end, start), rows)
        out.append((start, end))
        start = end
    return out


def check(a, b, offs, out, poison_rows) -> None:
    """Every element of every group's rows within rounding of float64; the rows of no group still NaN."""
    rows = a.shape[0]
    unit = {t: u for t, u in DTYPES.values()}[a.dtype]
    covered = torch.zeros(rows, dtype=torch.bool)
    for e, (start, end) in enumerate(groups_of(offs, rows)):
        if end == start:
            continue
        covered[start:end] = True
        x, w = a[start:end].double(), b[e].double()
        want = x @ w.T
        bound = unit * want.abs() + ACCUMULATION * (x.abs() @ w.abs().T) + 1e-30
        got = out[start:end].double()
        assert torch.isfinite(got).all(), f"expert {e}: non-finite output"
        err = (got - want).abs()
        assert (err <= bound).all(), f"expert {e}: worst error {(err / bound).max().item():.2f}x the bound"
    for r in poison_rows:
        assert not covered[r]
        assert out[r].isnan().all(), f"row {r} belongs to no group: it must not be written"


def test_the_op_launches_the_form_under_test(kernel):
    # A form that silently ran another kernel would test nothing.
    for rows in (1, 1 << 20):
        mma, _, launchers = grouped_gemm_op.launchers(torch.cuda.current_device(), "bf16", "none", 64, rows, 8, False)
        assert mma == FORMS[kernel][0]
        assert [launcher.cluster for launcher in launchers] == [2 if kernel == "wgmma_cluster" else 1] * 2


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(sizes=st.lists(st.sampled_from([0, 1, 7, 64, 127, 128, 129, 300]), min_size=1, max_size=6),
       spare=st.integers(0, 40), n=st.sampled_from([8, 64, 136, 256]), k=st.sampled_from([8, 40, 128, 192, 200, 320]),
       dtype=st.sampled_from(sorted(DTYPES)), seed=st.integers(0, 2**31 - 1))
def test_every_group_against_float64(sizes, spare, n, k, dtype, seed):
    torch_dtype = DTYPES[dtype][0]
    gen = torch.Generator(device="cuda").manual_seed(seed)
    grouped = sum(sizes)
    rows = grouped + spare
    a = torch.randn(rows, k, generator=gen, device="cuda").to(torch_dtype)
    a[grouped:] = float("nan")  # rows of no group: their out rows must stay as they were
    b = torch.randn(len(sizes), n, k, generator=gen, device="cuda").to(torch_dtype)
    offs_host = torch.tensor(sizes).cumsum(0).tolist()
    offs = torch.tensor(offs_host, dtype=torch.int32, device="cuda")
    out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch_dtype)
    assert kgen.ops.grouped_gemm(a, b, offs, out=out) is out
    check(a, b, offs_host, out, range(grouped, rows))


def test_blocks_that_take_many_tiles_with_a_long_k():
    # More tiles than the H200's 132 SMs (272), so each persistent block takes several in turn, and K of nine steps
    # with a tail: what the consumer warpgroups meet from one tile to the next. A hypothesis case above takes a
    # few tiles and K up to 200.
    sizes, spare, n, k = [513, 0, 700, 129, 400], 9, 4096, 520
    gen = torch.Generator(device="cuda").manual_seed(5)
    grouped = sum(sizes)
    rows = grouped + spare
    a = torch.randn(rows, k, generator=gen, device="cuda").to(torch.bfloat16)
    a[grouped:] = float("nan")
    b = torch.randn(len(sizes), n, k, generator=gen, device="cuda").to(torch.bfloat16)
    offs_host = torch.tensor(sizes).cumsum(0).tolist()
    out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    kgen.ops.grouped_gemm(a, b, torch.tensor(offs_host, dtype=torch.int32, device="cuda"), out=out)
    check(a, b, offs_host, out, range(grouped, rows))


def test_a_zero_depth_gives_zeros_in_the_groups_rows():
    a, b = torch.empty(5, 0, device="cuda", dtype=torch.bfloat16), torch.empty(2, 16, 0, device="cuda", dtype=torch.bfloat16)
    out = torch.full((5, 16), float("nan"), device="cuda", dtype=torch.bfloat16)
    kgen.ops.grouped_gemm(a, b, torch.tensor([1, 4], dtype=torch.int32, device="cuda"), out=out)
    assert (out[:4] == 0).all() and out[4].isnan().all()


@pytest.mark.parametrize("offs_host", [[300, 100, 450], [100, 900, 950], [-5, 200, 200]],
                         ids=["decreasing", "past-the-end", "negative"])
def test_hostile_offs_are_clamped(offs_host):
    rows, n, k = 400, 64, 128
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, n, k, device="cuda", dtype=torch.bfloat16)
    out = torch.full((rows, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    kgen.ops.grouped_gemm(a, b, torch.tensor(offs_host, dtype=torch.int32, device="cuda"), out=out)
    groups = groups_of(offs_host, rows)
    poisoned = [r for r in range(rows) if not any(s <= r < e for s, e in groups)]
    check(a, b, offs_host, out, poisoned)


@pytest.mark.parametrize("dtype", sorted(DTYPES))
@pytest.mark.parametrize("n, k", [(256, 128), (136, 40)], ids=["whole-tiles", "tails"])
def test_each_variant(dtype, n, k):
    # 256 x 128 runs the variant without N and K bounds checks, 136 x 40 the one with them.
    torch_dtype = DTYPES[dtype][0]
    sizes = [129, 0, 1, 300]
    a = torch.randn(sum(sizes) + 3, k, device="cuda").to(torch_dtype)
    b = torch.randn(len(sizes), n, k, device="cuda").to(torch_dtype)
    offs_host = torch.tensor(sizes).cumsum(0).tolist()
    out = torch.full((a.shape[0], n), float("nan"), device="cuda", dtype=torch_dtype)
    kgen.ops.grouped_gemm(a, b, torch.tensor(offs_host, dtype=torch.int32, device="cuda"), out=out)
    check(a, b, offs_host, out, range(sum(sizes), a.shape[0]))


def test_offsets_past_two_to_the_31_elements():
    # b holds 9 x 16384 x 16384 elements (4.8 GB): expert 8's weights start past 2^31 elements.
    experts, n, k = 9, 16384, 16384
    b = torch.randn(experts, n, k, device="cuda", dtype=torch.bfloat16)
    a = torch.randn(3 * experts, k, device="cuda", dtype=torch.bfloat16)
    offs_host = [3 * (e + 1) for e in range(experts)]
    out = kgen.ops.grouped_gemm(a, b, torch.tensor(offs_host, dtype=torch.int32, device="cuda"))
    start = offs_host[-2]
    x, w = a[start:].double(), b[-1].double()
    want = x @ w.T
    bound = DTYPES["bf16"][1] * want.abs() + ACCUMULATION * 4 * (x.abs() @ w.abs().T)  # K = 16384: 4x the slack
    assert ((out[start:].double() - want).abs() <= bound).all()


def test_an_out_that_overlaps_an_input_is_refused_by_name():
    a = torch.randn(64, 64, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(1, 64, 64, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="^out: overlaps a in memory"):
        kgen.ops.grouped_gemm(a, b, torch.tensor([64], dtype=torch.int32, device="cuda"), out=a)


def test_nan_stays_in_its_group():
    rows, n, k = 500, 128, 64
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(3, n, k, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([130, 260, 500], dtype=torch.int32, device="cuda")
    clean = kgen.ops.grouped_gemm(a, b, offs)
    poisoned_a = a.clone()
    poisoned_a[5, 3] = float("nan")  # expert 0's row 5
    poisoned_b = b.clone()
    poisoned_b[2, 7, 1] = float("inf")  # expert 2's column 7
    got = kgen.ops.grouped_gemm(poisoned_a, poisoned_b, offs)
    assert got[5].isnan().all()
    assert torch.equal(torch.cat([got[:5], got[6:260]]), torch.cat([clean[:5], clean[6:260]]))
    assert not torch.isfinite(got[260:, 7]).any()
    keep = torch.ones(n, dtype=torch.bool, device="cuda")
    keep[7] = False
    assert torch.equal(got[260:, keep], clean[260:, keep])


@pytest.mark.parametrize("swiglu", [False, True])
def test_the_masked_layout_in_a_graph_replayed_with_new_masked_m(swiglu):
    # DeepGEMM's masked layout for decode: a [E, M_max, K], expert e's first masked_m[e] rows. The grid depends on
    # M_max alone: a graph captured once serves new masked_m (clamped into [0, M_max]); the other rows stay NaN.
    experts, m_max, n, k = 5, 150, 136, 64
    a = torch.randn(experts, m_max, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(experts, 2 * n if swiglu else n, k, device="cuda", dtype=torch.bfloat16)
    masked_m = torch.tensor([3, 0, 150, 129, 1], dtype=torch.int32, device="cuda")
    out = torch.full((experts, m_max, n), float("nan"), device="cuda", dtype=torch.bfloat16)
    call = kgen.ops.grouped_gemm_swiglu if swiglu else kgen.ops.grouped_gemm
    call(a, b, masked_m=masked_m, out=out)  # warm: the kernel loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call(a, b, masked_m=masked_m, out=out)
    masked_m.copy_(torch.tensor([0, 77, 200, -4, 128], dtype=torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    for e, rows in enumerate([0, 77, 150, 0, 128]):
        assert out[e, rows:].isnan().all(), f"expert {e}: rows past masked_m must stay untouched"
        if rows == 0:
            continue
        x, w = a[e, :rows].double(), b[e].double()
        got = out[e, :rows].double()
        if swiglu:  # within the bf16 rounding of silu(g) * u and a small share of the products' magnitudes
            products = x @ w.T
            want = torch.nn.functional.silu(products[:, :n]) * products[:, n:]
            magnitudes = x.abs() @ w.abs().T  # bounds g's and u's accumulation errors, carried through silu(g) u
            sums = torch.maximum(magnitudes[:, :n], magnitudes[:, n:])
            slack = ACCUMULATION * 8 * sums * (1 + products[:, :n].abs() + products[:, n:].abs())
            assert ((got - want).abs() <= DTYPES["bf16"][1] * want.abs() + slack).all(), f"expert {e}"
        else:
            check(a[e], b[e:e + 1], [rows], out[e], range(rows, m_max))


def test_a_graph_replays_with_new_group_sizes_and_compile_matches_eager():
    rows, n, k = 700, 256, 128
    a = torch.randn(rows, k, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(4, n, k, device="cuda", dtype=torch.bfloat16)
    offs = torch.tensor([100, 100, 350, 700], dtype=torch.int32, device="cuda")
    out = torch.empty(rows, n, device="cuda", dtype=torch.bfloat16)
    kgen.ops.grouped_gemm(a, b, offs, out=out)  # warm: the kernel loaded before capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        kgen.ops.grouped_gemm(a, b, offs, out=out)
    new_sizes = [0, 513, 1, 186]
    offs.copy_(torch.tensor(new_sizes, device="cuda").cumsum(0).to(torch.int32))
    out.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    eager = kgen.ops.grouped_gemm(a, b, offs)
    assert torch.equal(out, eager)
    check(a, b, offs.tolist(), out, [])
    compiled = torch.compile(kgen.ops.grouped_gemm, fullgraph=True)(a, b, offs)
    assert torch.equal(compiled, eager)
