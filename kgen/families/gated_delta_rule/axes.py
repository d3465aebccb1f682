"""The values a gated delta rule spec offers on the axes its ops check on every call.

They are read from the spec (once per spec path), never listed in Python: a spec that adds a dtype
or a state layout is taken at its word.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from kgen import registry
from kgen.runtime.dispatch import SpecPathMemo, spec_dtypes


class SpecAxes(NamedTuple):
    dtypes: tuple[torch.dtype, ...]
    state_layouts: tuple[str, ...]


def spec_axes(family: str) -> SpecAxes:
    found = _spec_axes.get((family,))
    if found is None:
        state_layouts = tuple(registry.current().family(family).supported("state_layout"))
        found = _spec_axes.put((family,), SpecAxes(spec_dtypes(family), state_layouts))
    return found


_spec_axes = SpecPathMemo()
