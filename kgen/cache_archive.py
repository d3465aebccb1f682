"""Cache entries packed for a fleet: an archive with a manifest, or a wheel that installs a read-only cache.

``kgen cache export`` packs entries with a manifest
(kgen's and NVRTC's versions, and per entry its key, variant, arch and
SHA-256); ``kgen cache import`` checks all of it before it adds anything.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import re
import struct
import tarfile
import zipfile
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from kgen import __version__
from kgen.cache import ENTRY_SUFFIX, CacheEntry, CacheError, DiskCache, decode_entry, read_only_hint, replacing
from kgen.compiler import nvrtc_version

#: The entry-point group of caches installed as wheels; each entry point names an object holding its folder.
ENTRY_POINT_GROUP = "kgen.caches"

MANIFEST = "manifest.json"
#: Bumped whenever the manifest's fields or their meaning change.
MANIFEST_FORMAT = 1
#: The archive names ``kgen cache export`` writes: a tar file, gzipped or not.
ARCHIVE_SUFFIXES = (".tar", ".tar.gz", ".tgz")
_ENTRY_MEMBER = re.compile(rf"entries/[0-9a-f]{{64}}{re.escape(ENTRY_SUFFIX)}")


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
                "arch": self.entry.record.arch, "sha256": hashlib.sha256(self.blob).hexdigest()}


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


# --------------------------------------------------------------------------- wheels


_WHEEL_DATE = (1980, 1, 1, 0, 0, 0)  # the earliest a zip can say: the same entries give the same wheel


def write_wheel(folder: Path, packed: list[PackedEntry]) -> Path:
    """Write a wheel holding ``packed`` that registers itself under ``kgen.caches``; return its path.

    Package ``kgen_cache_<archs>`` holds the entries and manifest in its
    ``cache/`` folder, which ``CACHE_DIR`` names and the entry point points
    to. Its version is kgen's, with NVRTC's as the local label, and it
    requires this kgen: installed with another, it would never hit.
    """
    manifest = make_manifest(packed)
    package = "kgen_cache_" + "_".join(manifest["archs"])
    nvrtc = re.sub(r"[^0-9a-z]+", ".", nvrtc_version().split()[-1].lower()).strip(".")
    version = f"{__version__}+nvrtc.{nvrtc}"
    summary = (f"Prebuilt kgen cubins for {', '.join(manifest['archs'])} ({len(packed)} entries), "
               f"made by kgen {__version__} with NVRTC {nvrtc_version()}")
    files = {
        f"{package}/__init__.py": f'"""{summary}."""\n\nimport os\n\n'
                                  f'CACHE_DIR = os.path.join(os.path.dirname(__file__), "cache")\n'.encode(),
        f"{package}/cache/{MANIFEST}": json.dumps(manifest, indent=1).encode(),
        **{f"{package}/cache/{p.file_name}": p.blob for p in packed},
    }
    info = f"{package}-{version}.dist-info"
    files[f"{info}/METADATA"] = (f"Metadata-Version: 2.1\nName: {package.replace('_', '-')}\nVersion: {version}\n"
                                 f"Summary: {summary}\nRequires-Dist: kgen=={__version__}\n").encode()
    files[f"{info}/WHEEL"] = (f"Wheel-Version: 1.0\nGenerator: kgen {__version__}\nRoot-Is-Purelib: true\n"
                              f"Tag: py3-none-any\n").encode()
    files[f"{info}/entry_points.txt"] = f"[{ENTRY_POINT_GROUP}]\n{package} = {package}:CACHE_DIR\n".encode()
    files[f"{info}/RECORD"] = "".join(f"{name},sha256={_record_digest(data)},{len(data)}\n"
                                      for name, data in files.items()).encode() + f"{info}/RECORD,,\n".encode()
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{package}-{version}-py3-none-any.whl"
    with replacing(path) as tmp, zipfile.ZipFile(tmp, "w") as wheel:
        for name, data in files.items():
            member = zipfile.ZipInfo(name, _WHEEL_DATE)
            member.external_attr = 0o644 << 16
            wheel.writestr(member, data, zipfile.ZIP_DEFLATED)
    return path


def _record_digest(data: bytes) -> str:
    # The wheel spec's form: urlsafe base64 of the SHA-256, without padding.
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
