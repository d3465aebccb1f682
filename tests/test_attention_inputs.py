"""attention_varlen and its planner on the host: variant choice and input checks, no GPU needed."""

import math

import numpy as np
import pytest
import torch

from kgen import config, registry
from kgen.registry import UnsupportedVariantError
from kgen.families.attention_prefill import op, planner
from kgen.families.attention_prefill.recipe import AttentionRecipe
from kgen.ops import attention_varlen, plan_attention_varlen
from kgen.runtime.checks import softmax_scale_log2


def spec_tiles(head_dim: int, dtype: str = "bf16") -> dict:
    return registry.current().family("attention_prefill").select(
        head_dim=head_dim, dtype=dtype, has_incomplete_tile=True).param_dict


@pytest.mark.parametrize("head_dim", [64, 128])
def test_full_tile_batches_plan_the_full_tiles_variant(head_dim):
    tiles = spec_tiles(head_dim)
    step = math.lcm(tiles["tile_m"], tiles["tile_n"])  # whole query and key tiles
    full = plan_attention_varlen([0, step, 3 * step], [0, 2 * step, 2 * step], head_dim=head_dim)
    assert not full.has_incomplete_tile
    assert full.variant.param_dict["has_incomplete_tile"] is False
    assert {k: v for k, v in full.variant.params if k != "has_incomplete_tile"} == \
        {k: v for k, v in tiles.items() if k != "has_incomplete_tile"}
    partial = plan_attention_varlen([0, step, 3 * step - 1], [0, 2 * step, 2 * step], head_dim=head_dim)
    assert partial.has_incomplete_tile and partial.variant.param_dict["has_incomplete_tile"] is True


def test_work_list_covers_every_query_tile_longest_first():
    tile_m = spec_tiles(128)["tile_m"]
    plan = plan_attention_varlen([0, 3 * tile_m, 3 * tile_m + 1], [0, 3 * tile_m, 3 * tile_m + 1], head_dim=128,
                                 causal=True, tile_m=tile_m)
    assert plan.work.dtype == torch.int32 and plan.work.shape == (4, 6)
    # Each item: sequence, query tile, and the sequence's query and key bounds the kernel checks cu_seqlens against.
    end = 3 * tile_m
    assert sorted(map(tuple, plan.work.tolist())) == [(0, 0, 0, end, 0, end), (0, 1, 0, end, 0, end),
                                                      (0, 2, 0, end, 0, end), (1, 0, end, end + 1, end, end + 1)]
    assert tuple(plan.work[0, :2].tolist()) == (0, 2)  # the causal tile with the most keys goes first


def tile_heights(head_dim: int, tail: str | None = None) -> list[int]:
    """The tile heights a plan for sm_90 (what plans without a GPU target) chooses among for ``head_dim``,
    in the spec's order of preference."""
    return [v.param_dict["tile_m"] for v in planner.tile_candidates(head_dim, torch.bfloat16, tail, None, 90)]


def test_plans_without_a_gpu_take_the_first_kernel_the_arch_runs():
    family = registry.current().family("attention_prefill")
    assert [v.param_dict["mma"] for v in family.variants[:1]] == ["wgmma"]
    on_hopper = [v.param_dict["mma"] for v in planner.tile_candidates(128, torch.bfloat16, None, None, 90)]
    assert on_hopper[0] == "wgmma" and set(on_hopper) == {"wgmma", "mma_sync"}
    # Long sequences take wgmma's first shape; a 64-token causal prompt wgmma's 64x64 tiles (one warpgroup, three
    # blocks an SM), a quarter of the scores of its 128x128 ones, and at a lower cost per score than mma_sync's 64x64.
    assert plan_attention_varlen([0, 8192], [0, 8192], head_dim=128).variant.param_dict["mma"] == "wgmma"
    short = plan_attention_varlen([0, 64], [0, 64], head_dim=128, causal=True).variant.param_dict
    assert (short["mma"], short["tile_m"], short["tile_n"], short["min_blocks_per_sm"]) == ("wgmma", 64, 64, 3)
    # Under tail="cp_async" (mma_sync only at head dim 128) it takes mma_sync's 64x64 tiles.
    short = plan_attention_varlen([0, 64], [0, 64], head_dim=128, causal=True, tail="cp_async").variant.param_dict
    assert (short["mma"], short["tile_m"], short["tile_n"]) == ("mma_sync", 64, 64)
    # Newer GPUs have no wgmma: they run the mma.sync kernel.
    assert {v.param_dict["mma"] for v in planner.tile_candidates(128, torch.bfloat16, None, None, 100)} == {"mma_sync"}
    with config.overrides(KGEN_ARCH="sm_100a"):
        assert plan_attention_varlen([0, 256], [0, 256], head_dim=128).variant.param_dict["mma"] == "mma_sync"
    assert plan_attention_varlen([0, 256], [0, 256], head_dim=128).variant.param_dict["mma"] == "wgmma"


