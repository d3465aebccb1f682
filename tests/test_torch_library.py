"""kgen's torch.library ops on the CPU: every op under FakeTensorMode (shapes, dtypes, strides), the public
functions' route to them while torch.compile traces, plans rebuilt from their recipes, and the refusal of
tensors that require grad."""

from __future__ import annotations

from unittest import mock

import numpy as np
import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode

import kgen.config
import kgen.ops
from kgen.families import (attention_decode, attention_prefill, gated_delta_rule, grouped_gemm, merge_states,
                           quantize_fp8_blockwise)
from kgen.families.attention_decode import planner as decode_planner
from kgen.families.attention_prefill import planner as prefill_planner
from kgen.families.gated_delta_rule import recipe as chunk_recipe

OPS = (*merge_states.OPS, *attention_prefill.OPS, *attention_decode.OPS, *gated_delta_rule.OPS, *quantize_fp8_blockwise.OPS,
       *grouped_gemm.OPS)

BF16 = torch.bfloat16


def cuda(*shape, dtype=BF16):
    return torch.empty(shape, dtype=dtype, device="cuda")


def assert_like(t: torch.Tensor, shape: tuple, dtype: torch.dtype) -> None:
    assert tuple(t.shape) == shape and t.dtype == dtype and t.device.type == "cuda"
    assert t.is_contiguous(), f"strides {t.stride()} of a result the kernels write densely"


def test_every_op_is_registered():
    assert set(OPS) <= set(dir(torch.ops.kgen))
    schema = str(torch.ops.kgen.gated_delta_rule_step.default._schema)
    assert "Tensor(a5!) state" in schema  # the step declares the state it updates in place
    # The grouped GEMMs write into their results: rows of no group keep what they held.
    out_argument = {"grouped_gemm": 4, "grouped_gemm_swiglu": 4, "grouped_gemm_swiglu_quantize": 4, "grouped_gemm_fp8": 6}
    grouped = set(out_argument)
    for name, position in out_argument.items():
        assert f"Tensor(a{position}!) out" in str(getattr(torch.ops.kgen, name).default._schema), name
    for name in set(OPS) - {"gated_delta_rule_step"} - grouped:
        assert "!" not in str(getattr(torch.ops.kgen, name).default._schema), name


