"""Drop-in replacements for other libraries' functions, computed by kgen's ops.

- ``kgen.compat.flash_attn.flash_attn_varlen_func``: flash-attn's (signature of 2.8.3.post1), over
  ``kgen.ops.attention_varlen``;
- ``kgen.compat.fla.chunk_gated_delta_rule`` and ``fused_recurrent_gated_delta_rule``: fla's (0.5.2), over
  ``kgen.ops.chunk_gated_delta_rule`` (and ``kgen.ops.gated_delta_rule_step`` for one token a sequence);
- ``kgen.compat.flashinfer.merge_state`` and ``merge_states``: FlashInfer's (0.6.17), over
  ``kgen.ops.merge_attention_states`` and ``merge_attention_states_n``.

Each takes its peer's parameters (names, order, kinds, defaults), returns what the peer returns,
converts layouts and log bases both ways, and refuses by name, with a ValueError, an option kgen
cannot compute. They are forward only, like kgen's ops. docs/compat.md has the table of LSE bases,
layouts and state layouts.

The peers take no plan, so the varlen drop-ins copy ``cu_seqlens`` to the host on every call (a
synchronisation with the device) and make a kgen plan from it; plans of lengths seen before come
from a small LRU cache (:class:`PlanCache`, one per module) instead of being made again. Code that
can hold a plan should call ``kgen.ops`` directly with ``plan=``: no copy, and CUDA-graph capturable.

The submodules are imported on their own (``from kgen.compat.flash_attn import
flash_attn_varlen_func``); this package imports none of them.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Callable, Hashable, NamedTuple

import torch

__all__ = ["CacheInfo", "PlanCache"]


class CacheInfo(NamedTuple):
    hits: int
    misses: int
    size: int
    maxsize: int


class PlanCache:
    """A bounded least-recently-used cache of kgen plans, keyed by the lengths and the options they were made for.

    Thread-safe. A plan is made outside the lock, so two threads missing on one key at once may both
    make it; the first stored wins and both get that one.
    """

    def __init__(self, maxsize: int = 32):
        if isinstance(maxsize, bool) or not isinstance(maxsize, int) or maxsize < 1:
            raise ValueError(f"maxsize: expected a positive int, got {maxsize!r}")
        self.maxsize = maxsize
        self._plans: OrderedDict[Hashable, object] = OrderedDict()
        self._lock = threading.Lock()
        self._hits = self._misses = 0

    def get(self, key: Hashable, make: Callable[[], object]):
        """The plan stored under ``key``, else ``make()``'s, stored (evicting the least recently used)."""
        with self._lock:
            found = self._plans.get(key)
            if found is not None:
                self._plans.move_to_end(key)
                self._hits += 1
                return found
            self._misses += 1
        plan = make()
        with self._lock:
            found = self._plans.setdefault(key, plan)
            self._plans.move_to_end(key)
            while len(self._plans) > self.maxsize:
                self._plans.popitem(last=False)
        return found

    def clear(self) -> None:
        with self._lock:
            self._plans.clear()
            self._hits = self._misses = 0

    def info(self) -> CacheInfo:
        with self._lock:
            return CacheInfo(self._hits, self._misses, len(self._plans), self.maxsize)

    def __len__(self) -> int:
        return len(self._plans)


def _host_cu(cu, device, dtypes) -> tuple[int, ...] | None:
    """``cu`` (a 1-D tensor of one of ``dtypes`` on ``device``) as a tuple of host ints, copied from the device.

    None when ``cu`` is not such a tensor: the kgen op then checks it itself, without a plan, and says
    what is wrong by name.
    """
    if not (isinstance(cu, torch.Tensor) and cu.dim() == 1 and cu.dtype in dtypes and cu.device == device):
        return None
    return tuple(cu.tolist())  # a device tensor: a copy to the host, which waits for the device
