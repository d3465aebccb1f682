"""The host half of ``templates/common/tma.cuh``: TMA descriptors for a kernel's tiles.

A descriptor describes a tensor's layout and the box one copy moves; the box
comes from the kernel's layout (:mod:`kgen.layout`), so host and kernel agree
on it by construction. Descriptors are built by cuda.core
(``StridedMemoryView.as_tensor_map``); a tensor at a new address with the same
layout only patches its descriptor (about 2 us instead of 7 to build one).
"""

from __future__ import annotations

import contextlib
import threading
from typing import Iterator, Mapping

import torch
from cuda.core.utils import StridedMemoryView

from kgen.launch import TensorMapSwizzle

_SWIZZLES = {128: TensorMapSwizzle.SWIZZLE_128B, 64: TensorMapSwizzle.SWIZZLE_64B, 32: TensorMapSwizzle.SWIZZLE_32B}


def build_tensor_map(t: torch.Tensor, box_rows: int, span_bytes: int):
    """A descriptor for boxes of ``box_rows`` tokens x 1 head x ``span_bytes`` of the last dimension of 3-D ``t``.

    The box's span is also its swizzle width.
    """
    view = StridedMemoryView.from_dlpack(t, stream_ptr=-1)
    return view.as_tensor_map(box_dim=(box_rows, 1, span_bytes // t.element_size()), swizzle=_SWIZZLES[span_bytes])


_transient = threading.local()


@contextlib.contextmanager
def transient_descriptors() -> Iterator[None]:
    """Descriptors made inside are dropped on leaving: none is kept, patched or reused by a later launch.

    For launches whose tensors a CUDA graph's memory pool owns (torch.compile's mode="reduce-overhead"):
    a descriptor holds a reference to its tensor, which the pool would then find alive and unaccounted
    for. A launch copies its descriptors into the kernel's parameters, so dropping them after is safe.
    """
    previous = getattr(_transient, "made", None)
    _transient.made = {}
    try:
        yield
    finally:
        _transient.made = previous


class TensorMaps:
    """The descriptors of one launch's tensors, by role (q, k, v: tensors of equal layout keep their own).

    The owner keeps one per calling thread and per tensor layout: a patch must not race another
    thread's launch, and a new layout needs a new descriptor. ``alias_of`` lets a role use another's
    descriptor (an empty tensor has none of its own, yet the kernel still takes the parameter).
    """

    def __init__(self, box_rows: Mapping[str, int], span_bytes: int, alias_of: Mapping[str, str] | None = None):
        self.box_rows, self.span_bytes = dict(box_rows), span_bytes
        self.alias_of = dict(alias_of or {})
        self._entries: dict[str, list] = {}  # role -> [descriptor, the address it points at]

    def get(self, role: str, t: torch.Tensor):
        made = getattr(_transient, "made", None)
        if made is not None:  # inside transient_descriptors(): this launch's own, kept until it ends
            key = (id(self), self.alias_of.get(role, role))
            if key not in made:
                made[key] = build_tensor_map(t, self.box_rows[key[1]], self.span_bytes)
            return made[key]
        if role in self.alias_of:
            return self._entries[self.alias_of[role]][0]
        entry = self._entries.get(role)
        address = t.data_ptr()
        if entry is None:
            entry = self._entries[role] = [build_tensor_map(t, self.box_rows[role], self.span_bytes), address]
        elif entry[1] != address:
            entry[0].replace_address(t)
            entry[1] = address
        return entry[0]