def test_fake_shapes_of_every_op():
    prefill = kgen.ops.plan_attention_varlen([0, 100, 300], [0, 120, 500], head_dim=128, causal=True)
    decode_plan = kgen.ops.plan_attention_decode([1000, 5], num_heads_q=8, num_heads_kv=2, head_dim=128, q_len=3)
    chunk_plan = kgen.ops.plan_chunk_gated_delta_rule([0, 700, 765], num_heads_v=4)
    with FakeTensorMode():
        out, lse = torch.ops.kgen.merge_attention_states(cuda(7, 4, 64), cuda(7, 4, dtype=torch.float32),
                                                          cuda(7, 4, 64), cuda(7, 4, dtype=torch.float32))
        assert_like(out, (7, 4, 64), BF16), assert_like(lse, (7, 4), torch.float32)
        out, lse = torch.ops.kgen.merge_attention_states_n(cuda(3, 7, 4, 64), cuda(3, 7, 4, dtype=torch.float32))
        assert_like(out, (7, 4, 64), BF16), assert_like(lse, (7, 4), torch.float32)
        out, lse = torch.ops.kgen.attention_varlen(cuda(300, 8, 128), cuda(500, 2, 128), cuda(500, 2, 128),
                                                   cuda(3, dtype=torch.int32), cuda(3, dtype=torch.int32),
                                                   cuda(*prefill.work.shape, dtype=torch.int32),
                                                   cuda(3, dtype=torch.int32), None, list(prefill.recipe), None)
        assert_like(out, (300, 8, 128), BF16), assert_like(lse, (8, 300), torch.float32)
        out, lse = torch.ops.kgen.attention_decode(cuda(2, 3, 8, 128), cuda(2, 1000, 2, 128), cuda(2, 1000, 2, 128),
                                                   cuda(2, dtype=torch.int32), None, cuda(8, dtype=torch.float32),
                                                   list(decode_plan.recipe), 0.1)
        assert_like(out, (2, 3, 8, 128), BF16), assert_like(lse, (2, 3, 8), torch.float32)
        tables = [cuda(*t.shape, dtype=torch.int32) for t in
                  (chunk_plan.chunks, chunk_plan.segments, chunk_plan.summary_segments, chunk_plan.chains)]
        recipe = chunk_recipe.ChunkRecipe.of(chunk_plan).ints()
        for final in (True, False):
            o, state, *kept = torch.ops.kgen.chunk_gated_delta_rule(
                cuda(1, 765, 2, 128), cuda(1, 765, 2, 128), cuda(1, 765, 4, 128), cuda(1, 765, 4, dtype=torch.float32),
                cuda(1, 765, 4, dtype=torch.float32), None, cuda(3, dtype=torch.int32), tables, recipe, None, final,
                False, "kv")
            assert_like(o, (1, 765, 4, 128), BF16)
            assert_like(state, (2, 4, 128, 128) if final else (0,), torch.float32)
        # What autograd keeps for the backward (chunk.ForwardKept): Tbeta and the gate cumsums a chunk (11 + 2), the
        # start states a summary (none: this plan does not split).
        assert len(chunk_plan.chunks) == 13 and chunk_plan.num_summaries == 0
        for t, shape, dtype in zip(kept, [(13, 4, 64, 64), (13, 4, 64), (0, 4, 128, 128)], [BF16, *[torch.float32] * 2]):
            assert_like(t, shape, dtype)
        # A split plan: sequence 0's 11 chunks in segments of 4, two summaries, a row each in the summary table.
        split = kgen.ops.plan_chunk_gated_delta_rule([0, 700, 765], num_heads_v=4, segment_chunks=4)
        assert split.num_summaries == 2 == len(split.summary_segments)
        split_tables = [cuda(*t.shape, dtype=torch.int32) for t in
                        (split.chunks, split.segments, split.summary_segments, split.chains)]
        *_, starts = torch.ops.kgen.chunk_gated_delta_rule(
            cuda(1, 765, 2, 128), cuda(1, 765, 2, 128), cuda(1, 765, 4, 128), cuda(1, 765, 4, dtype=torch.float32),
            cuda(1, 765, 4, dtype=torch.float32), None, cuda(3, dtype=torch.int32), split_tables,
            chunk_recipe.ChunkRecipe.of(split).ints(), None, False, False, "kv")
        assert_like(starts, (2, 4, 128, 128), torch.float32)
        # Planned from the shapes (no recipe): B sequences of T tokens, ceil(T / 64) chunks each, and no start
        # states kept, whatever the split (the shapes may be symbolic).
        *_, tbeta, gammas, starts = torch.ops.kgen.chunk_gated_delta_rule(
            cuda(3, 130, 2, 64), cuda(3, 130, 2, 64), cuda(3, 130, 4, 64), cuda(3, 130, 4, dtype=torch.float32),
            cuda(3, 130, 4, dtype=torch.float32), None, None, [], [], None, False, False, "kv")
        assert_like(tbeta, (9, 4, 64, 64), BF16), assert_like(gammas, (9, 4, 64), torch.float32)
        assert_like(starts, (0, 4, 64, 64), torch.float32)

        o = torch.ops.kgen.gated_delta_rule_step(cuda(5, 2, 128), cuda(5, 2, 128), cuda(5, 4, 128),
                                                 cuda(5, 4, dtype=torch.float32), cuda(5, 4, dtype=torch.float32),
                                                 cuda(9, 4, 128, 128, dtype=torch.float32),
                                                 cuda(5, dtype=torch.int32), None, "vk", True)
        assert_like(o, (5, 4, 128), BF16)
        codes, scales = torch.ops.kgen.quantize_fp8_blockwise(cuda(7, 384), 128)
        assert_like(codes, (7, 384), torch.float8_e4m3fn)
        # The scales: [M, K / 128] over MN-major storage, each column block's rows padded to 4 floats.
        assert scales.shape == (7, 3) and scales.stride() == (1, 8) and scales.dtype == torch.float32
        assert torch.ops.kgen.grouped_gemm(cuda(10, 16), cuda(3, 24, 16), cuda(3, dtype=torch.int32), False,
                                           cuda(10, 24)) is None
        assert torch.ops.kgen.grouped_gemm_swiglu(cuda(3, 5, 16), cuda(3, 48, 16), cuda(3, dtype=torch.int32), True,
                                                  cuda(3, 5, 24)) is None


