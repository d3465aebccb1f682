"""A chunked gated delta rule plan as ints: how it crosses into ``torch.ops.kgen.chunk_gated_delta_rule``.

A compiled graph holds the recipe as constants and the plan's device tables as tensors; the op makes
the plan again from them, once per recipe and device (see :mod:`kgen.runtime.recipes`).
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from kgen.families.gated_delta_rule.planner import ChunkGatedDeltaRulePlan, plan_chunk_gated_delta_rule
from kgen.runtime.dispatch import SpecPathMemo


class ChunkRecipe(NamedTuple):
    """The inputs of :func:`plan_chunk_gated_delta_rule`, with the choices its planner made forced, so that
    planning again gives the same plan (a named tuple: torch.compile traces its making as plain data)."""

    num_heads_v: int
    head_dim: int
    #: The recurrence's value slice (tile_n).
    value_slice: int
    #: The segment length the planner chose.
    segment_chunks: int
    exact_split: bool
    cu_seqlens: tuple[int, ...]

    @property
    def num_seqs(self) -> int:
        return len(self.cu_seqlens) - 1

    @classmethod
    def of(cls, plan: ChunkGatedDeltaRulePlan) -> ChunkRecipe:
        return cls(plan.num_heads_v, plan.head_dim, plan.value_slice, plan.schedule.segment_chunks, plan.exact_split,
                   plan.cu_seqlens)

    def ints(self) -> list[int]:
        return [self.num_heads_v, self.head_dim, self.value_slice, self.segment_chunks, int(self.exact_split),
                *self.cu_seqlens]

    @classmethod
    def from_ints(cls, ints: Sequence[int]) -> ChunkRecipe:
        num_heads_v, head_dim, value_slice, segment_chunks, exact_split, *cu_seqlens = ints
        return cls(num_heads_v, head_dim, value_slice, segment_chunks, bool(exact_split), tuple(cu_seqlens))

    def plan(self) -> ChunkGatedDeltaRulePlan:
        return plan_chunk_gated_delta_rule(list(self.cu_seqlens), num_heads_v=self.num_heads_v, head_dim=self.head_dim,
                                           tile_n=self.value_slice, segment_chunks=self.segment_chunks,
                                           exact_split=self.exact_split)


def plan_from_recipe(recipe: tuple[int, ...], tables: Sequence[torch.Tensor]) -> ChunkGatedDeltaRulePlan:
    """The plan ``recipe`` (:meth:`ChunkRecipe.ints`) describes, its tables the device tensors ``tables`` (as
    ``plan.tables.on(device)`` gives them); made once per recipe and device."""
    device = tables[0].device
    key = (recipe, device)
    found = _from_recipe.get(key)
    if found is None:
        found = ChunkRecipe.from_ints(recipe).plan()
        found.tables.adopt(device, tables)
        found = _from_recipe.put(key, found)
    return found


_from_recipe = SpecPathMemo()
