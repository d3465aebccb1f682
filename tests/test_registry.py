"""The spec search path and the families it declares (kgen.registry), over temporary folders.

Nothing here needs a GPU: a user variant is rendered and compiled with NVRTC for sm_90a.
"""

from __future__ import annotations

import gc
import os
import textwrap
import weakref
from pathlib import Path

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kgen import config, registry
from kgen.compiler import compile_cubin
from kgen.registry import Registry, SpecPathError, UnsupportedVariantError
from kgen.render import render
from kgen.runtime.dispatch import SpecPathMemo
from kgen.spec import SpecError, load_spec_file
from kgen.spec_schema import MAX_VARIANTS

FAMILY = "merge_attention_states"
BUILTIN_SPEC = config.BUILTIN_SPEC_DIR / f"{FAMILY}.yaml"

# The built-in family's axes, with head_dim 80 (which the built-in spec lacks) for bf16 only.
USER_HEAD_DIM_80 = """
family: merge_attention_states
axes:
  head_dim: [80]
  dtype: [bf16]
  num_warps: [4]
  rows_per_thread: [2]
  min_blocks_per_sm: [8]
  has_incomplete_tile: [true, false]
"""


@pytest.fixture(autouse=True)
def isolated_search_path():
    """add_spec_path mutates module state; KGEN_SPEC_PATH may be set in the caller's environment."""
    saved = list(registry._extra_dirs)
    with config.overrides(KGEN_SPEC_PATH=None):
        yield
    registry._extra_dirs[:] = saved  # current() rebuilds itself once the path differs


def make_folder(root: Path, name: str, files: dict[str, str]) -> Path:
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    for filename, text in files.items():
        (folder / filename).write_text(textwrap.dedent(text).lstrip("\n"), encoding="utf-8")
    return folder


def params(variant) -> dict:
    return variant.param_dict


# --------------------------------------------------------------------------- merging


def test_families_merge_across_files_and_folders(tmp_path):
    first = make_folder(tmp_path, "first", {
        "a_owner.yaml": """
            family: demo
            template: demo.cu.j2
            entries: [k_main, k_aux]
            axes:
              num_warps: [1, 2]
              tail: [tma]
            defaults: {num_warps: 2}
            """,
        "b_more.yml": """
            family: demo
            axes:
              tail: [tma, cp_async]
              num_warps: [4]
            """,
        "c_other.yaml": """
            family: other
            template: other.cu.j2
            entries: [k]
            axes: {dtype: [fp32]}
            """,
    })
    second = make_folder(tmp_path, "second", {
        "demo_extra.yaml": """
            family: demo
            axes:
              num_warps: [2, 8]
              tail: [tma]
            """,
    })
    reg = Registry([first, second])
    assert sorted(reg.families) == ["demo", "other"]
    demo = reg.family("demo")
    assert demo.template == "demo.cu.j2"
    assert demo.entries == ("k_main", "k_aux")
    assert demo.axes == ("num_warps", "tail")
    assert demo.defaults == {"num_warps": 2}
    assert demo.template_dirs[0] == first
    assert demo.template_dirs[-1] == config.BUILTIN_TEMPLATE_DIR
    # Variants in search order, each once, params in the owner's axis order.
    assert [v.params for v in demo.variants] == [
        (("num_warps", 1), ("tail", "tma")),
        (("num_warps", 2), ("tail", "tma")),
        (("num_warps", 4), ("tail", "tma")),
        (("num_warps", 4), ("tail", "cp_async")),
        (("num_warps", 8), ("tail", "tma")),
    ]
    # (2, tma) is declared twice: the first file on the search path keeps it.
    origins = {v.name: v.spec_path.name for v in demo.variants}
    assert origins == {
        "demo[num_warps=1,tail=tma]": "a_owner.yaml",
        "demo[num_warps=2,tail=tma]": "a_owner.yaml",
        "demo[num_warps=4,tail=tma]": "b_more.yml",
        "demo[num_warps=4,tail=cp_async]": "b_more.yml",
        "demo[num_warps=8,tail=tma]": "demo_extra.yaml",
    }
    assert [v.name for v in reg.family("other").variants] == ["other[dtype=fp32]"]
    assert len(reg.variants()) == 6
    assert demo.supported("tail") == ["cp_async", "tma"]
    assert demo.supported("tail", num_warps=8) == ["tma"]


