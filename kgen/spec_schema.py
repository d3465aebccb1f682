"""The JSON Schema every kernel spec file must satisfy.

Axis names are a closed set so that a typo (``head_dims``) is an error, not a
silently ignored axis; a new kernel family that needs a new axis adds it here.
"""

from __future__ import annotations

_positive_int = {"type": "integer", "minimum": 1}

#: The schema of one value of each axis.
AXIS_VALUE_SCHEMAS: dict[str, dict] = {
    "head_dim": {"type": "integer", "minimum": 8, "maximum": 512, "multipleOf": 8},
    "dtype": {"enum": ["bf16", "fp16", "fp32"]},
    "tile_m": {**_positive_int, "maximum": 1024},
    "tile_n": {**_positive_int, "maximum": 1024},
    "num_warps": {**_positive_int, "maximum": 32},
    "num_stages": {**_positive_int, "maximum": 8},
    "min_blocks_per_sm": {**_positive_int, "maximum": 32},
    # How an incomplete tile reaches shared memory: a TMA load of the whole
    # box plus masking, or predicated zero-filling cp.async.
    "tail": {"enum": ["tma", "cp_async"]},
    # Specialisation chosen from batch metadata: False means every tile is
    # full, and the generated code has no tail body at all.
    "has_incomplete_tile": {"type": "boolean"},
    "rows_per_thread": {**_positive_int, "maximum": 16},
}

_identifier = {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"}


def _assignment(min_properties: int) -> dict:
    """An object that gives some axes one value each (an exclusion, the defaults)."""
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
        "allow_spills": {"type": "boolean"},
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
        "configs": {"type": "array", "items": _assignment(1), "minItems": 1},
        "exclude": {"type": "array", "items": _assignment(1)},
        "defaults": _assignment(0),
    },
}
