"""The ``kgen`` command (kgen.cli): list, render, build, cache; no GPU needed (``--arch sm_90a``).

In-process runs use click's CliRunner on ``kgen.cli.cli``; exit codes that
``kgen.cli.main`` maps (SpecError/ValueError → 2) are checked by running
``python -m kgen`` in a subprocess.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from kgen import config, registry
from kgen.cli import cli
from kgen.compiler import compile_cubin
from kgen.render import render
from kgen.spec import load_spec_file

FAMILY = "merge_attention_states"
BUILTIN_SPEC = config.BUILTIN_SPEC_DIR / f"{FAMILY}.yaml"
REPO_ROOT = Path(__file__).resolve().parent.parent

# 64 floats live at once under __launch_bounds__(1024, 2) (at most 32 registers a thread): ptxas must spill.
SPILL_TEMPLATE = r"""
extern "C" __global__ void __launch_bounds__(1024, 2) spill(const float* __restrict__ in, float* __restrict__ out) {
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
extern "C" __global__ void tiny(float* out) { out[threadIdx.x] = {{ num_warps }}.f; }
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
                num_warps: list[int] = (1,)) -> Path:
    """A user spec folder with one new family (template file next to its spec); returns the folder."""
    folder = root / f"specs_{family}"
    folder.mkdir(parents=True, exist_ok=True)
    lines = [f"family: {family}", f"template: {family}.cu.j2", f"entries: [{family}_entry]",
             f"axes: {{num_warps: {list(num_warps)}}}"]
    if allow_spills is not None:
        lines.append(f"allow_spills: {'true' if allow_spills else 'false'}")
    (folder / f"{family}.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    (folder / f"{family}.cu.j2").write_text(textwrap.dedent(template), encoding="utf-8")
    return folder


def cache_cells(output: str) -> list[str]:
    return re.findall(r"\b(hit|miss)\b", output)


def builtin_variant_count() -> int:
    return len(load_spec_file(BUILTIN_SPEC).assignments)


# --------------------------------------------------------------------------- list / render


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


def test_render_of_an_unsupported_head_dim_exits_2_listing_what_is_supported(env):
    proc = run_kgen(["render", FAMILY, "head_dim=80", "dtype=bf16"], env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "supported" in proc.stdout
    assert "head_dim=80" in proc.stdout
    assert "Traceback" not in proc.stderr
    assert "__launch_bounds__" not in proc.stdout
    # In process the error propagates as UnsupportedVariantError (main turns it into exit code 2).
    result = invoke(["render", FAMILY, "head_dim=80"], env)
    assert isinstance(result.exception, registry.UnsupportedVariantError)
    assert "supported" in str(result.exception)


@pytest.mark.parametrize("args,needle", [
    (["render", "no_such_family"], "no kernel family 'no_such_family'"),
    (["render", FAMILY, "bogus_axis=1"], "no axis ['bogus_axis']"),
])
def test_render_errors_exit_2(env, args, needle):
    proc = run_kgen(args, env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert needle in proc.stdout
    assert "Traceback" not in proc.stderr


def test_render_rejects_a_parameter_without_equals(env):
    result = invoke(["render", FAMILY, "head_dim"], env)
    assert result.exit_code == 2
    assert "is not key=value" in result.output


def test_a_bad_user_spec_exits_2_with_file_and_line(env, tmp_path):
    folder = tmp_path / "bad_specs"
    folder.mkdir()
    (folder / "bad.yaml").write_text("family: bad\ntemplate: bad.cu.j2\nentries: [k]\naxes:\n  tail: [dma]\n")
    proc = run_kgen(["--spec-path", str(folder), "list"], env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    flat = proc.stdout.replace("\n", "")
    assert "bad.yaml:5: axes.tail[0]" in flat
    assert "Traceback" not in proc.stderr


def test_a_missing_spec_path_is_a_usage_error(env, tmp_path):
    result = invoke(["--spec-path", str(tmp_path / "missing"), "list"], env)
    assert result.exit_code == 2
    assert "does not exist" in result.output


# --------------------------------------------------------------------------- build / cache


def test_build_compiles_every_variant_then_hits_the_cache(env, cache_dir):
    count = builtin_variant_count()
    first = invoke(["build", "--arch", "sm_90a", "--family", FAMILY], env)
    assert first.exit_code == 0, first.output
    assert f"kgen build for sm_90a ({count} variants)" in first.output
    assert cache_cells(first.output) == ["miss"] * count
    assert "FAILED" not in first.output and "SPILLS" not in first.output
    assert len(list(cache_dir.glob("*.cubin.kgen"))) == count

    second = invoke(["build", "--arch", "sm_90a", "--family", FAMILY], env)
    assert second.exit_code == 0, second.output
    assert cache_cells(second.output) == ["hit"] * count

    info = invoke(["cache", "info"], env)
    assert info.exit_code == 0, info.output
    assert f"cache dir: {cache_dir}\n" in info.output
    assert f"\nentries: {count}\n" in info.output
    size = int(re.search(r"bytes: (\d+)", info.output).group(1))
    assert size == sum(p.stat().st_size for p in cache_dir.glob("*.cubin.kgen")) > 0

    cleared = invoke(["cache", "clear"], env)
    assert cleared.exit_code == 0, cleared.output
    assert f"removed {count} entries from {cache_dir}" in cleared.output
    assert list(cache_dir.glob("*.cubin.kgen")) == []
    assert not (cache_dir / "locks").exists()
    assert "\nentries: 0\n" in invoke(["cache", "info"], env).output


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
    assert "(3 variants)" in result.output
    assert FAMILY not in result.output
    assert len(cache_cells(result.output)) == 3


def test_build_takes_the_arch_from_kgen_arch(env, tmp_path):
    folder = make_family(tmp_path, "tiny", TINY_TEMPLATE)
    result = invoke(["--spec-path", str(folder), "build", "--family", "tiny"], {**env, "KGEN_ARCH": "sm_90a"})
    assert result.exit_code == 0, result.output
    assert "kgen build for sm_90a (1 variants)" in result.output


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
    assert "FAILED broken[num_warps=2]" in result.output
    assert "FAILED broken[num_warps=1]" not in result.output
    assert "NVRTC failed to compile broken[num_warps=2] for sm_90a" in result.output
    assert "out[0] = 1.f +;" in result.output  # the offending rendered line is quoted
    assert cache_cells(result.output) == ["miss"]  # the good variant was built

    proc = run_kgen(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "broken"], env)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "FAILED broken[num_warps=2]" in proc.stdout
    assert "Traceback" not in proc.stderr


def test_the_spill_template_really_spills():
    """Precondition of the spill tests: ptxas reports spills for SPILL_TEMPLATE."""
    from jinja2 import Template

    _, record = compile_cubin(Template(SPILL_TEMPLATE).render(num_warps=1), "sm_90a", "spill_check")
    assert record.spills > 0
    assert record.entries["spill"].registers <= 32


def test_build_exits_1_when_a_variant_spills(env, tmp_path):
    folder = make_family(tmp_path, "spilly", SPILL_TEMPLATE)
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "spilly"], env)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)
    assert "SPILLS spilly[num_warps=1] spills registers and its spec does not allow spills" in result.output
    assert "FAILED" not in result.output

    proc = run_kgen(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "spilly"], env)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "SPILLS spilly[num_warps=1]" in proc.stdout
    assert cache_cells(proc.stdout) == ["hit"]  # a cached spilling variant still fails the build


