"""Hostile or careless files and settings on the spec path: each is refused in one line naming the file or
the setting, without hanging, exhausting memory or running a template's code outside Jinja's sandbox."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kgen import config
from kgen.config import SettingError
from kgen.registry import Registry, SpecPathWarning
from kgen.render import RenderError, check_family, render
from kgen.spec import MAX_SPEC_BYTES, SpecError

SPEC = """\
family: hostile
template: {template}
entries: [k]
axes: {{num_warps: [1]}}
"""


pytestmark = pytest.mark.usefixtures("isolated_search_path")


def folder_with(tmp_path: Path, template: str = "k.cu.j2", body: str | None = 'extern "C" __global__ void k() {}\n'):
    folder = tmp_path / "specs"
    folder.mkdir()
    (folder / "hostile.yaml").write_text(SPEC.format(template=template))
    if body is not None:
        (folder / template).write_text(body)
    return folder


def test_a_link_to_dev_zero_is_refused_as_not_a_regular_file(tmp_path):
    folder = folder_with(tmp_path)
    (folder / "zero.yaml").symlink_to("/dev/zero")
    with pytest.raises(SpecError, match=r"zero.yaml: <top>: not a regular file"):
        Registry([folder])


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path):
    folder = folder_with(tmp_path)
    os.mkfifo(folder / "pipe.yaml")
    with pytest.raises(SpecError, match=r"pipe.yaml: <top>: not a regular file"):
        Registry([folder])


def test_a_spec_over_the_size_limit_is_refused(tmp_path):
    folder = folder_with(tmp_path)
    (folder / "big.yaml").write_text("# " + "x" * MAX_SPEC_BYTES + "\n")
    with pytest.raises(SpecError, match=rf"big.yaml: <top>: larger than {MAX_SPEC_BYTES} bytes"):
        Registry([folder])


def test_hidden_files_such_as_an_editor_lock_are_skipped(tmp_path):
    folder = folder_with(tmp_path)
    (folder / ".#hostile.yaml").symlink_to("nobody@host.1234:1700000000")  # what emacs leaves: a dangling link
    (folder / ".hidden.yaml").write_text("not: [a, spec")
    assert [v.family.name for v in Registry([folder]).variants()] == ["hostile"]


def test_upper_case_suffixes_are_read_and_subfolders_are_named_in_a_warning(tmp_path):
    folder = folder_with(tmp_path)
    (folder / "more.YML").write_text("family: hostile\naxes: {num_warps: [2]}\n")
    (folder / "nested").mkdir()
    (folder / "nested" / "x.yaml").write_text("family: other\n")
    with pytest.warns(SpecPathWarning, match=r"subfolder nested/ are not read"):
        family = Registry([folder]).family("hostile")
    assert [v.param_dict["num_warps"] for v in family.variants] == [1, 2]


@pytest.mark.parametrize("knob", ["KGEN_SPEC_PATH", "KGEN_CACHE_DIR"])
def test_an_unknown_user_in_a_path_setting_is_a_setting_error(knob):
    with config.overrides(**{knob: "~nosuchuser_kgen/x"}):
        with pytest.raises(SettingError, match=rf"^{knob}: cannot expand '~nosuchuser_kgen/x': no such user"):
            config.user_spec_dirs() if knob == "KGEN_SPEC_PATH" else config.cache_dirs()


def test_a_template_cannot_reach_python_through_its_globals(tmp_path):
    marker = tmp_path / "ran"
    body = '{{ cycler.__init__.__globals__.os.system("touch %s") }}\n' % marker
    variant = Registry([folder_with(tmp_path, body=body)]).family("hostile").variants[0]
    with pytest.raises(RenderError, match="unsafe"):
        render(variant)
    assert not marker.exists()


@pytest.mark.parametrize("how", ["dotdot", "link"])
def test_a_template_outside_its_folder_is_refused(tmp_path, how):
    if how == "dotdot":
        (tmp_path / "outside.cu.j2").write_text("secret\n")
        folder = folder_with(tmp_path, template="../outside.cu.j2", body=None)
        (folder / "k.cu.j2").write_text('{% include "../outside.cu.j2" %}\n')
        (folder / "hostile.yaml").write_text(SPEC.format(template="k.cu.j2"))
    else:
        folder = folder_with(tmp_path, body=None)
        (folder / "k.cu.j2").symlink_to("/etc/passwd")
    variant = Registry([folder]).family("hostile").variants[0]
    with pytest.raises(RenderError, match="cannot render"):
        render(variant)


def test_a_render_over_the_size_limit_is_an_error_not_an_nvrtc_abort(tmp_path):
    body = '{% for i in range(100000) %}{{ "x" * 100 }}{% endfor %}\n'  # 10 M characters, 100 at a time
    variant = Registry([folder_with(tmp_path, body=body)]).family("hostile").variants[0]
    with pytest.raises(RenderError, match="the rendered source passes"):
        render(variant)


@pytest.mark.parametrize("body", ['{{ "x" * 10000000000 }}', "{{ 10 ** 100000000 }}", '{% set s = ["x"] * 10**10 %}'])
def test_a_value_too_large_to_render_is_refused_before_it_is_made(tmp_path, body):
    variant = Registry([folder_with(tmp_path, body=body + "\n")]).family("hostile").variants[0]
    with pytest.raises(RenderError, match="a (repetition|power) of over"):
        render(variant)


def test_loops_that_print_nothing_still_stop_at_the_time_limit(tmp_path, monkeypatch):
    monkeypatch.setattr("kgen.render.MAX_RENDER_SECONDS", 0.01)
    body = "{% for i in range(100000) %}{% for j in range(100000) %}{% endfor %}{% endfor %}\n"
    variant = Registry([folder_with(tmp_path, body=body)]).family("hostile").variants[0]
    with pytest.raises(RenderError, match="rendering took over"):
        render(variant)


def test_an_error_in_a_host_package_is_one_line_naming_it(tmp_path, monkeypatch):
    package = tmp_path / "broken_host"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "contract.py").write_text("def (:\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    folder = folder_with(tmp_path)
    (folder / "hostile.yaml").write_text(SPEC.format(template="k.cu.j2") + "host: broken_host\n")
    family = Registry([folder]).family("hostile")
    with pytest.raises(RenderError, match=r"^host package 'broken_host': importing broken_host.contract failed: "
                                          r"SyntaxError") as info:
        check_family(family)
    assert "\n" not in str(info.value)


def test_a_builtin_spec_copied_under_a_new_family_name_is_one_line_naming_the_host(tmp_path):
    folder = tmp_path / "copy"
    folder.mkdir()
    text = (config.BUILTIN_SPEC_DIR / "merge_attention_states.yaml").read_text()
    (folder / "mine.yaml").write_text(text.replace("family: merge_attention_states", "family: my_merge"))
    variant = Registry([folder]).family("my_merge").variants[0]
    with pytest.raises(RenderError) as info:
        render(variant)
    message = str(info.value)
    assert "\n" not in message and "my_merge" in message and "kgen.families.merge_states" in message
    assert "declares no contract" in message