def test_the_chunk_ops_fake_traces_symbolic_shapes():
    # torch.compile marks a dense call's B and T dynamic when they change between calls: the fake must size its
    # outputs (what autograd keeps included) from symbolic shapes, without planning.
    from torch.fx.experimental.proxy_tensor import make_fx

    def call(q, k, v, g, beta):
        return torch.ops.kgen.chunk_gated_delta_rule(q, k, v, g, beta, None, None, [], [], None, True, False, "kv")

    def meta(*shape, dtype=BF16):
        return torch.empty(shape, dtype=dtype, device="meta")

    graph = make_fx(call, tracing_mode="symbolic")(meta(3, 100, 1, 128), meta(3, 100, 1, 128), meta(3, 100, 2, 128),
                                                   meta(3, 100, 2, dtype=torch.float32), meta(3, 100, 2, dtype=torch.float32))
    outputs = next(n for n in graph.graph.nodes if n.op == "output").args[0]
    shapes = [tuple(str(size) for size in node.meta["val"].shape) for node in outputs]
    batch, tokens = shapes[0][:2]
    assert not batch.isdigit() and not tokens.isdigit(), "the trace did not make B and T symbolic"
    assert shapes[2][2:] == ("64", "64") and shapes[4][0] == "0" and shapes[4][2:] == ("128", "128")


def test_public_functions_call_the_ops_while_compiling():
    # torch.compile traces the public functions with is_compiling() true: they must reach torch.ops.kgen
    # (and not the eager path, which reads data pointers that fake tensors do not have).
    with FakeTensorMode(allow_non_fake_inputs=True), mock.patch("torch.compiler.is_compiling", return_value=True), \
            kgen.config.overrides(KGEN_ARCH="sm_90a"):  # the plan's kernel, without asking a GPU
        plan = kgen.ops.plan_attention_varlen([0, 64, 200], [0, 64, 200], head_dim=64)
        plan.tables.adopt("cuda:0", [cuda(*plan.work.shape, dtype=torch.int32), cuda(3, dtype=torch.int32)])  # as device="cuda" would place them
        q, k = cuda(200, 4, 64), cuda(200, 2, 64)
        cu = cuda(3, dtype=torch.int32)
        out, lse = kgen.ops.attention_varlen(q, k, k, cu, cu, plan=plan, return_lse=True)
        assert_like(out, (200, 4, 64), BF16)
        assert_like(lse, (4, 200), torch.float32)
        with pytest.raises(ValueError, match="pass a plan"):
            kgen.ops.attention_varlen(q, k, k, cu, cu)
        with pytest.raises(ValueError, match="window"):
            kgen.ops.attention_varlen(q, k, k, cu, cu, causal=True, plan=plan)
        dplan = kgen.ops.plan_attention_decode([300, 40], num_heads_q=4, num_heads_kv=2, head_dim=64)
        out = kgen.ops.attention_decode(cuda(2, 4, 64), cuda(2, 300, 2, 64), cuda(2, 300, 2, 64),
                                        cuda(2, dtype=torch.int32), plan=dplan)
        assert_like(out, (2, 4, 64), BF16)
        o, final = kgen.ops.chunk_gated_delta_rule(cuda(2, 64, 1, 128), cuda(2, 64, 1, 128), cuda(2, 64, 2, 128),
                                                   cuda(2, 64, 2, dtype=torch.float32), cuda(2, 64, 2),
                                                   output_final_state=False)
        assert_like(o, (2, 64, 2, 128), BF16)
        assert final is None
        merged, _ = kgen.ops.merge_attention_states_n(cuda(2, 5, 3, 64), cuda(2, 5, 3, dtype=torch.float32))
        assert_like(merged, (5, 3, 64), BF16)
        codes, scales = kgen.ops.quantize_fp8_blockwise(cuda(4, 256))
        assert_like(codes, (4, 256), torch.float8_e4m3fn)
        assert scales.shape == (4, 2) and scales.stride() == (1, 4)
        assert_like(kgen.ops.grouped_gemm(cuda(10, 16), cuda(3, 24, 16), cuda(3, dtype=torch.int32)), (10, 24), BF16)
        assert_like(kgen.ops.grouped_gemm_swiglu(cuda(10, 16), cuda(3, 48, 16), cuda(3, dtype=torch.int32)), (10, 24), BF16)
        out, codes, scales = kgen.ops.grouped_gemm_swiglu(cuda(10, 16), cuda(3, 256, 16), cuda(3, dtype=torch.int32),
                                                          quantize_out=True)
        assert_like(out, (10, 128), BF16), assert_like(codes, (10, 128), torch.float8_e4m3fn)
        assert scales.shape == (10, 1) and scales.stride() == (1, 12)
        masked = kgen.ops.grouped_gemm(cuda(3, 5, 16), cuda(3, 24, 16), masked_m=cuda(3, dtype=torch.int32))
        assert_like(masked, (3, 5, 24), BF16)
        fp8 = torch.float8_e4m3fn  # FP8 inputs give bf16
        assert_like(kgen.ops.grouped_gemm(cuda(10, 256, dtype=fp8), cuda(3, 128, 256, dtype=fp8), cuda(3, dtype=torch.int32),
                                          a_scale=cuda(10, 2, dtype=torch.float32), b_scale=cuda(3, 1, 2, dtype=torch.float32)),
                    (10, 128), BF16)


