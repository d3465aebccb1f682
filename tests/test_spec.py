"""Spec file validation (kgen.spec.load_spec_file): what loads, and how each problem is reported.

Every malformed file must raise SpecError whose text reads ``file:line: key.path: problem``
with the line of the offending key in the hand-written YAML below, and no input
whatsoever (structured or random text/bytes) may escape as another exception.
"""

from __future__ import annotations

import itertools
import re
import textwrap
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, find, given, settings
from hypothesis import strategies as st

from kgen.spec import SpecError, SpecFile, load_spec_file
from kgen.spec_schema import AXIS_VALUE_SCHEMAS, MAX_VARIANTS

BUILTIN_SPEC = Path(__file__).resolve().parent.parent / "specs" / "merge_attention_states.yaml"


def write(folder: Path, text: str | bytes, name: str = "spec.yaml") -> Path:
    path = folder / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def spec_text(body: str) -> str:
    return textwrap.dedent(body).lstrip("\n")


# --------------------------------------------------------------------------- valid specs


def test_valid_spec_loads_every_field_and_expands_the_cross_product_minus_exclusions(tmp_path):
    path = write(tmp_path, spec_text("""
        # a demo family
        family: demo
        description: a demo family
        template: demo.cu.j2
        entries: [k_a, k_b]
        allow_spills: true
        axes:
          head_dim: [64, 128]
          dtype: [bf16, fp32]
          has_incomplete_tile: [true, false]
        exclude:
          - {head_dim: 128, dtype: fp32}
          - {has_incomplete_tile: false, dtype: bf16, head_dim: 64}
        defaults:
          dtype: fp32
        """))
    spec = load_spec_file(path)
    assert isinstance(spec, SpecFile)
    assert spec.path == path
    assert spec.family == "demo"
    assert spec.template == "demo.cu.j2"
    assert spec.entries == ("k_a", "k_b")
    assert spec.allow_spills is True
    assert spec.axes == {"head_dim": (64, 128), "dtype": ("bf16", "fp32"), "has_incomplete_tile": (True, False)}
    assert list(spec.axes) == ["head_dim", "dtype", "has_incomplete_tile"]
    assert spec.defaults == {"dtype": "fp32"}
    expected = [
        (64, "bf16", True),
        # (64, "bf16", False) is excluded by the second exclusion
        (64, "fp32", True),
        (64, "fp32", False),
        (128, "bf16", True),
        (128, "bf16", False),
        # (128, "fp32", *) are excluded by the first exclusion
    ]
    assert spec.assignments == tuple(
        (("head_dim", h), ("dtype", d), ("has_incomplete_tile", t)) for h, d, t in expected
    )


def test_minimal_spec_gets_the_documented_defaults(tmp_path):
    spec = load_spec_file(write(tmp_path, "family: tiny\naxes: {num_warps: [1, 2]}\n"))
    assert spec.template is None
    assert spec.entries is None
    assert spec.allow_spills is False
    assert spec.defaults == {}
    assert spec.assignments == ((("num_warps", 1),), (("num_warps", 2),))


def test_axis_order_is_the_files_order_and_the_full_product_without_exclusions(tmp_path):
    spec = load_spec_file(write(tmp_path, spec_text("""
        family: order
        axes:
          tail: [cp_async, tma]
          num_warps: [8, 1, 4]
          rows_per_thread: [2, 3]
        """)))
    assert list(spec.axes) == ["tail", "num_warps", "rows_per_thread"]
    expected = tuple(
        (("tail", a), ("num_warps", b), ("rows_per_thread", c))
        for a, b, c in itertools.product(["cp_async", "tma"], [8, 1, 4], [2, 3])
    )
    assert spec.assignments == expected


def test_builtin_spec_is_valid(tmp_path):
    spec = load_spec_file(BUILTIN_SPEC)
    assert spec.family == "merge_attention_states"
    assert spec.template is not None and spec.entries
    assert len(spec.assignments) == len(set(spec.assignments)) > 0


def test_yml_string_path_is_accepted(tmp_path):
    path = write(tmp_path, "family: tiny\naxes: {tail: [tma]}\n", name="x.yml")
    assert load_spec_file(str(path)).assignments == ((("tail", "tma"),),)


# --------------------------------------------------------------------------- errors with a line

