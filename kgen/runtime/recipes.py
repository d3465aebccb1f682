"""Plans as plain ints, for torch.library: what crosses into a torch.ops.kgen op instead of a Python object.

A plan's recipe is the inputs it was made from (the lengths and options, with the choices the planner
made forced, so that planning again gives the same plan) encoded as ints. A compiled graph holds the
recipe as constants and the plan's device tables as tensors; the op makes the plan from them once
per recipe and device (each plan module's ``plan_from_recipe``).
"""

from __future__ import annotations

from typing import Any, Sequence

import torch

#: Value tables of the recipes' enumerated fields; a field holds the index of its value.
DTYPES = (torch.bfloat16, torch.float16, torch.float32)
TAILS = ("tma", "cp_async")
MMAS = ("wgmma", "mma_sync")
NONE = -1  # an optional int field left out


def code(table: Sequence[Any], value: Any) -> int:
    return table.index(value)


def cumulative(lengths: Sequence[int]) -> list[int]:
    """``[0, n0, n0 + n1, ...]`` as Python ints."""
    out = [0]
    for n in lengths:
        out.append(out[-1] + int(n))
    return out

