"""docs/architecture.md's checklist, followed: a toy family (a spec, a template folder and a host package
under tests/toy_family/) that touches no shared module builds for sm_90a on the CPU and runs on the GPU."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import given, settings, strategies as st

import kgen.config
from kgen import jit, registry
from kgen.contract import contract_of
from kgen.render import render

SPECS = Path(__file__).resolve().parent / "toy_family" / "specs"
gpu = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture
def toy_spec_path(cache_dir):
    with kgen.config.overrides(KGEN_SPEC_PATH=str(SPECS)):
        yield registry.current().family("toy_scale")


def test_the_toy_family_is_found_with_its_contract(toy_spec_path):
    family = toy_spec_path
    assert family.host == "toy_family.host" and len(family.variants) == 4
    for variant in family.variants:
        contract = contract_of(variant)
        assert contract.threads == 128 and contract.sizes["tile"] == 512
        # The kernel's signature is the contract's.
        assert 'toy_scale(const T* __restrict__ x, T* __restrict__ out, long long n, float scale)' in render(variant)


def test_every_toy_variant_builds_for_sm_90a(toy_spec_path):
    for variant in toy_spec_path.variants:
        result = jit.build(variant, "sm_90a")
        assert set(result.record.entries) == {"toy_scale"} and result.record.spills == 0


@pytest.mark.gpu
@gpu
@settings(max_examples=20, deadline=None)
@given(n=st.one_of(st.integers(0, 5000), st.sampled_from([512, 1024, 512 * 37])),
       dtype=st.sampled_from([torch.float32, torch.bfloat16]), scale=st.floats(-4, 4, allow_nan=False))
def test_the_toy_op_matches_a_float64_reference(n, dtype, scale):
    from toy_family.host import toy_scale

    with kgen.config.overrides(KGEN_SPEC_PATH=str(SPECS)):
        x = torch.randn(n, device="cuda").to(dtype)
        out = toy_scale(x, scale)
        expected = (x.double() * float(torch.tensor(scale, dtype=torch.float32))).to(dtype)
        torch.cuda.synchronize()
    assert out.dtype == dtype and out.shape == x.shape
    assert torch.equal(out.double(), expected.double()), (out - expected).abs().max()


def test_the_toy_op_refuses_bad_arguments_by_name(toy_spec_path):
    from toy_family.host import toy_scale

    with pytest.raises(TypeError, match="^x: "):
        toy_scale([1.0, 2.0], 2.0)
    with pytest.raises(ValueError, match="^x: expected a CUDA tensor"):
        toy_scale(torch.zeros(4), 2.0)
    with pytest.raises(ValueError, match="^scale: "):
        toy_scale(torch.zeros(4), float("nan"))
