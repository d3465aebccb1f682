"""Plans as plain ints, for torch.library: what crosses into a torch.ops.kgen op instead of a Python object.

A plan's recipe is the inputs it was made from (the lengths and options, with the choices the planner
made forced, so that planning again gives the same plan) encoded as ints. A compiled graph holds the
recipe as constants and the plan's device tables as tensors; the op makes the plan from them once
per recipe and device (each plan module's ``plan_from_recipe``).
"""

from __future__ import annotations

import itertools
from typing import Sequence

import torch

from kgen.dtypes import ELEMENT_TYPES
from kgen.spec_schema import AXIS_VALUE_SCHEMAS

NONE = -1  # an optional int field left out


def axis_code(axis: str, value: str) -> int:
    """An enumerated axis value as a recipe stores it: its index among the spec schema's values of the axis,
    a vocabulary that stays put (unlike the values a spec path happens to offer)."""
    return AXIS_VALUE_SCHEMAS[axis]["enum"].index(value)


def axis_value(axis: str, code: int) -> str:
    return AXIS_VALUE_SCHEMAS[axis]["enum"][code]


def dtype_code(dtype: torch.dtype) -> int:
    return axis_code("dtype", _DTYPE_NAMES[dtype])


def dtype_value(code: int) -> torch.dtype:
    return getattr(torch, ELEMENT_TYPES[axis_value("dtype", code)].torch_name)


_DTYPE_NAMES = {getattr(torch, t.torch_name): t.name for t in ELEMENT_TYPES.values()}


def cumulative(lengths: Sequence[int]) -> list[int]:
    """``[0, n0, n0 + n1, ...]`` as Python ints (accumulated in C: a Python loop was a tenth of a plan's host
    time at 4,096 sequences)."""
    return list(itertools.accumulate(map(int, lengths), initial=0))

