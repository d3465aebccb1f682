"""The toy op as a torch.library custom op, for torch.compile."""

# No `from __future__ import annotations`: torch.library reads the op's schema from real annotations.
import torch
from torch import Tensor
from torch.library import custom_op

from toy_family.host import op


@custom_op("kgen_toy::toy_scale", mutates_args=())
def _toy_scale(x: Tensor, scale: float) -> Tensor:
    return op.toy_scale(x, scale)


@_toy_scale.register_fake
def _(x, scale):
    return torch.empty_like(x)


def toy_scale(x, scale):
    return torch.ops.kgen_toy.toy_scale(x, scale)
