"""A toy family's host package, made by following docs/architecture.md (tests/test_toy_family.py)."""

from __future__ import annotations

import torch

from kgen.runtime.checks import refuse_grad
from toy_family.host import library, op


def toy_scale(x, scale):
    refuse_grad("toy_scale", x)
    if torch.compiler.is_compiling():
        return library.toy_scale(x, scale)
    return op.toy_scale(x, scale)


toy_scale.__doc__ = op.toy_scale.__doc__
