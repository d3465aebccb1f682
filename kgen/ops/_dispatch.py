"""From an op's request to launchable kernels: variant choice, tail specialisation, per-device caching."""

from __future__ import annotations

from typing import Any

import torch

from kgen import jit, registry as registry_module
from kgen.launch import KernelLauncher
from kgen.registry import Variant

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def tail_pair(family: str, **required: Any) -> tuple[Variant, Variant]:
    """The (with-tail, without-tail) variants for ``required``: see :func:`without_tail`."""
    with_tail = registry_module.current().family(family).select(**required, has_incomplete_tile=True)
    return with_tail, without_tail(family, with_tail)


def without_tail(family: str, with_tail: Variant) -> Variant:
    """The has_incomplete_tile=false twin of ``with_tail`` (same other parameters).

    It runs when every tile of a batch is full; when the spec declares none,
    the with-tail variant serves both.
    """
    fam = registry_module.current().family(family)
    params = dict(with_tail.params, has_incomplete_tile=False)
    return next((v for v in fam.variants if v.param_dict == params), with_tail)


def launcher(variant: Variant, entry: str, device_index: int, dynamic_smem: int = 0) -> KernelLauncher:
    """``entry`` of ``variant`` loaded for ``device_index`` (which must be current), with num_warps * 32 threads."""
    threads = variant.param_dict["num_warps"] * 32
    return KernelLauncher(jit.load(variant).kernel(entry), device_index, threads, dynamic_smem)


class DispatchCache:
    """Per-op memo of whatever an op derives from a variant, dropped when the spec path changes."""

    def __init__(self) -> None:
        self._entries: dict[tuple, Any] = {}
        self._generation = -1

    def get(self, key: tuple):
        if self._generation != registry_module.generation:
            self._entries.clear()
            self._generation = registry_module.generation
        return self._entries.get(key)

    def put(self, key: tuple, value: Any) -> Any:
        self._entries[key] = value
        return value
