"""The ``kgen`` command (kgen.cli): list, render, build, cache; no GPU needed (``--arch sm_90a``).

In-process runs use click's CliRunner on ``kgen.cli.cli`` (not a terminal, so
progress comes as lines); what ``kgen.cli.main`` does with kgen's errors (one
``error: ...`` line on stderr, exit 2) is checked by running ``python -m kgen``
in a subprocess.
"""

from __future__ import annotations

import errno
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

import kgen
import kgen.cache.store
import kgen.cli.progress
import kgen.jit
import kgen.cli.report
import kgen.contract
from kgen import arch, config, registry
from kgen.cache import DiskCache
from kgen.cli import cli, printable
from kgen.compiler import compile_cubin
from kgen.render import render
from kgen.spec import load_spec_file

FAMILY = "merge_attention_states"
BUILTIN_SPEC = config.BUILTIN_SPEC_DIR / f"{FAMILY}.yaml"
REPO_ROOT = Path(__file__).resolve().parent.parent

# 64 floats live at once under __launch_bounds__(1024, 2) (at most 32 registers a thread): ptxas must spill.
SPILL_TEMPLATE = r"""
extern "C" __global__ void __launch_bounds__(1024, 2) {{ entries[0] }}(const float* __restrict__ in, float* __restrict__ out) {
    float a[64];
#pragma unroll
    for (int i = 0; i < 64; ++i) a[i] = in[threadIdx.x + i * 1024];
    float s = 0.f;
#pragma unroll
    for (int i = 0; i < 64; ++i) s += a[i] * a[63 - i];
#pragma unroll
    for (int i = 0; i < 64; ++i) out[threadIdx.x + i * 1024] = a[i] * s * {{ num_warps }};
}
"""

TINY_TEMPLATE = r"""
extern "C" __global__ void {{ entries[0] }}(float* out) { out[threadIdx.x] = {{ num_warps }}.f; }
"""


@pytest.fixture(autouse=True)
def isolated_search_path():
    """``--spec-path`` calls add_spec_path, which mutates module state; restore it."""
    saved = list(registry._extra_dirs)
    yield
    registry._extra_dirs[:] = saved


@pytest.fixture
def cache_dir(tmp_path) -> Path:
    return tmp_path / "kgen_cache"


@pytest.fixture
def env(cache_dir) -> dict:
    """For CliRunner.invoke: a private cache, no user spec path or arch from the caller, wide output."""
    return {"KGEN_CACHE_DIR": str(cache_dir), "KGEN_SPEC_PATH": None, "KGEN_ARCH": None, "COLUMNS": "400"}


def invoke(args: list[str], env: dict):
    return CliRunner().invoke(cli, args, env=env)


def run_kgen(args: list[str], env: dict, timeout: float = 300) -> subprocess.CompletedProcess:
    """``python -m kgen ARGS`` in a subprocess, with ``env`` applied over this process's environment."""
    full = dict(os.environ)
    for key, value in env.items():
        if value is None:
            full.pop(key, None)
        else:
            full[key] = value
    return subprocess.run([sys.executable, "-m", "kgen", *args], env=full, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=timeout)


def make_family(root: Path, family: str, template: str, *, allow_spills: bool | None = None,
                num_warps: list[int] = (1,), entries: list[str] | None = None, min_sm: int | None = None,
                mma: list[str] | None = None, sm_only: dict | None = None) -> Path:
    """A user spec folder with one new family (template file next to its spec); returns the folder.

    The entries default to ``[<family>_entry]``, the name the templates here give their kernel.
    """
    folder = root / f"specs_{family}"
    folder.mkdir(parents=True, exist_ok=True)
    axes = f"num_warps: {list(num_warps)}" + (f", mma: [{', '.join(mma)}]" if mma else "")
    lines = [f"family: {family}", f"template: {family}.cu.j2", f"entries: {entries or [family + '_entry']}",
             f"axes: {{{axes}}}"]
    if allow_spills is not None:
        lines.append(f"allow_spills: {'true' if allow_spills else 'false'}")
    if min_sm is not None:
        lines.append(f"min_sm: {min_sm}")
    if sm_only is not None:
        lines.append(f"sm_only: {json.dumps(sm_only)}")  # JSON is YAML
    (folder / f"{family}.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / f"{family}.cu.j2").write_text(textwrap.dedent(template), encoding="utf-8")
    return folder


def cache_cells(output: str) -> list[str]:
    """The cache column of every variant's line of a build report, in order."""
    return re.findall(r"^  \s*\S+  .*?\b(hit|miss)\s{2,}\S", output, re.M)


def builtin_variant_count() -> int:
    return len(load_spec_file(BUILTIN_SPEC).assignments)


def table_rows(stdout: str, family: str, arch: str | None = None) -> list[list[str]]:
    """The line of each variant of ``family``'s build report (for ``arch``, if given), as cells in the order
    label, regs, spills, smem, dyn smem, ms, cache (the line itself puts the label last)."""
    lines = stdout.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.startswith(f"{family} (") and (arch is None or line.rstrip().endswith(f" for {arch}")))
    assert lines[start + 1].split() == ["regs", "spills", "smem", "dyn", "smem", "ms", "cache", "variant"]
    rows = []
    for line in lines[start + 2:]:
        cells = re.split(r"\s{2,}", line.strip())
        if len(cells) != 7 or cells[5] not in ("hit", "miss", "FAILED"):
            break  # the next family's title, the next arch, or the summary
        rows.append([cells[6], *cells[:6]])
    return rows