def test_plans_rebuilt_from_their_recipes_are_the_same():
    prefill = kgen.ops.plan_attention_varlen([0, 1, 300, 301], [0, 5, 900, 901], head_dim=128, causal=True,
                                             window=(50, -1), tail="cp_async")
    work, plan_cu = (t.clone() for t in prefill.tables.on(torch.device("cpu")))
    again = prefill_planner.plan_from_recipe(prefill.recipe, work, plan_cu)
    assert again.variant == prefill.variant and again.window == prefill.window and again.work is work
    assert np.array_equal(again.schedule.work, prefill.schedule.work)
    chunk_plan = kgen.ops.plan_chunk_gated_delta_rule([0, 32768, 32803], num_heads_v=8)  # a recipe no other test made
    assert len(chunk_plan.segments) > 2  # split: the recipe must carry the planner's choice
    tables = [torch.from_numpy(np.ascontiguousarray(t)) for t in
              (chunk_plan.chunks, chunk_plan.segments, chunk_plan.summary_segments, chunk_plan.chains)]
    again = chunk_recipe.plan_from_recipe(tuple(chunk_recipe.ChunkRecipe.of(chunk_plan).ints()), tables)
    for name in ("chunks", "segments", "summary_segments", "chains"):
        assert np.array_equal(getattr(again, name), getattr(chunk_plan, name)), name
    assert again.tables.on(torch.device("cpu"))[1] is tables[1]
    for kw in (dict(page_size=16), dict(page_size=5), dict(max_seqlen_k=9000, window_left=100), dict(q_len=4)):
        plan = kgen.ops.plan_attention_decode([3000, 17], num_heads_q=8, num_heads_kv=2, head_dim=128, **kw)
        with mock.patch.object(decode_planner, "kept_allocations"):  # needs a GPU
            again = decode_planner.plan_from_recipe(plan.recipe, torch.device("cpu"))
        assert (again.variant, again.splits, again.grid, again.max_seqlen_k) == \
            (plan.variant, plan.splits, plan.grid, plan.max_seqlen_k), kw


