"""The pipeline for one variant: render → key → disk cache or NVRTC → loaded module.

``build`` needs no GPU (it is what ``kgen build`` and CI run); ``load`` adds the
driver step and keeps the module in memory, so a repeated call touches no disk.
Before anything is rendered, ``build`` checks the arch (kgen.arch) and that the
variant's spec allows it (``min_sm``); after, that the cubin holds every entry
the spec names.
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import filelock
from cuda.core import Device, Kernel, ObjectCode

from kgen import arch as arch_module
from kgen import config
from kgen.cache import CacheEntry, cache_key, cache_layers, warn_once
from kgen.compiler import BuildRecord, CompileError, compile_cubin, cubin_kernels
from kgen.registry import Variant
from kgen.render import render


class UnsupportedArchError(ValueError):
    """A variant's spec needs a newer arch (``min_sm``) than the one asked for."""


@dataclass
class BuildResult:
    variant: Variant
    arch: str
    key: str
    cubin: bytes
    record: BuildRecord
    #: True when the cubin came from the disk cache, False when this call compiled it.
    cache_hit: bool


def arch_of(major: int, minor: int) -> str:
    # Hopper and later need the arch-specific target ("a") for wgmma, setmaxnreg and friends.
    return f"sm_{major}{minor}{'a' if major >= 9 else ''}"


def device_arch() -> str:
    """``KGEN_ARCH`` if set (and valid), else the current device's arch."""
    override = config.arch_override()
    if override:
        return arch_module.parse(override, "KGEN_ARCH").name
    cc = Device().compute_capability
    return arch_of(cc.major, cc.minor)


def build(variant: Variant, arch: str | None = None) -> BuildResult:
    """The cubin of ``variant`` for ``arch``, from the disk cache or compiled (and then cached).

    Raises :class:`kgen.arch.ArchError` for an arch kgen cannot build for,
    :class:`UnsupportedArchError` where the variant's spec needs a newer one, and
    :class:`CompileError` if it does not compile into every entry its spec names.
    """
    target = arch_module.parse(arch, "arch") if arch else arch_module.parse(device_arch(), "device arch")
    reason = variant.arch_refusal(target.sm)
    if reason is not None:
        raise UnsupportedArchError(f"{variant.name} cannot be built for {target.name}: such variants {reason}, "
                                   f"{variant.spec_path}")
    source = render(variant)
    result = _cached_or_compiled(variant, target.name, source)
    _check_entries(result)
    return result


def _cached_or_compiled(variant: Variant, arch: str, source: str) -> BuildResult:
    key = cache_key(source, arch)
    layers = cache_layers()
    # KGEN_ALWAYS_COMPILE: compile whatever the cache holds (to time a compile, or save its source); still publish.
    look_up = not config.always_compile()
    entry = layers.get(key) if look_up else None
    if entry is not None:
        return BuildResult(variant, arch, key, entry.cubin, entry.record, cache_hit=True)
    cache = layers.writable
    if cache is None:
        folders = os.pathsep.join(str(f) for f in layers.folders)
        warn_once("unwritable", folders,
                  f"kgen: no folder on the cache path {folders} is writable; compiling in memory")
        return _compiled(variant, arch, key, source)
    try:
        lock = cache.lock(key)
        _acquire_saying_so(lock, variant.name)
    except OSError as exc:
        warn_once("unwritable", str(cache.root),
                  f"kgen: cache folder {cache.root} is not usable ({exc}); compiling in memory")
        return _compiled(variant, arch, key, source)
    try:
        # Another process may have built it into this folder while this one waited for the lock.
        entry = cache.get(key) if look_up else None
        if entry is not None:
            return BuildResult(variant, arch, key, entry.cubin, entry.record, cache_hit=True)
        result = _compiled(variant, arch, key, source)
        try:
            cache.put(CacheEntry(key, result.cubin, result.record, variant.name),
                      source if config.save_source() else None)
        except OSError as exc:
            warn_once("unwritable", str(cache.root), f"kgen: cannot write to cache folder {cache.root} ({exc})")
        return result
    finally:
        lock.release()


#: How long a builder waits for a build lock before it says what it waits for (then it waits on, within the
#: lock's own timeout: kgen.cache.store.LOCK_TIMEOUT_S).
LOCK_NOTICE_S = 10.0


def _acquire_saying_so(lock: filelock.FileLock, variant_name: str) -> None:
    if lock.timeout <= LOCK_NOTICE_S:
        lock.acquire()
        return
    try:
        lock.acquire(timeout=LOCK_NOTICE_S)
    except filelock.Timeout:
        warn_once("lock wait", str(lock.lock_file),
                  f"kgen: waiting for {lock.lock_file} (another process is building {variant_name} or a variant "
                  f"sharing its lock) for at most {lock.timeout:.0f} s more")
        lock.acquire()


def _compiled(variant: Variant, arch: str, key: str, source: str) -> BuildResult:
    cubin, record = compile_cubin(source, arch, variant.name)
    return BuildResult(variant, arch, key, cubin, record, cache_hit=False)


def _check_entries(result: BuildResult) -> None:
    # A name the spec lists that the cubin does not hold would only fail at launch.
    variant = result.variant
    compiled = cubin_kernels(result.cubin)
    missing = [e for e in variant.family.entries if e not in compiled]
    if missing:
        raise CompileError(f"{variant.name}: the compiled code has no entry {', '.join(missing)} named in its spec "
                           f"({variant.spec_path}); compiled entries: {', '.join(sorted(compiled)) or 'none'}")


class KernelModule:
    """A variant's cubin loaded into the driver, with its entry kernels."""

    def __init__(self, result: BuildResult):
        self.result = result
        self.object_code = ObjectCode.from_cubin(result.cubin, name=result.variant.name)
        self._kernels: dict[str, Kernel] = {}

    def kernel(self, entry: str) -> Kernel:
        kernel = self._kernels.get(entry)
        if kernel is None:
            if entry not in self.result.variant.family.entries:
                raise KeyError(f"{self.result.variant.name} has no entry {entry!r}; "
                               f"entries: {list(self.result.variant.family.entries)}")
            kernel = self._kernels[entry] = self.object_code.get_kernel(entry)
        return kernel


#: Loaded modules kept per process. A bound, because the key includes the family's template folders: a
#: process that goes through many spec folders would otherwise keep every module it ever loaded.
LOADED_MODULES = 256


@functools.lru_cache(maxsize=LOADED_MODULES)
def _load(variant_name: str, template_dirs: tuple, arch: str, variant: Variant) -> KernelModule:
    return KernelModule(build(variant, arch))


def load(variant: Variant) -> KernelModule:
    """The loaded module of ``variant`` for the current device, built or read from disk on first use only."""
    return _load(variant.name, variant.family.template_dirs, device_arch(), variant)