def test_a_missing_folder_or_a_file_on_the_path_is_refused(tmp_path):
    folder = make_folder(tmp_path, "specs", {"x.yaml": "family: x\ntemplate: x.cu.j2\nentries: [k]\naxes: {num_warps: [1]}\n"})
    assert list(Registry([folder]).families) == ["x"]
    missing = tmp_path / "does_not_exist"
    with pytest.raises(SpecPathError, match=f"spec folder {missing} on the spec search path does not exist"):
        Registry([missing, folder])
    with pytest.raises(SpecPathError, match="is not a folder"):
        Registry([folder, folder / "x.yaml"])
    # add_spec_path's callers catch FileNotFoundError; the CLI turns every ValueError into exit code 2.
    assert issubclass(SpecPathError, FileNotFoundError) and issubclass(SpecPathError, ValueError)


def test_a_folder_listed_twice_is_searched_once_where_it_first_appears(tmp_path):
    first = make_folder(tmp_path, "first", {"x.yaml": "family: x\ntemplate: x.cu.j2\nentries: [k]\naxes: {num_warps: [1]}\n"})
    second = make_folder(tmp_path, "second", {"x.yaml": "family: x\naxes: {num_warps: [1, 2]}\n"})
    family = Registry([second, first, second / ".." / "second"]).family("x")
    assert [v.spec_path for v in family.variants] == [second / "x.yaml", second / "x.yaml"]
    with config.overrides(KGEN_SPEC_PATH=str(config.BUILTIN_SPEC_DIR)):
        assert FAMILY in registry.current().families  # not two files naming its template


def test_unknown_family_lists_the_known_ones(tmp_path):
    folder = make_folder(tmp_path, "specs", {"x.yaml": "family: x\ntemplate: x.cu.j2\nentries: [k]\naxes: {num_warps: [1]}\n"})
    with pytest.raises(UnsupportedVariantError, match=r"no kernel family 'y'.*families: \['x'\]"):
        Registry([folder]).family("y")


def test_two_files_naming_a_template_for_one_family_are_refused(tmp_path):
    folder = make_folder(tmp_path, "specs", {
        "one.yaml": "family: demo\ntemplate: a.cu.j2\nentries: [k]\naxes: {num_warps: [1]}\n",
        "two.yaml": "family: demo\ntemplate: b.cu.j2\nentries: [k]\naxes: {num_warps: [2]}\n",
    })
    with pytest.raises(SpecError, match="exactly one spec naming its template; found 2") as info:
        Registry([folder])
    # The second file's template line, naming the first's.
    assert info.value.file == str(folder / "two.yaml") and info.value.line == 2
    assert f"{folder / 'one.yaml'}:2" in str(info.value) and f"{folder / 'two.yaml'}:2" in str(info.value)
    assert info.value.key_path == "template"


def test_template_owners_in_two_folders_are_refused(tmp_path):
    a = make_folder(tmp_path, "a", {"demo.yaml": "family: demo\ntemplate: a.cu.j2\nentries: [k]\naxes: {num_warps: [1]}\n"})
    b = make_folder(tmp_path, "b", {"demo.yaml": "family: demo\ntemplate: a.cu.j2\nentries: [k]\naxes: {num_warps: [2]}\n"})
    with pytest.raises(SpecError, match="found 2"):
        Registry([a, b])


def test_family_without_a_template_is_refused(tmp_path):
    folder = make_folder(tmp_path, "specs", {"lonely.yaml": "family: lonely\naxes: {num_warps: [1]}\n"})
    with pytest.raises(SpecError, match="found 0") as info:
        Registry([folder])
    assert str(info.value).startswith(f"{folder / 'lonely.yaml'}:1: family: ")


def test_template_owner_must_list_entries(tmp_path):
    folder = make_folder(tmp_path, "specs", {"demo.yaml": "family: demo\ntemplate: a.cu.j2\naxes: {num_warps: [1]}\n"})
    with pytest.raises(SpecError, match="must list its entries") as info:
        Registry([folder])
    assert info.value.key_path == "template" and info.value.line == 2


