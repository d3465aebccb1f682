"""The JSON Schema every kernel spec file must satisfy, the validator that checks it, and the limits on its size.

Axis names are a closed set so that a typo (``head_dims``) is an error, not a
silently ignored axis; a new kernel family that needs a new axis adds it here.
Each axis admits only values that some kernel could use (tile sizes are multiples
of 16 up to 256, warps per block a power of two up to 16); a template's
finer constraints are its own ``static_assert``s.

Top-level keys besides the variant space:

``min_sm`` (optional integer, ``major * 10 + minor`` as in ``sm_90``)
    The oldest GPU architecture the family's variants run on: ``min_sm: 90``
    for a template that uses TMA. ``kgen build --arch sm_80`` skips such
    variants (see ``Variant.supports_sm``). Without it a family runs anywhere.
    Only the file naming the template needs to give it; another file of the
    family may repeat it, with the same value.

``sm_only`` (optional: axis -> value -> list of archs)
    Values of an axis that run on the listed archs alone: ``sm_only: {mma: {wgmma:
    [90]}}`` for a kernel built on sm_90a's wgmma, which neither older nor newer
    GPUs have. ``kgen build`` skips those variants for other archs, and ops do not
    choose them there. Family-wide, like ``min_sm``. Each axis and value must be one
    of the family's (spelled as in YAML: ``true``, ``128``), so that a typo is an
    error rather than a restriction silently lifted.

``score_cost`` (optional: axis -> value -> positive number)
    How much more a unit of work costs with that axis value, for an op's planner
    that weighs variants by the work each would do: ``score_cost: {mma: {mma_sync:
    1.25}}`` says a score computed by the mma.sync kernel costs 1.25 of one by
    another (measured, see the spec's comment). A variant's cost is the product
    over its axis values, 1 for values not listed. Family-wide, like ``min_sm``;
    its axes and values are checked as ``sm_only``'s are, and NaN is refused.

``host`` (optional: a Python package name, ``kgen.families.merge_states``)
    The package that launches the family's kernels. Its module ``contract``
    holds ``CONTRACTS``, family name -> a function of a variant's parameters
    giving its :class:`kgen.contract.LaunchContract`: the threads, shared memory,
    sizes and parameters the template is rendered with and the launcher checks.
    Without it kgen builds the family but knows nothing of how to launch it.
    Family-wide, like ``min_sm``.

A family declares at most :data:`MAX_VARIANTS` variants: each file's cross
product (the axis sizes multiplied, times the number of configs, counted
before exclusions) and the family's pooled variants after merging files. The
limit is checked before anything is expanded, so a small file cannot make kgen
build millions of variants; it also bounds ``exclude``, since no file needs
more exclusions than it has variants.
"""

from __future__ import annotations

import math
import re
from typing import Any

import jsonschema

from kgen.dtypes import ELEMENT_TYPES

#: The most variants one spec file, or one family after merging its files, may declare.
MAX_VARIANTS = 4096

_positive_int = {"type": "integer", "minimum": 1}
#: Tile rows and keys: whole 16-row mma blocks, at most a TMA box (256 rows).
_tile = {"type": "integer", "minimum": 16, "maximum": 256, "multipleOf": 16}