# (id, YAML text, expected key path as printed, expected line, a fragment of the problem)
LINE_CASES = [
    ("unknown-top-level-key", """
        family: demo
        axes:
          num_warps: [1]
        bogus: 1
        """, "bogus", 4, "unknown key 'bogus'"),
    ("unknown-axis-name", """
        family: demo
        axes:
          num_warps: [1]
          head_dims: [64]
        """, "axes.head_dims", 4, "unknown key 'head_dims'"),
    ("wrong-value-type", """
        family: demo
        axes:
          num_warps: [1]
          head_dim: ["abc"]
        """, "axes.head_dim[0]", 4, "'abc' is not of type 'integer'"),
    ("head-dim-not-multiple-of-8", """
        family: demo
        axes:
          head_dim:
            - 64
            - 12
        """, "axes.head_dim[1]", 5, "multiple of 8"),
    ("bad-enum", """
        family: demo
        axes:
          num_warps: [1]
          dtype: [bf16]
          tail: [dma]
        """, "axes.tail[0]", 5, "'dma' is not one of"),
    ("bad-enum-second-item-block-list", """
        family: demo
        axes:
          tail:
            - tma
            - dma
        """, "axes.tail[1]", 5, "'dma' is not one of"),
    ("duplicate-axis-key", """
        family: demo
        axes:
          num_warps: [1]
          tail: [tma]
          num_warps: [2]
        """, "axes.num_warps", 5, "duplicate key"),
    ("duplicate-top-level-key", """
        family: demo
        axes: {num_warps: [1]}
        description: x
        family: other
        """, "family", 4, "duplicate key"),
    ("invalid-yaml-syntax", """
        family: demo
        axes:
          num_warps: [1]: 2
        """, "<top>", 3, "invalid YAML"),
    ("invalid-yaml-tab", """
        family: demo
        axes: {num_warps: [1]}
        \tdefaults: {}
        """, "<top>", 3, "invalid YAML"),
    ("top-level-list", """
        - family: demo
        - axes: {num_warps: [1]}
        """, "<top>", 1, "is not of type 'object'"),
    ("exclusion-names-a-missing-axis", """
        family: demo
        axes:
          num_warps: [1, 2]
        exclude:
          - {num_warps: 1}
          - {tail: tma}
        """, "exclude[1].tail", 6, "'tail' is not an axis of this spec"),
    ("exclusion-names-an-unknown-axis", """
        family: demo
        axes:
          num_warps: [1, 2]
        exclude:
          - {num_warp: 1}
        """, "exclude[0].num_warp", 5, "unknown key 'num_warp'"),
    ("exclusion-of-an-absent-value", """
        family: demo
        axes:
          num_warps: [1, 2]
        exclude:
          - {num_warps: 4}
        """, "exclude[0].num_warps", 5, "excluded value 4 is not among the axis values"),
    ("default-not-among-values", """
        family: demo
        axes:
          num_warps: [1, 2]
          tail: [tma]
        defaults:
          tail: tma
          num_warps: 4
        """, "defaults.num_warps", 7, "default 4 is not among the axis values"),
    ("default-names-a-missing-axis", """
        family: demo
        axes:
          num_warps: [1, 2]
        defaults:
          tail: tma
        """, "defaults.tail", 5, "'tail' is not an axis of this spec"),
    ("exclusions-remove-every-variant", """
        family: demo
        axes:
          num_warps: [1, 2]
          tail: [tma]
        exclude: [{num_warps: 1}, {tail: tma}]
        """, "exclude", 5, "remove every variant"),
    ("missing-family", """
        axes:
          num_warps: [1]
        """, "<top>", 1, "'family' is a required property"),
    ("bad-family-name", """
        description: x
        family: Bad-Name
        axes: {num_warps: [1]}
        """, "family", 2, "does not match"),
    ("template-not-j2", """
        family: demo
        axes: {num_warps: [1]}
        template: demo.cu
        """, "template", 3, "does not match"),
    ("duplicate-axis-values", """
        family: demo
        axes:
          num_warps: [1, 2, 1]
        """, "axes.num_warps", 3, "non-unique"),
    ("empty-exclusion", """
        family: demo
        axes:
          num_warps: [1, 2]
        exclude:
          - {}
        """, "exclude[0]", 5, ""),
    ("allow-spills-not-bool", """
        family: demo
        allow_spills: "yes please"
        axes: {num_warps: [1]}
        """, "allow_spills", 2, "is not of type 'boolean'"),
    ("python-tag-in-a-value", """
        family: demo
        axes: {num_warps: [1]}
        description: !!python/name:os.system
        """, "<top>", 3, "invalid YAML"),
]


@pytest.mark.parametrize("text,key_path,line,fragment", [c[1:] for c in LINE_CASES], ids=[c[0] for c in LINE_CASES])
def test_error_names_file_key_path_and_line(tmp_path, text, key_path, line, fragment):
    path = write(tmp_path, spec_text(text), name="my_spec.yaml")
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    err = info.value
    message = str(err)
    assert message.startswith(f"{path}:{line}: {key_path}: "), message
    assert "my_spec.yaml" in message
    assert fragment in message
    assert err.file == str(path)
    assert err.line == line
    assert (err.key_path or "<top>") == key_path
    assert isinstance(err, ValueError)  # the CLI maps ValueError to exit code 2


@pytest.mark.parametrize("text", ["", "\n\n", "# only a comment\n", "  \n# two\n# comments\n"],
                         ids=["empty", "newlines", "comment", "comments"])
def test_empty_file_is_a_spec_error(tmp_path, text):
    path = write(tmp_path, text, name="empty_one.yaml")
    with pytest.raises(SpecError, match="empty spec file") as info:
        load_spec_file(path)
    assert str(info.value).startswith(f"{path}: ")
    assert info.value.line is None


@pytest.mark.parametrize("text", ["---\n", "...\n", "---\n...\n"])
def test_a_document_without_content_is_a_spec_error(tmp_path, text):
    with pytest.raises(SpecError):
        load_spec_file(write(tmp_path, text))


@pytest.mark.parametrize("text", ["just a string\n", "42\n", "null\n", "[1, 2]\n"])
def test_non_mapping_documents_are_spec_errors(tmp_path, text):
    path = write(tmp_path, text)
    with pytest.raises(SpecError, match="not of type 'object'") as info:
        load_spec_file(path)
    assert info.value.line == 1


def test_several_documents_are_refused(tmp_path):
    path = write(tmp_path, "family: a\naxes: {num_warps: [1]}\n---\nfamily: b\naxes: {num_warps: [1]}\n")
    with pytest.raises(SpecError, match="invalid YAML") as info:
        load_spec_file(path)
    assert info.value.line == 3


