"""The element types a spec's ``dtype`` axis may name: one table for every spelling of each.

The spec names a type (``bf16``), templates spell it in C++, the host needs its
size, and the torch ops map tensors to it. Torch is not imported here, so that
``kgen build`` and ``kgen list`` stay light; the ops resolve ``torch_name``.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ElementType:
    name: str  # as the spec's dtype axis spells it
    cuda: str  # as the templates spell it
    itemsize: int
    torch_name: str  # the attribute of the torch module


ELEMENT_TYPES: dict[str, ElementType] = {
    t.name: t for t in (
        ElementType("bf16", "__nv_bfloat16", 2, "bfloat16"),
        ElementType("fp16", "__half", 2, "float16"),
        ElementType("fp32", "float", 4, "float32"),
        ElementType("e4m3", "__nv_fp8_e4m3", 1, "float8_e4m3fn"),  # FP8 inputs with block scales
    )
}