@pytest.mark.parametrize("head_dim", [32, 64, 128, 256])
def test_long_sequences_take_the_first_tile_shape_and_short_ones_the_smallest(head_dim):
    heights = tile_heights(head_dim)
    first, smallest = heights[0], min(heights)
    long = plan_attention_varlen([0, 64 * first, 128 * first], [0, 64 * first, 128 * first], head_dim=head_dim)
    assert long.variant.param_dict["tile_m"] == first
    short = plan_attention_varlen([0, smallest - 1, 2 * smallest - 2], [0, 5, 10], head_dim=head_dim)
    assert short.variant.param_dict["tile_m"] == smallest
    assert short.has_incomplete_tile and short.variant.param_dict["has_incomplete_tile"] is True


@pytest.mark.parametrize("head_dim", registry.current().family("attention_prefill").supported("head_dim"))
def test_every_tile_shape_has_its_full_tiles_twin(head_dim):
    candidates = planner.tile_candidates(head_dim, torch.bfloat16, None, None, 90)
    step = math.lcm(*(v.param_dict[t] for v in candidates for t in ("tile_m", "tile_n")))  # every tile is whole
    for tile_m in tile_heights(head_dim):
        plan = plan_attention_varlen([0, step, 3 * step], [0, step, 3 * step], head_dim=head_dim,
                                     tile_m=tile_m)
        params = plan.variant.param_dict
        assert params["tile_m"] == tile_m and params["has_incomplete_tile"] is False
        assert (plan.schedule.tile_m, plan.schedule.tile_n) == (params["tile_m"], params["tile_n"])


def test_the_cp_async_tail_runs_only_the_shapes_that_offer_it():
    offered = tile_heights(128, tail="cp_async")
    assert 128 not in offered  # the spec excludes it at head dim 128: it spills
    long = plan_attention_varlen([0, 8192], [0, 8192], head_dim=128, tail="cp_async")
    assert long.variant.param_dict["tile_m"] in offered and long.variant.param_dict["tail"] == "cp_async"
    with pytest.raises(UnsupportedVariantError, match=r"tile_m=128 is not supported.*supported: \[64\]"):
        plan_attention_varlen([0, 8192], [0, 8192], head_dim=128, tail="cp_async", tile_m=128)



def test_a_recipe_reads_back_by_name_and_plans_the_same_again():
    cu_q, cu_k = [0, 1, 300, 301], [0, 5, 900, 901]
    plan = plan_attention_varlen(cu_q, cu_k, head_dim=128, dtype=torch.float16, causal=True, window=(50, -1),
                                 tail="cp_async")
    recipe = AttentionRecipe(list(plan.recipe))  # as torch.library hands it to the op
    params = plan.variant.param_dict
    assert (recipe.head_dim, recipe.dtype, recipe.causal, recipe.window, recipe.num_seqs) == \
        (128, torch.float16, True, (50, -1), 3)
    assert (recipe.tail, recipe.tile_m, recipe.tile_n, recipe.mma, recipe.rows) == \
        ("cp_async", params["tile_m"], params["tile_n"], params["mma"], params["rows"])
    assert (recipe.cu_seqlens_q, recipe.cu_seqlens_k) == (cu_q, cu_k)
    work, plan_cu = (t.clone() for t in plan.tables.on(torch.device("cpu")))
    again = planner.plan_from_recipe(recipe, work, plan_cu)
    assert again.variant == plan.variant and again.window == plan.window and again.work is work
    assert np.array_equal(again.schedule.work, plan.schedule.work)
    assert planner.plan_from_recipe(AttentionRecipe(list(plan.recipe)), work, plan_cu) is again  # made once


def test_packed_rows_are_refused_where_they_cannot_run():
    with pytest.raises(ValueError, match="rows: 'packed' needs self-attention"):
        plan_attention_varlen([0, 65, 130], [0, 65, 131], head_dim=128, causal=True, rows="packed")
    with pytest.raises(ValueError, match="rows: 'packed' needs self-attention"):
        plan_attention_varlen([0, 65, 130], [0, 65, 130], head_dim=128, window=(16, 0), rows="packed")
    with pytest.raises(ValueError, match="rows: expected"):
        plan_attention_varlen([0, 65, 130], [0, 65, 130], head_dim=128, rows="tokens")