def test_mismatched_axes_across_files_are_refused(tmp_path):
    folder = make_folder(tmp_path, "specs", {
        "a_owner.yaml": "family: demo\ntemplate: a.cu.j2\nentries: [k]\naxes: {num_warps: [1], tail: [tma]}\n",
        "b_extra.yaml": "family: demo\naxes: {num_warps: [2]}\n",
    })
    with pytest.raises(SpecError) as info:
        Registry([folder])
    assert str(info.value) == (f"{folder / 'b_extra.yaml'}:2: axes: family 'demo' has the axis 'tail' "
                               f"({folder / 'a_owner.yaml'}:4), which this file does not give and the family has no "
                               f"default for: give tail in this file's axes or configs")


def test_a_file_written_before_the_family_gained_an_axis_takes_its_default(tmp_path):
    # attention's `mma` broke every earlier user spec; an axis with a family default no longer does.
    folder = make_folder(tmp_path, "specs", {
        "a_owner.yaml": "family: demo\ntemplate: a.cu.j2\nentries: [k]\naxes: {num_warps: [1], tail: [tma, cp_async]}\n"
                        "defaults: {tail: cp_async}\n",
        "b_older.yaml": "family: demo\naxes: {num_warps: [2]}\n",
    })
    variants = Registry([folder]).family("demo").variants
    assert [params(v) for v in variants] == [{"num_warps": 1, "tail": "tma"}, {"num_warps": 1, "tail": "cp_async"},
                                             {"num_warps": 2, "tail": "cp_async"}]


def test_an_older_user_spec_of_attention_prefill_takes_tail_s_and_rows_defaults_and_is_told_mma_has_none(tmp_path):
    old = ("family: attention_prefill\naxes: {dtype: [bf16], has_incomplete_tile: [true]}\n"
           "configs:\n  - {head_dim: 80, tile_m: 64, tile_n: 64, num_warps: 4, min_blocks_per_sm: 2%s}\n")
    folder = make_folder(tmp_path, "user", {"old.yaml": old % ""})
    with pytest.raises(SpecError, match="has the axis 'mma' .* has no default for: give mma"):
        Registry([folder, config.BUILTIN_SPEC_DIR])
    (folder / "old.yaml").write_text(old % ", mma: mma_sync")
    family = Registry([folder, config.BUILTIN_SPEC_DIR]).family("attention_prefill")
    added = [params(v) for v in family.variants if v.param_dict["head_dim"] == 80]
    assert added == [dict(mma="mma_sync", head_dim=80, tile_m=64, tile_n=64, num_warps=4, min_blocks_per_sm=2,
                          dtype="bf16", tail="tma", has_incomplete_tile=True, rows="per_sequence")]


def test_an_extra_axis_is_reported_on_its_own_line(tmp_path):
    folder = make_folder(tmp_path, "specs", {
        "a_owner.yaml": "family: demo\ntemplate: a.cu.j2\nentries: [k]\naxes: {num_warps: [1]}\n",
        "b_extra.yaml": "family: demo\naxes:\n  num_warps: [2]\n  tail: [tma]\n",
    })
    with pytest.raises(SpecError, match=r"; extra: \['tail'\]$") as info:
        Registry([folder])
    assert info.value.key_path == "axes.tail" and info.value.line == 4


def test_a_user_file_with_different_axes_than_the_builtin_is_refused(tmp_path):
    folder = make_folder(tmp_path, "user", {"extra.yaml": "family: merge_attention_states\naxes: {head_dim: [80], dtype: [bf16]}\n"})
    with pytest.raises(SpecError, match="has the axis 'rows_per_thread'"):
        Registry([folder, config.BUILTIN_SPEC_DIR])


def test_an_invalid_file_anywhere_on_the_path_is_a_spec_error(tmp_path):
    folder = make_folder(tmp_path, "specs", {"bad.yaml": "family: demo\naxes:\n  num_warps: [1]\n  tail: [dma]\n"})
    with pytest.raises(SpecError, match=r"bad\.yaml:4: axes\.tail\[0\]"):
        Registry([folder])


