"""kgen's ops inside compiled programs, on the GPU: torch.compile(fullgraph=True) of a small function per op
matches eager bitwise, also as CUDA graphs (mode="reduce-overhead"), and torch.library.opcheck passes."""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

import kgen.ops as ops  # noqa: E402


def randn(*shape, dtype=torch.bfloat16):
    return torch.randn(shape, device="cuda", dtype=dtype)


def lse(*shape):
    return torch.empty(shape, device="cuda").uniform_(-5, 5)


def merge_case():
    def f(v_a, l_a, v_b, l_b):
        out, out_lse = ops.merge_attention_states(v_a * 2, l_a, v_b, l_b)
        return out, out_lse + 1
    return f, (randn(64, 8, 128), lse(64, 8), randn(64, 8, 128), lse(64, 8))


def merge_n_case():
    def f(v, l):
        return ops.merge_attention_states_n(v, l)
    return f, (randn(3, 64, 8, 128), lse(3, 64, 8))


def varlen_case():
    cu_host = [0, 100, 137]
    plan = ops.plan_attention_varlen(cu_host, cu_host, head_dim=128, causal=True, device="cuda")
    cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
    sink = torch.randn(8, device="cuda")

    def f(q, k, v):
        out, out_lse = ops.attention_varlen(q, k, v, cu, cu, causal=True, sink=sink, return_lse=True, plan=plan)
        return out * 2, out_lse  # elementwise work around the op: bitwise the same compiled or not
    return f, (randn(137, 8, 128), randn(137, 2, 128), randn(137, 2, 128))


def decode_case(paged: bool):
    lengths = [500, 17, 2000]
    page = 16 if paged else None
    plan = ops.plan_attention_decode(lengths, num_heads_q=8, num_heads_kv=2, head_dim=128, q_len=2, page_size=page,
                                     device="cuda")
    assert plan.splits.max_splits > 1  # the in-kernel merge runs too
    seqlens = torch.tensor(lengths, dtype=torch.int32, device="cuda")
    if paged:
        table = torch.randperm(3 * 125, device="cuda", dtype=torch.int32).view(3, 125)
        cache = randn(3 * 125, 16, 2, 2, 128)  # k and v interleaved
    else:
        table, cache = None, randn(3, 2000, 2, 2, 128)

    def f(q, kv):
        return ops.attention_decode(q, kv[:, :, 0], kv[:, :, 1], seqlens, block_table=table, plan=plan, return_lse=True)
    return f, (randn(3, 2, 8, 128), cache)


def chunk_case(varlen: bool):
    if varlen:
        cu_host = [0, 300, 365]
        plan = ops.plan_chunk_gated_delta_rule(cu_host, num_heads_v=4, segment_chunks=2, device="cuda")
        cu = torch.tensor(cu_host, dtype=torch.int32, device="cuda")
        shape = (1, 365)
    else:
        plan, cu, shape = None, None, (2, 64)
    sequences = 2

    def f(q, k, v, g, beta, h0):
        return ops.chunk_gated_delta_rule(q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=cu,
                                          use_qk_l2norm_in_kernel=True, plan=plan)
    g = -torch.rand(*shape, 4, device="cuda")
    return f, (randn(*shape, 2, 128), randn(*shape, 2, 128), randn(*shape, 4, 128), g,
               torch.rand(*shape, 4, device="cuda"), torch.randn(sequences, 4, 128, 128, device="cuda") * 0.1)


def step_case():
    slots = torch.tensor([5, -1, 0, 2], dtype=torch.int32, device="cuda")

    def f(q, k, v, g, beta, state):
        return ops.gated_delta_rule_step(q, k, v, g, beta, state, state_indices=slots, use_qk_l2norm_in_kernel=True)
    return f, (randn(4, 2, 128), randn(4, 2, 128), randn(4, 4, 128), -torch.rand(4, 4, device="cuda"),
               torch.rand(4, 4, device="cuda"), torch.randn(6, 4, 128, 128, device="cuda"))


CASES = {"merge": merge_case, "merge_n": merge_n_case, "varlen": varlen_case,
         "decode": lambda: decode_case(False), "decode_paged": lambda: decode_case(True),
         "chunk": lambda: chunk_case(True), "chunk_fixed": lambda: chunk_case(False), "step": step_case}


def flat(result):
    return [t for t in (result if isinstance(result, tuple) else (result,)) if t is not None]


def run(fn, args):
    """``fn`` on fresh copies of ``args`` (the step updates its state in place); the results, then the args."""
    copies = tuple(a.clone() for a in args)
    return flat(fn(*copies)) + list(copies)


def assert_bitwise(got, expected):
    assert len(got) == len(expected)
    for g, e in zip(got, expected):
        assert g.shape == e.shape and g.dtype == e.dtype and g.stride() == e.stride()
        assert torch.equal(g, e), "compiled and eager results differ"


@pytest.mark.parametrize("name,mode", [(name, None) for name in CASES] +
                         [(name, "reduce-overhead") for name in ("varlen", "decode_paged", "chunk", "chunk_fixed", "step")])
def test_compiled_matches_eager_bitwise(name, mode):
    torch._dynamo.reset()
    fn, args = CASES[name]()
    with torch.no_grad():
        expected = run(fn, args)
        compiled = torch.compile(fn, fullgraph=True, mode=mode)
        for _ in range(3):  # reduce-overhead: warm-up, record, replay
            assert_bitwise(run(compiled, args), expected)


def op_arguments(name):
    """(op, args) of the torch.ops.kgen op each case's function calls, on the case's inputs."""
    calls = []

    class Recorded(Exception):
        pass

    def record(op):
        def recorded(*args):
            calls.append((op, args))
            raise Recorded  # the op itself would route back here while is_compiling() is patched
        return recorded
    fn, args = CASES[name]()
    names = {"merge": "merge_attention_states", "merge_n": "merge_attention_states_n", "varlen": "attention_varlen",
             "decode": "attention_decode", "decode_paged": "attention_decode", "chunk": "chunk_gated_delta_rule",
             "chunk_fixed": "chunk_gated_delta_rule", "step": "gated_delta_rule_step"}
    op = getattr(torch.ops.kgen, names[name])
    from unittest import mock
    with mock.patch("torch.compiler.is_compiling", return_value=True), \
            mock.patch.object(torch.ops.kgen, names[name], record(op)), torch.no_grad(), \
            pytest.raises(Recorded):
        fn(*(a.clone() for a in args))
    assert len(calls) == 1
    return calls[0]


@pytest.mark.parametrize("name", CASES)
def test_opcheck(name):
    op, args = op_arguments(name)
    torch.library.opcheck(op.default, args)
