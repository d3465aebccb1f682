"""The JSON Schema every kernel spec file must satisfy, and the limits on its size.

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
    choose them there. Family-wide, like ``min_sm``.

``score_cost`` (optional: axis -> value -> positive number)
    How much more a unit of work costs with that axis value, for an op's planner
    that weighs variants by the work each would do: ``score_cost: {mma: {mma_sync:
    1.25}}`` says a score computed by the mma.sync kernel costs 1.25 of one by
    another (measured, see the spec's comment). A variant's cost is the product
    over its axis values, 1 for values not listed. Family-wide, like ``min_sm``.

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
    "rows_per_thread": {**_positive_int, "maximum": 16},
    # How a recurrent state [K, V] is stored: "kv" (fla's), or "vk" (vLLM's, sglang's, FlashInfer's).
    "state_layout": {"enum": ["kv", "vk"]},
    # How a KV cache is laid out: [B, Lmax, Hkv, D] per request, or pages [num_pages, page_size, Hkv, D]
    # named by a block table.
    "kv_layout": {"enum": ["contiguous", "paged"]},
    # How whole K/V tiles reach shared memory: TMA boxes, or cp.async gathers (any page size).
    "kv_load": {"enum": ["tma", "cp_async"]},
    # Tiles in flight or ready per pipeline (per warp, or per block).
    "stages": {"type": "integer", "minimum": 2, "maximum": 8},
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
        # The Python package that launches the family's kernels (see ``host`` above).
        "host": {"type": "string", "pattern": r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"},
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