# --------------------------------------------------------------------------- select


@pytest.fixture
def demo_registry(tmp_path) -> Registry:
    folder = make_folder(tmp_path, "specs", {
        "demo.yaml": """
            family: demo
            template: demo.cu.j2
            entries: [k]
            axes:
              num_warps: [1, 2, 4]
              tail: [tma, cp_async]
            exclude:
              - {num_warps: 4, tail: cp_async}
            defaults:
              num_warps: 2
              tail: cp_async
            """,
        "plain.yaml": """
            family: plain
            template: demo.cu.j2
            entries: [k]
            axes:
              num_warps: [1, 2, 4]
              tail: [tma, cp_async]
            """,
    })
    return Registry([folder])


def test_select_prefers_the_defaults(demo_registry):
    demo = demo_registry.family("demo")
    assert params(demo.select()) == {"num_warps": 2, "tail": "cp_async"}
    assert params(demo.select(tail="tma")) == {"num_warps": 2, "tail": "tma"}
    assert params(demo.select(num_warps=1)) == {"num_warps": 1, "tail": "cp_async"}
    # (4, cp_async) is excluded, so the default tail cannot be had with num_warps=4.
    assert params(demo.select(num_warps=4)) == {"num_warps": 4, "tail": "tma"}
    # Without defaults the earliest variant wins.
    plain = demo_registry.family("plain")
    assert params(plain.select()) == {"num_warps": 1, "tail": "tma"}
    assert params(plain.select(tail="cp_async")) == {"num_warps": 1, "tail": "cp_async"}


def test_select_exact(demo_registry):
    variant = demo_registry.family("demo").select(num_warps=4, tail="tma")
    assert variant.name == "demo[num_warps=4,tail=tma]"
    assert variant.family.name == "demo"


def test_select_unsupported_value_lists_the_supported_ones(demo_registry):
    demo = demo_registry.family("demo")
    with pytest.raises(UnsupportedVariantError) as info:
        demo.select(num_warps=3)
    assert str(info.value) == "demo: num_warps=3 is not supported; supported: [1, 2, 4]"
    # An excluded combination names what the other fixed values allow.
    with pytest.raises(UnsupportedVariantError) as info:
        demo.select(num_warps=4, tail="cp_async")
    assert str(info.value) == "demo: tail='cp_async' is not supported with {'num_warps': 4}; supported: ['tma']"
    with pytest.raises(UnsupportedVariantError, match=r"no axis \['head_dim'\]; axes: \['num_warps', 'tail'\]"):
        demo.select(head_dim=64)
    assert issubclass(UnsupportedVariantError, ValueError)  # the CLI maps ValueError to exit code 2


def test_builtin_select_of_an_unsupported_head_dim_lists_the_spec_values():
    family = registry.current().family(FAMILY)
    with pytest.raises(UnsupportedVariantError, match="head_dim=80 is not supported") as info:
        family.select(head_dim=80, dtype="bf16", has_incomplete_tile=True)
    listed = str(info.value).split("supported: ")[-1]
    assert listed == str(sorted(load_spec_file(BUILTIN_SPEC).axes["head_dim"]))


# --------------------------------------------------------------------------- user spec folders


@pytest.fixture
def user_folder(tmp_path) -> Path:
    return make_folder(tmp_path, "user_specs", {"extra_head_dims.yaml": USER_HEAD_DIM_80})


def assert_has_user_variant(user_folder: Path):
    family = registry.current().family(FAMILY)
    variant = family.select(head_dim=80, dtype="bf16", has_incomplete_tile=True)
    assert params(variant) == {"head_dim": 80, "dtype": "bf16", "num_warps": 4, "rows_per_thread": 2,
                               "min_blocks_per_sm": 8, "has_incomplete_tile": True}
    assert variant.spec_path.resolve() == (user_folder / "extra_head_dims.yaml").resolve()
    assert 80 in family.supported("head_dim")
    assert family.supported("dtype", head_dim=80) == ["bf16"]
    # The built-in variants are all still there, and the template is still the built-in one.
    builtin = {tuple(sorted(a)) for a in load_spec_file(BUILTIN_SPEC).assignments}
    have = {tuple(sorted(v.params)) for v in family.variants}
    assert builtin <= have
    assert len(have) == len(builtin) + 2
    assert family.template_dirs[0] == config.BUILTIN_SPEC_DIR
    return variant


