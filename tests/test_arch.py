"""kgen.arch: which arch strings kgen builds cubins for, checked against what NVRTC really does."""

from __future__ import annotations

import pytest
from cuda.core import Program, ProgramOptions
from hypothesis import given, settings
from hypothesis import strategies as st

from kgen.arch import Arch, ArchError, parse, supported, supported_numbers

TINY = 'extern "C" __global__ void k(int* p) { p[threadIdx.x] = 1; }\n'


def nvrtc_cubin(arch: str) -> bytes | None:
    """What NVRTC makes of ``arch`` as a cubin target: the cubin, or None if it refuses."""
    try:
        return bytes(Program(TINY, "c++", options=ProgramOptions(arch=arch)).compile("cubin").code)
    except Exception:  # cuda.core's NVRTCError is not public API
        return None


def test_supported_numbers_are_nvrtcs_and_include_hopper():
    numbers = supported_numbers()
    assert 90 in numbers and 80 in numbers and 100 in numbers
    assert list(numbers) == sorted(set(numbers))


def test_the_accepted_forms_are_exactly_those_nvrtc_builds_cubins_for():
    # Every number NVRTC lists, with every suffix: kgen accepts a form iff NVRTC makes an ELF cubin of it.
    for number in supported_numbers():
        for suffix in ("", "a", "f"):
            name = f"sm_{number}{suffix}"
            cubin = nvrtc_cubin(name)
            accepted = name in supported()
            assert accepted is (cubin is not None and cubin[:4] == b"\x7fELF"), name


def test_compute_targets_are_refused_though_nvrtc_returns_an_empty_cubin():
    assert nvrtc_cubin("compute_90a") == b""  # the defect that validation exists for
    with pytest.raises(ArchError):
        parse("compute_90a")


@pytest.mark.parametrize("name,sm,suffix", [("sm_90a", 90, "a"), ("sm_100f", 100, "f"), ("sm_80", 80, ""),
                                            ("sm_120a", 120, "a")])
def test_arch_numbers(name, sm, suffix):
    assert parse(name) == Arch(name, sm, suffix)


@given(st.sampled_from(supported()))
def test_every_supported_form_parses_to_itself(name):
    arch = parse(name)
    assert arch.name == name
    assert name == f"sm_{arch.sm}{arch.suffix}"


@settings(max_examples=300)
@given(st.one_of(st.text(max_size=12), st.from_regex(r"(sm|compute|lto)_[0-9]{1,4}[a-z]?", fullmatch=True)))
def test_anything_else_is_refused_in_one_line_naming_the_source_and_the_supported_forms(text):
    if text in supported():
        assert parse(text).name == text
        return
    with pytest.raises(ArchError) as info:
        parse(text, "--arch")
    message = str(info.value)
    assert message == f"--arch: {text!r} is not an arch kgen can build cubins for; supported: {', '.join(supported())}"
    assert "\n" not in message  # repr() escapes a newline in the input too


@pytest.mark.parametrize("name", ["sm_91", "bogus", "sm_90f", "sm_89a", "sm_090", "SM_90A", " sm_90a", "sm_90a "])
def test_near_misses_are_refused(name):
    with pytest.raises(ArchError):
        parse(name)


def test_shared_memory_limits():
    assert parse("sm_90a").max_smem_per_block == 232448  # 227 KB, the H100/H200 opt-in limit
    assert parse("sm_80").max_smem_per_block == 163 * 1024
    assert parse("sm_86").max_smem_per_block == 99 * 1024
    assert parse("sm_100f").max_smem_per_block == parse("sm_100").max_smem_per_block == 232448
