"""Cache entries packed for a fleet as a tar archive with a manifest (``kgen cache export`` / ``import``).

``kgen cache import`` checks all of it before it adds anything.
"""

from __future__ import annotations

import hashlib
import io
import json
import re
import struct
import tarfile
from pathlib import Path, PurePosixPath

from kgen.cache.manifest import MANIFEST, ArchiveError, PackedEntry, check_toolchain, make_manifest
from kgen.cache.store import ENTRY_SUFFIX, CacheError, DiskCache, decode_entry, read_only_hint, replacing

#: The archive names ``kgen cache export`` writes: a tar file, gzipped or not.
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_ENTRY_MEMBER = re.compile(rf"entries/[0-9a-f]{{64}}{re.escape(ENTRY_SUFFIX)}")


def write_archive(path: Path, packed: list[PackedEntry]) -> None:
    """Write ``packed`` and their manifest as a tar file (gzipped for ``.tar.gz`` and ``.tgz``), whole or not at all."""
    members = {MANIFEST: json.dumps(make_manifest(packed), indent=1).encode()}
    members.update({f"entries/{p.file_name}": p.blob for p in packed})
    mode = "w:gz" if path.name.endswith((".tar.gz", ".tgz")) else "w"
    with replacing(path) as tmp, tarfile.open(tmp, mode) as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            tar.addfile(info, io.BytesIO(data))


def read_archive(path: Path) -> list[PackedEntry]:
    """Every entry of the archive at ``path``, or :class:`ArchiveError` if any member, digest or entry is off.

    Members are read into memory, never extracted: only a regular file named
    ``manifest.json`` or ``entries/<key>.cubin.kgen`` is accepted. The manifest
    must be of this kgen and NVRTC, list exactly the entries present, and
    agree with each: its SHA-256, and the key, variant and arch inside it.
    """
    try:
        with tarfile.open(path, "r:*") as tar:
            members = _regular_members(tar)
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise ArchiveError(f"it is not a tar archive kgen can read ({exc})") from None
    if MANIFEST not in members:
        raise ArchiveError(f"it has no {MANIFEST}")
    try:
        manifest = json.loads(members.pop(MANIFEST))
        check_toolchain(manifest)
        rows = {row["file"]: row for row in manifest["entries"]}
    except ArchiveError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError) as exc:  # not JSON, or not of the manifest's shape
        raise ArchiveError(f"its {MANIFEST} is malformed ({exc!r})") from None
    if len(rows) != len(manifest["entries"]):
        raise ArchiveError(f"{MANIFEST} lists an entry twice")
    present = {name[len("entries/"):]: data for name, data in members.items()}
    if set(rows) != set(present):
        missing, unlisted = sorted(set(rows) - set(present)), sorted(set(present) - set(rows))
        raise ArchiveError(f"{MANIFEST} does not list exactly its entries (missing: {missing or 'none'}; "
                           f"not listed: {unlisted or 'none'})")
    return [_checked_entry(rows[name], present[name]) for name in sorted(rows)]


def _regular_members(tar: tarfile.TarFile) -> dict[str, bytes]:
    members: dict[str, bytes] = {}
    for member in tar:
        name = member.name
        if PurePosixPath(name).is_absolute() or ".." in PurePosixPath(name).parts or "\\" in name:
            raise ArchiveError(f"member {name!r} has an unsafe path")
        if not member.isreg():
            kind = "a symbolic link" if member.issym() else "a hard link" if member.islnk() else \
                "a folder" if member.isdir() else "a special file"
            raise ArchiveError(f"member {name!r} is {kind}, not a regular file")
        if name != MANIFEST and not _ENTRY_MEMBER.fullmatch(name):
            raise ArchiveError(f"member {name!r} is neither {MANIFEST} nor entries/<key>{ENTRY_SUFFIX}")
        if name in members:
            raise ArchiveError(f"member {name!r} appears twice")
        members[name] = tar.extractfile(member).read()
    return members


def _checked_entry(row: dict, blob: bytes) -> PackedEntry:
    name = row["file"]
    if hashlib.sha256(blob).hexdigest() != row.get("sha256"):
        raise ArchiveError(f"{name} does not match its SHA-256 in {MANIFEST}")
    try:
        entry = decode_entry(blob)
    except (ValueError, KeyError, TypeError, struct.error) as exc:
        raise ArchiveError(f"{name} is not a valid entry ({exc})") from None
    packed = PackedEntry(entry, blob)
    if packed.manifest_row() != row:
        raise ArchiveError(f"{name} holds {packed.manifest_row()}, but {MANIFEST} says {row}")
    return packed


def import_entries(packed: list[PackedEntry], cache: DiskCache) -> int:
    """Publish the entries ``cache`` lacks, each under its key's lock; return how many were added."""
    added = 0
    try:
        for item in packed:
            with cache.lock(item.entry.key):
                if cache.get(item.entry.key) is None:
                    cache.put(item.entry)
                    added += 1
    except OSError as exc:
        raise CacheError(f"cannot import into the cache {cache.root}: {exc.filename or cache.root}: "
                         f"{exc.strerror or exc}{read_only_hint(exc)}") from None
    return added