@pytest.mark.parametrize("allow", [True, False], ids=["allow_spills", "explicit_false"])
def test_allow_spills_decides_whether_spills_fail_the_build(env, tmp_path, allow):
    folder = make_family(tmp_path, "spilly_ok", SPILL_TEMPLATE, allow_spills=allow)
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "spilly_ok"], env)
    assert result.exit_code == (0 if allow else 1), result.output
    assert ("SPILLS" in result.output) is (not allow)
    # The spill count is shown either way.
    row = next(line for line in result.output.splitlines() if "spilly_ok" in line and "│" in line)
    cells = [c.strip() for c in re.split(r"[│|┃]", row) if c.strip()]
    assert int(cells[3]) > 0  # family, variant, regs, spills, ...


def test_cache_info_and_clear_on_an_empty_or_missing_cache(env, cache_dir):
    info = invoke(["cache", "info"], env)
    assert info.exit_code == 0, info.output
    assert info.output == f"cache dir: {cache_dir}\nentries: 0\nbytes: 0\n"
    cleared = invoke(["cache", "clear"], env)
    assert cleared.exit_code == 0, cleared.output
    assert cleared.output == f"removed 0 entries from {cache_dir}\n"


# A Jinja error (syntax error, undefined variable) is not a C++ compile error, but
# must be reported the same way: `build` lists the variant as FAILED, `render` exits 2.
def test_build_reports_a_jinja_error_as_a_failed_variant(env, tmp_path):
    folder = make_family(tmp_path, "bad_jinja", """
        extern "C" __global__ void bad_jinja_entry(float* out) { {% if num_warps %} out[0] = 1.f; }
        """)
    result = invoke(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "bad_jinja"], env)
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # reported, not a crash
    assert "FAILED bad_jinja[num_warps=1]" in result.output
    proc = run_kgen(["--spec-path", str(folder), "build", "--arch", "sm_90a", "--family", "bad_jinja"], env)
    assert proc.returncode == 1, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "FAILED bad_jinja[num_warps=1]" in proc.stdout


def test_render_reports_a_jinja_error_without_a_traceback(env, tmp_path):
    folder = make_family(tmp_path, "undefined_var", """
        extern "C" __global__ void undefined_var_entry(float* out) { out[0] = {{ no_such_variable }}; }
        """)
    proc = run_kgen(["--spec-path", str(folder), "render", "undefined_var"], env)
    assert proc.returncode == 2, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    assert "no_such_variable" in proc.stdout