#: The schema of one value of each axis.
AXIS_VALUE_SCHEMAS: dict[str, dict] = {
    "head_dim": {"type": "integer", "minimum": 8, "maximum": 512, "multipleOf": 8},
    "dtype": {"enum": list(ELEMENT_TYPES)},
    "tile_m": _tile,
    "tile_n": _tile,
    # The reduction's step (a GEMM's K per pipeline stage).
    "tile_k": _tile,
    # Powers of two, so that warps split a power-of-two tile evenly.
    "num_warps": {"type": "integer", "enum": [1, 2, 4, 8, 12, 16]},
    # Which tensor-core instructions a kernel is built on (attention: Ampere-style mma.sync, or Hopper's wgmma).
    "mma": {"enum": ["mma_sync", "wgmma"]},
    "min_blocks_per_sm": {**_positive_int, "maximum": 32},
    # How an incomplete tile reaches shared memory: a TMA load of the whole
    # box plus masking, or predicated zero-filling cp.async.
    "tail": {"enum": ["tma", "cp_async"]},
    # Specialisation chosen from batch metadata: False means every tile is
    # full, and the generated code has no tail body at all.
    "has_incomplete_tile": {"type": "boolean"},
    # Whose rows a tile holds: one sequence's, or consecutive tokens of several short ones (attention prefill).
    "rows": {"enum": ["per_sequence", "packed"]},
    "rows_per_thread": {**_positive_int, "maximum": 16},
    # How a recurrent state [K, V] is stored: "kv" (fla's), or "vk" (vLLM's, sglang's, FlashInfer's).
    "state_layout": {"enum": ["kv", "vk"]},
    # How a KV cache is laid out: [B, Lmax, Hkv, D] per request, or pages [num_pages, page_size, Hkv, D]
    # named by a block table.
    "kv_layout": {"enum": ["contiguous", "paged"]},
    # How whole K/V tiles reach shared memory: TMA boxes, or cp.async gathers (any page size).
    "kv_load": {"enum": ["tma", "cp_async"]},
    # What a GEMM does with its accumulators: store them, or SwiGLU (silu(gate) * up of two products), also
    # quantized to FP8 e4m3 in 1 x 128 blocks.
    "epilogue": {"enum": ["none", "swiglu", "swiglu_quantize"]},
    # Tiles in flight or ready per pipeline (per warp, or per block).
    "stages": {"type": "integer", "minimum": 2, "maximum": 8},
    # Blocks per thread-block cluster (Hopper's portable cluster sizes), which share loads by TMA multicast.
    "cluster": {"type": "integer", "enum": [1, 2, 4, 8]},
}

_identifier = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}


def _assignment(min_properties: int) -> dict:
    """An object that gives some axes one value each (a config, an exclusion, the defaults)."""
    return {
        "type": "object",
        "properties": AXIS_VALUE_SCHEMAS,
        "additionalProperties": False,
        "minProperties": min_properties,
    }


SPEC_SCHEMA: dict = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "required": ["family", "axes"],
    "additionalProperties": False,
    "properties": {
        "family": {"type": "string", "pattern": "^[a-z][a-z0-9_]*$"},
        "description": {"type": "string"},
        # The Jinja template, relative to the spec's folder or the built-in
        # templates/. One spec file of a family must name it; others may add
        # variants only.
        "template": {"type": "string", "pattern": r"^[\w./-]+\.j2$"},
        "entries": {"type": "array", "items": _identifier, "minItems": 1, "uniqueItems": True},
        # The Python package that launches the family's kernels (see ``host`` above). At most 32 dotted
        # parts: importing each part imports its parent first, recursively, and a thousand overflow the stack.
        "host": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*){0,31}$"},
        "allow_spills": {"type": "boolean"},
        # sm_50 is the oldest arch NVRTC has targeted; three digits cover sm_100 and later.
        "min_sm": {"type": "integer", "minimum": 50, "maximum": 999},
        "sm_only": {
            "type": "object",
            "propertyNames": {"enum": list(AXIS_VALUE_SCHEMAS)},
            "additionalProperties": {
                "type": "object", "minProperties": 1,
                "additionalProperties": {"type": "array", "minItems": 1, "uniqueItems": True,
                                         "items": {"type": "integer", "minimum": 50, "maximum": 999}},
            },
        },
        "score_cost": {
            "type": "object",
            "propertyNames": {"enum": list(AXIS_VALUE_SCHEMAS)},
            "additionalProperties": {
                "type": "object", "minProperties": 1,
                "additionalProperties": {"type": "number", "exclusiveMinimum": 0, "maximum": 1000},
            },
        },
        "axes": {
            "type": "object",
            "minProperties": 1,
            "additionalProperties": False,
            "properties": {
                name: {"type": "array", "items": schema, "minItems": 1, "uniqueItems": True}
                for name, schema in AXIS_VALUE_SCHEMAS.items()
            },
        },
        # Axes that go together (a head dim with its tile shape): each config is
        # crossed with `axes`, instead of every axis being crossed with every other.
        # A repeated config would only repeat its variants.
        "configs": {"type": "array", "items": _assignment(1), "minItems": 1, "maxItems": MAX_VARIANTS,
                    "uniqueItems": True},
        "exclude": {"type": "array", "items": _assignment(1), "maxItems": MAX_VARIANTS},
        "defaults": _assignment(0),
    },
}