def test_add_spec_path_adds_a_user_variant(user_folder):
    with pytest.raises(UnsupportedVariantError):
        registry.current().family(FAMILY).select(head_dim=80)
    generation = registry.generation
    registry.add_spec_path(user_folder)
    assert registry.spec_path()[0] == user_folder.resolve()
    assert registry.generation > generation  # ops drop their dispatch caches
    assert_has_user_variant(user_folder)


def test_add_spec_path_is_idempotent_and_accepts_strings(user_folder):
    registry.add_spec_path(str(user_folder))
    registry.add_spec_path(user_folder)
    assert registry._extra_dirs.count(user_folder.resolve()) == 1


def test_kgen_spec_path_adds_a_user_variant(user_folder):
    with config.overrides(KGEN_SPEC_PATH=str(user_folder)):
        assert_has_user_variant(user_folder)
    # Leaving the override drops the user folder again.
    with pytest.raises(UnsupportedVariantError, match="head_dim=80"):
        registry.current().family(FAMILY).select(head_dim=80)


def test_kgen_spec_path_takes_several_folders(user_folder, tmp_path):
    other = make_folder(tmp_path, "other", {"fp16.yaml": USER_HEAD_DIM_80.replace("[bf16]", "[fp16]")})
    with config.overrides(KGEN_SPEC_PATH=os.pathsep.join([str(other), "", str(user_folder)])):
        family = registry.current().family(FAMILY)
        assert family.supported("dtype", head_dim=80) == ["bf16", "fp16"]
        assert family.select(head_dim=80, dtype="fp16").spec_path.parent == other


def test_add_spec_path_comes_before_kgen_spec_path_before_builtins(tmp_path):
    # The same (new) variants declared in two folders: the earlier folder on the path owns them.
    added = make_folder(tmp_path, "added", {"x.yaml": USER_HEAD_DIM_80})
    env = make_folder(tmp_path, "env", {"x.yaml": USER_HEAD_DIM_80})
    with config.overrides(KGEN_SPEC_PATH=str(env)):
        assert registry.current().family(FAMILY).select(head_dim=80).spec_path.parent == env
        registry.add_spec_path(added)
        assert registry.spec_path() == [added.resolve(), env, config.BUILTIN_SPEC_DIR]
        assert registry.current().family(FAMILY).select(head_dim=80).spec_path.parent == added.resolve()


def test_add_spec_path_refuses_bad_folders_and_keeps_the_path(tmp_path):
    before = list(registry._extra_dirs)
    with pytest.raises(FileNotFoundError, match="missing does not exist"):
        registry.add_spec_path(tmp_path / "missing")
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SpecPathError, match="a_file is not a folder"):
        registry.add_spec_path(tmp_path / "a_file")
    bad = make_folder(tmp_path, "bad", {"bad.yaml": "family: demo\naxes: {head_dims: [64]}\n"})
    with pytest.raises(SpecError, match="head_dims"):
        registry.add_spec_path(bad)
    assert registry._extra_dirs == before
    assert FAMILY in registry.current().families  # the registry still loads


def test_user_variant_renders_and_compiles_without_spills(user_folder):
    registry.add_spec_path(user_folder)
    variant = registry.current().family(FAMILY).select(head_dim=80, dtype="bf16", has_incomplete_tile=True)
    source = render(variant)
    assert source.startswith(f"// kgen: {variant.name}\n")
    assert "kHeadDim = 80;" in source
    assert "__nv_bfloat16" in source
    assert "merge_states_2" in source and "merge_states_n" in source
    cubin, record = compile_cubin(source, "sm_90a", variant.name)
    assert cubin[:4] == b"\x7fELF"
    assert record.arch == "sm_90a"
    assert set(record.entries) == {"merge_states_2", "merge_states_n"}
    assert all(e.registers > 0 for e in record.entries.values())
    assert record.spills == 0


