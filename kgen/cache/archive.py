"""Cache entries packed for a fleet as a tar archive with a manifest (``kgen cache export`` / ``import``).

``kgen cache import`` checks all of it before it adds anything.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import stat
import struct
import tarfile
import zlib
from pathlib import Path, PurePosixPath

from kgen.cache.manifest import MANIFEST, ArchiveError, PackedEntry, check_toolchain, make_manifest
from kgen.cache.store import (ENTRY_SUFFIX, MAX_ENTRY_BYTES, CacheError, DiskCache, decode_entry, read_only_hint,
                              replacing)

#: The archive names ``kgen cache export`` writes: a tar file, gzipped or not.
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_ENTRY_MEMBER = re.compile(rf"entries/[0-9a-f]{{64}}{re.escape(ENTRY_SUFFIX)}")
#: The most bytes kgen reads of a manifest, of one entry, and of all members together. A cubin is well under
#: a megabyte and a manifest row about 300 bytes: anything near these is not an archive kgen made.
MAX_MANIFEST_BYTES = 16 << 20
MAX_ARCHIVE_BYTES = 1 << 30
#: The most members kgen walks: a manifest of at most MAX_MANIFEST_BYTES cannot list more (a row is over 200
#: bytes), and each member walked is kept in memory, so empty members, which take nothing from the size caps,
#: are capped by count.
MAX_MEMBERS = 100_000
#: The largest extended header (pax, GNU long name) kgen lets tarfile read: it reads one whole, before any
#: check of kgen's. kgen writes none (its names are short), and other tools' are a few hundred bytes.
MAX_EXTENDED_HEADER_BYTES = 1 << 20
_CHUNK = 1 << 20


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
    """Every entry of the archive at ``path``, or :class:`ArchiveError` if any member, size, digest or entry is off.

    Members are read into memory, never extracted: only a regular file named
    ``manifest.json`` or ``entries/<key>.cubin.kgen`` is accepted. The manifest
    must be of this kgen and NVRTC, list exactly the entries present, and
    agree with each: its size, its SHA-256, and the key, variant and arch inside it.

    A small gzipped archive can hold a huge member, so no member is read before
    its size is known to be sane: every size in the tar headers is checked
    against the caps first (the archive is walked without reading any data),
    and each entry's against the manifest's; data is then read in chunks up to
    that size. Memory holds the manifest and the entries, never more than the caps.
    """
    try:
        # Not a FIFO or a device (say /dev/zero, which the xz reader would read without end): a regular file.
        if not stat.S_ISREG(os.stat(path).st_mode):
            raise ArchiveError("it is not a regular file")
        with tarfile.open(path, "r:*", tarinfo=_CheckedTarInfo) as tar:
            members = _regular_members(tar)
            if MANIFEST not in members:
                raise ArchiveError(f"it has no {MANIFEST}")
            rows = _manifest_rows(_read_member(tar, members.pop(MANIFEST)))
            present = {name[len("entries/"):]: info for name, info in members.items()}
            if set(rows) != set(present):
                missing, unlisted = sorted(set(rows) - set(present)), sorted(set(present) - set(rows))
                raise ArchiveError(f"{MANIFEST} does not list exactly its entries (missing: {missing or 'none'}; "
                                   f"not listed: {unlisted or 'none'})")
            for name in sorted(rows):
                if present[name].size != rows[name].get("size"):
                    raise ArchiveError(f"{name} is {present[name].size} bytes, but {MANIFEST} says "
                                       f"{rows[name].get('size')!r}")
            return [_checked_entry(rows[name], _read_member(tar, present[name])) for name in sorted(rows)]
    except (tarfile.TarError, OSError, EOFError, zlib.error) as exc:
        raise ArchiveError(f"it is not a tar archive kgen can read ({exc})") from None


class _CheckedTarInfo(tarfile.TarInfo):
    """The headers of an archive, refused before tarfile reads what could be a gzip bomb into memory.

    tarfile reads an extended header's data (pax, GNU long name) whole, and a GNU
    sparse map a block at a time into a list, before the caller sees the member: a
    small ``.tar.gz`` could make either gigabytes. kgen writes neither.
    """

    def _proc_member(self, tar):
        extended = (tarfile.XHDTYPE, tarfile.XGLTYPE, tarfile.SOLARIS_XHDTYPE, tarfile.GNUTYPE_LONGNAME,
                    tarfile.GNUTYPE_LONGLINK)
        if self.type in extended and self.size > MAX_EXTENDED_HEADER_BYTES:
            raise ArchiveError(f"it has an extended tar header of {self.size} bytes, over the "
                               f"{MAX_EXTENDED_HEADER_BYTES >> 20} MiB kgen accepts")
        if self.type == tarfile.GNUTYPE_SPARSE:
            raise ArchiveError(f"member {self.name!r} is a sparse file, not a regular file")
        return super()._proc_member(tar)

    def _refuse_sparse(self, *args):
        raise ArchiveError("a member is a sparse file, not a regular file")

    _proc_gnusparse_00 = _proc_gnusparse_01 = _proc_gnusparse_10 = _refuse_sparse


def _regular_members(tar: tarfile.TarFile) -> dict[str, tarfile.TarInfo]:
    # Headers only: TarFile's iteration skips each member's data (decompressing it a chunk at a time).
    members: dict[str, tarfile.TarInfo] = {}
    total = 0
    for count, member in enumerate(tar, 1):
        if count > MAX_MEMBERS:
            raise ArchiveError(f"it has over the {MAX_MEMBERS} members kgen accepts")
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
        cap = MAX_MANIFEST_BYTES if name == MANIFEST else MAX_ENTRY_BYTES
        if member.size > cap:
            raise ArchiveError(f"member {name!r} is {member.size} bytes, over the {cap >> 20} MiB kgen accepts")
        total += member.size
        if total > MAX_ARCHIVE_BYTES:
            raise ArchiveError(f"its members hold over the {MAX_ARCHIVE_BYTES >> 20} MiB kgen accepts")
        members[name] = member
    return members


def _read_member(tar: tarfile.TarFile, member: tarfile.TarInfo) -> bytes:
    # Its size was checked against the caps (and an entry's against the manifest) before this reads a byte.
    data = bytearray()
    with tar.extractfile(member) as stream:
        while len(data) < member.size:
            chunk = stream.read(min(_CHUNK, member.size - len(data)))
            if not chunk:
                raise ArchiveError(f"member {member.name!r} ends before its {member.size} bytes")
            data += chunk
    return bytes(data)


def _manifest_rows(text: bytes) -> dict[str, dict]:
    """The manifest's rows by file name, once it is known to be of this kgen and NVRTC and of the right shape."""
    try:
        manifest = json.loads(text)
        check_toolchain(manifest)
        rows = {row["file"]: row for row in manifest["entries"]}
    except ArchiveError:
        raise
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError) as exc:  # not JSON, or not of its shape
        raise ArchiveError(f"its {MANIFEST} is malformed ({exc!r})"[:500]) from None
    if len(rows) != len(manifest["entries"]):
        raise ArchiveError(f"{MANIFEST} lists an entry twice")
    return rows


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
