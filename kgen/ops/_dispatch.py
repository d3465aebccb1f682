"""From an op's request to launchable kernels: variant choice, tail specialisation, per-device caching."""

from __future__ import annotations

from typing import Any

import torch

from kgen import jit, registry as registry_module
from kgen.launch import KernelLauncher
from kgen.registry import Variant

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}


def tail_pair(family: str, **required: Any) -> tuple[Variant, Variant]:
    """The (with-tail, without-tail) variants for ``required``.

    The second is the has_incomplete_tile=false specialisation with the same
    other parameters, used when every tile of a batch is full; when the spec
    declares none, the with-tail variant serves both.
    """
    fam = registry_module.current().family(family)
    with_tail = fam.select(**required, has_incomplete_tile=True)
    params = dict(with_tail.params, has_incomplete_tile=False)
    without_tail = next((v for v in fam.variants if v.param_dict == params), with_tail)
    return with_tail, without_tail


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
