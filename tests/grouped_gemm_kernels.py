"""Every grouped GEMM kernel form on the GPU: a module-scoped, parametrised fixture that makes the op take each in
turn, so one test file checks the wgmma kernel in single blocks and in clusters of two blocks sharing B tiles (the
op's choices on sm_90, by the experts' average rows), and the mma_sync one (the choice elsewhere, and the
reference). Import ``kernel`` into a test module; its tests then run once per form. The FP8 tests, on wgmma alone,
take ``fp8_spec_path`` instead: the built-in 128 x 256 tile, the 128 x 128 one (tests/specs/grouped_gemm_fp8_narrow)
and the 128 x 256 one in clusters (tests/specs/grouped_gemm_fp8_cluster)."""

from __future__ import annotations

from pathlib import Path
from unittest import mock

import pytest
import torch

from kgen import config
from kgen.families.grouped_gemm import op
from kgen.runtime.dispatch import planning_sm

SPECS = Path(__file__).resolve().parent / "specs"
#: The op's kernel (``mma``) and whether it runs in clusters, per form.
FORMS = {"wgmma": ("wgmma", False), "wgmma_cluster": ("wgmma", True), "mma_sync": ("mma_sync", False)}
#: The spec folder put ahead of the built-in one, and whether the op runs in clusters, per FP8 form.
FP8_FORMS = {"built_in": (None, False), "fp8_narrow": (SPECS / "grouped_gemm_fp8_narrow", False),
             "fp8_cluster": (SPECS / "grouped_gemm_fp8_cluster", True)}


def _needs_wgmma() -> None:
    if planning_sm(torch.cuda.current_device()) != 90:
        pytest.skip("the wgmma kernel runs on sm_90a alone")


def taking_clusters(clusters: bool):
    """A context in which the op takes the most blocks per cluster the spec path offers, or the fewest, whatever
    the call's rows (tools/sanitizer_case.py and tools/ab_grouped_gemm_forms.py use it too)."""
    return mock.patch.object(op, "cluster_size", lambda offered, *args: offered[-1] if clusters else offered[0])


@pytest.fixture(autouse=True, scope="module", params=list(FORMS))
def kernel(request):
    mma, clusters = FORMS[request.param]
    if mma == "wgmma":
        _needs_wgmma()
    with mock.patch.object(op, "first_runnable", lambda *args, **kwargs: mma), taking_clusters(clusters):
        yield request.param


@pytest.fixture(autouse=True, scope="module", params=list(FP8_FORMS))
def fp8_spec_path(request):
    _needs_wgmma()
    spec_path, clusters = FP8_FORMS[request.param]
    with config.overrides(KGEN_SPEC_PATH=spec_path and str(spec_path)), taking_clusters(clusters):
        yield request.param