@pytest.mark.parametrize("tag", [
    "!!python/object/apply:os.system",
    "!!python/object/new:os.system",
])
def test_python_object_tags_are_refused_and_never_executed(tmp_path, tag):
    sentinel = tmp_path / "pwned"
    path = write(tmp_path, f"family: demo\naxes: {{num_warps: [1]}}\ndescription: {tag} [\"touch {sentinel}\"]\n")
    with pytest.raises(SpecError, match="invalid YAML") as info:
        load_spec_file(path)
    assert info.value.line == 3
    assert not sentinel.exists()
    # A tag as the whole document too.
    path = write(tmp_path, f"{tag} [\"touch {sentinel}\"]\n", name="whole.yaml")
    with pytest.raises(SpecError, match="invalid YAML"):
        load_spec_file(path)
    assert not sentinel.exists()


def test_unreadable_files_are_spec_errors(tmp_path):
    missing = tmp_path / "nope.yaml"
    with pytest.raises(SpecError, match="cannot read") as info:
        load_spec_file(missing)
    assert str(missing) in str(info.value)
    with pytest.raises(SpecError, match="not a regular file"):
        load_spec_file(tmp_path)  # a folder


def test_control_characters_are_spec_errors(tmp_path):
    with pytest.raises(SpecError, match="invalid YAML"):
        load_spec_file(write(tmp_path, "family: de\x00mo\naxes: {num_warps: [1]}\n"))


@pytest.mark.parametrize("text,line", [
    ("family: demo\naxes: &a {num_warps: [1], more: *a}\n", 2),
    ("family: demo\naxes: {num_warps: [1]}\ndescription: &d [*d]\n", 3),
    ("family: demo\naxes: {num_warps: [1]}\nexclude:\n  - &e {num_warps: [*e]}\n", 4),
], ids=["recursive-mapping", "recursive-list", "recursive-exclusion"])
def test_recursive_alias_is_a_spec_error(tmp_path, text, line):
    """An alias inside its own anchor makes a cyclic document; it must not recurse forever."""
    path = write(tmp_path, text)
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    assert str(info.value).startswith(f"{path}:{line}: ")


def test_shared_non_recursive_aliases_are_fine(tmp_path):
    text = "family: demo\naxes:\n  num_warps: &w [1, 2]\n  rows_per_thread: *w\nexclude:\n  - &x {num_warps: 1}\n  - *x\n"
    spec = load_spec_file(write(tmp_path, text))
    assert spec.axes == {"num_warps": (1, 2), "rows_per_thread": (1, 2)}
    assert [dict(a) for a in spec.assignments] == [{"num_warps": 2, "rows_per_thread": 1},
                                                   {"num_warps": 2, "rows_per_thread": 2}]


@pytest.mark.parametrize("depth", [100, 3000])
@pytest.mark.parametrize("where", ["description: {}\n", "axes:\n  num_warps: {}\n", "{}\n"])
def test_deeply_nested_yaml_is_a_spec_error(tmp_path, depth, where):
    path = write(tmp_path, "family: demo\n" + where.format("[" * depth + "]" * depth))
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    assert str(info.value).startswith(str(path))


# PyYAML's safe constructors raise plain ValueError/IndexError/KeyError/AttributeError
# (not yaml.YAMLError) for a malformed explicitly tagged scalar.
@pytest.mark.parametrize("value", ["!!int", "!!int A", "!!int 0x", "!!float abc", "!!float",
                                   "!!bool maybe", "!!timestamp 2020-13-45", "!!timestamp x"])
def test_malformed_tagged_scalar_is_a_spec_error(tmp_path, value):
    path = write(tmp_path, f"family: demo\naxes: {{num_warps: [1]}}\ndescription: {value}\n")
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    assert str(info.value).startswith(f"{path}:3: ")


# JSON Schema's "integer" accepts integral floats; kgen must not, or `head_dim: [128.0]`
# would load as the float 128.0, be named head_dim=128.0, render
# `__launch_bounds__(kThreads, 8.0)` (an NVRTC error), and because 128.0 == 128 a
# user file's float variant silently replaces the built-in integer one.
@pytest.mark.parametrize("text", [
    "family: demo\naxes: {head_dim: [128.0]}\n",
    "family: demo\naxes: {min_blocks_per_sm: [8.0, 2]}\n",
    "family: demo\naxes: {num_warps: [1, 2]}\ndefaults: {num_warps: 1.0}\n",
], ids=["axis", "axis-mixed", "default"])
def test_integral_floats_are_refused_or_made_ints(tmp_path, text):
    try:
        spec = load_spec_file(write(tmp_path, text))
    except SpecError:
        return
    values = [v for vs in spec.axes.values() for v in vs] + list(spec.defaults.values())
    values += [v for assignment in spec.assignments for _, v in assignment]
    assert not [v for v in values if isinstance(v, float)]


# --------------------------------------------------------------------------- property tests

AXES = sorted(AXIS_VALUE_SCHEMAS)
SPEC_KEYS = ["family", "description", "template", "entries", "allow_spills", "min_sm", "sm_only", "score_cost", "axes",
             "configs", "exclude", "defaults"]
