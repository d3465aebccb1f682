"""The cache's layers: which folders kgen searches for an entry, and which one takes new entries.

The cache path (``KGEN_CACHE_DIR``, kgen.config) may name several
folders: the first writable one takes new entries, the others are searched,
read-only, after it; then come the caches installed as wheels (entry-point
group ``kgen.caches``). Keys are content addresses, so a hit in any layer is
the same cubin; the writable layer goes first so that an entry rebuilt there
(its copy in a read-only layer being corrupt) is the one found next time.
"""

from __future__ import annotations

import functools
import importlib.metadata
import json
import os
import sys
from dataclasses import dataclass
from pathlib import Path

from kgen import config
from kgen.cache.manifest import MANIFEST, check_toolchain
from kgen.cache.store import CacheEntry, DiskCache, warn_once
from kgen.cache.wheel import ENTRY_POINT_GROUP


@dataclass(frozen=True)
class Layer:
    """One folder kgen searches for entries."""

    cache: DiskCache
    role: str  # "writable", "read-only" or "installed"
    #: For an installed cache, the distribution that holds it (``kgen-cache-sm-90a 0.1.0+nvrtc.13.0.88``).
    origin: str = ""


class CacheLayers:
    """The cache path as one cache: lookups search every layer, new entries go to the writable one."""

    def __init__(self, folders: list[Path], installed: list[Layer]):
        self.folders = folders
        writable = next((folder for folder in folders if _can_write(folder)), None)
        #: Where new entries go; None when no folder on the cache path is writable (kgen then compiles in memory).
        self.writable = DiskCache(writable) if writable is not None else None
        self.layers = ([Layer(self.writable, "writable")] if self.writable else []) + \
            [Layer(DiskCache(f), "read-only") for f in folders if f != writable] + installed

    def get(self, key: str) -> CacheEntry | None:
        for layer in self.layers:
            entry = layer.cache.get(key)
            if entry is not None:
                return entry
        return None


def cache_layers() -> CacheLayers:
    """The configured folders (``KGEN_CACHE_DIR``), then the installed caches."""
    return CacheLayers(config.cache_dirs(), installed_caches())


def _can_write(folder: Path) -> bool:
    # Asked without creating anything, so that a run that only hits writes nothing: the folder, or the
    # nearest existing one above it (where it would be created), must be a folder this user may write to.
    # os.access also says False on a read-only file system, even to root.
    while not folder.exists():
        if folder.parent == folder:
            return False
        folder = folder.parent
    return folder.is_dir() and os.access(folder, os.W_OK | os.X_OK)


def installed_caches() -> list[Layer]:
    """The caches that installed wheels register under ``kgen.caches``, by entry-point name.

    Looked up once per ``sys.path`` (it reads every installed distribution's
    metadata, which a build of many variants would otherwise do per variant). A
    cache that cannot be loaded, or was made for another kgen or NVRTC (its keys
    could never match), is reported once and left out.
    """
    return list(_installed_caches(tuple(sys.path)))


@functools.lru_cache(maxsize=8)
def _installed_caches(search_path: tuple[str, ...]) -> tuple[Layer, ...]:
    # search_path only keys the lru_cache: entry_points() reads sys.path itself.
    found = []
    for point in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda p: p.name):
        origin = f"{point.dist.name} {point.dist.version}" if point.dist is not None else point.value
        try:
            folder = Path(point.load())
            check_toolchain(json.loads((folder / MANIFEST).read_bytes()))
        except Exception as exc:  # any error of a third-party package's import: report it, do not stop kgen
            warn_once("installed", origin, f"kgen: installed cache {origin} ({ENTRY_POINT_GROUP}:{point.name}) "
                                           f"is not used: {exc}")
            continue
        found.append(Layer(DiskCache(folder), "installed", origin))
    return tuple(found)
