"""A prefill plan's recipe: the inputs it was made from, as ints read by name (how a plan crosses into torch.library).

A compiled graph holds a plan as its recipe (constants) and its work list (a tensor); the registered op
plans again from the recipe (:func:`kgen.families.attention_prefill.planner.plan_from_recipe`). The recipe
records the planner's choices, the kernel and its tile shape, so that planning again gives the same plan.
"""

from __future__ import annotations

from typing import Sequence

import torch

from kgen.runtime import recipes
#: Where the cumulative lengths start: after head_dim, dtype, causal, the window's two sides, tail, tile_m,
#: tile_n, mma, rows and num_seqs.
_CU_START = 11


class AttentionRecipe(tuple):
    """``(head_dim, dtype, causal, window_left, window_right, tail, tile_m, tile_n, mma, rows, num_seqs,
    *cu_seqlens_q, *cu_seqlens_k)``.

    A flat tuple of ints, so that it crosses into torch.library as a ``list[int]`` (and is hashable, a memo
    key); its fields are read by name. A named tuple cannot hold it: the lengths vary with the batch.
    """

    __slots__ = ()

    @classmethod
    def of(cls, *, head_dim: int, dtype: torch.dtype, causal: bool, window: Sequence[int], tail: str, tile_m: int,
           tile_n: int, mma: str, rows: str, seqlens_q: Sequence[int], seqlens_k: Sequence[int]) -> AttentionRecipe:
        left, right = window
        return cls((head_dim, recipes.dtype_code(dtype), int(causal), left, right,
                    recipes.axis_code("tail", tail), tile_m, tile_n, recipes.axis_code("mma", mma),
                    recipes.axis_code("rows", rows), len(seqlens_q), *recipes.cumulative(seqlens_q),
                    *recipes.cumulative(seqlens_k)))

    @property
    def head_dim(self) -> int:
        return self[0]

    @property
    def dtype(self) -> torch.dtype:
        return recipes.dtype_value(self[1])

    @property
    def causal(self) -> bool:
        return bool(self[2])

    @property
    def window(self) -> tuple[int, int]:
        """As the plan was asked for, before causality is folded in."""
        return self[3], self[4]

    @property
    def tail(self) -> str:
        return recipes.axis_value("tail", self[5])

    @property
    def tile_m(self) -> int:
        return self[6]

    @property
    def tile_n(self) -> int:
        return self[7]

    @property
    def mma(self) -> str:
        return recipes.axis_value("mma", self[8])

    @property
    def rows(self) -> str:
        return recipes.axis_value("rows", self[9])

    @property
    def num_seqs(self) -> int:
        return self[10]

    @property
    def cu_seqlens_q(self) -> list[int]:
        return list(self[_CU_START:_CU_START + self.num_seqs + 1])

    @property
    def cu_seqlens_k(self) -> list[int]:
        return list(self[_CU_START + self.num_seqs + 1:])