# A mix of values each axis accepts and values it refuses, so that generated
# specs reach past the schema into exclusion/default checks and expansion.
AXIS_VALUES = st.sampled_from([
    8, 64, 80, 128, 512, 12, 0, -8, 1, 2, 4, 32, 33, 1024, 2048, 8.0, 64.5,
    "bf16", "fp16", "fp32", "fp64", "tma", "cp_async", "dma", "kv", "vk", "paged", "contiguous", "packed", True, False, None, "",
    "64",
])
SCALARS = st.one_of(
    st.none(), st.booleans(), st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), AXIS_VALUES,
)
KEYS = st.one_of(
    st.sampled_from(SPEC_KEYS + AXES + ["head_dims", "bogus", "1", "true", "<<"]),
    st.text(max_size=8), st.integers(-5, 5), st.booleans(), st.none(),
    st.floats(allow_nan=False, allow_infinity=False),
)
ANYTHING = st.recursive(
    SCALARS,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(KEYS, children, max_size=4),
    max_leaves=16,
)
ASSIGNMENT = st.dictionaries(st.sampled_from(AXES + ["bogus"]), AXIS_VALUES, max_size=3)
#: Values each axis accepts (a few per axis), to build specs that pass the schema.
VALID_VALUES = {
    "head_dim": [64, 80, 128, 256], "dtype": ["bf16", "fp16", "fp32"], "tile_m": [16, 64, 128],
    "tile_n": [32, 64], "tile_k": [16, 32, 64], "num_warps": [1, 4, 8], "min_blocks_per_sm": [1, 2],
    "tail": ["tma", "cp_async"], "has_incomplete_tile": [True, False], "rows_per_thread": [1, 2, 4],
    "mma": ["mma_sync", "wgmma"], "state_layout": ["kv", "vk"], "kv_layout": ["contiguous", "paged"],
    "kv_load": ["tma", "cp_async"], "stages": [2, 3, 4], "epilogue": ["none", "swiglu", "swiglu_quantize"],
    "rows": ["per_sequence", "packed"], "cluster": [1, 2],
}
assert set(VALID_VALUES) == set(AXES)


@st.composite
def valid_ish_specs(draw):
    """A spec that passes the schema, with exclusions and defaults drawn from its own axes,
    then sometimes one field replaced by something arbitrary."""
    names = draw(st.lists(st.sampled_from(AXES), min_size=1, max_size=4, unique=True))
    axes = {n: draw(st.lists(st.sampled_from(VALID_VALUES[n]), min_size=1, max_size=3, unique=True)) for n in names}
    assignment = st.lists(st.sampled_from(names), min_size=1, max_size=len(names), unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: st.sampled_from(axes[k]) for k in keys}))
    spec = {"family": draw(st.sampled_from(["demo", "merge_attention_states", "x_1"])), "axes": axes}
    if draw(st.booleans()):
        spec["exclude"] = draw(st.lists(assignment, max_size=3))
    if draw(st.booleans()):
        spec["defaults"] = draw(st.lists(st.sampled_from(names), max_size=len(names), unique=True).flatmap(
            lambda keys: st.fixed_dictionaries({k: st.sampled_from(axes[k]) for k in keys})))
    if draw(st.booleans()):
        spec["template"] = "t.cu.j2"
        spec["entries"] = ["k"]
    if draw(st.booleans()):
        spec["allow_spills"] = draw(st.booleans())
    if draw(st.booleans()):
        spec["min_sm"] = draw(st.sampled_from([50, 80, 90, 100, 999]))
    if draw(st.integers(0, 2)) == 0:
        key = draw(st.sampled_from(sorted(spec) + ["bogus"]))
        spec[key] = draw(ANYTHING)
    if draw(st.integers(0, 3)) == 0:
        axis = draw(st.sampled_from(names + ["head_dims"]))
        spec["axes"] = {**axes, axis: draw(st.lists(AXIS_VALUES, max_size=3) | ANYTHING)}
    return spec


LOOSE_SPECS = st.fixed_dictionaries(
    {
        "family": st.sampled_from(["demo", "merge_attention_states", "x_1"]) | ANYTHING,
        "axes": st.dictionaries(
            st.sampled_from(AXES + ["head_dims"]), st.lists(AXIS_VALUES, max_size=3), min_size=0, max_size=3,
        ) | ANYTHING,
    },
    optional={
        "description": st.text(max_size=10) | ANYTHING,
        "template": st.sampled_from(["t.cu.j2", "sub/t.j2", "t.cu", "../x.j2"]) | ANYTHING,
        "entries": st.lists(st.sampled_from(["k", "k2", "1bad", "k"]), max_size=3) | ANYTHING,
        "allow_spills": st.booleans() | ANYTHING,
        "min_sm": st.sampled_from([49, 80, 90, 1000, 90.0, "sm_90"]) | ANYTHING,
        "configs": st.lists(ASSIGNMENT, max_size=3) | ANYTHING,
        "exclude": st.lists(ASSIGNMENT, max_size=3) | ANYTHING,
        "defaults": ASSIGNMENT | ANYTHING,
        "bogus": ANYTHING,
    },
)
SPEC_LIKE = st.one_of(valid_ish_specs(), LOOSE_SPECS)
STRUCTURES = st.one_of(valid_ish_specs(), LOOSE_SPECS, ANYTHING, st.dictionaries(KEYS, ANYTHING, max_size=6))

_counter = itertools.count()
_LINE_BREAK = re.compile(r"\r\n|[\r\n\x85\u2028\u2029]")


def fresh_file(folder: Path) -> Path:
    return folder / f"fuzz_{next(_counter)}.yaml"


