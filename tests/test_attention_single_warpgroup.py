"""The wgmma prefill as one warpgroup without a producer (64-row tiles, three blocks an SM: step 2b of
docs/prefill_short_sequences.md) builds for sm_90a under the host's contract, and a shape past the registers a
thread starts with is refused naming the axis."""

from __future__ import annotations

import pytest

from kgen import registry
from kgen.compiler import CompileError, compile_cubin
from kgen.contract import contract_of
from kgen.registry import Variant
from kgen.render import render

#: Shared memory an sm_90 SM gives its blocks, and what it keeps back per block.
SM90_SMEM_PER_SM, SMEM_RESERVED_PER_BLOCK = 228 * 1024, 1024


def single_warpgroup_variants() -> list[Variant]:
    family = registry.current().family("attention_prefill")
    return [v for v in family.variants
            if v.param_dict["mma"] == "wgmma" and v.param_dict["min_blocks_per_sm"] >= 3 and v.param_dict["dtype"] == "bf16"]


@pytest.mark.parametrize("variant", single_warpgroup_variants(), ids=lambda v: v.name.split("[")[1])
def test_the_single_warpgroup_tile_builds_under_its_contract(variant):
    contract = contract_of(variant)
    assert contract.threads == 128, "one consumer warpgroup and no producer"
    # The template's static_asserts hold its threads and shared memory to the contract's.
    _, record = compile_cubin(render(variant), "sm_90a", variant.name)
    assert record.spills == 0
    blocks = variant.param_dict["min_blocks_per_sm"]
    assert blocks * (contract.dynamic_smem_bytes + SMEM_RESERVED_PER_BLOCK) <= SM90_SMEM_PER_SM


def test_four_blocks_an_sm_are_refused_naming_the_axis():
    # At four blocks a thread starts with 128 registers, too few beside S, P and O (ptxas serialised the wgmma).
    variant = single_warpgroup_variants()[0]
    params = tuple((k, 4 if k == "min_blocks_per_sm" else v) for k, v in variant.params)
    with pytest.raises(CompileError, match="min_blocks_per_sm is too"):
        compile_cubin(render(Variant(variant.family, params, variant.spec_path)), "sm_90a", "four blocks")