# --------------------------------------------------------------------------- list / render / version


def test_version(env):
    result = invoke(["--version"], env)
    assert result.exit_code == 0
    assert result.stdout == f"kgen, version {kgen.__version__}\n"


def test_list_shows_the_family_and_its_variants(env):
    result = invoke(["list"], env)
    assert result.exit_code == 0, result.output
    spec = load_spec_file(BUILTIN_SPEC)
    assert f"{FAMILY}  template={spec.template}" in result.output
    assert f"entries={list(spec.entries)}" in result.output
    assert f"variants={builtin_variant_count()}" in result.output
    assert "[head_dim=128,dtype=bf16,num_warps=4," in result.output
    assert result.output.count(str(BUILTIN_SPEC)) == builtin_variant_count()


def test_list_shows_user_families_from_spec_path(env, tmp_path):
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE, num_warps=[1, 2])
    result = invoke(["--spec-path", str(folder), "list"], env)
    assert result.exit_code == 0, result.output
    assert "tiny  template=tiny.cu.j2  entries=['tiny_entry']  variants=2" in result.output
    assert "[num_warps=2]" in result.output
    assert FAMILY in result.output


def test_render_prints_the_exact_source(env):
    result = invoke(["render", FAMILY, "head_dim=128", "dtype=bf16"], env)
    assert result.exit_code == 0, result.output
    source = result.output
    assert "merge_states_2" in source
    assert "__launch_bounds__" in source
    assert source.startswith(f"// kgen: {FAMILY}[head_dim=128,dtype=bf16,")
    assert "constexpr int kHeadDim = 128;" in source
    assert "using T = __nv_bfloat16;" in source
    # Byte for byte what the library renders for that variant.
    variant = registry.current().family(FAMILY).select(head_dim=128, dtype="bf16")
    assert source == render(variant)


def test_render_parses_booleans_and_ints(env):
    result = invoke(["render", FAMILY, "head_dim=64", "dtype=fp32", "has_incomplete_tile=false"], env)
    assert result.exit_code == 0, result.output
    first_line = result.output.splitlines()[0]
    assert first_line.startswith(f"// kgen: {FAMILY}[head_dim=64,dtype=fp32,")
    assert first_line.endswith("has_incomplete_tile=false]")
    assert "using T = float;" in result.output


def assert_one_error(proc: subprocess.CompletedProcess, *needles: str) -> str:
    """``main()``'s way with a kgen error: exit 2, nothing on stdout, one ``error:`` message on stderr."""
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stdout == ""
    assert proc.stderr.startswith("error: "), proc.stderr
    assert proc.stderr.count("error: ") == 1 and "Traceback" not in proc.stderr
    for needle in needles:
        assert needle in proc.stderr, (needle, proc.stderr)
    return proc.stderr


def test_render_of_an_unsupported_head_dim_exits_2_listing_what_is_supported(env):
    proc = run_kgen(["render", FAMILY, "head_dim=80", "dtype=bf16"], env)
    assert_one_error(proc, "supported", "head_dim=80")
    # In process the error propagates as UnsupportedVariantError (main turns it into exit code 2).
    result = invoke(["render", FAMILY, "head_dim=80"], env)
    assert isinstance(result.exception, registry.UnsupportedVariantError)
    assert "supported" in str(result.exception)


@pytest.mark.parametrize("args,needle", [
    (["render", "no_such_family"], "no kernel family 'no_such_family'"),
    (["render", FAMILY, "bogus_axis=1"], "no axis ['bogus_axis']"),
])
def test_render_errors_exit_2(env, args, needle):
    assert_one_error(run_kgen(args, env), needle)


def test_render_rejects_a_parameter_without_equals(env):
    result = invoke(["render", FAMILY, "head_dim"], env)
    assert result.exit_code == 2
    assert "is not key=value" in result.output


def test_a_bad_user_spec_exits_2_with_file_and_line(env, tmp_path):
    folder = tmp_path / "bad_specs"
    folder.mkdir()
    (folder / "bad.yaml").write_text("family: bad\ntemplate: bad.cu.j2\nentries: [k]\naxes:\n  tail: [dma]\n")
    stderr = assert_one_error(run_kgen(["--spec-path", str(folder), "list"], env))
    assert "bad.yaml:5: axes.tail[0]" in stderr
    assert stderr.count("\n") == 1  # unwrapped: one line, however long


def test_a_missing_spec_path_is_a_usage_error(env, tmp_path):
    result = invoke(["--spec-path", str(tmp_path / "missing"), "list"], env)
    assert result.exit_code == 2
    assert "does not exist" in result.output


