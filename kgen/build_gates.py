"""The build's gates: what fails a variant although NVRTC made a cubin of it.

A kernel that spills, that ptxas says lost its Hopper design, or that needs more
shared memory than a block may have is correct code that runs far below its
speed, or not at all: the build refuses it rather than let it reach a GPU. A
cubin kernel that ptxas reported nothing about has unknown registers and
spills, so the other gates could not judge it.

Each gate returns its problem as one message, or None (or an empty list) when
the variant passes. kgen.compiler applies the gates on ptxas' log and the cubin
(a failure there is a :class:`kgen.compiler.CompileError`); ``kgen build``
applies those on the build record and the layout. This module imports nothing of
kgen's, so either may import it.
"""

from __future__ import annotations

import re
from typing import Iterable

#: ptxas warnings that a Hopper kernel lost its design: wgmma serialised (C7510-C7520: too few
#: registers, accumulators touched inside a fence..wait window, ...) or setmaxnreg ignored.
#: They fail the build as spills do: such a kernel is correct but runs far below its speed.
_LOST_DESIGN = re.compile(r"^.*(?:\(C75(?:0[89]|1\d|20)\)|wgmma\.mma_async instructions are serialized"
                          r"|'?setmaxnreg'? ignored).*$", re.M)


def lost_design(name: str, arch: str, ptxas_log: str) -> str | None:
    """The ptxas warnings of ``ptxas_log`` that say the kernel lost its Hopper design, if any."""
    lost = [line.strip() for line in _LOST_DESIGN.findall(ptxas_log)]
    if not lost:
        return None
    return f"{name} for {arch}: ptxas says the kernel loses its Hopper design:\n" + "\n".join(lost)


def unreported_kernels(name: str, kernels: Iterable[str], reported: Iterable[str]) -> str | None:
    """The cubin's kernels that ptxas' report does not cover (their registers and spills are unknown), if any."""
    missing = sorted(set(kernels) - set(reported))
    if not missing:
        return None
    return f"{name}: ptxas reported no resources for {', '.join(missing)} (registers and spills unknown)"


def spills(name: str, spilled_bytes: int, allowed: bool) -> str | None:
    """A variant that spills registers fails unless its spec sets ``allow_spills``."""
    if spilled_bytes and not allowed:
        return f"SPILLS {name} spills registers and its spec does not allow spills"
    return None


def shared_memory(name: str, static: int, dynamic: int | None, limit: int | None, arch: str) -> str | None:
    """A variant whose static plus dynamic shared memory is over ``limit`` (None: unknown, not checked) fails."""
    total = static + (dynamic or 0)
    if limit is None or total <= limit:
        return None
    return (f"SMEM {name} needs {total} bytes of shared memory ({static} static + {dynamic or 0} dynamic), "
            f"over the {limit} a block may have on {arch}")