@pytest.mark.parametrize("call", ["merge", "merge_n", "varlen", "decode", "step", "quantize", "grouped_gemm", "swiglu"])
def test_tensors_that_require_grad_are_refused(call):
    x = torch.zeros(2, 2, 2, 2, requires_grad=True)
    calls = {
        "merge": lambda: kgen.ops.merge_attention_states(x[0], x[0, 0], x[0], x[0, 0]),
        "merge_n": lambda: kgen.ops.merge_attention_states_n(x, x[0]),
        "varlen": lambda: kgen.ops.attention_varlen(x[0], x[0], x[0], None, None),
        "decode": lambda: kgen.ops.attention_decode(x[0], x, x, None),
        "step": lambda: kgen.ops.gated_delta_rule_step(x[0], x[0], x[0], x[0, 0], x[0, 0], x),
        "quantize": lambda: kgen.ops.quantize_fp8_blockwise(x[0, 0]),
        "grouped_gemm": lambda: kgen.ops.grouped_gemm(x[0, 0], x[0], x[0, 0, 0]),
        "swiglu": lambda: kgen.ops.grouped_gemm_swiglu(x[0, 0], x[0], x[0, 0, 0]),
    }
    with pytest.raises(RuntimeError, match="no backward"):
        calls[call]()
    with torch.no_grad(), pytest.raises((TypeError, ValueError)):  # past the grad check: CPU tensors are refused
        calls[call]()


def test_a_differentiable_chunk_call_is_checked_like_any_other():
    # chunk_gated_delta_rule has a backward: tensors that require grad pass the grad check and meet the same
    # argument checks (here: CPU tensors), and a preallocated out cannot take a result that requires grad.
    x = torch.zeros(1, 2, 2, 128, requires_grad=True)
    with pytest.raises((TypeError, ValueError), match="^q: "):
        kgen.ops.chunk_gated_delta_rule(x, x, x, x[..., 0], x[..., 0])
    with pytest.raises(ValueError, match="^out: "):
        kgen.ops.chunk_gated_delta_rule(x, x, x, x[..., 0], x[..., 0], out=torch.empty(1, 2, 2, 128))
    with pytest.raises(ValueError, match="^per_chunk: "):
        kgen.ops.chunk_gated_delta_rule_bwd(x, x, x, x[..., 0], x[..., 0], x, per_chunk="triton")
    # Without per_chunk, the KGEN_GDN_BACKWARD setting names the path, and a value that is none is refused by name.
    with kgen.config.overrides(KGEN_GDN_BACKWARD="triton"), pytest.raises(kgen.config.SettingError,
                                                                             match="^KGEN_GDN_BACKWARD: 'triton'"):
        kgen.ops.chunk_gated_delta_rule_bwd(x, x, x, x[..., 0], x[..., 0], x)


@pytest.mark.filterwarnings("ignore:Accessing the data pointer of FakeTensor")  # good tensors' alignment checks
def test_the_backward_refuses_kept_tensors_that_are_not_the_forwards_by_name():
    plan = kgen.ops.plan_chunk_gated_delta_rule([0, 130], num_heads_v=2, segment_chunks=1)  # 3 chunks, 2 summaries
    Kept = gated_delta_rule.chunk.ForwardKept
    with FakeTensorMode():
        q = cuda(1, 130, 1, 128)
        good = Kept(cuda(3, 2, 64, 64), cuda(3, 2, 64, dtype=torch.float32), cuda(2, 2, 128, 128, dtype=torch.float32))
        cases = [(tuple(good), "^forward_kept: expected a ForwardKept"),
                 (good._replace(start_states=cuda(1, 2, 64, 128, dtype=torch.float32)), r"^forward_kept\.start_states: "),
                 (good._replace(tbeta=cuda(2, 2, 64, 64)), r"^forward_kept\.tbeta: "),
                 (good._replace(tbeta=cuda(3, 2, 64, 64, dtype=torch.float32)), r"^forward_kept\.tbeta: "),
                 (good._replace(gamma_log2=cuda(3, 2, 64)), r"^forward_kept\.gamma_log2: "),
                 (good._replace(gamma_log2=cuda(3, 64, 2, dtype=torch.float32).transpose(1, 2)), r"^forward_kept\.gamma_log2: "),
                 (good._replace(start_states=cuda(1, 2, 128, 128, dtype=torch.float32)), r"^forward_kept\.start_states: ")]
        for kept, message in cases:
            with pytest.raises((TypeError, ValueError), match=message):
                gated_delta_rule.backward.check_forward_kept(kept, plan, q, 2)
        gated_delta_rule.backward.check_forward_kept(good, plan, q, 2)
        # No start states kept (a call planned from the shapes): the backward runs the summaries again.
        gated_delta_rule.backward.check_forward_kept(good._replace(start_states=cuda(0, 2, 128, 128, dtype=torch.float32)),
                                                     plan, q, 2)