@pytest.mark.parametrize("problem", ["missing", "a file"])
def test_a_bad_kgen_spec_path_entry_is_an_error_naming_it(env, tmp_path, problem):
    entry = tmp_path / "not_there"
    if problem == "a file":
        entry.write_text("family: x\n")
    good = make_family(tmp_path, "tiny", TINY_TEMPLATE)
    value = os.pathsep.join([str(good), str(entry)])
    expected = f"{entry} does not exist" if problem == "missing" else f"{entry} is not a folder"
    for command in (["list"], ["build", "--arch", "sm_90a"]):
        assert_one_error(run_kgen(command, {**env, "KGEN_SPEC_PATH": value}), "KGEN_SPEC_PATH", expected)
    with config.overrides(KGEN_SPEC_PATH=value), pytest.raises(config.SettingError, match=re.escape(expected)):
        config.user_spec_dirs()


# --------------------------------------------------------------------------- build / cache


def test_build_compiles_every_variant_then_hits_the_cache(env, cache_dir):
    count = builtin_variant_count()
    first = invoke(["build", "--arch", "sm_90a", "--family", FAMILY], env)
    assert first.exit_code == 0, first.output
    assert f"kgen build for sm_90a ({count} variants)" in first.stdout
    rows = table_rows(first.stdout, FAMILY)
    assert [r[-1] for r in rows] == ["miss"] * count
    assert all(float(r[5]) > 0 for r in rows)  # a miss shows its compile time
    assert "FAILED" not in first.output and "SPILLS" not in first.output
    assert len(list(cache_dir.glob("*.cubin.kgen"))) == count

    second = invoke(["build", "--arch", "sm_90a", "--family", FAMILY], env)
    assert second.exit_code == 0, second.output
    rows = table_rows(second.stdout, FAMILY)
    assert [r[-1] for r in rows] == ["hit"] * count
    assert [r[5] for r in rows] == ["-"] * count  # a hit compiled nothing: no (old) compile time

    info = invoke(["cache", "info"], env)
    assert info.exit_code == 0, info.output
    size = sum(p.stat().st_size for p in cache_dir.glob("*.cubin.kgen"))
    assert size > 0
    assert info.output == f"writable: {cache_dir} ({count} entries, {size} bytes)\n"

    (cache_dir / ".0123abcd.deadbeef.tmp").write_bytes(b"half an entry")  # left by a killed build
    cleared = invoke(["cache", "clear"], env)
    assert cleared.exit_code == 0, cleared.output
    assert f"removed {count} entries from {cache_dir}" in cleared.output
    assert list(cache_dir.glob("*.cubin.kgen")) == [] and list(cache_dir.glob(".*.tmp")) == []
    assert invoke(["cache", "info"], env).output == f"writable: {cache_dir} (0 entries, 0 bytes)\n"


def test_build_hits_across_processes(env, tmp_path):
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE, num_warps=[1, 2])
    args = ["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "tiny"]
    first = run_kgen(args, {**env, "COLUMNS": "200"})
    assert first.returncode == 0, (first.stdout, first.stderr)
    assert cache_cells(first.stdout) == ["miss", "miss"]
    second = run_kgen(args, {**env, "COLUMNS": "200"})
    assert second.returncode == 0, (second.stdout, second.stderr)
    assert cache_cells(second.stdout) == ["hit", "hit"]


def test_build_only_builds_the_named_family(env, tmp_path):
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE, num_warps=[1, 2, 4])
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "tiny"], env)
    assert result.exit_code == 0, result.output
    assert "(3 variants)" in result.stdout
    assert FAMILY not in result.output
    assert len(cache_cells(result.stdout)) == 3


def test_build_of_an_unknown_family_names_the_known_ones(env, tmp_path):
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE)
    proc = run_kgen(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "tiny",
                     "--family", "nosuch"], env)
    assert_one_error(proc, "no kernel family 'nosuch'", "'tiny'", f"'{FAMILY}'")
    assert not (Path(env["KGEN_CACHE_DIR"])).exists()  # refused before building the known one


def test_build_takes_the_arch_from_kgen_arch(env, tmp_path):
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE)
    result = invoke(["--spec-path", str(folder), "build", "--family", "tiny"], {**env, "KGEN_ARCH": "sm_90a"})
    assert result.exit_code == 0, result.output
    assert "kgen build for sm_90a (1 variant)" in result.output


@pytest.mark.parametrize("bad", ["compute_90a", "sm_91", "bogus"])
@pytest.mark.parametrize("where", ["--arch", "KGEN_ARCH"])
def test_build_refuses_an_unknown_arch_in_one_line(env, tmp_path, bad, where):
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE)
    args = ["--spec-path", str(folder), "build", "--family", "tiny"]
    if where == "--arch":
        proc = run_kgen([*args, "--arch", bad], env)
    else:
        proc = run_kgen(args, {**env, "KGEN_ARCH": bad})
    stderr = assert_one_error(proc, f"{where}: {bad!r} is not an arch", "supported: sm_75, ", "sm_90a", "sm_100f")
    assert stderr.count("\n") == 1
    assert not Path(env["KGEN_CACHE_DIR"]).exists()  # compute_90a once cached empty cubins with rc 0


def test_build_without_an_arch_or_gpu_is_a_usage_error(env, tmp_path):
    try:
        from cuda.core import Device

        Device().compute_capability
    except Exception:
        pass
    else:
        pytest.skip("a GPU is present, so the arch can be read from it")
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE)
    result = invoke(["--spec-path", str(folder), "build", "--family", "tiny"], env)
    assert result.exit_code == 2
    assert "--arch" in result.output