def test_the_planner_packs_where_that_computes_fewer_scores():
    for length, rows in ((65, "packed"), (64, "per_sequence"), (32, "packed"), (128, "per_sequence")):
        cu = [length * i for i in range(2017)]
        plan = plan_attention_varlen(cu, cu, head_dim=128, causal=True)
        assert plan.variant.param_dict["rows"] == rows, length


def test_packed_items_take_causality_from_the_merged_window():
    """causal=False with window (-1, 0) is causal: its packed items end their keys at their last token."""
    cu = [65 * i for i in range(5)]
    as_window = plan_attention_varlen(cu, cu, head_dim=128, window=(-1, 0), rows="packed")
    as_flag = plan_attention_varlen(cu, cu, head_dim=128, causal=True, rows="packed")
    assert np.array_equal(as_window.schedule.work, as_flag.schedule.work)
    assert (as_window.schedule.work[:, 5] == as_window.schedule.work[:, 3]).all()  # k1 = t1


def test_a_packed_plan_reads_back_from_its_recipe():
    cu = [0, 65, 130, 195]
    plan = plan_attention_varlen(cu, cu, head_dim=128, causal=True, rows="packed")
    assert plan.variant.param_dict["rows"] == "packed" and plan.schedule.packed
    recipe = AttentionRecipe(list(plan.recipe))
    assert recipe.rows == "packed"
    again = planner.plan_from_recipe(recipe, *(t.clone() for t in plan.tables.on(torch.device("cpu"))))
    assert again.variant == plan.variant and np.array_equal(again.schedule.work, plan.schedule.work)

USER_SHAPE = """
family: attention_prefill
axes:
  dtype: [bf16]
  tail: [tma]
  has_incomplete_tile: [true, false]
configs:
  - {mma: wgmma, head_dim: 128, tile_m: 128, tile_n: 64, num_warps: 8, min_blocks_per_sm: 1}
"""


def test_a_user_spec_tile_shape_leads_the_planners_preference(tmp_path):
    (tmp_path / "shape.yaml").write_text(USER_SHAPE.lstrip(), encoding="utf-8")
    with config.overrides(KGEN_SPEC_PATH=str(tmp_path)):
        plan = plan_attention_varlen([0, 8192], [0, 8192], head_dim=128)
        assert (plan.variant.param_dict["tile_m"], plan.variant.param_dict["tile_n"]) == (128, 64)
        assert plan.variant.spec_path == tmp_path / "shape.yaml"
        # 64 queries over 128 keys take the built-in 64-row tiles: the user's 128x64 computes twice as many scores.
        short = plan_attention_varlen([0, 64], [0, 128], head_dim=128)
        assert short.variant.param_dict["tile_m"] == 64 and short.variant.spec_path != tmp_path / "shape.yaml"
    assert plan_attention_varlen([0, 8192], [0, 8192], head_dim=128).variant.param_dict["tile_n"] == spec_tiles(128)["tile_n"]


def test_a_forced_tile_height_must_be_one_the_spec_lists():
    for tile_m in tile_heights(128):
        assert plan_attention_varlen([0, 5], [0, 5], head_dim=128,
                                     tile_m=tile_m).variant.param_dict["tile_m"] == tile_m
    with pytest.raises(UnsupportedVariantError, match=r"tile_m=48 is not supported.*supported: \["):
        plan_attention_varlen([0, 5], [0, 5], head_dim=128, tile_m=48)


@pytest.mark.parametrize("tail", ["cp_async", "tma"])
def test_tail_policy_can_be_chosen_per_plan(tail):
    plan = plan_attention_varlen([0, 5], [0, 5], head_dim=64, tail=tail)
    assert plan.variant.param_dict["tail"] == tail


def test_the_spec_default_tail_policy_is_used_without_a_choice():
    default = registry.current().family("attention_prefill").defaults["tail"]
    assert plan_attention_varlen([0, 5], [0, 5], head_dim=64).variant.param_dict["tail"] == default


def test_unsupported_head_dim_lists_the_supported_ones():
    with pytest.raises(ValueError, match=r"head_dim=72 is not supported.*supported: \["):
        plan_attention_varlen([0, 5], [0, 5], head_dim=72)


def test_planner_refuses_bad_cu_seqlens_and_windows():
    with pytest.raises(ValueError, match="cu_seqlens_k: expected 3 entries"):
        plan_attention_varlen([0, 5, 9], [0, 5], head_dim=64)
    with pytest.raises(ValueError, match="non-decreasing"):
        plan_attention_varlen([0, 5, 4], [0, 5, 9], head_dim=64)
    with pytest.raises(ValueError, match=r"window\[0\]"):
        plan_attention_varlen([0, 5], [0, 5], head_dim=64, window=(-2, 0))
    with pytest.raises(TypeError, match="dtype"):
        plan_attention_varlen([0, 5], [0, 5], head_dim=64, dtype=torch.float32)


