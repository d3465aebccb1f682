"""The wheel: it carries every module and the built-in specs and templates, and kgen run from it finds them.

The wheel is built once (``pip wheel --no-deps``, about 10-30 s) and unpacked
into a folder that is put first on ``PYTHONPATH`` of a ``python -m kgen`` run
from a folder outside the checkout: that is what an installed kgen sees
(its dependencies come from this venv).
"""

from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import kgen
from kgen import config

REPO_ROOT = Path(__file__).resolve().parent.parent


def checkout_files(folder: str, pattern: str) -> set[str]:
    return {p.relative_to(REPO_ROOT / folder).as_posix() for p in (REPO_ROOT / folder).rglob(pattern)
            if p.is_file() and "__pycache__" not in p.parts}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("dist")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(REPO_ROOT)],
                   check=True, capture_output=True, timeout=600)
    [built] = out.glob("kgen-*.whl")
    return built


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def run_installed(site: Path, args: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("KGEN_") and k != "XDG_CACHE_HOME"}
    full.update(env, PYTHONPATH=str(site))
    return subprocess.run([sys.executable, *args], cwd=cwd, env=full, capture_output=True, text=True, timeout=300)


def test_the_wheel_carries_every_module_spec_and_template(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    modules = {f"kgen/{p}" for p in checkout_files("kgen", "*.py")}
    specs = {f"kgen/_builtin/specs/{p}" for p in checkout_files("specs", "*.y*ml")}
    templates = {f"kgen/_builtin/templates/{p}" for p in checkout_files("templates", "*")}
    assert specs and templates and "kgen/_builtin/templates/common/numeric.cuh" in templates
    assert modules | specs | templates <= names, sorted((modules | specs | templates) - names)
    # Nothing from the checkout's top level other than the package itself.
    assert all(n.startswith(("kgen/", "kgen-")) for n in names), sorted(names)
    entry_points = zipfile.ZipFile(wheel).read(f"kgen-{kgen.__version__}.dist-info/entry_points.txt").decode()
    assert "kgen = kgen.cli:main" in entry_points


def test_installed_kgen_finds_its_specs_and_uses_the_user_cache(installed, tmp_path):
    probe = ("import kgen, kgen.config as c\n"
             "print(kgen.__file__); print(c.INSTALLED); print(c.BUILTIN_SPEC_DIR); print(c.BUILTIN_TEMPLATE_DIR)\n"
             "print(c.cache_dir())\n")
    proc = run_installed(installed, ["-c", probe], tmp_path, XDG_CACHE_HOME=str(tmp_path / "xdg"))
    assert proc.returncode == 0, proc.stderr
    module, flag, specs, templates, cache = proc.stdout.splitlines()
    assert Path(module) == installed / "kgen" / "__init__.py"  # not the checkout's
    assert flag == "True"
    assert Path(specs) == installed / "kgen" / "_builtin" / "specs"
    assert Path(templates) == installed / "kgen" / "_builtin" / "templates"
    assert Path(cache) == tmp_path / "xdg" / "kgen"


def test_installed_kgen_lists_and_builds_the_builtin_families(installed, tmp_path):
    xdg = tmp_path / "xdg"
    listed = run_installed(installed, ["-m", "kgen", "list"], tmp_path, XDG_CACHE_HOME=str(xdg), COLUMNS="300")
    assert listed.returncode == 0, listed.stderr
    for spec in (REPO_ROOT / "specs").glob("*.yaml"):
        family = spec.stem
        assert f"{family}  template=" in listed.stdout
        assert str(installed / "kgen" / "_builtin" / "specs" / spec.name) in listed.stdout
    assert str(REPO_ROOT) not in listed.stdout

    built = run_installed(installed, ["-m", "kgen", "build", "--arch", "sm_90a", "--family", "merge_attention_states"],
                          tmp_path, XDG_CACHE_HOME=str(xdg))
    assert built.returncode == 0, built.stderr
    assert list((xdg / "kgen").glob("*.cubin.kgen"))


def test_a_checkout_keeps_its_top_level_folders_and_cache():
    # These tests run from the checkout (an editable install): the layout of the repo is unchanged.
    assert config.INSTALLED is False
    assert config.BUILTIN_SPEC_DIR == REPO_ROOT / "specs"
    assert config.BUILTIN_TEMPLATE_DIR == REPO_ROOT / "templates"
    with config.overrides(KGEN_CACHE_DIR=None):
        assert config.cache_dir() == REPO_ROOT / "cache"


@pytest.mark.parametrize("xdg,expected", [
    ("/somewhere/cache", Path("/somewhere/cache/kgen")),
    ("relative/cache", Path.home() / ".cache" / "kgen"),  # the XDG spec: a relative path is to be ignored
    (None, Path.home() / ".cache" / "kgen"),
])
def test_user_cache_dir(xdg, expected):
    with config.overrides(XDG_CACHE_HOME=xdg):
        assert config.user_cache_dir() == expected


def test_kgen_version_matches_the_package_metadata():
    import importlib.metadata

    assert kgen.__version__ == importlib.metadata.version("kgen")
