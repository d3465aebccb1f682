"""Both grouped GEMM kernels on the GPU: a module-scoped, parametrised fixture that makes the op take each kernel
(``mma``) in turn, so one test file checks the wgmma kernel (the op's choice on sm_90) and the mma_sync one (the
choice elsewhere, and the reference). Import ``kernel`` into a test module; its tests then run once per kernel."""

from __future__ import annotations

import pytest
import torch

from kgen.families.grouped_gemm import op
from kgen.runtime.dispatch import planning_sm


@pytest.fixture(autouse=True, scope="module", params=["wgmma", "mma_sync"])
def kernel(request):
    if request.param == "wgmma" and planning_sm(torch.cuda.current_device()) != 90:
        pytest.skip("the wgmma kernel runs on sm_90a alone")
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(op, "first_runnable", lambda *args, **kwargs: request.param)
        yield request.param