def test_build_skips_variants_needing_a_newer_arch_with_one_line_per_family(env, tmp_path):
    hopper = make_family(tmp_path, "hopper_only", TINY_TEMPLATE, num_warps=[1, 2, 4], min_sm=90)
    anywhere = make_family(tmp_path, "anywhere", TINY_TEMPLATE, num_warps=[1, 2])
    args = ["--spec-path", str(hopper), "--spec-path", str(anywhere), "build", "--arch", "sm_80",
            "--family", "hopper_only", "--family", "anywhere"]
    result = invoke(args, env)
    assert result.exit_code == 0, result.output
    skips = [line for line in result.stderr.splitlines() if line.startswith("skip:")]
    assert skips == ["skip: hopper_only: 3 of 3 variants not built for sm_80: its variants need sm_90 or newer "
                     "(min_sm in its spec)"]
    assert "kgen build for sm_80 (2 variants)" in result.stdout
    assert [r[-1] for r in table_rows(result.stdout, "anywhere")] == ["miss", "miss"]
    assert "hopper_only (" not in result.stdout and "ptxas" not in result.output

    # For sm_90a nothing is skipped.
    result = invoke([*args[:4], "build", "--arch", "sm_90a", *args[-4:]], env)
    assert result.exit_code == 0, result.output
    assert "skip:" not in result.stderr and "kgen build for sm_90a (5 variants)" in result.stdout


def test_build_for_two_archs_prints_each_arch_s_tables_and_skips_per_arch(env, tmp_path, cache_dir):
    folder = make_family(tmp_path, "tiny_mma", TINY_TEMPLATE, num_warps=[1, 2], mma=["mma_sync", "wgmma"],
                         sm_only={"mma": {"wgmma": [90]}})
    args = ["--spec-path", str(folder), "build", "--arch", "sm_90a", "--arch", "sm_100a", "--family", "tiny_mma"]
    result = invoke(args, env)
    assert result.exit_code == 0, result.output
    skips = [line for line in result.stderr.splitlines() if line.startswith("skip:")]
    assert skips == ["skip: tiny_mma: 2 of 4 variants not built for sm_100a: its variants with mma=wgmma run on "
                     "sm_90 only (sm_only in its spec)"]
    hopper, blackwell = (result.stdout.index(f"kgen build for {a}") for a in ("sm_90a (4 variants)", "sm_100a (2 variants)"))
    assert hopper < blackwell
    assert "tiny_mma (4 variants) for sm_90a" in result.stdout and "tiny_mma (2 variants) for sm_100a" in result.stdout
    assert [r[0] for r in table_rows(result.stdout, "tiny_mma", "sm_100a")] == \
        ["num_warps=1 mma=mma_sync", "num_warps=2 mma=mma_sync"]
    assert [r[-1] for r in table_rows(result.stdout, "tiny_mma", "sm_90a")] == ["miss"] * 4
    assert len(DiskCache(cache_dir).entries()) == 6

    again = invoke(args, env)
    assert again.exit_code == 0, again.output
    assert cache_cells(again.stdout) == ["hit"] * 6


def test_an_arch_given_twice_is_built_once(env, tmp_path):
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE)
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--arch", "sm_90a", "--family", "tiny"],
                    env)
    assert result.exit_code == 0, result.output
    assert result.stdout.count("kgen build for sm_90a (1 variant)") == 1


def test_build_exits_1_when_one_of_its_archs_fails(env, tmp_path):
    folder = make_family(tmp_path, "hopper_code", """
        #if __CUDA_ARCH__ >= 1000
        #error this kernel is Hopper's only
        #endif
        extern "C" __global__ void hopper_code_entry(float* out) { out[threadIdx.x] = {{ num_warps }}.f; }
        """)
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--arch", "sm_100a",
                     "--family", "hopper_code"], env)
    assert result.exit_code == 1, result.output
    assert [r[-1] for r in table_rows(result.stdout, "hopper_code", "sm_90a")] == ["miss"]
    assert [r[-1] for r in table_rows(result.stdout, "hopper_code", "sm_100a")] == ["FAILED"]
    assert "FAILED hopper_code[num_warps=1]" in result.stderr
    assert "NVRTC failed to compile hopper_code[num_warps=1] for sm_100a" in result.stderr
    assert "for sm_90a" not in result.stderr