def check_outcome(path: Path, text: str | None) -> SpecFile | None:
    """Load ``path``; it must give a consistent SpecFile or a SpecError that names the file."""
    try:
        spec = load_spec_file(path)
    except SpecError as err:
        assert str(err).startswith(str(path)), str(err)
        if err.line is not None:
            assert err.line >= 1
            if text is not None:
                assert err.line <= len(_LINE_BREAK.split(text)) + 1, (err.line, text)
        return None
    assert isinstance(spec, SpecFile)
    assert isinstance(spec.family, str) and spec.family
    assert spec.axes and all(spec.axes.values())
    assert spec.assignments
    for assignment in spec.assignments:
        assert [axis for axis, _ in assignment] == list(spec.axes)
        assert all(value in spec.axes[axis] for axis, value in assignment)
    assert all(value in spec.axes[axis] for axis, value in spec.defaults.items())
    assert set(spec.config_axes) <= set(spec.axes)
    assert {"family", "axes"} <= set(spec.lines)
    assert all(line >= 1 for line in spec.lines.values())
    if text is not None:
        assert max(spec.lines.values()) <= len(_LINE_BREAK.split(text))
    return spec


def naive_assignments(data: dict) -> tuple:
    """What a spec's variants are by definition: each config crossed with the axes, less the exclusions."""
    configs = data.get("configs") or [{}]
    order = [*configs[0], *data["axes"]]
    out = []
    for config in configs:
        for combo in itertools.product(*data["axes"].values()):
            assignment = {**dict(zip(data["axes"], combo)), **config}
            if not any(all(assignment[k] == v for k, v in ex.items()) for ex in data.get("exclude", [])):
                out.append(tuple((axis, assignment[axis]) for axis in order))
    return tuple(out)


# No example database: the runs stay independent of failures stored by other test files.
FUZZ = settings(max_examples=200, deadline=None, database=None,
                suppress_health_check=[HealthCheck.function_scoped_fixture])


@FUZZ
@given(data=STRUCTURES)
def test_any_yaml_structure_gives_a_spec_or_a_spec_error(tmp_path, data):
    text = yaml.safe_dump(data, allow_unicode=True, sort_keys=False)
    path = fresh_file(tmp_path)
    path.write_text(text, encoding="utf-8")
    spec = check_outcome(path, text)
    if spec is not None:
        # What loaded is what was written.
        assert spec.family == data["family"]
        assert {k: list(v) for k, v in spec.axes.items() if k in data["axes"]} == data["axes"]
        assert spec.config_axes == tuple(data["configs"][0] if data.get("configs") else ())
        assert spec.defaults == data.get("defaults", {})
        assert spec.min_sm == data.get("min_sm")
        assert spec.assignments == naive_assignments(data)


def test_structure_fuzzer_reaches_valid_specs(tmp_path):
    """The structured strategy is not vacuous: it can produce specs that load, exclusions included."""

    def loads_with_exclusions(data) -> bool:
        path = fresh_file(tmp_path)
        path.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
        try:
            load_spec_file(path)
        except SpecError:
            return False
        return bool(data.get("exclude"))

    example = find(SPEC_LIKE, loads_with_exclusions,
                   settings=settings(max_examples=500, deadline=None, database=None))
    assert example["exclude"]


YAML_TOKENS = st.sampled_from([
    "family", "axes", "exclude", "defaults", "template", "entries", "allow_spills", "description",
    *AXES, "demo", "bf16", "tma", "1", "8", "64", "true", "null", "1.5", "t.cu.j2",
    ":", ": ", "- ", "[", "]", "{", "}", ",", "\n", "  ", "\t", "#", "'", '"', "? ", "&a ", "*a", "!!str ", "!!binary ", "!!set ", "!!int ", "!!float ", "!!bool ", "!!timestamp ",
    "!!python/object/apply:os.system ", "|", ">", "---", "...", "%YAML 1.1", "\r", "\x85", "\u2028", "\ufeff",
])


@FUZZ
@given(text=st.one_of(st.text(), st.lists(YAML_TOKENS, max_size=40).map("".join)))
def test_any_text_gives_a_spec_or_a_spec_error(tmp_path, text):
    path = fresh_file(tmp_path)
    path.write_text(text, encoding="utf-8")
    check_outcome(path, path.read_text(encoding="utf-8"))


@FUZZ
@given(blob=st.binary(max_size=200))
def test_any_bytes_give_a_spec_or_a_spec_error(tmp_path, blob):
    path = fresh_file(tmp_path)
    path.write_bytes(blob)
    check_outcome(path, None)


VALID_TEXT = spec_text("""
    family: demo
    template: demo.cu.j2
    entries: [k]
    axes:
      head_dim: [64, 128]
      dtype: [bf16, fp32]
      tail: [tma, cp_async]
    exclude:
      - {head_dim: 128, dtype: fp32}
    defaults:
      dtype: bf16
    """)


@FUZZ
@given(edits=st.lists(st.tuples(st.integers(0, len(VALID_TEXT)), st.integers(0, 3),
                                st.sampled_from(list(" :-[]{},\n#&*!'\"\tx1") + ["", "  ", "exclude", "tail"])),
                      min_size=1, max_size=4))
def test_mutated_valid_spec_gives_a_spec_or_a_spec_error(tmp_path, edits):
    """Small edits of a valid file (deleting and inserting characters) exercise every check with line numbers."""
    text = VALID_TEXT
    for at, delete, insert in edits:
        at = min(at, len(text))
        text = text[:at] + insert + text[at + delete:]
    path = fresh_file(tmp_path)
    path.write_text(text, encoding="utf-8")
    check_outcome(path, path.read_text(encoding="utf-8"))


# --------------------------------------------------------------------------- configs


