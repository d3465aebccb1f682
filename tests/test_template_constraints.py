"""Nothing broken compiles silently: a spec value the template cannot run fails the build with a message.

For each built-in family, every value the schema admits for head_dim, tile_m, tile_n
and num_warps is tried one axis at a time around each built-in configuration. Each
candidate either fails to compile with a static_assert naming the axis, or is refused by
``kgen build``'s gates (spills, serialised wgmma, shared memory over sm_90's limit), or is a variant the GPU
tests run: a built-in one or one listed in tests/specs/neighbours/, which
tests/test_neighbour_variants_gpu.py runs. The last check is both ways, so that list
cannot go stale. The list may also hold a built-in shape at another min_blocks_per_sm (not
swept), where the kernel's form changes with it; OCCUPANCY_NEIGHBOURS names those that must stay.
"""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import jsonschema
import pytest

from kgen import config, registry
from kgen.arch import parse as parse_arch
from kgen.compiler import CompileError, compile_cubin
from kgen.contract import contract_of
from kgen.registry import Variant
from kgen.render import render
from kgen.spec_schema import AXIS_VALUE_SCHEMAS

NEIGHBOURS = Path(__file__).parent / "specs" / "neighbours"
# Kernel forms that only another min_blocks_per_sm than the built-in shapes' reaches (that axis is not swept), each
# of which tests/specs/neighbours must keep listing: wgmma's 64-row tile with a producer warpgroup (the built-in one
# has none, from three blocks an SM).
OCCUPANCY_NEIGHBOURS = {"attention_prefill": [
    ("wgmma 64-row tile with a producer", {"mma": "wgmma", "tile_m": 64, "min_blocks_per_sm": 2}),
]}
SWEPT_AXES = ("head_dim", "tile_m", "tile_n", "num_warps")
SM90_SMEM_LIMIT = parse_arch("sm_90a").max_smem_per_block
# The variants whose neighbours are swept, per configuration: each tail policy's (fp16 compiles the
# same code as bf16 but for the mma's operand type).
BASES = ({"dtype": "bf16", "tail": "tma", "has_incomplete_tile": True},
         {"dtype": "bf16", "tail": "cp_async", "has_incomplete_tile": True})


def is_base(variant: Variant) -> bool:
    params = variant.param_dict
    return any(all(params.get(k, v) == v for k, v in base.items()) for base in BASES)


def admitted(axis: str) -> list[int]:
    validator = jsonschema.Draft202012Validator(AXIS_VALUE_SCHEMAS[axis])
    return [value for value in range(1, 1025) if validator.is_valid(value)]


def bases(family: registry.Family) -> list[Variant]:
    return [variant for variant in family.variants if is_base(variant)]


def candidates(family: registry.Family) -> list[tuple[str, Variant]]:
    """(swept axis, variant) for every one-axis neighbour of a base that the spec does not list."""
    listed = {v.params for v in family.variants}
    seen, out = set(), []
    for base in bases(family):
        for axis in (a for a in SWEPT_AXES if a in family.axes):
            for value in admitted(axis):
                params = tuple((k, value if k == axis else x) for k, x in base.params)
                if params not in listed and params not in seen:
                    seen.add(params)
                    out.append((axis, Variant(family, params, base.spec_path)))
    return out


def occupancy_of_a_base(params: tuple, family: registry.Family) -> bool:
    """Whether ``params`` are a base's but for min_blocks_per_sm."""
    def shape(p):
        return tuple(item for item in p if item[0] != "min_blocks_per_sm")
    return any(shape(params) == shape(base.params) for base in bases(family))


def builds(variant: Variant) -> bool:
    """build_passes, False where the template refuses the variant."""
    try:
        return build_passes(variant)
    except CompileError:
        return False


def build_passes(variant: Variant) -> bool:
    """Whether `kgen build` accepts a variant that compiled: no spills, shared memory within the limit."""
    _, record = compile_cubin(render(variant), "sm_90a", variant.name)
    smem = contract_of(variant).dynamic_smem_bytes + max(e.static_smem_bytes for e in record.entries.values())
    return record.spills == 0 and smem <= SM90_SMEM_LIMIT


def _compiled_in_parallel(swept):
    """(axis, variant, build_passes or its CompileError) for each candidate; NVRTC runs outside the GIL."""
    def outcome(item):
        axis, variant = item
        try:
            return axis, variant, build_passes(variant)
        except CompileError as exc:
            return axis, variant, exc

    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        return list(pool.map(outcome, swept))