def test_an_arch_with_nothing_to_build_is_skipped_when_another_has_some(env, tmp_path):
    hopper = make_family(tmp_path, "hopper_only", TINY_TEMPLATE, min_sm=90)
    args = ["--spec-path", str(hopper), "build", "--family", "hopper_only"]
    result = invoke([*args, "--arch", "sm_80", "--arch", "sm_90a"], env)
    assert result.exit_code == 0, result.output
    assert "not built for sm_80" in result.stderr
    assert "kgen build for sm_80" not in result.stdout and "kgen build for sm_90a (1 variant)" in result.stdout

    proc = run_kgen([*args, "--arch", "sm_80", "--arch", "sm_86"], env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.splitlines()[-1] == ("error: nothing to build for sm_80 or sm_86: families ['hopper_only'] "
                                            "has no variant for these archs")


def test_building_nothing_is_an_error(env, tmp_path):
    hopper = make_family(tmp_path, "hopper_only", TINY_TEMPLATE, min_sm=90)
    proc = run_kgen(["--spec-path", str(hopper), "build", "--arch", "sm_80", "--family", "hopper_only"], env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert proc.stderr.splitlines() == [
        "skip: hopper_only: 1 of 1 variant not built for sm_80: its variants need sm_90 or newer (min_sm in its spec)",
        "error: nothing to build for sm_80: families ['hopper_only'] has no variant for this arch",
    ]


def test_build_exits_1_when_a_variant_fails_to_compile(env, tmp_path):
    # num_warps=2 renders a C++ syntax error; num_warps=1 is fine and still gets built.
    folder = make_family(tmp_path, "broken", """
        extern "C" __global__ void broken_entry(float* out) {
        {% if num_warps == 2 %}
            out[0] = 1.f +;
        {% else %}
            out[0] = 1.f;
        {% endif %}
        }
        """, num_warps=[1, 2])
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "broken"], env)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # a reported failure, not a crash
    assert "FAILED broken[num_warps=2]" in result.stderr
    assert "FAILED broken[num_warps=1]" not in result.output
    assert "NVRTC failed to compile broken[num_warps=2] for sm_90a" in result.stderr
    assert "out[0] = 1.f +;" in result.stderr  # the offending rendered line is quoted
    assert cache_cells(result.stdout) == ["miss"]  # the good variant was built

    proc = run_kgen(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "broken"], env)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "FAILED broken[num_warps=2]" in proc.stderr and "FAILED" in proc.stdout  # the table row says so too
    assert "NVRTC failed" not in proc.stdout
    assert "Traceback" not in proc.stderr
    assert "\x00" not in proc.stderr + proc.stdout  # NVRTC's log ends in a NUL


def test_build_fails_a_spec_entry_missing_from_the_cubin(env, tmp_path):
    folder = make_family(tmp_path, "misnamed", TINY_TEMPLATE, entries=["misnamed_entry", "misnamed_other"])
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "misnamed"], env)
    assert result.exit_code == 1, result.output
    assert "FAILED misnamed[num_warps=1]" in result.stderr
    assert "has no entry misnamed_other named in its spec" in result.stderr


def test_the_spill_template_really_spills():
    """Precondition of the spill tests: ptxas reports spills for SPILL_TEMPLATE."""
    from jinja2 import Template

    source = Template(SPILL_TEMPLATE).render(num_warps=1, entries=["spill"])
    _, record = compile_cubin(source, "sm_90a", "spill_check")
    assert record.spills > 0
    assert record.entries["spill"].registers <= 32


def test_build_exits_1_when_a_variant_spills(env, tmp_path):
    folder = make_family(tmp_path, "spilly", SPILL_TEMPLATE)
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "spilly"], env)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "SPILLS spilly[num_warps=1] spills registers and its spec does not allow spills" in result.stderr
    assert "FAILED" not in result.output

    proc = run_kgen(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "spilly"], env)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "SPILLS spilly[num_warps=1]" in proc.stderr
    assert cache_cells(proc.stdout) == ["hit"]  # a cached spilling variant still fails the build


@pytest.mark.parametrize("allow", [True, False], ids=["allow_spills", "explicit_false"])
def test_allow_spills_decides_whether_spills_fail_the_build(env, tmp_path, allow):
    folder = make_family(tmp_path, "spilly_ok", SPILL_TEMPLATE, allow_spills=allow)
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "spilly_ok"], env)
    assert result.exit_code == (0 if allow else 1), result.output
    assert ("SPILLS" in result.stderr) is (not allow)
    # The spill count is shown either way.
    [row] = table_rows(result.stdout, "spilly_ok")
    assert int(row[2]) > 0  # variant, regs, spills, ...


class FakeContract:
    def __init__(self, dynamic_smem_bytes: int):
        self.dynamic_smem_bytes = dynamic_smem_bytes
        self.threads = 32

    def launch_shape(self, entry: str) -> tuple[int, int]:
        return self.threads, self.dynamic_smem_bytes


def test_build_reports_dynamic_shared_memory_and_fails_a_variant_over_the_limit(env, tmp_path, monkeypatch):
    limit = arch.parse("sm_90a").max_smem_per_block
    assert limit == 232448
    sizes = {1: 1000, 2: limit, 4: limit + 1}  # by num_warps; the tiny kernel has no static shared memory
    real_contract_of = kgen.contract.contract_of
    monkeypatch.setattr(kgen.cli.report, "contract_of", lambda v: FakeContract(sizes[v.param_dict["num_warps"]])
                        if v.family.name == "roomy" else real_contract_of(v))
    folder = make_family(tmp_path, "roomy", TINY_TEMPLATE, num_warps=[1, 2, 4])
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "roomy"], env)
    assert result.exit_code == 1, result.output
    rows = table_rows(result.stdout, "roomy")
    assert [(r[0], r[3], r[4]) for r in rows] == [("num_warps=1", "0", "1000"), ("num_warps=2", "0", str(limit)),
                                                  ("num_warps=4", "0", str(limit + 1))]
    problems = [line for line in result.stderr.splitlines() if line.startswith("SMEM")]
    assert problems == [f"SMEM roomy[num_warps=4] needs {limit + 1} bytes of shared memory (0 static + {limit + 1} "
                        f"dynamic), over the {limit} a block may have on sm_90a"]