CONFIGS_SPEC = """\
family: demo
axes:
  dtype: [bf16, fp16]
  has_incomplete_tile: [true, false]
configs:
  - {head_dim: 64, tile_m: 128}
  - {head_dim: 128, tile_m: 64}
exclude:
  - {head_dim: 128, dtype: fp16, has_incomplete_tile: false}
defaults: {tile_m: 64}
"""


def test_configs_are_crossed_with_the_axes(tmp_path):
    spec = load_spec_file(write(tmp_path, CONFIGS_SPEC))
    assert list(spec.axes) == ["head_dim", "tile_m", "dtype", "has_incomplete_tile"]
    assert spec.axes["head_dim"] == (64, 128) and spec.axes["tile_m"] == (128, 64)
    expected = {
        (("head_dim", hd), ("tile_m", tm), ("dtype", dt), ("has_incomplete_tile", inc))
        for hd, tm in ((64, 128), (128, 64)) for dt in ("bf16", "fp16") for inc in (True, False)
    } - {(("head_dim", 128), ("tile_m", 64), ("dtype", "fp16"), ("has_incomplete_tile", False))}
    assert set(spec.assignments) == expected and len(spec.assignments) == 7
    # A head dim never meets the other config's tile: configs are not crossed with each other.
    assert (("head_dim", 64), ("tile_m", 64)) not in {a[:2] for a in spec.assignments}
    assert spec.defaults == {"tile_m": 64}


def test_an_axis_set_both_in_axes_and_in_a_config_is_refused(tmp_path):
    text = CONFIGS_SPEC.replace("  dtype: [bf16, fp16]\n", "  dtype: [bf16, fp16]\n  head_dim: [64]\n")
    with pytest.raises(SpecError) as info:
        load_spec_file(write(tmp_path, text))
    assert info.value.key_path == "configs[0].head_dim" and info.value.line == 7  # one line lower: axes grew
    assert "both here and in axes" in str(info.value)


def test_configs_must_set_the_same_axes(tmp_path):
    text = CONFIGS_SPEC.replace("  - {head_dim: 128, tile_m: 64}\n", "  - {head_dim: 128}\n")
    with pytest.raises(SpecError) as info:
        load_spec_file(write(tmp_path, text))
    assert info.value.key_path == "configs[1]" and info.value.line == 7
    assert "every config must set the same axes" in str(info.value)


def test_a_default_must_be_a_value_some_config_gives(tmp_path):
    with pytest.raises(SpecError, match=r"default 32 is not among the axis values \[128, 64\]"):
        load_spec_file(write(tmp_path, CONFIGS_SPEC.replace("defaults: {tile_m: 64}", "defaults: {tile_m: 32}")))


def test_configs_reject_unknown_axes_like_everything_else(tmp_path):
    with pytest.raises(SpecError, match="unknown key 'head_dims'") as info:
        load_spec_file(write(tmp_path, CONFIGS_SPEC.replace("{head_dim: 64, tile_m: 128}", "{head_dims: 64, tile_m: 128}")))
    assert info.value.line == 6


def test_config_axes_are_the_first_configs_keys_in_order(tmp_path):
    spec = load_spec_file(write(tmp_path, CONFIGS_SPEC.replace("{head_dim: 128, tile_m: 64}", "{tile_m: 64, head_dim: 128}")))
    assert spec.config_axes == ("head_dim", "tile_m")
    assert load_spec_file(write(tmp_path, "family: tiny\naxes: {num_warps: [1]}\n")).config_axes == ()


def test_a_repeated_config_is_refused(tmp_path):
    text = CONFIGS_SPEC.replace("  - {head_dim: 128, tile_m: 64}\n", "  - {head_dim: 64, tile_m: 128}\n")
    with pytest.raises(SpecError, match="non-unique") as info:
        load_spec_file(write(tmp_path, text))
    assert info.value.key_path == "configs" and info.value.line == 6


# --------------------------------------------------------------------------- size limits

#: Every value the schema admits for each axis, to build specs of any size up to the largest.
ALL_VALUES = {
    "head_dim": list(range(8, 513, 8)), "dtype": ["bf16", "fp16", "fp32"], "tile_m": list(range(16, 257, 16)),
    "tile_n": list(range(16, 257, 16)), "tile_k": list(range(16, 257, 16)), "num_warps": [1, 2, 4, 8, 12, 16], "min_blocks_per_sm": list(range(1, 33)),
    "tail": ["tma", "cp_async"], "has_incomplete_tile": [True, False], "rows_per_thread": list(range(1, 17)),
    "mma": ["mma_sync", "wgmma"], "state_layout": ["kv", "vk"], "kv_layout": ["contiguous", "paged"],
    "kv_load": ["tma", "cp_async"], "stages": [2, 3, 4], "epilogue": ["none", "swiglu", "swiglu_quantize"],
    "rows": ["per_sequence", "packed"], "cluster": [1, 2, 4, 8],
}
assert set(ALL_VALUES) == set(AXES)


def line_of_key(text: str, key: str) -> int:
    return next(i for i, line in enumerate(text.splitlines(), 1) if line.startswith(f"{key}:"))