@pytest.mark.sweep
@pytest.mark.parametrize("family_name", ["attention_prefill", "merge_attention_states", "gated_delta_rule_step"])
def test_every_admitted_value_compiles_into_a_tested_variant_or_fails_with_its_axis(family_name):
    builtin = registry.current().family(family_name)
    with config.overrides(KGEN_SPEC_PATH=str(NEIGHBOURS)):
        listed = {v.params: v for v in registry.current().family(family_name).variants if is_base(v)}
    covered = set(listed)
    buildable = set()
    for axis, variant, outcome in _compiled_in_parallel(candidates(builtin)):
        if isinstance(outcome, CompileError):
            message = str(outcome)
            if "loses its Hopper design" in message:  # a build gate, as spills are: wgmma serialised
                continue
            assert "static assertion failed" in message, f"{variant.name}: not refused by a static_assert:\n{message}"
            assert f'"{family_name}: ' in message and axis in message.split("static assertion failed", 1)[1], \
                f"{variant.name}: the static_assert does not name {axis}:\n{message}"
            continue
        if outcome:
            buildable.add(variant.params)
    untested = buildable - covered
    assert not untested, f"buildable but run by no GPU test: {sorted(untested)}"
    # Every neighbour the GPU tests run is one the sweep builds (or a built-in variant).
    stale = covered - buildable - {v.params for v in builtin.variants}
    # min_blocks_per_sm is not swept, but a kernel's form can change with it (wgmma's 64-row tile drops its producer
    # from three blocks an SM), so the list may also hold a base's shape at another occupancy, if it builds.
    stale -= {params for params in stale if occupancy_of_a_base(params, builtin) and builds(listed[params])}
    assert not stale, f"tests/specs/neighbours lists variants that do not build: {sorted(stale)}"
    # The forms no built-in runs any more stay listed, so a GPU test still runs them.
    missing = [name for name, params in OCCUPANCY_NEIGHBOURS.get(family_name, ())
               if not any(all(v.param_dict.get(k) == x for k, x in params.items()) for v in listed.values())]
    assert not missing, f"tests/specs/neighbours no longer lists {missing}"


@pytest.mark.parametrize("family_name, change, message", [
    ("attention_prefill", {"dynamic_smem_bytes": 64}, "dynamic shared memory differs from the host's contract"),
    ("attention_prefill", {"threads": 32}, "threads per block differ from the host's contract"),
    ("attention_prefill", {"sizes": {"q_box_rows": 8, "kv_box_rows": 8, "box_span_bytes": 128, "work_fields": 6}},
     "the host's TMA boxes must be one Q tile and one K/V tile high"),
    ("attention_prefill", {"sizes": {"q_box_rows": 128, "kv_box_rows": 128, "box_span_bytes": 128, "work_fields": 2}},
     "a work item's fields differ from the host's contract"),
    # The signature and the mainloop's arguments are rendered from the contract: a parameter it lacks
    # is one the body cannot name.
    ("attention_prefill", {"drop_parameter": True}, 'class "<unnamed>::Arguments" has no member "heads_fastest"'),
    ("merge_attention_states", {"sizes": {"tile_rows": 3}}, "rows per block differ from the host's contract"),
    ("merge_attention_states", {"drop_parameter": True}, 'identifier "num_heads" is undefined'),
])
def test_a_contract_that_disagrees_with_the_template_fails_to_compile(monkeypatch, family_name, change, message):
    import dataclasses

    from kgen import contract as contract_module

    family = registry.current().family(family_name)
    original = contract_module.contract_functions(family.host)[family_name]

    def disagreeing(params):
        found = original(params)
        if change.get("drop_parameter"):
            return dataclasses.replace(found, parameters={e: p[:-1] for e, p in found.parameters.items()})
        return dataclasses.replace(found, **change)

    monkeypatch.setitem(contract_module.contract_functions(family.host), family_name, disagreeing)
    contract_module._contract.cache_clear()
    try:
        variant = family.variants[0]
        with pytest.raises(CompileError, match=message):
            compile_cubin(render(variant), "sm_90a", variant.name)
    finally:
        contract_module._contract.cache_clear()


# The gated delta rule's chunk kernels: a few values the schema admits but the templates cannot run,
# one axis at a time; each must fail to compile with a message naming its family and axis. (A full
# sweep, as above, would compile hundreds of these large kernels.)
@pytest.mark.parametrize("family_name, axis, value", [
    ("gated_delta_rule_kkt", "head_dim", 96), ("gated_delta_rule_kkt", "tile_m", 128),
    ("gated_delta_rule_kkt", "num_warps", 8), ("gated_delta_rule_kkt", "min_blocks_per_sm", 6),
    ("gated_delta_rule_chunk", "head_dim", 256), ("gated_delta_rule_chunk", "tile_m", 32),
    ("gated_delta_rule_chunk", "tile_n", 128), ("gated_delta_rule_chunk", "num_warps", 8),
    ("gated_delta_rule_chunk", "min_blocks_per_sm", 4),
])
def test_gdn_values_the_templates_cannot_run_fail_with_their_axis(family_name, axis, value):
    base = next(v for v in registry.current().family(family_name).variants if is_base(v))
    variant = Variant(base.family, tuple((k, value if k == axis else v) for k, v in base.params), base.spec_path)
    with pytest.raises(CompileError) as failure:
        compile_cubin(render(variant), "sm_90a", variant.name)
    message = str(failure.value)
    assert f'"{family_name}: ' in message and axis in message.split("static assertion failed", 1)[1], message[-400:]