def test_a_user_family_uses_the_template_next_to_its_spec(tmp_path):
    # The user's template has the built-in template's file name: the spec's folder is searched first.
    folder = make_folder(tmp_path, "user", {
        "shadow.yaml": "family: shadow\ntemplate: merge_attention_states.cu.j2\nentries: [k]\naxes: {num_warps: [1, 2]}\n",
        "merge_attention_states.cu.j2": "// user template, {{ num_warps * 32 }} threads, {{ family }}\n",
    })
    registry.add_spec_path(folder)
    family = registry.current().family("shadow")
    assert family.template_dirs[0] == folder.resolve()
    source = render(family.select(num_warps=2))
    assert source == "// kgen: shadow[num_warps=2]\n// user template, 64 threads, shadow\n"


# --------------------------------------------------------------------------- what a family keeps from its specs

OWNER_WITH_CONFIGS = """
family: demo
template: demo.cu.j2
entries: [k]
min_sm: 90
axes:
  dtype: [bf16, fp16]
configs:
  - {head_dim: 128, tile_m: 128, tile_n: 64}
  - {head_dim: 128, tile_m: 64, tile_n: 64}
  - {head_dim: 64, tile_m: 64, tile_n: 32}
"""


def test_a_family_keeps_its_config_axes_and_min_sm(tmp_path):
    family = Registry([make_folder(tmp_path, "specs", {"demo.yaml": OWNER_WITH_CONFIGS})]).family("demo")
    assert family.config_axes == ("head_dim", "tile_m", "tile_n")
    assert family.min_sm == 90
    # Grouping by the config axes gives one variant per config, in spec order.
    assert [v.param_dict["tile_m"] for v in family.preferred(group_by=family.config_axes, head_dim=128)] == [128, 64]
    plain = Registry([make_folder(tmp_path, "plain", {"p.yaml": "family: p\ntemplate: p.cu.j2\nentries: [k]\n"
                                                                "axes: {num_warps: [1]}\n"})]).family("p")
    assert plain.config_axes == () and plain.min_sm is None


def test_the_builtin_attention_family_groups_by_its_tile_shape():
    family = registry.current().family("attention_prefill")
    assert family.config_axes == ("mma", "head_dim", "tile_m", "tile_n", "num_warps", "min_blocks_per_sm")
    assert family.axis_values("dtype") == ["bf16", "fp16"]


def test_axis_values_keep_search_path_and_spec_order(tmp_path):
    first = make_folder(tmp_path, "first", {"demo.yaml": OWNER_WITH_CONFIGS})
    second = make_folder(tmp_path, "second", {"more.yaml": """
        family: demo
        axes: {dtype: [fp32, bf16]}
        configs: [{head_dim: 256, tile_m: 16, tile_n: 64}, {head_dim: 32, tile_m: 16, tile_n: 16}]
        """})
    family = Registry([second, first]).family("demo")
    assert family.axis_values("head_dim") == [256, 32, 128, 64]
    assert family.axis_values("tile_m", head_dim=128) == [128, 64]
    assert family.axis_values("dtype") == ["fp32", "bf16", "fp16"]
    assert family.supported("dtype") == ["bf16", "fp16", "fp32"]  # sorted
    assert family.axis_values("dtype", head_dim=512) == []


@given(min_sm=st.none() | st.integers(50, 999), sm=st.integers(0, 2000))
def test_a_variant_supports_an_arch_at_or_above_its_familys_min_sm(min_sm, sm):
    family = registry.Family(name="f", template="f.cu.j2", entries=("k",), template_dirs=(), allow_spills=False,
                             axes=("num_warps",), defaults={}, min_sm=min_sm)
    variant = registry.Variant(family, (("num_warps", 4),), Path("f.yaml"))
    assert variant.supports_sm(sm) is (min_sm is None or sm >= min_sm)