@pytest.mark.parametrize("family", [FAMILY, "gated_delta_rule_chunk"])
def test_build_shows_the_contract_s_dynamic_shared_memory_of_a_builtin_family(env, family):
    # The most any entry of the variant needs: the gated delta rule's chain stages more than its recurrence.
    result = invoke(["build", "--arch", "sm_90a", "--family", family], env)
    assert result.exit_code == 0, result.output
    contracts = [kgen.contract.contract_of(v) for v in registry.current().family(family).variants]
    expected = [str(max(c.launch_shape(entry)[1] for entry in c.parameters)) for c in contracts]
    assert [r[4] for r in table_rows(result.stdout, family)] == expected
    if family != FAMILY:  # at head dim 128 the row is the chain's
        assert any(c.launch_shape("gated_delta_rule_chunk_chain")[1] > c.dynamic_smem_bytes for c in contracts)


def test_a_family_without_a_host_shows_no_dynamic_size(env, tmp_path):
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE)
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "tiny"], env)
    assert result.exit_code == 0, result.output
    assert [r[4] for r in table_rows(result.stdout, "tiny")] == ["-"]


def test_build_prints_one_line_per_variant_when_piped_at_80_columns(env, tmp_path):
    # Piped (not a terminal), at 80 columns: nothing wraps; each variant's line says which variant it is.
    folder = make_family(tmp_path, "a_family_with_a_rather_long_name", TINY_TEMPLATE, num_warps=[1, 2, 4, 8])
    args = ["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", FAMILY,
            "--family", "a_family_with_a_rather_long_name"]
    proc = run_kgen(args, {**env, "COLUMNS": "80"})
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    lines = proc.stdout.splitlines()
    count = builtin_variant_count()
    # The arch's line, a title and a header per family, a line per variant, the summary.
    assert len(lines) == 1 + 2 * 2 + count + 4 + 1
    assert lines[-1] == f"summary: {count + 4} variants for sm_90a: 0 hits, {count + 4} compiled, 0 failed"
    rows = table_rows(proc.stdout, FAMILY)
    assert len(rows) == count
    # The label names only the axes that vary (not num_warps=4 or rows_per_thread=2, the same everywhere).
    assert all(r[0].startswith("head_dim=") and "num_warps" not in r[0] for r in rows)
    assert [r[0] for r in table_rows(proc.stdout, "a_family_with_a_rather_long_name")] == \
        [f"num_warps={n}" for n in (1, 2, 4, 8)]
    assert all(len(r) == 7 and r[1].isdigit() for r in rows)


def test_build_quiet_prints_only_the_summary_and_errors(env, tmp_path):
    hopper = make_family(tmp_path, "hopper_only", TINY_TEMPLATE, min_sm=90)
    spilly = make_family(tmp_path, "spilly", SPILL_TEMPLATE)
    args = ["--spec-path", str(hopper), "--spec-path", str(spilly), "build", "--arch", "sm_90a", "--arch", "sm_80",
            "--family", "hopper_only", "--family", "spilly", "--quiet"]
    result = invoke(args, env)
    assert result.exit_code == 1, result.output
    assert result.stdout == "summary: 3 variants for sm_90a, sm_80: 0 hits, 3 compiled, 2 failed, 1 skipped\n"
    assert result.stderr.splitlines() == ["SPILLS spilly[num_warps=1] spills registers and its spec does not allow spills",
                                          "SPILLS spilly[num_warps=1] spills registers and its spec does not allow spills"]
    again = invoke(["--spec-path", str(hopper), "build", "--arch", "sm_90a", "--arch", "sm_80", "--family", "hopper_only",
                    "-q"], env)
    assert again.exit_code == 0 and again.stderr == ""
    assert again.stdout == "summary: 1 variant for sm_90a: 1 hit, 0 compiled, 0 failed, 1 skipped\n"


def all_commands(group=cli, path=()) -> list[tuple[str, ...]]:
    found = [path]
    for name, command in group.commands.items():
        found += all_commands(command, (*path, name)) if hasattr(command, "commands") else [(*path, name)]
    return found


def test_every_help_text_is_plain_text(env):
    commands = all_commands()
    assert ("cache", "verify") in commands and ("build",) in commands
    for path in commands:
        result = invoke([*path, "--help"], env)
        assert result.exit_code == 0, (path, result.output)
        assert "``" not in result.output, (path, result.output)
        assert not re.search(r"\b1 [a-z]+s\b", result.output), (path, result.output)