def test_cpu_tensors_are_refused_by_name():
    q = torch.randn(5, 4, 64, dtype=torch.bfloat16)
    cu = torch.tensor([0, 5], dtype=torch.int32)
    with pytest.raises(ValueError, match="q: expected a CUDA tensor"):
        attention_varlen(q, q, q, cu, cu)


@pytest.mark.parametrize("cu", [[0, 2**40], [0, 2**63], [0, 2**31], [0, 2**30, 2**31 + 5]])
def test_lengths_past_int32_indexing_are_refused(cu):
    with pytest.raises(ValueError, match="cu_seqlens_q"):
        plan_attention_varlen(cu, cu, head_dim=128)


@pytest.mark.parametrize("window", [(2**31, -1), (-1, 2**31), (2**40, 0)])
def test_windows_past_int32_are_refused(window):
    with pytest.raises(ValueError, match=r"window\["):
        plan_attention_varlen([0, 10], [0, 10], head_dim=128, window=window)


@pytest.mark.parametrize("scale, error", [("abc", TypeError), (True, TypeError), (None.__class__, TypeError),
                                          (float("nan"), ValueError), (float("inf"), ValueError), (0.0, ValueError),
                                          (-0.5, ValueError), (1e39, ValueError), (1e-46, ValueError)])
def test_softmax_scale_must_be_a_finite_positive_fp32(scale, error):
    with pytest.raises(error, match="softmax_scale"):
        softmax_scale_log2(scale, 128)


def test_softmax_scale_default_and_given():
    assert softmax_scale_log2(None, 64) == np.float32(1.4426950408889634 / 8)
    assert softmax_scale_log2(0.5, 64) == np.float32(0.5 * 1.4426950408889634)


def test_plan_of_the_wrong_type_names_plan():
    t = torch.zeros((4, 2, 64), dtype=torch.bfloat16)
    cu = torch.tensor([0, 4], dtype=torch.int32)
    with pytest.raises(TypeError, match="plan: expected an AttentionPlan"):
        attention_varlen(t, t, t, cu, cu, plan={"work": None})


def test_plans_are_made_on_the_host_and_placed_on_first_use():
    plan = plan_attention_varlen([0, 100, 300], [0, 100, 300], head_dim=128, causal=True)
    assert plan.work.device.type == "cpu"  # no GPU needed to plan
    assert plan.work_on(torch.device("meta")).device.type == "meta"  # moved on first use
    with pytest.raises(ValueError, match="plan: its work list is on meta"):
        plan.work_on(torch.device("cpu"))


def test_a_plan_asked_to_live_on_the_cpu_is_refused_by_its_argument():
    # A plan runs on a CUDA device; device="cpu" was accepted once and gave a plan every call refused.
    with pytest.raises(ValueError, match="^device: plans run on a CUDA device, got cpu"):
        plan_attention_varlen([0, 100], [0, 100], head_dim=128, device="cpu")


def test_a_window_side_wider_than_every_sequence_reaches_the_kernel_as_unbounded():
    assert op.kernel_window((2**31 - 1, 2**31 - 1), 100, 300) == (-1, -1)
    assert op.kernel_window((300, 100), 100, 300) == (-1, -1)
    assert op.kernel_window((299, 99), 100, 300) == (299, 99)
    assert op.kernel_window((-1, 0), 100, 300) == (-1, 0)


def test_query_and_key_lengths_together_past_int32_are_refused():
    half = 2**30 + 1
    with pytest.raises(ValueError, match="query and key tokens together"):
        plan_attention_varlen([0, half], [0, half], head_dim=128)


@pytest.mark.parametrize("causal, window, scale", [(1, (-1, -1), None), (True, [-1, -1], None),
                                                    (False, (True, -1), None), (False, (-1, -1), True)])
def test_unusual_option_types_always_take_the_checks(causal, window, scale):
    t = torch.zeros((4, 2, 64), dtype=torch.bfloat16)
    assert op._call_key(t, t, t, t, t, None, None, None, causal, window, scale) is None
    assert op._call_key(t, t, t, t, t, None, None, None, False, (-1, -1), 0.5) is not None


def test_the_memoised_tile_candidates_are_each_callers_own():
    """The planner extends the per-sequence shapes by the packed ones: a caller's list must not be the memo's."""
    first = planner.tile_candidates(128, torch.bfloat16, None, None, 90)
    first.append("extended")
    again = planner.tile_candidates(128, torch.bfloat16, None, None, 90)
    assert "extended" not in again and again == first[:-1]
