"""Every variant of tests/specs/neighbours on the GPU: the tile shapes and block sizes a user's spec
can build one axis away from the built-in ones (tests/test_template_constraints.py keeps that list
exact). Each kernel is launched directly, outputs poisoned, a neighbouring sequence's inputs NaN/Inf,
and compared with float64.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

from kgen import config, registry  # noqa: E402
from kgen.runtime.dispatch import contract, launcher  # noqa: E402
from kgen.families.attention_prefill import attention_varlen  # noqa: E402
from kgen.families.attention_prefill.plan import plan_packed_tiles, plan_tiles  # noqa: E402
from kgen.families.attention_prefill.planner import AttentionPlan  # noqa: E402
from kgen.runtime.tables import DeviceTables  # noqa: E402

from test_attention_gpu import poison_sequence, reference as attention_reference  # noqa: E402
from test_merge_states_gpu import assert_matches, reference as merge_reference  # noqa: E402

NEIGHBOURS = Path(__file__).parent / "specs" / "neighbours"


def neighbours(family: str) -> list:
    with config.overrides(KGEN_SPEC_PATH=str(NEIGHBOURS)):
        return [v for v in registry.current().family(family).variants if v.spec_path.parent == NEIGHBOURS]


@pytest.fixture(autouse=True)
def neighbour_specs():
    with config.overrides(KGEN_SPEC_PATH=str(NEIGHBOURS)):
        yield


@pytest.mark.parametrize("variant", neighbours("attention_prefill"), ids=lambda v: v.name.split("[")[1])
@pytest.mark.parametrize("causal", [False, True])
def test_attention_neighbour(variant, causal):
    params = variant.param_dict
    incomplete = params["has_incomplete_tile"]
    whole = math.lcm(params["tile_m"], params["tile_n"])  # a length of whole query and key tiles
    lengths = [63, 200, 1, 129] if incomplete else [2 * whole, 4 * whole, whole]
    if params["rows"] == "packed":  # tiles of consecutive tokens, the sequences' rows mixed
        schedule = plan_packed_tiles(lengths, tile_m=params["tile_m"], tile_n=params["tile_n"], causal=causal)
    else:
        schedule = plan_tiles(lengths, lengths, tile_m=params["tile_m"], tile_n=params["tile_n"], causal=causal,
                              window=(-1, -1))
    assert schedule.has_incomplete_tile is incomplete
    work = torch.from_numpy(schedule.work)
    cu_host = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32)
    plan = AttentionPlan(schedule, params["head_dim"], torch.bfloat16, (-1, 0 if causal else -1), len(lengths),
                         variant, DeviceTables(lambda device: (work.to(device), cu_host.to(device)), "work list",
                                               one_device=True))
    gen = torch.Generator(device="cuda").manual_seed(params["head_dim"] + params["tile_n"])
    total, head_dim = sum(lengths), params["head_dim"]
    q = torch.randn((total, 4, head_dim), generator=gen, device="cuda").to(torch.bfloat16)
    k, v = (torch.randn((total, 2, head_dim), generator=gen, device="cuda").to(torch.bfloat16) for _ in range(2))
    poison_sequence(q, k, v, lengths, lengths, 1)  # no other sequence may see its NaN and Inf
    cu = torch.tensor([0, *torch.tensor(lengths).cumsum(0).tolist()], dtype=torch.int32, device="cuda")
    out = torch.full_like(q, float("nan"))
    lse = torch.full((4, total), float("nan"), device="cuda")
    attention_varlen(q, k, v, cu, cu, causal=causal, plan=plan, out=out, lse_out=lse, return_lse=True)
    out_ref, lse_ref = attention_reference(q, k, v, lengths, lengths, (-1, 0 if causal else -1), None,
                                           head_dim ** -0.5)
    keep = torch.ones(total, dtype=torch.bool, device="cuda")
    keep[lengths[0]:lengths[0] + lengths[1]] = False
    out, out_ref, lse, lse_ref = out[keep], out_ref[keep], lse[:, keep], lse_ref[:, keep]
    assert not out.isnan().any() and not lse.isnan().any()
    torch.testing.assert_close(out.double(), out_ref, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(lse.double(), lse_ref, atol=2e-3, rtol=1e-4)


@pytest.mark.parametrize("variant", neighbours("merge_attention_states"), ids=lambda v: v.name.split("[")[1])
def test_merge_neighbour(variant):
    params = variant.param_dict
    tile_rows = contract(variant).sizes["tile_rows"]
    heads, head_dim = 3, params["head_dim"]
    # The has_incomplete_tile=false variant only ever runs on a whole number of tiles.
    tokens = tile_rows + 5 if params["has_incomplete_tile"] else 2 * tile_rows
    rows = tokens * heads
    gen = torch.Generator(device="cuda").manual_seed(head_dim)
    v = torch.randn((2, tokens, heads, head_dim), generator=gen, device="cuda").to(torch.bfloat16)
    lse = torch.randn((2, tokens, heads), generator=gen, device="cuda") * 3
    out = torch.full((tokens, heads, head_dim), float("nan"), dtype=torch.bfloat16, device="cuda")
    lse_out = torch.full((tokens, heads), float("nan"), device="cuda")
    kernel = launcher(variant, "merge_states_2", torch.cuda.current_device())
    (a_t, a_h), (b_t, b_h) = lse[0].stride(), lse[1].stride()
    kernel(-(-rows // tile_rows), v_a=v[0].data_ptr(), lse_a=lse[0].data_ptr(), lse_a_stride_t=a_t, lse_a_stride_h=a_h,
           v_b=v[1].data_ptr(), lse_b=lse[1].data_ptr(), lse_b_stride_t=b_t, lse_b_stride_h=b_h,
           v_out=out.data_ptr(), lse_out=lse_out.data_ptr(), num_rows=rows, num_heads=heads)
    assert_matches(out, lse_out, *merge_reference(v, lse))


def test_launches_with_the_wrong_arguments_are_refused():
    from kgen.launch import LaunchArgumentError

    variant = registry.current().family("merge_attention_states").select(head_dim=128, dtype="bf16",
                                                                           has_incomplete_tile=True)
    kernel = launcher(variant, "merge_states_2", torch.cuda.current_device())
    assert [p.name for p in kernel.parameters][:2] == ["v_a", "lse_a"]
    names = [p.name for p in kernel.parameters]
    with pytest.raises(TypeError, match=r"merge_states_2\(\) missing 10 required keyword-only arguments"):
        kernel.launch(1, v_a=0, lse_a=0)
    with pytest.raises(TypeError, match=r"got an unexpected keyword argument 'lse_c'"):
        kernel.launch(1, **dict.fromkeys(names, 0), lse_c=0)
    with pytest.raises(LaunchArgumentError, match="parameter lse_a_stride_t .* takes int, got float"):
        kernel.launch(1, **dict(dict.fromkeys(names, 0), lse_a_stride_t=1.5))
