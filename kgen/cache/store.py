"""One folder of cubins: keys, self-checking entries, atomic publish, cross-process locks.

* **Key.** ``cuda.core.utils.make_program_cache_key`` over the rendered source,
  the NVRTC options, the arch and the target, with an extra digest of labelled
  fields: kgen's version, the entry and build-record formats, NVRTC's full
  version and the content of every header the source includes. The include
  folder itself is left out of the options that are keyed: the headers'
  content stands for it, so the same toolchain in another venv or on another
  machine hits the same entry.
* **Entry.** ``MAGIC | SHA-256 of the rest | header length | JSON header | cubin``;
  the header names the entry's own key. A truncated, corrupt or misplaced entry
  (another key's file copied over this one) is a miss: it is reported once and
  rebuilt. So is a name that is not a regular file (a FIFO, a link to a device,
  a folder) or a file over MAX_ENTRY_BYTES: neither is opened or read, so it can
  neither block a reader nor fill its memory.
* **Publish.** Write to a temporary file in the same folder (created like any
  file, so the umask decides who may read it: a group-shared cache works), then
  ``os.replace``: a reader sees the old entry, the new one, or none.
* **Single flight.** Builders take one of a fixed set of lock files, chosen by
  the key's hash, and re-check the cache once they hold it, so N processes
  compile a variant once. The set is fixed, and lock files are never deleted:
  deleting one that another process waits on would let two processes hold it.
  A lock is waited for at most LOCK_TIMEOUT_S: a process that holds one and
  hangs makes the others compile in memory (with a warning), not hang too.

Which folders are searched (layers, installed caches): kgen.cache.layers; archives and wheels of
entries for a fleet: kgen.cache.archive and kgen.cache.wheel.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import os
import re
import secrets
import struct
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import filelock
from cuda.core.utils import make_program_cache_key

from kgen import __version__
from kgen.compiler import PROGRAM_NAME, RECORD_FORMAT, BuildRecord, header_digest, nvrtc_version, program_options
from kgen.files import read_regular_file

_MAGIC = b"KGENCUBIN4"
_HEADER_LEN = struct.Struct("<I")
_DIGEST_LEN = 32  # SHA-256
ENTRY_SUFFIX = ".cubin.kgen"
_SOURCE_SUFFIX = ".cu"
_KEY = re.compile(r"[0-9a-f]{64}")
_TEMPORARY = ".*.tmp"
#: Lock files in the ``locks/`` folder; two keys share one with probability 1/LOCK_STRIPES,
#: and then only wait for each other.
LOCK_STRIPES = 256
#: The longest a builder waits for a lock (far longer than any compile) before it gives up with an OSError.
LOCK_TIMEOUT_S = 600.0
#: The largest entry file kgen reads. A cubin is well under a megabyte: a file near this is not an entry.
MAX_ENTRY_BYTES = 64 << 20
_warned: set[tuple[str, str]] = set()


class CacheWarning(RuntimeWarning):
    """Something about the cache kgen worked around (a corrupt entry rebuilt, an installed cache left out)."""


class UnwritableCacheWarning(CacheWarning):
    """No folder on the cache path can take new entries, so what kgen compiles is not kept.

    A run-time op warns and runs on; ``kgen build``, whose job is to fill the cache, fails on it.
    """


def warn_once(kind: str, subject: str, message: str) -> None:
    """Warn ``message`` once per process for ``(kind, subject)``; kind ``unwritable`` is an UnwritableCacheWarning."""
    if (kind, subject) not in _warned:
        _warned.add((kind, subject))
        category = UnwritableCacheWarning if kind == "unwritable" else CacheWarning
        warnings.warn(message, category, stacklevel=3)


class CacheError(OSError):
    """The cache folder cannot be changed as asked; the message names the folder and the file."""


def _labelled_digest(fields: list[tuple[str, bytes]]) -> bytes:
    # Length-prefixed label and value, so no two different field lists hash alike.
    digest = hashlib.sha256()
    for label, value in fields:
        digest.update(b"%d:%s%d:" % (len(label), label.encode(), len(value)) + value)
    return digest.digest()


def cache_key(source: str, arch: str) -> str:
    extra = _labelled_digest([
        ("kgen", __version__.encode()),
        ("entry-format", _MAGIC),
        ("record-format", str(RECORD_FORMAT).encode()),
        ("nvrtc", nvrtc_version().encode()),
        ("headers", header_digest(source)),
    ])
    options = dataclasses.replace(program_options(arch, PROGRAM_NAME), include_path=None)
    key = make_program_cache_key(code=source, code_type="c++", options=options, target_type="cubin",
                                 extra_digest=extra)
    return key.hex()


@dataclass
class CacheEntry:
    key: str
    cubin: bytes
    record: BuildRecord
    variant_name: str


def encode_entry(entry: CacheEntry) -> bytes:
    header = json.dumps({
        "key": entry.key,
        "variant": entry.variant_name,
        "size": len(entry.cubin),
        "record": entry.record.to_json(),
    }).encode()
    payload = _HEADER_LEN.pack(len(header)) + header + entry.cubin
    return _MAGIC + hashlib.sha256(payload).digest() + payload


def decode_entry(blob: bytes) -> CacheEntry:
    """Parse an entry, or raise ``ValueError`` if it is not exactly what was written.

    The digest covers the header (key, build record, variant name) as well as the cubin.
    """
    if not blob.startswith(_MAGIC):
        raise ValueError("bad magic")
    digest, payload = blob[len(_MAGIC):len(_MAGIC) + _DIGEST_LEN], blob[len(_MAGIC) + _DIGEST_LEN:]
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError("entry does not match its digest")
    if len(payload) < _HEADER_LEN.size:
        raise ValueError("it has no header")
    (header_len,) = _HEADER_LEN.unpack_from(payload, 0)
    cubin = payload[_HEADER_LEN.size + header_len:]
    # The digest proves the entry whole, not well made (anyone who can write to the folder can make one):
    # whatever the header holds is a ValueError here, never another exception in a caller that loads it.
    try:
        header = json.loads(payload[_HEADER_LEN.size:_HEADER_LEN.size + header_len])
        entry = CacheEntry(header["key"], cubin, BuildRecord.from_json(header["record"]), header["variant"])
        size = header["size"]
    except (ValueError, RecursionError, KeyError, TypeError, AttributeError) as exc:
        raise ValueError(f"its header is malformed ({type(exc).__name__}: {exc})"[:300]) from None
    if size != len(cubin) or type(size) is not int:
        raise ValueError("cubin size does not match its header")
    _check_fields(entry)
    return entry


def _check_fields(entry: CacheEntry) -> None:
    # Strings and numbers where the build report and the manifest expect them (not booleans: JSON's true is not 1).
    record = entry.record
    numbers = [record.callee_spill_bytes] + [value for resources in record.entries.values()
                                              for value in dataclasses.astuple(resources)]
    if not (isinstance(entry.key, str) and isinstance(entry.variant_name, str) and isinstance(record.arch, str)
            and type(record.compile_ms) in (int, float) and all(type(n) is int for n in numbers)):
        raise ValueError("its header is malformed (a field of the wrong type)")


class DiskCache:
    """Cubins under one folder, one file per key (and, with ``KGEN_SAVE_SOURCE``, its source beside it)."""

    def __init__(self, root: Path):
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / f"{key}{ENTRY_SUFFIX}"

    def source_path(self, key: str) -> Path:
        return self.root / f"{key}{_SOURCE_SUFFIX}"

    def holds(self, key: str) -> bool:
        """Whether this folder has a file for ``key`` (read nothing: it may still be corrupt)."""
        return self._path(key).is_file()

    def get(self, key: str) -> CacheEntry | None:
        """The entry of ``key``; None if there is none, or if it is corrupt (reported once)."""
        try:
            return self.read(key)[0]
        except OSError:
            return None
        except ValueError as exc:
            path = self._path(key)
            warn_once("corrupt", str(path), f"kgen: cache entry {path} is corrupt ({exc}); rebuilding it")
            return None

    def read(self, key: str) -> tuple[CacheEntry, bytes]:
        """The entry of ``key`` and its file's bytes.

        Raises ``OSError`` if the file cannot be read, ``ValueError`` if it is not a valid entry of that key.
        """
        blob = read_regular_file(self._path(key), MAX_ENTRY_BYTES)
        try:
            entry = decode_entry(blob)
        except struct.error as exc:
            raise ValueError(exc) from None
        if entry.key != key:
            raise ValueError(f"it holds the entry of key {entry.key}")
        return entry, blob

    def put(self, entry: CacheEntry, source: str | None = None) -> None:
        """Publish ``entry`` under its key, and ``source`` beside it if given.

        The caller holds :meth:`lock` of that key.
        """
        self._publish(self._path(entry.key), encode_entry(entry))
        if source is not None:
            self._publish(self.source_path(entry.key), source.encode())

    def _publish(self, path: Path, data: bytes) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        with replacing(path) as tmp:
            # 0o666 less the umask, as for any file the user writes (mkstemp would make it 0o600).
            with os.fdopen(os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), "wb") as f:
                f.write(data)

    def lock(self, key: str) -> filelock.FileLock:
        """The build lock of ``key``; acquiring it creates the folder (and raises ``OSError`` if it cannot)."""
        return self._stripe(int(hashlib.sha256(key.encode()).hexdigest(), 16) % LOCK_STRIPES)

    def _stripe(self, index: int) -> filelock.FileLock:
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        return filelock.FileLock(locks / f"{index:03d}.lock", timeout=LOCK_TIMEOUT_S)

    def entries(self) -> list[Path]:
        return sorted(self.root.glob(f"*{ENTRY_SUFFIX}")) if self.root.is_dir() else []

    def clear(self) -> int:
        """Remove every entry, saved source and orphan temporary file; return how many entries there were.

        Every lock is held meanwhile, so no builder is between compiling and
        publishing: a temporary file found then was left by a writer that died.
        A folder that cannot be changed raises :class:`CacheError`.
        """
        if not self.root.is_dir():
            return 0
        try:
            with contextlib.ExitStack() as held:
                for index in range(LOCK_STRIPES):
                    held.enter_context(self._stripe(index))
                entries = self.entries()
                sources = [p for p in self.root.glob(f"*{_SOURCE_SUFFIX}") if _KEY.fullmatch(p.stem)]
                for path in [*entries, *sources, *self.root.glob(_TEMPORARY)]:
                    path.unlink(missing_ok=True)
        except OSError as exc:
            raise CacheError(f"cannot clear the cache {self.root}: {exc.filename or self.root}: "
                             f"{exc.strerror or exc}{read_only_hint(exc)}") from None
        return len(entries)


@contextlib.contextmanager
def replacing(path: Path) -> Iterator[Path]:
    """A temporary file beside ``path`` to write: renamed over ``path`` if the block succeeds, removed if not."""
    tmp = path.with_name(f".{path.name}.{secrets.token_hex(8)}.tmp")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_only_hint(exc: OSError) -> str:
    return "; the cache is read-only to this user" if exc.errno in (errno.EACCES, errno.EPERM, errno.EROFS) else ""
