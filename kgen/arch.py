"""Target archs: an arch string is parsed and checked before anything is rendered or compiled.

kgen builds cubins only, so an arch is ``sm_<N>`` with an optional suffix: ``a``
(arch-specific features such as wgmma and setmaxnreg, from sm_90) or ``f``
(family-portable features, from sm_100). The numbers come from the NVRTC that
is loaded (``nvrtcGetSupportedArchs``), so a newer NVRTC widens the list by
itself. Anything else is refused up front with one line naming what is
supported: ``compute_90a``, for one, makes NVRTC return an empty "cubin"
without an error, and ``sm_91`` or a typo only fails deep inside NVRTC.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from cuda.bindings import nvrtc

_FORM = re.compile(r"sm_([1-9][0-9]{0,3})([af]?)")  # at most 4 digits: int() of a longer run is refused by Python
#: The first arch number each suffix exists for (NVRTC refuses sm_90f and sm_89a).
_SUFFIX_FROM = {"": 0, "a": 90, "f": 100}

#: Shared memory one block may use, static and dynamic together, once it opts in
#: (cudaDevAttrMaxSharedMemoryPerBlockOptin), by arch number: the CUDA C++
#: Programming Guide's table of compute capabilities. An arch missing here has
#: no limit kgen knows of, and ``kgen build`` says that it did not check.
_MAX_SMEM_PER_BLOCK = {
    75: 64 * 1024,
    80: 163 * 1024,
    86: 99 * 1024,
    87: 163 * 1024,
    89: 99 * 1024,
    90: 227 * 1024,
    100: 227 * 1024,
    103: 227 * 1024,
    110: 227 * 1024,
    120: 99 * 1024,
    121: 99 * 1024,
}


class ArchError(ValueError):
    """An arch string kgen cannot build cubins for."""


@dataclass(frozen=True)
class Arch:
    """A validated cubin target."""

    name: str  # "sm_90a", what NVRTC is given
    sm: int  # 90: what a spec's ``min_sm`` is compared with
    suffix: str  # "", "a" or "f"

    @property
    def max_smem_per_block(self) -> int | None:
        """Bytes of shared memory a block may use on this arch, or None where kgen knows no limit."""
        return _MAX_SMEM_PER_BLOCK.get(self.sm)


@functools.lru_cache(maxsize=1)
def supported_numbers() -> tuple[int, ...]:
    """The arch numbers the loaded NVRTC compiles for (75, 80, ..., 121 for NVRTC 13.0)."""
    result, numbers = nvrtc.nvrtcGetSupportedArchs()
    if result != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise RuntimeError(f"nvrtcGetSupportedArchs failed: {result}")
    return tuple(sorted(numbers))


def supported() -> list[str]:
    """Every arch string :func:`parse` accepts, in order (``sm_90``, ``sm_90a``, ``sm_100``, ``sm_100a``, ``sm_100f``...)."""
    return [f"sm_{n}{suffix}" for n in supported_numbers() for suffix, first in _SUFFIX_FROM.items() if n >= first]


def parse(text: str, source: str = "arch") -> Arch:
    """The :class:`Arch` that ``text`` names, or :class:`ArchError` naming ``source`` (``--arch``, ``KGEN_ARCH``)."""
    match = _FORM.fullmatch(text) if isinstance(text, str) else None
    if match is not None:
        number, suffix = int(match.group(1)), match.group(2)
        if number in supported_numbers() and number >= _SUFFIX_FROM[suffix]:
            return Arch(text, number, suffix)
    raise ArchError(f"{source}: {text!r} is not an arch kgen can build cubins for; supported: {', '.join(supported())}")
