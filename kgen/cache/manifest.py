"""What travels with cache entries to a fleet: the manifest, and the entries packed with it.

The manifest names kgen's and NVRTC's versions and, per entry, its key,
variant, arch, size and SHA-256 (format 2; format 1 had no size). An archive (kgen.cache.archive) and a wheel
(kgen.cache.wheel) both carry one; an import or an installed wheel is checked
against it.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from kgen import __version__
from kgen.cache.store import ENTRY_SUFFIX, CacheEntry, DiskCache
from kgen.compiler import nvrtc_version

MANIFEST = "manifest.json"
#: Bumped whenever the manifest's fields or their meaning change.
MANIFEST_FORMAT = 2


class ArchiveError(ValueError):
    """A cache archive kgen will not import; the message says why (and nothing was added)."""


@dataclass(frozen=True)
class PackedEntry:
    """An entry as it travels: the bytes of its file, and what they decode to."""

    entry: CacheEntry
    blob: bytes

    @property
    def file_name(self) -> str:
        return f"{self.entry.key}{ENTRY_SUFFIX}"

    def manifest_row(self) -> dict:
        return {"file": self.file_name, "key": self.entry.key, "variant": self.entry.variant_name,
                "arch": self.entry.record.arch, "size": len(self.blob),
                "sha256": hashlib.sha256(self.blob).hexdigest()}


def toolchain() -> dict[str, str]:
    """The versions an entry's key depends on: kgen's and NVRTC's.

    (The key also covers the content of the CUDA headers, which has no version
    to compare: different headers on a node make its builds miss, not fail.)
    """
    return {"kgen": __version__, "nvrtc": nvrtc_version()}


def check_toolchain(manifest: dict) -> None:
    """Refuse a manifest of another kgen or NVRTC: its entries' keys could never match here."""
    if manifest.get("format") != MANIFEST_FORMAT:
        raise ArchiveError(f"its manifest has format {manifest.get('format')!r}; this kgen reads {MANIFEST_FORMAT}")
    made, here = (manifest.get("kgen"), manifest.get("nvrtc")), (__version__, nvrtc_version())
    if made != here:
        raise ArchiveError(f"it was made by kgen {made[0]} with NVRTC {made[1]}, and this is kgen {here[0]} with "
                           f"NVRTC {here[1]}: its entries' keys would never match a build here")


def collect_entries(caches: list[DiskCache], archs: set[str] | None = None) -> tuple[list[PackedEntry], int]:
    """The valid entries of ``caches``, and how many files were left out as invalid.

    A key is taken once, from the first cache that has it; with ``archs``, only
    entries for those archs. Invalid files are corrupt, or of another entry format.
    """
    chosen: dict[str, PackedEntry] = {}
    invalid = 0
    for cache in caches:
        for path in cache.entries():
            key = path.name[:-len(ENTRY_SUFFIX)]
            if key in chosen:
                continue
            try:
                packed = PackedEntry(*cache.read(key))
            except (OSError, ValueError):
                invalid += 1
                continue
            if not archs or packed.entry.record.arch in archs:
                chosen[key] = packed
    return [chosen[key] for key in sorted(chosen)], invalid


def make_manifest(packed: list[PackedEntry]) -> dict:
    return {"format": MANIFEST_FORMAT, **toolchain(), "archs": sorted({p.entry.record.arch for p in packed}),
            "entries": [p.manifest_row() for p in packed]}