@pytest.mark.parametrize("args,message", [
    (["nosuch"], "error: No such command 'nosuch'."),
    (["render"], "error: Missing argument 'FAMILY'."),
    (["render", FAMILY, "head_dim"], "error: Invalid value: 'head_dim' is not key=value"),
    (["build", "--jobs", "0"], "error: Invalid value for '--jobs' / '-j': 0 is not in the range x>=1."),
    (["build", "--bogus"], "error: No such option '--bogus'"),
    (["--spec-path", "/no/such/folder", "list"], "error: Invalid value for '--spec-path': Directory "),
    (["cache", "export"], "error: give PATH (an archive) or --wheel DIR (a wheel), one of the two"),
    (["cache", "export", "x.zip"], "error: Invalid value for PATH: 'x.zip' does not end in .tar, .tar.gz, .tgz"),
    (["cache", "import"], "error: Missing argument 'PATH'."),
    (["cache", "verify", "--arch", "bogus"], "error: --arch: 'bogus' is not an arch"),
])
def test_every_refusal_is_one_error_line_with_status_2(env, args, message):
    proc = run_kgen(args, env)
    assert_one_error(proc)
    assert proc.stderr.startswith(message), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Usage:" not in proc.stderr and "--help" not in proc.stderr


def test_kgen_alone_prints_its_help(env):
    for args in ([], ["cache"]):
        result = invoke(args, env)
        assert result.exit_code == 0 and result.stdout.startswith("Usage: "), result.output


def test_counts_of_one_are_singular(env, tmp_path, cache_dir):
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE)
    built = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "tiny"], env)
    assert "kgen build for sm_90a (1 variant)\ntiny (1 variant) for sm_90a\n" in built.stdout
    assert built.stdout.endswith("summary: 1 variant for sm_90a: 0 hits, 1 compiled, 0 failed\n")
    size = sum(p.stat().st_size for p in cache_dir.glob("*.cubin.kgen"))
    assert invoke(["cache", "info"], env).stdout == f"writable: {cache_dir} (1 entry, {size} bytes)\n"
    archive = tmp_path / "one.tar"
    assert invoke(["cache", "export", str(archive)], env).stdout == f"exported 1 entry (sm_90a: 1) to {archive}\n"
    assert invoke(["cache", "import", str(archive)], env).stdout == \
        f"imported 0 entries into {cache_dir} (1 was there already)\n"
    assert invoke(["cache", "clear"], env).stdout == f"removed 1 entry from {cache_dir}\n"


def test_progress_is_a_line_every_few_seconds_when_not_a_terminal(env, tmp_path, monkeypatch):
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE, num_warps=[1, 2, 4])
    args = ["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "tiny", "-j", "1"]
    # By default (5 s) a quick build shows only its final line.
    result = invoke(args, env)
    assert result.exit_code == 0, result.output
    assert re.findall(r"^build: .*$", result.stderr, re.M) == [
        re.search(r"^build: 3/3 done, \d+\.\d s$", result.stderr, re.M).group()]
    # With no interval, every step shows.
    monkeypatch.setattr(kgen.cli.progress, "PROGRESS_INTERVAL_S", 0.0)
    result = invoke(args, env)
    counts = re.findall(r"^build: (\d)/3 done, \d+\.\d s$", result.stderr, re.M)
    assert counts[-1] == "3" and counts == sorted(counts) and len(counts) >= 3
    assert "\r" not in result.stderr and "\x1b" not in result.stderr  # no bar drawing in a log


class FullDisk:
    """A file whose every write fails as on a full disk."""

    open_fd = staticmethod(os.fdopen)

    def __init__(self, fd: int, mode: str):
        self.file = self.open_fd(fd, mode)

    def write(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.file.close()


def unusable_cache(case: str, tmp_path: Path, cache_dir: Path, monkeypatch) -> tuple[str, str]:
    """Make the cache ``case`` (read-only, a file, /dev/null, a full disk); return KGEN_CACHE_DIR and the reason."""
    if case == "read-only":
        # Tests run as root, where chmod makes nothing read-only: os.access answers as on a read-only mount.
        cache_dir.mkdir(exist_ok=True)
        real_access = os.access
        monkeypatch.setattr(os, "access", lambda path, mode, **kw: False if str(path).startswith(str(cache_dir))
                            else real_access(path, mode, **kw))
        return str(cache_dir), f"no folder on the cache path {cache_dir} is writable"
    if case == "a file":
        cache_dir.write_bytes(b"not a folder")
        return str(cache_dir), f"no folder on the cache path {cache_dir} is writable"
    if case == "/dev/null":
        return "/dev/null", "no folder on the cache path /dev/null is writable"
    monkeypatch.setattr(kgen.cache.store.os, "fdopen", FullDisk)
    return str(cache_dir), f"cannot write to cache folder {cache_dir} ([Errno 28] No space left on device)"


@pytest.mark.parametrize("case", ["read-only", "a file", "/dev/null", "disk full"])
def test_build_exits_1_in_one_line_when_the_cache_kept_nothing(env, tmp_path, cache_dir, monkeypatch, case):
    monkeypatch.setattr(kgen.cache.store, "_warned", set())
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE, num_warps=[1, 2])
    value, reason = unusable_cache(case, tmp_path, cache_dir, monkeypatch)
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "tiny"],
                    {**env, "KGEN_CACHE_DIR": value})
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    lines = [line for line in result.stderr.splitlines() if not line.startswith("build: ")]
    assert lines == [f"error: the cache kept none of the 2 variants compiled for sm_90a: {reason}"]
    assert cache_cells(result.stdout) == ["miss", "miss"]  # it still built and reported them


