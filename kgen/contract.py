"""A kernel's launch contract: what the host must know about it, declared once.

Each family's host package declares, in its ``contract`` module, a function
per family from a variant's parameters to a :class:`LaunchContract`: threads
per block, dynamic shared memory, the sizes the host shapes its work by (tile
rows, TMA boxes, the chunk) and each entry's parameters, each with its name and
C type. :func:`kgen.render.render` hands the contract to the template, which
renders its kernels' signatures from it (``contract.signature(entry)``) and
``static_assert``\\ s its own sizes against it; the launcher takes arguments by
the same names and checks them against the same declaration. Host and kernel
therefore cannot disagree silently: a mismatch fails to compile, in CPU CI too.

The spec names the package (``host: kgen.families.merge_states``); a family
without one (a user's template built only to be inspected) has no contract.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
from dataclasses import dataclass
from typing import Any, Callable, Mapping

#: TMA's 128-byte swizzle repeats every 1024 bytes; tiles in shared memory start on such a boundary.
SWIZZLE_ALIGNMENT = 1024
#: A warpgroup: wgmma's unit, four warps.
WARPGROUP_THREADS = 128

#: How the launcher passes each C type.
_SCALAR_KINDS = {"long long": "int64", "float": "float32", "kgen::TmaDescriptor": "tensor_map"}


class ContractError(LookupError):
    """A family's host package is missing, or declares no contract for the family."""


@dataclass(frozen=True)
class Parameter:
    name: str
    #: The C type, without qualifiers: ``const T*``, ``long long``, ``float``, ``kgen::TmaDescriptor``.
    ctype: str

    @property
    def kind(self) -> str:
        """How the launcher passes it: ``pointer``, ``int64``, ``float32`` or ``tensor_map``."""
        if self.ctype.endswith("*"):
            return "pointer"
        return _SCALAR_KINDS[self.ctype]

    @property
    def declaration(self) -> str:
        """The parameter as a kernel signature declares it: pointers never alias (``__restrict__``), and a
        tensor map is passed by value in the parameter space (``__grid_constant__``) so TMA reads it there."""
        kind = self.kind
        if kind == "pointer":
            return f"{self.ctype} __restrict__ {self.name}"
        if kind == "tensor_map":
            return f"const __grid_constant__ {self.ctype} {self.name}"
        return f"{self.ctype} {self.name}"


def parameters(text: str) -> tuple[Parameter, ...]:
    """``"const T* q, long long n"`` -> parameters, so that a declaration reads as the C++ signature does."""
    out = []
    for item in text.split(","):
        ctype, _, name = item.strip().rpartition(" ")
        out.append(Parameter(name, ctype.strip()))
    return tuple(out)


@dataclass(frozen=True)
class LaunchContract:
    threads: int
    dynamic_smem_bytes: int
    #: Named sizes the host relies on; the template asserts each against its own.
    sizes: Mapping[str, int]
    #: Each entry's parameters, in order.
    parameters: Mapping[str, tuple[Parameter, ...]]
    #: Entries whose block differs from ``threads`` and ``dynamic_smem_bytes``: entry -> (threads, bytes).
    entry_shapes: Mapping[str, tuple[int, int]] = dataclasses.field(default_factory=dict)
    #: Blocks per thread-block cluster (along x); a launch's grid still counts blocks, a multiple of it.
    cluster: int = 1

    def launch_shape(self, entry: str) -> tuple[int, int]:
        """(threads per block, dynamic shared-memory bytes) of ``entry``."""
        return self.entry_shapes.get(entry, (self.threads, self.dynamic_smem_bytes))

    def signature(self, entry: str) -> str:
        """The entry's parameter list as C++, for the template's kernel declaration."""
        return ", ".join(p.declaration for p in self.parameters[entry])


ContractFunction = Callable[[Mapping[str, Any]], LaunchContract]


def contract_of(variant) -> LaunchContract | None:
    """The contract of ``variant`` (a :class:`kgen.registry.Variant`), or None if its family names no host."""
    family = variant.family
    if family.host is None:
        return None
    return _contract(family.host, family.name, variant.params)


def contract_functions(host: str) -> Mapping[str, ContractFunction]:
    """The ``CONTRACTS`` of ``host``'s ``contract`` module."""
    try:
        module = importlib.import_module(f"{host}.contract")
    except ModuleNotFoundError as exc:
        if exc.name is not None and (f"{host}.contract" == exc.name or f"{host}.contract".startswith(exc.name + ".")):
            raise ContractError(f"host package {host!r} has no module {host}.contract (is it on sys.path?)") from None
        raise ContractError(f"host package {host!r}: importing {host}.contract failed: {type(exc).__name__}: {exc}"
                            ) from None
    except Exception as exc:  # noqa: BLE001 - the host package is the user's code: its error, in one line
        raise ContractError(f"host package {host!r}: importing {host}.contract failed: {type(exc).__name__}: {exc}"
                            ) from None
    found = getattr(module, "CONTRACTS", None)
    if not isinstance(found, Mapping) or not all(callable(f) for f in found.values()):
        raise ContractError(f"{host}.contract has no CONTRACTS mapping of family names to contract functions")
    return found


def contract_function(host: str, family: str) -> ContractFunction:
    """The function ``host`` declares for ``family``'s contract, or a :class:`ContractError` in one line."""
    declared = contract_functions(host)
    function = declared.get(family)
    if function is None:
        raise ContractError(f"family {family!r}: its host package {host!r} declares no contract for it "
                            f"({host}.contract.CONTRACTS has {sorted(declared)})")
    return function


# Ops ask on every call; a contract depends on the family and the parameters alone.
@functools.lru_cache(maxsize=1024)
def _contract(host: str, family: str, params: tuple) -> LaunchContract:
    return contract_function(host, family)(dict(params))