def test_a_variants_score_cost_is_the_product_of_its_axis_values_factors(tmp_path):
    folder = make_folder(tmp_path, "specs", {"demo.yaml": OWNER_WITH_CONFIGS.replace(
        "min_sm: 90\n", "min_sm: 90\nscore_cost:\n  tile_m: {64: 1.5}\n  dtype: {fp16: 2, bf16: 1}\n")})
    family = Registry([folder]).family("demo")
    costs = {(p["tile_m"], p["dtype"]): v.score_cost for v in family.variants for p in [v.param_dict]}
    assert costs == {(128, "bf16"): 1.0, (128, "fp16"): 2.0, (64, "bf16"): 1.5, (64, "fp16"): 3.0}
    plain = Registry([make_folder(tmp_path, "plain", {"demo.yaml": OWNER_WITH_CONFIGS})]).family("demo")
    assert {v.score_cost for v in plain.variants} == {1.0}


@pytest.mark.parametrize("table", ["{tile_m: {64: 0}}", "{tile_m: {64: -1}}", "{tile_m: {64: fast}}",
                                   "{tile_ms: {64: 2}}", "{tile_m: {}}"])
def test_a_bad_score_cost_is_a_spec_error(tmp_path, table):
    folder = make_folder(tmp_path, "specs", {"demo.yaml": OWNER_WITH_CONFIGS.replace(
        "min_sm: 90\n", f"min_sm: 90\nscore_cost: {table}\n")})
    with pytest.raises(SpecError, match="score_cost"):
        Registry([folder])


def test_the_builtin_prefill_spec_costs_mma_sync_scores_more():
    family = registry.current().family("attention_prefill")
    costs = {mma: {v.score_cost for v in family.variants if v.param_dict["mma"] == mma} for mma in ("wgmma", "mma_sync")}
    assert min(costs["mma_sync"]) > max(costs["wgmma"])


# --------------------------------------------------------------------------- files of a family must agree

ADD_CONFIG = """
family: demo
axes: {dtype: [bf16]}
configs: [{head_dim: 256, tile_m: 64, tile_n: 64}]
"""


@pytest.mark.parametrize("text,key,line,fragment", [
    # The configs set other axes than the owner's: an axis moved between configs and axes.
    ("family: demo\naxes: {dtype: [bf16], tile_n: [64]}\nconfigs: [{head_dim: 256, tile_m: 64}]\n",
     "configs", 3, "the configs of family 'demo' set ['head_dim', 'tile_m', 'tile_n']"),
    ("family: demo\naxes: {dtype: [bf16], head_dim: [256], tile_m: [64], tile_n: [64]}\n",
     "axes", 2, "this file's set []"),
    # Family-wide keys repeated with another value.
    (ADD_CONFIG + "min_sm: 80\n", "min_sm", 4, "min_sm is the same for the whole family"),
    (ADD_CONFIG + "entries: [other]\n", "entries", 4, "('k',); this file gives ('other',)"),
    (ADD_CONFIG + "allow_spills: true\n", "allow_spills", 4, "False; this file gives True"),
    (ADD_CONFIG + "defaults: {dtype: bf16}\n", "defaults", 4, "{}; this file gives {'dtype': 'bf16'}"),
    # A config axis the family lacks: the configs line.
    ("family: demo\naxes: {dtype: [bf16]}\nconfigs: [{head_dim: 256, tile_m: 64, tile_n: 64, num_warps: 4}]\n",
     "configs", 3, "extra: ['num_warps']"),
], ids=["config-axis-in-axes", "no-configs", "min_sm", "entries", "allow_spills", "defaults", "extra-config-axis"])
def test_a_file_that_disagrees_with_the_owner_is_refused_on_its_line(tmp_path, text, key, line, fragment):
    owner = make_folder(tmp_path, "owner", {"demo.yaml": OWNER_WITH_CONFIGS})
    user = make_folder(tmp_path, "user", {"user.yaml": text})
    with pytest.raises(SpecError) as info:
        Registry([user, owner])
    assert info.value.file == str(user / "user.yaml")
    assert (info.value.key_path, info.value.line) == (key, line)
    assert fragment in str(info.value)
    assert str(owner / "demo.yaml") in str(info.value)  # where the family's own value is