def test_build_from_a_read_only_cache_that_has_every_entry_passes(env, tmp_path, cache_dir, monkeypatch):
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE, num_warps=[1, 2])
    args = ["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "tiny"]
    assert invoke(args, env).exit_code == 0
    value, _ = unusable_cache("read-only", tmp_path, cache_dir, monkeypatch)
    result = invoke(args, {**env, "KGEN_CACHE_DIR": value})
    assert result.exit_code == 0, result.output  # a fleet node's check: every row a hit, nothing to keep
    assert cache_cells(result.stdout) == ["hit", "hit"]


def test_the_cache_path_of_the_op_still_only_warns(tmp_path, monkeypatch):
    """The run-time path is unchanged: no writable cache is a warning, and the variant is built in memory."""
    monkeypatch.setattr(kgen.cache.store, "_warned", set())
    variant = registry.current().family(FAMILY).variants[0]
    with config.overrides(KGEN_CACHE_DIR="/dev/null"), pytest.warns(RuntimeWarning, match="compiling in memory"):
        assert kgen.jit.build(variant, "sm_90a").cubin[:4] == b"\x7fELF"


def test_cache_info_and_clear_on_an_empty_or_missing_cache(env, cache_dir):
    info = invoke(["cache", "info"], env)
    assert info.exit_code == 0, info.output
    assert info.output == f"writable: {cache_dir} (0 entries, 0 bytes)\n"
    cleared = invoke(["cache", "clear"], env)
    assert cleared.exit_code == 0, cleared.output
    assert cleared.output == f"removed 0 entries from {cache_dir}\n"


def test_cache_clear_on_a_read_only_cache_says_so(env, cache_dir, tmp_path):
    # Tests run as root, where chmod makes nothing read-only: the refusal is simulated in the kgen process.
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE)
    assert invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "tiny"], env).exit_code == 0
    [entry] = DiskCache(cache_dir).entries()
    script = ("import errno, os, pathlib, kgen.cli\n"
              "def refuse(self, missing_ok=False): raise OSError(errno.EROFS, os.strerror(errno.EROFS), str(self))\n"
              "pathlib.Path.unlink = refuse\n"
              "kgen.cli.main()\n")
    full = {**os.environ, "KGEN_CACHE_DIR": str(cache_dir)}
    proc = subprocess.run([sys.executable, "-c", script, "cache", "clear"], env=full, capture_output=True, text=True,
                          timeout=120)
    assert_one_error(proc, f"cannot clear the cache {cache_dir}: {entry}: Read-only file system; "
                           "the cache is read-only to this user")
    assert entry.exists()


@settings(max_examples=200)
@given(st.text(max_size=40))
def test_printable_escapes_control_characters_only(text):
    shown = printable(text)
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown)
    if not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", text):
        assert shown == text  # tabs, newlines and printable text pass through
    assert printable("log\n\x00") == "log\n\\x00"


# A Jinja error (syntax error, undefined variable) is not a C++ compile error, but
# must be reported the same way: `build` lists the variant as FAILED, `render` exits 2.
def test_build_reports_a_jinja_error_as_a_failed_variant(env, tmp_path):
    folder = make_family(tmp_path, "bad_jinja", """
        extern "C" __global__ void bad_jinja_entry(float* out) { {% if num_warps %} out[0] = 1.f; }
        """)
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "bad_jinja"], env)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # reported, not a crash
    assert "FAILED bad_jinja[num_warps=1]" in result.stderr
    proc = run_kgen(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "bad_jinja"], env)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "FAILED bad_jinja[num_warps=1]" in proc.stderr


def test_render_reports_a_jinja_error_without_a_traceback(env, tmp_path):
    folder = make_family(tmp_path, "undefined_var", """
        extern "C" __global__ void undefined_var_entry(float* out) { out[0] = {{ no_such_variable }}; }
        """)
    assert_one_error(run_kgen(["--spec-path", str(folder), "render", "undefined_var"], env), "no_such_variable")


def test_list_puts_each_variant_on_one_line_when_piped(env):
    result = invoke(["list"], {**env, "COLUMNS": "80"})
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    variant_lines = [line for line in lines if line.startswith("  [")]
    assert len(variant_lines) == len(registry.current().variants())
    assert all(line.endswith(".yaml") for line in variant_lines)


@pytest.mark.parametrize("case", ["missing template", "template syntax", "no contract", "bad knob"])
def test_list_refuses_what_build_refuses_in_one_error_line(env, tmp_path, case):
    folder = make_family(tmp_path, "listed", TINY_TEMPLATE)
    spec = folder / "listed.yaml"
    if case == "missing template":
        (folder / "listed.cu.j2").unlink()
    elif case == "template syntax":
        (folder / "listed.cu.j2").write_text("{% if %}\n")
    elif case == "no contract":
        spec.write_text(spec.read_text().replace("entries:", "host: kgen.families.merge_states\nentries:", 1))
    else:
        env = dict(env, KGEN_ALWAYS_COMPILE="maybe")
    result = run_kgen(["--spec-path", str(folder), "list"], env)
    assert result.returncode == 2, result.stdout + result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    assert ("KGEN_ALWAYS_COMPILE" if case == "bad knob" else "family 'listed'") in lines[0]