def test_autograd_leaves_the_gdn_backward_path_to_the_setting():
    with kgen.config.overrides(KGEN_GDN_BACKWARD=None):  # unset, whatever the environment says
        assert kgen.config.gdn_backward() == "kernel"
    with kgen.config.overrides(KGEN_GDN_BACKWARD="torch"):
        assert kgen.config.gdn_backward() == "torch"
    # The backward op (what autograd calls) names no path, so the setting decides it for every training step.
    q = torch.zeros(1, 2, 2, 128)
    grads = (q, q, q, q[..., 0], q[..., 0], torch.zeros(0))
    library = gated_delta_rule.library
    with mock.patch.object(library, "_plan_of"), \
         mock.patch.object(library.backward, "chunk_gated_delta_rule_bwd",
                           side_effect=lambda *a, **k: tuple(t.clone() for t in grads)) as backward:  # no aliases
        torch.ops.kgen.chunk_gated_delta_rule_bwd(q, q, q, q[..., 0], q[..., 0], q, None, None, None, [], [], None,
                                                  False, "kv")
    assert backward.call_count == 1 and "per_chunk" not in backward.call_args.kwargs


@pytest.mark.parametrize("planned", [True, False], ids=["a plan's recipe", "planned from the shapes"])
def test_autograd_gives_the_backward_what_the_forward_kept(planned):
    # The forward op returns chunk.ForwardKept's tensors; autograd keeps them (as FlashQLA keeps its A and start
    # states) and hands them to the backward, which then does not compute them again. Without a plan
    # (torch.compile's dense call) the recipe is an empty list, whose gradient must be one too.
    tables, recipe = ([torch.zeros(1, 2, dtype=torch.int32)] * 4, [2, 128, 64, 1, 0, 0, 64]) if planned else ([], [])
    q = torch.randn(1, 64, 2, 128, requires_grad=True)
    library = gated_delta_rule.library
    kept = library.chunk.ForwardKept(torch.randn(1, 2, 64, 64), torch.randn(1, 2, 64), torch.randn(0, 2, 128, 128))
    seen = {}

    def backward(*args, **kwargs):
        seen.update(kwargs)
        return tuple(torch.zeros_like(t) for t in args[:5]) + (None,)

    with mock.patch.object(library, "_plan_of"), \
         mock.patch.object(library.chunk, "forward_keeping",
                           side_effect=lambda *a, **k: (torch.zeros(1, 64, 2, 128), None, library.chunk.ForwardKept(
                               *(t.clone() for t in kept)))), \
         mock.patch.object(library.backward, "chunk_gated_delta_rule_bwd", side_effect=backward):
        o, *_ = torch.ops.kgen.chunk_gated_delta_rule(q, q, q, q[..., 0], q[..., 0], None, None, tables, recipe, None,
                                                      False, False, "kv")
        o.sum().backward()
    assert isinstance(seen["forward_kept"], library.chunk.ForwardKept)
    assert all(torch.equal(a, b) for a, b in zip(seen["forward_kept"], kept))
    assert q.grad is not None
