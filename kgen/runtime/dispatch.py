"""From an op's request to launchable kernels: variant choice, the incomplete-tile twins, per-device caching."""

from __future__ import annotations

import contextlib
from typing import Any, Iterator

import torch
from cuda.core import Device

from kgen import arch, config, jit, registry as registry_module
from kgen.dtypes import ELEMENT_TYPES
from kgen.launch import KernelLauncher
from kgen.contract import LaunchContract, contract_of
from kgen.registry import Variant

#: torch dtype -> the spec's dtype name, for every element type kgen knows.
DTYPE_NAMES = {getattr(torch, t.torch_name): t.name for t in ELEMENT_TYPES.values()}


#: The arch an op or plan chooses its kernel for without any GPU: the one kgen's built-in specs target.
PLANNING_SM_WITHOUT_GPU = 90


def planning_sm(device: torch.device | str | int | None) -> int:
    """The arch number an op or plan picks its kernel for: ``KGEN_ARCH``'s, else ``device``'s (else the current GPU's)."""
    override = config.arch_override()
    if override:
        return arch.parse(override, "KGEN_ARCH").sm
    if device is not None and torch.device(device).type == "cuda":
        major, minor = torch.cuda.get_device_capability(torch.device(device))
    elif device is None and torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
    else:
        return PLANNING_SM_WITHOUT_GPU
    return major * 10 + minor


def spec_dtypes(family: str) -> tuple[torch.dtype, ...]:
    """The torch dtypes of the family's ``dtype`` axis: what the spec path offers, not a list kept in Python."""
    found = _spec_dtypes.get((family,))
    if found is None:
        names = registry_module.current().family(family).supported("dtype")
        found = _spec_dtypes.put((family,), tuple(dtype for dtype, name in DTYPE_NAMES.items() if name in names))
    return found


def incomplete_tile_pair(family: str, **required: Any) -> tuple[Variant, Variant]:
    """The (has_incomplete_tile=true, =false) variants for ``required``: see :func:`full_tiles_twin`."""
    any_tiles = registry_module.current().family(family).select(**required, has_incomplete_tile=True)
    return any_tiles, full_tiles_twin(family, any_tiles)


def full_tiles_twin(family: str, any_tiles: Variant) -> Variant:
    """The has_incomplete_tile=false twin of ``any_tiles`` (same other parameters).

    It runs when every tile of a batch is full; when the spec declares none,
    the has_incomplete_tile=true variant serves both.
    """
    fam = registry_module.current().family(family)
    params = dict(any_tiles.params, has_incomplete_tile=False)
    return next((v for v in fam.variants if v.param_dict == params), any_tiles)


def contract(variant: Variant) -> LaunchContract:
    found = contract_of(variant)
    if found is None:
        raise LookupError(f"{variant.name}: family {variant.family.name!r} names no host package")
    return found


def launcher(variant: Variant, entry: str, device_index: int) -> KernelLauncher:
    """``entry`` of ``variant`` loaded for ``device_index``, launched with the block, shared memory and
    parameters of the variant's contract."""
    shape = contract(variant)
    with torch.cuda.device(device_index):
        # The driver calls below need a current context, which torch makes only at its first allocation.
        Device(device_index).set_current()
        kernel = jit.load(variant).kernel(entry)
        threads, dynamic_smem = shape.launch_shape(entry)
        made = KernelLauncher(kernel, device_index, threads, dynamic_smem, shape.parameters[entry],
                              f"{variant.name}.{entry}", cluster=shape.cluster)
        if shape.cluster > 1:
            made.resident_clusters()  # asked here, once, rather than by an op's first call
        return made


def cached_launcher(variant: Variant, entry: str, device_index: int) -> KernelLauncher:
    """:func:`launcher`, made once per device, variant and entry (until the spec path changes)."""
    # The variant's params, not its name: Variant.name builds a string on every call.
    key = (device_index, variant.family.name, variant.params, entry)
    found = _launchers.get(key)
    return found if found is not None else _launchers.put(key, launcher(variant, entry, device_index))


def first_runnable(family: str, axis: str, sm: int, tensor: str, **required: Any) -> Any:
    """The first value of ``axis`` in the spec's order whose variant for ``required`` runs on arch ``sm`` (the
    fastest kernel first, as a spec lists them); refused naming ``tensor`` when none does."""
    key = (family, axis, sm, tuple(sorted(required.items())))
    found = _runnable.get(key)
    if found is None:
        fam = registry_module.current().family(family)
        values = fam.axis_values(axis, **required)
        runnable = [x for x in values if fam.select(**required, **{axis: x}).supports_sm(sm)]
        if not runnable:
            raise registry_module.UnsupportedVariantError(
                f"{tensor}: no {family} variant for {required} runs on sm_{sm} (its {axis} values {values} do not)")
        found = _runnable.put(key, runnable[0])
    return found


def tile_pair_launchers(family: str, entry: str, device_index: int, tensor: str, **required: Any
                        ) -> tuple[Any, tuple[KernelLauncher, KernelLauncher]]:
    """The contract sizes of the variants ``required`` selects (with has_incomplete_tile true and false) and their
    (any tiles, full tiles) launchers of ``entry``, made once per device. Axis values the spec path lacks are
    refused naming ``tensor``, the argument that asked for them."""
    key = (family, entry, device_index, tuple(sorted(required.items())))
    found = _pairs.get(key)
    if found is None:
        try:
            variants = incomplete_tile_pair(family, **required)
        except registry_module.UnsupportedVariantError as exc:  # names the family: name the tensor too
            raise registry_module.UnsupportedVariantError(f"{tensor}: {exc}") from None
        found = _pairs.put(key, (contract(variants[0]).sizes, tuple(launcher(v, entry, device_index) for v in variants)))
    return found


_kept_pools: dict[torch.device, torch.cuda.MemPool] = {}


@contextlib.contextmanager
def kept_allocations(device: torch.device) -> Iterator[None]:
    """Allocations that outlive the op call making them (a plan's tables or workspace made inside an op) come
    from a pool of kgen's own: not from a CUDA graph's, which owns the allocations of a
    torch.compile(mode="reduce-overhead") call and refuses any left alive that it cannot account for."""
    if device not in _kept_pools:
        with torch.cuda.device(device):
            _kept_pools[device] = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(_kept_pools[device], device=device):
        yield


class SpecPathMemo:
    """A memo of what an op derives from the spec path (launchers, plans from recipes, spec values), emptied
    when the spec path changes, since every entry may depend on the variants it offers."""

    def __init__(self) -> None:
        self._entries: dict[tuple, Any] = {}
        self._generation = -1

    def _entries_of_the_current_path(self) -> dict[tuple, Any]:
        registry_module.current()  # rebuilds the registry, bumping its generation, if the spec path changed
        if self._generation != registry_module.generation:
            self._entries.clear()
            self._generation = registry_module.generation
        return self._entries

    def get(self, key: tuple):
        entries = self._entries_of_the_current_path()
        try:
            return entries.get(key)
        except TypeError:  # a caller's unhashable argument in the key: not memoised; what the memo stands in front
            return None    # of refuses it by name (a planner fuzz found tail=[] crashing here)

    def put(self, key: tuple, value: Any) -> Any:
        entries = self._entries_of_the_current_path()
        try:
            entries[key] = value
        except TypeError:  # unhashable, as in get
            pass
        return value


_spec_dtypes = SpecPathMemo()
_launchers = SpecPathMemo()
_pairs = SpecPathMemo()
_runnable = SpecPathMemo()
