"""Every grouped GEMM kernel form on the GPU: a module-scoped, parametrised fixture that makes the op take each in
turn, so one test file checks the wgmma kernel (the op's choice on sm_90), the wgmma kernel in clusters of two
blocks sharing B tiles (tests/specs/grouped_gemm_cluster on the search path), and the mma_sync one (the choice
elsewhere, and the reference). Import ``kernel`` into a test module; its tests then run once per form. The FP8
tests, on wgmma alone, take ``fp8_spec_path`` instead: the built-in tile, the 128 x 256 one
(tests/specs/grouped_gemm_fp8_wide) and the clustered one."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from kgen import config
from kgen.families.grouped_gemm import op
from kgen.runtime.dispatch import planning_sm

SPECS = Path(__file__).resolve().parent / "specs"
#: The op's kernel (``mma``) and the spec folder put ahead of the built-in one, per form.
FORMS = {"wgmma": ("wgmma", None), "wgmma_cluster": ("wgmma", SPECS / "grouped_gemm_cluster"),
         "mma_sync": ("mma_sync", None)}
FP8_SPEC_PATHS = {"built_in": None, "fp8_wide": SPECS / "grouped_gemm_fp8_wide", "cluster": SPECS / "grouped_gemm_cluster"}


def _needs_wgmma() -> None:
    if planning_sm(torch.cuda.current_device()) != 90:
        pytest.skip("the wgmma kernel runs on sm_90a alone")


@pytest.fixture(autouse=True, scope="module", params=list(FORMS))
def kernel(request):
    mma, spec_path = FORMS[request.param]
    if mma == "wgmma":
        _needs_wgmma()
    with pytest.MonkeyPatch.context() as patch, config.overrides(KGEN_SPEC_PATH=spec_path and str(spec_path)):
        patch.setattr(op, "first_runnable", lambda *args, **kwargs: mma)
        yield request.param


@pytest.fixture(autouse=True, scope="module", params=list(FP8_SPEC_PATHS))
def fp8_spec_path(request):
    _needs_wgmma()
    spec_path = FP8_SPEC_PATHS[request.param]
    with config.overrides(KGEN_SPEC_PATH=spec_path and str(spec_path)):
        yield request.param
