"""A decode plan's recipe: the inputs it was made from, as ints read by name (how a plan crosses into torch.library).

A compiled graph holds a plan as its recipe (constants); the registered op plans again from it
(:func:`kgen.families.attention_decode.planner.plan_from_recipe`). The recipe records the planner's
choices (the KV load policy and the tail's) and the SM count it planned for, so that planning again
gives the same grid and kernel.
"""

from __future__ import annotations

from operator import itemgetter
from typing import Sequence

import torch

from kgen.runtime import recipes

#: Where the lengths start: after the eleven fields :class:`DecodeRecipe` names.
_SEQLENS_START = 11


def _optional(value: int) -> int | None:
    return None if value == recipes.NONE else value


class DecodeRecipe(tuple):
    """``(num_heads_q, num_heads_kv, head_dim, q_len, dtype, page_size, window_left, max_seqlen_k, kv_load,
    tail, num_sms, *seqlens_k)``.

    A flat tuple of ints, so that it crosses into torch.library as a ``list[int]`` (and is hashable, a memo
    key); its fields are read by name. A named tuple cannot hold it: the lengths vary with the batch.
    """

    __slots__ = ()

    @classmethod
    def of(cls, *, num_heads_q: int, num_heads_kv: int, head_dim: int, q_len: int, dtype: torch.dtype,
           page_size: int | None, window_left: int, max_seqlen_k: int | None, kv_load: str, tail: str, num_sms: int,
           seqlens_k: Sequence[int]) -> DecodeRecipe:
        return cls((num_heads_q, num_heads_kv, head_dim, q_len, recipes.dtype_code(dtype),
                    recipes.NONE if page_size is None else page_size, window_left,
                    recipes.NONE if max_seqlen_k is None else max_seqlen_k, recipes.axis_code("kv_load", kv_load),
                    recipes.axis_code("tail", tail), num_sms, *(int(n) for n in seqlens_k)))

    num_heads_q = property(itemgetter(0))
    num_heads_kv = property(itemgetter(1))
    head_dim = property(itemgetter(2))
    q_len = property(itemgetter(3))
    window_left = property(itemgetter(6))
    num_sms = property(itemgetter(10))

    @property
    def dtype(self) -> torch.dtype:
        return recipes.dtype_value(self[4])

    @property
    def page_size(self) -> int | None:
        """None: a contiguous cache."""
        return _optional(self[5])

    @property
    def max_seqlen_k(self) -> int | None:
        """The bound the caller reserved for new lengths; None: the longest given."""
        return _optional(self[7])

    @property
    def kv_load(self) -> str:
        return recipes.axis_value("kv_load", self[8])

    @property
    def tail(self) -> str:
        return recipes.axis_value("tail", self[9])

    @property
    def seqlens_k(self) -> list[int]:
        return list(self[_SEQLENS_START:])
