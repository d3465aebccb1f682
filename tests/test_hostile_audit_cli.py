"""Regressions from the hostile audit of spec files and the ``kgen`` command (issue 22): each input below once
gave a traceback, a crash, a hang, a multi-line error, or was accepted when it should have been refused.

CPU only. Most run in process; the few that could crash or block the process run ``python -m kgen`` (or a
spec load) in a subprocess with a generous timeout.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from kgen.cli import cli, main
from kgen.config import SettingError
from kgen.registry import Registry, SpecPathError, UnsupportedVariantError
from kgen.render import RenderError, check_family
from kgen.spec import SpecError, load_spec_file

REPO_ROOT = Path(__file__).resolve().parent.parent
MERGE = "merge_attention_states"
TEMPLATE = 'extern "C" __global__ void k(float* out) { out[0] = 1.f; }\n'


pytestmark = pytest.mark.usefixtures("isolated_search_path")


@pytest.fixture
def env(tmp_path) -> dict:
    return {"KGEN_CACHE_DIR": str(tmp_path / "cache"), "KGEN_SPEC_PATH": None, "KGEN_ARCH": None, "COLUMNS": "400"}


def invoke(args: list[str], env: dict):
    return CliRunner().invoke(cli, args, env=env)


def run_main(args: list[str], monkeypatch, capsys) -> tuple[int, str]:
    """``kgen.cli.main`` (what ``python -m kgen`` runs) in process: its exit status and its stderr."""
    monkeypatch.setattr(sys, "argv", ["kgen", *args])
    with pytest.raises(SystemExit) as exit_info:
        main()
    return exit_info.value.code, capsys.readouterr().err


def spec_folder(tmp_path: Path, body: str, name: str = "s.yaml", folder: str = "specs") -> Path:
    """A folder holding one spec file ``name`` and the tiny template ``k.cu.j2`` it may name."""
    path = tmp_path / folder
    path.mkdir(exist_ok=True)
    (path / name).write_text(textwrap.dedent(body))
    (path / "k.cu.j2").write_text(TEMPLATE)
    return path


OWNER = """\
family: audit
template: k.cu.j2
entries: [k]
axes: {num_warps: [4], has_incomplete_tile: [true, false]}
"""


# --------------------------------------------------------------------------- kgen render's key=value pairs

@pytest.mark.parametrize("pair", ["self=1", "group_by=", "group_by=dtype"])
def test_a_key_that_is_a_parameter_of_select_is_an_unknown_axis(env, pair):
    result = invoke(["render", MERGE, pair], env)
    assert isinstance(result.exception, UnsupportedVariantError), result.output
    assert f"no axis ['{pair.partition('=')[0]}']" in str(result.exception)


@pytest.mark.parametrize("family,pair", [
    (MERGE, "head_dim=\u00b2"),             # a digit to str.isdigit, not to int()
    (MERGE, "head_dim=" + "9" * 5000),      # past Python's int() digit limit
    (MERGE, "has_incomplete_tile=1"),       # 1 == True in Python
    ("attention_prefill", "min_blocks_per_sm=true"),  # True == 1
])
def test_a_value_the_axis_does_not_spell_is_refused_naming_the_axis(env, family, pair):
    result = invoke(["render", family, pair], env)
    assert isinstance(result.exception, UnsupportedVariantError), result.output
    assert f"{pair.partition('=')[0]}=" in str(result.exception) and "is not supported" in str(result.exception)


def test_a_key_given_twice_is_refused(env):
    result = invoke(["render", MERGE, "head_dim=64", "head_dim=128"], env)
    assert result.exit_code == 2 and "'head_dim' is given twice" in result.output


def test_booleans_in_any_case_and_ints_still_select(env):
    result = invoke(["render", MERGE, "head_dim=128", "dtype=fp16", "has_incomplete_tile=FALSE"], env)
    assert result.exit_code == 0, result.output
    assert result.output.startswith(f"// kgen: {MERGE}[head_dim=128,dtype=fp16,")


# --------------------------------------------------------------------------- sm_only and score_cost

def test_a_boolean_key_in_sm_only_restricts_its_variants(tmp_path):
    folder = spec_folder(tmp_path, OWNER + "sm_only: {has_incomplete_tile: {true: [100]}}\n")
    refusals = {v.param_dict["has_incomplete_tile"]: v.arch_refusal(90) for v in Registry([folder]).variants()}
    assert refusals[False] is None and "sm_100 only" in refusals[True]


@pytest.mark.parametrize("table,needle", [
    ("sm_only: {num_warps: {5: [90]}}", "'5' is not a value of the family's axis 'num_warps'"),
    ("score_cost: {num_warps: {a: 2}}", "'a' is not a value of the family's axis 'num_warps'"),
    ("sm_only: {mma: {wgmma: [90]}}", "'mma' is not an axis of family 'audit'"),
])
def test_a_table_entry_naming_nothing_of_the_family_is_refused(tmp_path, table, needle):
    with pytest.raises(SpecError, match=needle) as info:
        Registry([spec_folder(tmp_path, OWNER + table + "\n")])
    assert info.value.file.endswith("s.yaml") and info.value.line == 5


def test_a_nan_score_cost_is_refused(tmp_path):
    with pytest.raises(SpecError, match=r"score_cost\.num_warps\[4\]: nan is not of type 'number'"):
        Registry([spec_folder(tmp_path, OWNER + "score_cost: {num_warps: {4: .nan}}\n")])


# --------------------------------------------------------------------------- the schema's strings and lists

@pytest.mark.parametrize("line", ['family: "audit\\n"', 'template: "k.cu.j2\\n"', 'entries: ["k\\n"]',
                                  'host: "kgen.families.merge_states\\n"'])
def test_a_trailing_newline_does_not_pass_a_pattern(tmp_path, line):
    key = line.partition(":")[0]
    body = "\n".join(line if text.startswith(key + ":") else text for text in OWNER.splitlines())
    body += "" if key != "host" else "\n" + line
    with pytest.raises(SpecError, match="does not match"):
        load_spec_file(spec_folder(tmp_path, body + "\n") / "s.yaml")


def test_a_host_of_many_dotted_parts_is_refused_by_the_schema(tmp_path):
    with pytest.raises(SpecError, match=r"host: 'a\.a\.a.* does not match"):
        load_spec_file(spec_folder(tmp_path, OWNER + "host: " + ".".join(["a"] * 300) + "\n") / "s.yaml")


def test_uniqueness_of_a_long_unsortable_list_is_checked_in_linear_time(tmp_path):
    # Ints and strings do not sort: jsonschema's own check compared every pair (minutes at this length).
    items = ", ".join(str(i) if i % 2 else f"s{i}" for i in range(20000))
    with pytest.raises(SpecError) as info:
        load_spec_file(spec_folder(tmp_path, f"family: audit\naxes:\n  head_dim: [{items}]\n") / "s.yaml")
    assert len(str(info.value)) < 1000  # the message elides the 20,000 values it would quote


def test_a_schema_error_quoting_a_huge_value_is_shortened(tmp_path):
    body = OWNER.replace("axes:", "axes: &a") + "exclude: [" + ", ".join(["*a"] * 5000) + "]\n"
    with pytest.raises(SpecError, match=r"exclude: \[.* \.\.\. .*\] is too long") as info:
        load_spec_file(spec_folder(tmp_path, body) / "s.yaml")
    assert len(str(info.value)) < 1000


# --------------------------------------------------------------------------- YAML the parser must not choke on

def test_a_control_character_is_one_line_naming_its_line(tmp_path):
    folder = spec_folder(tmp_path, OWNER)
    (folder / "s.yaml").write_bytes(OWNER.encode() + b"description: a\x00b\n")
    with pytest.raises(SpecError) as info:
        load_spec_file(folder / "s.yaml")
    assert info.value.line == 5 and "\n" not in str(info.value) and "unacceptable character" in str(info.value)


@pytest.mark.parametrize("nesting", ["[" * 60000 + "]" * 60000, "\n" + "- " * 60000 + "1"], ids=["flow", "block"])
def test_nesting_that_crashed_the_yaml_parser_is_a_spec_error(tmp_path, nesting):
    # libyaml's binding composed 50,000 levels recursively and killed the process: run it apart.
    path = spec_folder(tmp_path, OWNER + f"description: {nesting}\n") / "s.yaml"
    code = ("import sys\nfrom kgen.spec import SpecError, load_spec_file\n"
            "try:\n    load_spec_file(sys.argv[1])\nexcept SpecError as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", code, str(path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    # kgen's own depth check, or, where PyYAML is new enough to have one, PyYAML's (it stops first): one line,
    # naming the file, either way.
    assert proc.stdout.startswith(str(path)) and proc.stdout.count("\n") == 1
    assert "nested deeper than 16 levels" in proc.stdout or "exceeded maximum nesting depth" in proc.stdout


def test_an_unreadable_spec_folder_is_named_and_an_unreadable_subfolder_is_passed_over(tmp_path, monkeypatch):
    # As root, chmod 000 denies nothing: deny the listing itself.
    real_iterdir = Path.iterdir

    def iterdir(path):
        if path.name in ("locked", "specs_locked"):
            raise PermissionError(13, "Permission denied", str(path))
        return real_iterdir(path)

    monkeypatch.setattr(Path, "iterdir", iterdir)
    folder = spec_folder(tmp_path, OWNER)
    (folder / "locked").mkdir()  # looked into only to warn about specs there
    assert [v.family.name for v in Registry([folder]).variants()] == ["audit", "audit"]
    with pytest.raises(SpecPathError, match=r"spec folder \S*specs_locked cannot be read: Permission denied$"):
        Registry([spec_folder(tmp_path, OWNER, folder="specs_locked")])


# --------------------------------------------------------------------------- templates

def test_a_template_that_is_not_utf8_names_its_family_and_file(tmp_path):
    folder = spec_folder(tmp_path, OWNER)
    (folder / "k.cu.j2").write_bytes("caf\u00e9\n".encode("latin-1"))
    with pytest.raises(RenderError, match=r"family 'audit': cannot load its template k\.cu\.j2: 'utf-8' codec"):
        check_family(Registry([folder]).family("audit"))


# --------------------------------------------------------------------------- kgen list and main's error line

def test_list_of_a_very_long_family_name_does_not_run_rich_s_highlighter(env, tmp_path):
    name = "a" * 100000  # rich's highlighter backtracked for minutes over it
    folder = spec_folder(tmp_path, OWNER.replace("family: audit", f"family: {name}"))
    result = invoke(["--spec-path", str(folder), "list"], env)
    assert result.exit_code == 0, result.output
    assert f"\n{name}  template=k.cu.j2" in "\n" + result.output


def test_list_escapes_a_path_a_strict_utf8_stdout_cannot_write(env, tmp_path):
    # CliRunner's stdout is strict UTF-8, as a terminal's is under most locales: a lone surrogate (Python's
    # stand-in for a byte that is not UTF-8) could not be written to it.
    folder = spec_folder(tmp_path, OWNER, folder=os.fsdecode(b"specs\xff"))
    result = invoke(["--spec-path", str(folder), "list"], env)
    assert result.exit_code == 0, result.output
    assert "specs\\udcff/s.yaml" in result.output


def test_an_error_quoting_a_file_name_with_a_newline_is_one_line(tmp_path, monkeypatch, capsys):
    folder = spec_folder(tmp_path, "family: [\n", name="a\nb.yaml")
    code, err = run_main(["--spec-path", str(folder), "list"], monkeypatch, capsys)
    assert code == 2 and err.count("\n") == 1 and err.startswith("error: ") and "a\\nb.yaml:" in err, err


def test_spec_path_is_the_folder_click_checked_not_a_user_s_home(env, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    spec_folder(tmp_path, OWNER, folder="~nosuchuser_kgen")
    result = invoke(["--spec-path", "~nosuchuser_kgen", "list"], env)
    assert result.exit_code == 0, result.output
    assert "audit  template=k.cu.j2" in result.output


# --------------------------------------------------------------------------- kgen cache

def test_cache_verify_refuses_a_bad_setting_once(env):
    result = invoke(["cache", "verify"], {**env, "KGEN_LINEINFO": "maybe"})  # main() makes it exit 2
    assert isinstance(result.exception, SettingError), result.output
    assert "KGEN_LINEINFO: 'maybe' is neither 0 nor 1" in str(result.exception)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_cache_import_of_a_fifo_is_refused_without_waiting_for_a_writer(env, tmp_path):
    fifo = tmp_path / "cubins.tar"
    os.mkfifo(fifo)
    full = {**os.environ, **{k: v for k, v in env.items() if v is not None}}
    proc = subprocess.run([sys.executable, "-m", "kgen", "cache", "import", str(fifo)], env=full, cwd=REPO_ROOT,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
    assert "not a regular file" in proc.stderr and "Traceback" not in proc.stderr


def test_cache_export_refuses_an_empty_wheel_folder(env):
    result = invoke(["cache", "export", "--wheel", ""], env)
    assert result.exit_code == 2 and "--wheel" in result.output and "is empty" in result.output


def test_a_yaml_merge_key_may_be_overridden_but_a_key_may_not_be_repeated(tmp_path):
    merged = spec_folder(tmp_path, OWNER + "description: {<<: {a: 1, b: 2}, a: 3}\n", folder="merged")
    try:
        load_spec_file(merged / "s.yaml")
    except SpecError as exc:  # the schema may refuse the value; the merge itself is valid YAML
        assert "duplicate key" not in str(exc)
    repeated = spec_folder(tmp_path, OWNER + "description: {a: 1, a: 2}\n", folder="repeated")
    with pytest.raises(SpecError, match="description.a: duplicate key"):
        load_spec_file(repeated / "s.yaml")