def yaml_spelling(value: Any) -> str:
    """An axis value as the family-wide tables (``sm_only``, ``score_cost``) key it, as YAML spells it:
    ``true`` for True, ``128`` for 128, ``wgmma`` for wgmma."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def variant_count_problem(data: dict) -> str | None:
    """Why a spec that passed the schema declares too many variants, from its axis sizes alone; None if it does not."""
    sizes = [len(values) for values in data["axes"].values()]
    configs = len(data.get("configs", [])) or 1
    count = math.prod(sizes) * configs
    if count <= MAX_VARIANTS:
        return None
    product = " x ".join(map(str, sizes)) + (f", times {configs} configs" if "configs" in data else "")
    return (f"declares {count} variants before exclusions (axis sizes {product}); "
            f"a family may have at most {MAX_VARIANTS}")


# JSON Schema counts 8.0 as an integer; a spec must not (it would render "128.0" into C++). Nor is NaN a number
# here: it passes every bound (no comparison with NaN is true), and a NaN score_cost would make a planner's every
# comparison of two shapes false.
_STRICT_TYPES = jsonschema.Draft202012Validator.TYPE_CHECKER.redefine_many({
    "integer": lambda _checker, value: isinstance(value, int) and not isinstance(value, bool),
    "number": lambda _checker, value: (isinstance(value, (int, float)) and not isinstance(value, bool)
                                       and not (isinstance(value, float) and math.isnan(value))),
})


def _whole_string_pattern(validator, pattern, instance, schema):
    """``pattern``, with ``$`` ending the string as in JSON Schema's regexes (ECMA-262): Python's ``$`` also
    matches before a final newline, which would let ``family: "x\\n"`` name a family of its own."""
    if validator.is_type(instance, "string") and (re.search(pattern, instance) is None or
                                                  (pattern.endswith("$") and instance.endswith("\n"))):
        yield jsonschema.ValidationError(f"{instance!r} does not match {pattern!r}")


def _canonical(value) -> tuple:
    """A hashable stand-in for a YAML value, equal exactly where JSON Schema calls two values equal
    (``1`` and ``1.0`` are, ``1`` and ``true`` are not)."""
    if isinstance(value, bool):
        return ("boolean", value)
    if isinstance(value, (int, float)):
        return ("number", value)
    if isinstance(value, dict):
        return ("object", frozenset((_canonical(k), _canonical(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("array", tuple(_canonical(item) for item in value))
    return (type(value).__name__, value if isinstance(value, str) else repr(value))


def _unique_items(validator, unique, instance, schema):
    """``uniqueItems`` in linear time: jsonschema's own compares every pair of items that do not sort
    (objects, or mixed types), which takes hours for a 1 MiB list."""
    if unique and validator.is_type(instance, "array"):
        seen = set()
        for item in instance:
            key = _canonical(item)
            if key in seen:
                yield jsonschema.ValidationError(f"{instance!r} has non-unique elements")
                return
            seen.add(key)


#: Validates a spec's value against :data:`SPEC_SCHEMA` (kgen.spec turns its errors into lines of the file).
VALIDATOR = jsonschema.validators.extend(
    jsonschema.Draft202012Validator, type_checker=_STRICT_TYPES,
    validators={"pattern": _whole_string_pattern, "uniqueItems": _unique_items})(SPEC_SCHEMA)
