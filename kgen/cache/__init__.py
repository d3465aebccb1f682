"""The on-disk cubin cache, read top-down:

* :mod:`kgen.cache.store`: one folder of entries (keys, self-checking entries, atomic publish, locks);
* :mod:`kgen.cache.layers`: the cache path as one cache (writable folder, read-only folders, installed wheels);
* :mod:`kgen.cache.manifest`: what travels with entries to a fleet, and the checks made on it;
* :mod:`kgen.cache.archive` and :mod:`kgen.cache.wheel`: the two ways entries travel;
* :mod:`kgen.cache.verify`: recompile entries and compare their cubins (how a fleet checks a shared cache).

The names below are the public ones; the submodules hold the rest.
"""

from kgen.cache.archive import ARCHIVE_SUFFIXES, import_entries, read_archive, write_archive
from kgen.cache.layers import CacheLayers, Layer, cache_layers, installed_caches
from kgen.cache.manifest import (MANIFEST, ArchiveError, PackedEntry, check_toolchain, collect_entries,
                                 make_manifest, toolchain)
from kgen.cache.store import (ENTRY_SUFFIX, LOCK_STRIPES, CacheEntry, CacheError, CacheWarning, DiskCache,
                              UnwritableCacheWarning, cache_key, decode_entry, encode_entry, read_only_hint, warn_once)
from kgen.cache.verify import Verdict, verify_caches
from kgen.cache.wheel import ENTRY_POINT_GROUP, write_wheel

__all__ = [
    "ARCHIVE_SUFFIXES", "ENTRY_POINT_GROUP", "ENTRY_SUFFIX", "LOCK_STRIPES", "MANIFEST", "ArchiveError", "CacheEntry",
    "CacheError", "CacheLayers", "CacheWarning", "DiskCache", "Layer", "PackedEntry", "cache_key", "cache_layers", "check_toolchain",
    "collect_entries", "decode_entry", "encode_entry", "import_entries", "installed_caches", "make_manifest",
    "read_archive", "read_only_hint", "toolchain", "UnwritableCacheWarning", "Verdict", "verify_caches", "warn_once", "write_archive",
    "write_wheel",
]