def test_a_file_may_repeat_the_familys_keys_and_order_its_config_axes_freely(tmp_path):
    owner = make_folder(tmp_path, "owner", {"demo.yaml": OWNER_WITH_CONFIGS})
    user = make_folder(tmp_path, "user", {"user.yaml": """
        family: demo
        min_sm: 90
        entries: [k]
        allow_spills: false
        axes: {dtype: [bf16]}
        configs: [{tile_n: 64, tile_m: 64, head_dim: 256}]
        """})
    family = Registry([user, owner]).family("demo")
    assert family.config_axes == ("head_dim", "tile_m", "tile_n")  # the owner's order
    assert family.variants[0].params == (("head_dim", 256), ("tile_m", 64), ("tile_n", 64), ("dtype", "bf16"))


# --------------------------------------------------------------------------- the family variant limit


def spec_with_head_dims(head_dims, *, owner: bool) -> str:
    lines = ["family: wide"] + (["template: w.cu.j2", "entries: [k]"] if owner else [])
    return "\n".join(lines + ["axes:", f"  head_dim: {list(head_dims)}", f"  min_blocks_per_sm: {list(range(1, 33))}",
                              "  has_incomplete_tile: [true, false]", ""])


@given(first=st.integers(1, 64), second=st.integers(1, 64), overlap=st.integers(0, 64))
@example(first=64, second=5, overlap=0)  # the user's head dims start past the list's end (CI found it)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_family_over_the_limit_after_merging_is_refused_on_the_file_that_passes_it(tmp_path_factory, first, second,
                                                                                      overlap):
    """Each file is 64 variants per head dim; a head dim both files list counts once."""
    head_dims = list(range(8, 513, 8))
    overlap = min(overlap, first, second)
    own = head_dims[:first]
    start = min(first - overlap, len(head_dims) - second)  # `second` head dims, the overlap growing at the list's end
    added = head_dims[start:start + second]
    root = tmp_path_factory.mktemp("limit")
    owner = make_folder(root, "owner", {"w.yaml": spec_with_head_dims(own, owner=True)})
    user = make_folder(root, "user", {"more.yaml": spec_with_head_dims(added, owner=False)})
    total = 64 * len(set(own) | set(added))
    if total <= MAX_VARIANTS:
        assert len(Registry([owner, user]).family("wide").variants) == total
        return
    with pytest.raises(SpecError, match=f"family 'wide' reaches {total} variants with this file; "
                                        f"a family may have at most {MAX_VARIANTS}") as info:
        Registry([owner, user])
    assert info.value.file == str(user / "more.yaml") and (info.value.key_path, info.value.line) == ("axes", 2)


# --------------------------------------------------------------------------- module state


def test_switching_folders_keeps_one_registry_and_drops_the_old_ones(tmp_path):
    """The module holds the registry of the current path only: nothing piles up per folder."""
    seen = []
    for index in range(5):
        folder = make_folder(tmp_path, f"user{index}", {"extra_head_dims.yaml": USER_HEAD_DIM_80})
        with config.overrides(KGEN_SPEC_PATH=str(folder)):
            seen.append(weakref.ref(registry.current()))
            assert registry.spec_path() == [folder, config.BUILTIN_SPEC_DIR]
            assert registry._current[0] == ((), str(folder))  # the setting it was built for
    gc.collect()
    assert all(ref() is None for ref in seen[:-1])  # the last may still be current until the next rebuild
    registry.current()
    gc.collect()
    assert seen[-1]() is None
    assert registry._extra_dirs == []  # KGEN_SPEC_PATH folders are never added to the module's list


def test_a_dispatch_memo_is_emptied_by_a_new_spec_path_before_anything_asks_the_registry(user_folder):
    """Ops look in their memos first: a memo must see a changed KGEN_SPEC_PATH by itself, or an op keeps
    launching the variants of the path it was first called under."""
    memo = SpecPathMemo()
    memo.put(("key",), "from the built-in path")
    assert memo.get(("key",)) == "from the built-in path"
    with config.overrides(KGEN_SPEC_PATH=str(user_folder)):
        assert memo.get(("key",)) is None
        memo.put(("key",), "from the user path")
        assert memo.get(("key",)) == "from the user path"
    assert memo.get(("key",)) is None