@st.composite
def sized_specs(draw):
    """A valid spec of some size: a few axes with many values, maybe crossed with configs of a head dim and tile_m."""
    with_configs = draw(st.booleans())
    pool = [a for a in AXES if not (with_configs and a in ("head_dim", "tile_m"))]
    names = draw(st.lists(st.sampled_from(pool), min_size=1, max_size=5, unique=True))
    axes = {n: ALL_VALUES[n][:draw(st.integers(1, len(ALL_VALUES[n])))] for n in names}
    spec = {"family": "big"}
    if draw(st.booleans()):
        spec["description"] = "a first line, so that axes is not always on line 2"
    spec["axes"] = axes
    if with_configs:
        pairs = itertools.product(ALL_VALUES["head_dim"], ALL_VALUES["tile_m"])
        count = draw(st.integers(1, 64 * 5))
        spec["configs"] = [{"head_dim": h, "tile_m": t} for h, t in itertools.islice(pairs, count)]
    return spec


@settings(max_examples=150, deadline=None, database=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=sized_specs())
def test_a_spec_over_the_variant_limit_is_refused_on_its_axes_line(tmp_path, data):
    text = yaml.safe_dump(data, sort_keys=False)
    path = fresh_file(tmp_path)
    path.write_text(text, encoding="utf-8")
    count = len(data.get("configs", [None]))
    for values in data["axes"].values():
        count *= len(values)
    if count <= MAX_VARIANTS:
        assert len(load_spec_file(path).assignments) == count
        return
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    assert info.value.key_path == "axes" and info.value.line == line_of_key(text, "axes")
    assert f"declares {count} variants" in str(info.value) and f"at most {MAX_VARIANTS}" in str(info.value)


def test_a_tiny_spec_with_millions_of_variants_is_refused_before_expanding(tmp_path, monkeypatch):
    """The issue's case: a few hundred bytes declaring millions of variants must not build any of them."""
    import kgen.spec

    def must_not_expand(data):
        raise AssertionError("expanded a spec over the variant limit")

    monkeypatch.setattr(kgen.spec, "_expand", must_not_expand)
    axes = {n: ALL_VALUES[n] for n in ("head_dim", "min_blocks_per_sm", "rows_per_thread", "tile_m", "num_warps")}
    text = "family: huge\naxes:\n" + "".join(f"  {n}: {list(v)}\n" for n, v in axes.items())
    assert len(text) < 1000
    with pytest.raises(SpecError, match=f"declares {64 * 32 * 16 * 16 * 6} variants") as info:
        load_spec_file(write(tmp_path, text))
    assert info.value.line == 2


def test_a_spec_at_the_limit_loads(tmp_path):
    text = f"family: full\naxes:\n  head_dim: {ALL_VALUES['head_dim']}\n  min_blocks_per_sm: {ALL_VALUES['min_blocks_per_sm']}\n" \
           "  has_incomplete_tile: [true, false]\n"
    assert len(load_spec_file(write(tmp_path, text)).assignments) == MAX_VARIANTS == 64 * 32 * 2


@FUZZ
@given(data=st.data())
def test_exclusions_remove_exactly_the_matching_variants(tmp_path, data):
    """Exclusions are grouped by the axes they name for speed; the result must be the definition's."""
    names = data.draw(st.lists(st.sampled_from(["dtype", "tail", "num_warps", "has_incomplete_tile"]),
                               min_size=1, max_size=4, unique=True))
    axes = {n: data.draw(st.lists(st.sampled_from(ALL_VALUES[n]), min_size=1, max_size=3, unique=True)) for n in names}
    configs = [{"head_dim": h} for h in data.draw(st.lists(st.sampled_from([64, 128, 256]), max_size=3, unique=True))]
    axis_pool = names + (["head_dim"] if configs else [])
    values = {**axes, "head_dim": [c["head_dim"] for c in configs]}
    exclusion = st.lists(st.sampled_from(axis_pool), min_size=1, unique=True).flatmap(
        lambda keys: st.fixed_dictionaries({k: st.sampled_from(values[k]) for k in keys}))
    spec = {"family": "ex", "axes": axes, "exclude": data.draw(st.lists(exclusion, max_size=8))}
    if configs:
        spec["configs"] = configs
    path = fresh_file(tmp_path)
    path.write_text(yaml.safe_dump(spec, sort_keys=False), encoding="utf-8")
    expected = naive_assignments(spec)
    if not expected:
        with pytest.raises(SpecError, match="remove every variant"):
            load_spec_file(path)
    else:
        assert load_spec_file(path).assignments == expected


