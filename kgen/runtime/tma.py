"""The host half of ``templates/common/tma.cuh``: TMA descriptors for a kernel's tiles.

A descriptor describes a tensor's layout and the box one copy moves; the box
comes from the kernel's launch contract (:mod:`kgen.contract`), so host and kernel agree
on it by construction. Descriptors are built by cuda.core
(``StridedMemoryView.as_tensor_map``); a tensor at a new address with the same
layout only patches its descriptor (about 2 us instead of 7 to build one).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Mapping

import torch
from cuda.core.utils import StridedMemoryView

from kgen.launch import TensorMapSwizzle

_SWIZZLES = {128: TensorMapSwizzle.SWIZZLE_128B, 64: TensorMapSwizzle.SWIZZLE_64B, 32: TensorMapSwizzle.SWIZZLE_32B}


class _Memory:
    """``t``'s memory as the CUDA Array Interface describes it, holding no reference to ``t``.

    A descriptor keeps the object it was made (or patched) from. Made from this one, it keeps no tensor
    alive, so it may be cached even where the tensors are a CUDA graph pool's (torch.compile's
    mode="reduce-overhead"), whose allocations must not outlive the graph's accounting. A launch copies
    the descriptor into the kernel's parameters; what it points at afterwards is never read.
    """

    def __init__(self, t: torch.Tensor):
        size = t.element_size()
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape), "strides": tuple(s * size for s in t.stride()),
            # TMA copies bytes: an unsigned type of the element's size moves the same ones (zeros past the end too).
            "typestr": f"<u{size}", "data": (t.data_ptr(), False), "version": 3,
        }


def _view(t: torch.Tensor) -> StridedMemoryView:
    """``t``'s memory as a view with no tensor behind it. The interface names no stream, so none is synchronised
    (-1: cuda.core 1.2.0 refuses None as ambiguous)."""
    return StridedMemoryView.from_cuda_array_interface(_Memory(t), stream_ptr=-1)


def build_tensor_map(t: torch.Tensor, box_rows: int, span_bytes: int):
    """A descriptor for boxes of ``box_rows`` tokens x 1 head x ``span_bytes`` of the last dimension of 3-D ``t``.

    The box's span is also its swizzle width.
    """
    return _view(t).as_tensor_map(box_dim=(box_rows, 1, span_bytes // t.element_size()), swizzle=_SWIZZLES[span_bytes])


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
        if role in self.alias_of:
            return self._entries[self.alias_of[role]][0]
        entry = self._entries.get(role)
        address = t.data_ptr()
        if entry is None:
            entry = self._entries[role] = [build_tensor_map(t, self.box_rows[role], self.span_bytes), address]
        elif entry[1] != address:
            entry[0].replace_address(_view(t))
            entry[1] = address
        return entry[0]


class DescriptorCache:
    """The :class:`TensorMaps` of an op's launches, per calling thread and tensor layout, bounded.

    A patch must not race another thread's launch, and a new layout needs new descriptors; layouts
    come and go with batch shapes, so the least recently used set is dropped past ``capacity``.
    """

    def __init__(self, capacity: int = 16):
        self._capacity = capacity
        self._entries: OrderedDict[tuple, TensorMaps] = OrderedDict()

    def get(self, key: tuple, make: Callable[..., TensorMaps], *args) -> TensorMaps:
        """The maps of ``key`` (the caller's layout key; the calling thread is added here), made by
        ``make(*args)`` when new (arguments rather than a closure: no function is built per call)."""
        key = (threading.get_ident(),) + key
        found = self._entries.get(key)
        if found is None:
            found = self._entries[key] = make(*args)
            if len(self._entries) > self._capacity:
                self._entries.popitem(last=False)
        else:
            try:
                self._entries.move_to_end(key)
            except KeyError:  # another thread dropped it meanwhile: this call still uses what it found
                pass
        return found
