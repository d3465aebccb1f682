"""The host half of ``templates/common/tma.cuh``: TMA descriptors for a kernel's tiles, cached.

A descriptor describes a tensor's layout and the box one copy moves; the box
comes from the kernel's layout (:mod:`kgen.layout`), so host and kernel agree
on it by construction. Descriptors are built by cuda.core
(``StridedMemoryView.as_tensor_map``) and cached by role, layout and calling
thread; a new address with an unchanged layout only patches the cached one
(about 2 us instead of 7 to build one). Keying by thread means one thread's
patch can never race another thread's launch.
"""

from __future__ import annotations

import threading

import torch
from cuda.core.utils import StridedMemoryView

from kgen.launch import TensorMapSwizzle

_SWIZZLES = {128: TensorMapSwizzle.SWIZZLE_128B, 64: TensorMapSwizzle.SWIZZLE_64B, 32: TensorMapSwizzle.SWIZZLE_32B}
_MAX_DESCRIPTORS = 256
# key -> [descriptor, the address it points at]
_descriptors: dict[tuple, list] = {}


def tensor_map(role: str, t: torch.Tensor, box_rows: int, span_bytes: int):
    """A descriptor for boxes of ``box_rows`` tokens x 1 head x ``span_bytes`` of the last dimension of 3-D ``t``.

    ``role`` tells apart tensors of equal layout passed to one launch (q, k, v): each
    keeps its own descriptor. The box's span is also its swizzle width.
    """
    key = (role, threading.get_ident(), t.device.index, tuple(t.shape), t.stride(), t.dtype, box_rows, span_bytes)
    entry = _descriptors.get(key)
    if entry is None:
        if len(_descriptors) >= _MAX_DESCRIPTORS:
            _descriptors.clear()
        view = StridedMemoryView.from_dlpack(t, stream_ptr=-1)
        descriptor = view.as_tensor_map(box_dim=(box_rows, 1, span_bytes // t.element_size()),
                                        swizzle=_SWIZZLES[span_bytes])
        entry = _descriptors[key] = [descriptor, t.data_ptr()]
    elif entry[1] != t.data_ptr():
        entry[0].replace_address(t)
        entry[1] = t.data_ptr()
    return entry[0]