def largest_exclusion_spec() -> dict:
    """4,096 variants against 4,096 exclusions naming 256 different axis sets (bench/bench_spec.py times it)."""
    axes = {"head_dim": ALL_VALUES["head_dim"][:16], "dtype": ["bf16", "fp16"], "tile_m": [16, 32], "tile_n": [16, 32],
            "num_warps": [1, 2], "min_blocks_per_sm": [1, 2], "tail": ["tma", "cp_async"],
            "has_incomplete_tile": [True, False], "rows_per_thread": [1, 2]}
    others = list(axes)[1:]
    subsets = [("head_dim", *c) for r in range(len(others) + 1) for c in itertools.combinations(others, r)]
    exclude = [{n: 128 if n == "head_dim" else axes[n][(i // len(subsets)) % 2] for n in subsets[i % len(subsets)]}
               for i in range(MAX_VARIANTS)]
    return {"family": "slow", "axes": axes, "exclude": exclude}


def test_the_most_exclusions_on_the_largest_spec_expand_to_the_right_variants(tmp_path):
    # Its speed is a benchmark's business (bench/bench_spec.py), not a test's: a wall-clock bound failed
    # 4 of 7 runs on a 2-core machine.
    loaded = load_spec_file(write(tmp_path, yaml.safe_dump(largest_exclusion_spec())))
    assert len(loaded.assignments) == MAX_VARIANTS - MAX_VARIANTS // 16  # every head_dim=128 variant is excluded
    assert all(dict(a)["head_dim"] != 128 for a in loaded.assignments)


def test_more_exclusions_than_the_variant_limit_are_refused(tmp_path):
    text = "family: many\naxes: {num_warps: [1, 2]}\nexclude:\n" + "  - {num_warps: 1}\n" * (MAX_VARIANTS + 1)
    with pytest.raises(SpecError, match="is too long") as info:
        load_spec_file(write(tmp_path, text))
    assert info.value.key_path == "exclude" and info.value.line == 4  # the list's first item


# --------------------------------------------------------------------------- lines kept, bad bytes, template owners


def test_a_spec_file_keeps_the_line_of_each_key(tmp_path):
    path = write(tmp_path, CONFIGS_SPEC.replace("family: demo\n", "family: demo\ntemplate: d.cu.j2\nentries: [k]\n"))
    spec = load_spec_file(path)
    assert spec.lines == {"family": 1, "template": 2, "entries": 3, "axes": 4, "axes.dtype": 5,
                          "axes.has_incomplete_tile": 6, "configs": 7, "exclude": 10, "defaults": 12}
    err = spec.error("axes.dtype", "a problem")
    assert str(err) == f"{path}:5: axes.dtype: a problem"
    assert spec.error("min_sm", "not given").line is None  # a key the file lacks has no line


@FUZZ
@given(lines=st.lists(st.text(st.characters(blacklist_categories=["Cs"]), max_size=10), min_size=0, max_size=6),
       bad=st.sampled_from([b"\xff", b"\xfe", b"\xc3", b"\x80", b"\xed\xa0\x80"]),
       newline=st.sampled_from(["\n", "\r\n", "\r"]))
def test_a_byte_that_is_not_utf8_is_reported_on_its_line(tmp_path, lines, bad, newline):
    prefix = "".join(line.replace("\r", "").replace("\n", "") + newline for line in lines)
    prefix = re.sub("[\x85\u2028\u2029]", "", prefix)
    path = fresh_file(tmp_path)
    path.write_bytes(prefix.encode("utf-8") + bad + b"tail\n")
    with pytest.raises(SpecError, match="not UTF-8 text") as info:
        load_spec_file(path)
    assert info.value.line == len(lines) + 1
    assert str(info.value).startswith(f"{path}:{len(lines) + 1}: ")


def test_a_non_utf8_spec_names_the_byte(tmp_path):
    path = write(tmp_path, b"family: demo\naxes: {num_warps: [1]}\ndescription: caf\xe9\n")
    with pytest.raises(SpecError) as info:
        load_spec_file(path)
    assert str(info.value) == f"{path}:3: <top>: not UTF-8 text: byte 52 is 0xe9"


def test_a_spec_naming_a_template_must_list_entries_on_the_template_line(tmp_path):
    path = write(tmp_path, "family: demo\naxes: {num_warps: [1]}\ntemplate: a.cu.j2\n")
    with pytest.raises(SpecError, match="must list its entries") as info:
        load_spec_file(path)
    assert info.value.key_path == "template" and info.value.line == 3


# --------------------------------------------------------------------------- min_sm


def test_min_sm_loads_and_defaults_to_none(tmp_path):
    assert load_spec_file(write(tmp_path, "family: tma\nmin_sm: 90\naxes: {num_warps: [4]}\n")).min_sm == 90
    assert load_spec_file(write(tmp_path, "family: any\naxes: {num_warps: [4]}\n")).min_sm is None


@pytest.mark.parametrize("value,fragment", [
    ("sm_90", "is not of type 'integer'"), ("90.0", "is not of type 'integer'"), ("true", "is not of type 'integer'"),
    ("9", "less than the minimum of 50"), ("1000", "greater than the maximum of 999"), ("[90]", "not of type"),
])
def test_a_bad_min_sm_is_refused_on_its_line(tmp_path, value, fragment):
    with pytest.raises(SpecError, match=re.escape(fragment)) as info:
        load_spec_file(write(tmp_path, f"family: tma\naxes: {{num_warps: [4]}}\nmin_sm: {value}\n"))
    assert info.value.key_path == "min_sm" and info.value.line == 3


# --------------------------------------------------------------------------- axis value schemas


def axis_spec(tmp_path, axis: str, value) -> Path:
    return write(tmp_path, yaml.safe_dump({"family": "values", "axes": {axis: [value]}}))


@FUZZ
@given(axis=st.sampled_from(["tile_m", "tile_n", "num_warps", "head_dim"]), value=st.integers(-64, 1100))
def test_integer_axes_admit_only_values_a_kernel_could_use(tmp_path, axis, value):
    admitted = {
        "tile_m": 16 <= value <= 256 and value % 16 == 0,
        "tile_n": 16 <= value <= 256 and value % 16 == 0,
        "num_warps": value in (1, 2, 4, 8, 12, 16),
        "head_dim": 8 <= value <= 512 and value % 8 == 0,
    }[axis]
    path = axis_spec(tmp_path, axis, value)
    if admitted:
        assert load_spec_file(path).axes == {axis: (value,)}
    else:
        with pytest.raises(SpecError) as info:
            load_spec_file(path)
        assert info.value.key_path == f"axes.{axis}[0]"


def test_num_stages_is_no_longer_an_axis(tmp_path):
    with pytest.raises(SpecError, match="unknown key 'num_stages'"):
        load_spec_file(write(tmp_path, "family: demo\naxes:\n  num_warps: [4]\n  num_stages: [2]\n"))
