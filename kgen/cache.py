"""The on-disk cubin cache: keys, self-checking entries, atomic publish, cross-process locks.

* **Key.** ``cuda.core.utils.make_program_cache_key`` over the rendered source,
  the NVRTC options, the arch, the target and NVRTC's version, with an extra
  digest of kgen's version and of every header the source includes. Nothing
  else goes in, so the same inputs always hit and any changed input misses.
* **Entry.** ``MAGIC | SHA-256 of the rest | header length | JSON header | cubin``.
  A truncated or corrupt entry is a miss: it is reported once and rebuilt.
* **Publish.** Write to a temporary file in the same folder, then
  ``os.replace``: a reader sees the old entry, the new one, or none.
* **Single flight.** Builders take a ``filelock`` per key and re-check the
  cache once they hold it, so N processes compile a variant once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import struct
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import filelock
from cuda.core.utils import make_program_cache_key

from kgen import __version__
from kgen.compiler import PROGRAM_NAME, BuildRecord, header_digest, program_options

_MAGIC = b"KGENCUBIN3"
_HEADER_LEN = struct.Struct("<I")
_DIGEST_LEN = 32  # SHA-256
_SUFFIX = ".cubin.kgen"
_warned: set[tuple[str, str]] = set()


def warn_once(kind: str, subject: str, message: str) -> None:
    if (kind, subject) not in _warned:
        _warned.add((kind, subject))
        warnings.warn(message, RuntimeWarning, stacklevel=3)


def cache_key(source: str, arch: str) -> str:
    # The entry format is in the key too, so entries of another format are never looked up.
    extra = hashlib.sha256(f"kgen {__version__}\0".encode() + _MAGIC + b"\0" + header_digest(source)).digest()
    key = make_program_cache_key(
        code=source, code_type="c++", options=program_options(arch, PROGRAM_NAME),
        target_type="cubin", extra_digest=extra,
    )
    return key.hex()


@dataclass
class CacheEntry:
    cubin: bytes
    record: BuildRecord
    variant_name: str


def encode_entry(entry: CacheEntry) -> bytes:
    header = json.dumps({
        "variant": entry.variant_name,
        "size": len(entry.cubin),
        "record": entry.record.to_json(),
    }).encode()
    payload = _HEADER_LEN.pack(len(header)) + header + entry.cubin
    return _MAGIC + hashlib.sha256(payload).digest() + payload


def decode_entry(blob: bytes) -> CacheEntry:
    """Parse an entry, or raise ``ValueError`` if it is not exactly what was written.

    The digest covers the header (build record, variant name) as well as the cubin.
    """
    if not blob.startswith(_MAGIC):
        raise ValueError("bad magic")
    digest, payload = blob[len(_MAGIC):len(_MAGIC) + _DIGEST_LEN], blob[len(_MAGIC) + _DIGEST_LEN:]
    if hashlib.sha256(payload).digest() != digest:
        raise ValueError("entry does not match its digest")
    (header_len,) = _HEADER_LEN.unpack_from(payload, 0)
    header = json.loads(payload[_HEADER_LEN.size:_HEADER_LEN.size + header_len])
    cubin = payload[_HEADER_LEN.size + header_len:]
    if len(cubin) != header["size"]:
        raise ValueError("cubin size does not match its header")
    return CacheEntry(cubin, BuildRecord.from_json(header["record"]), header["variant"])


class DiskCache:
    """Cubins under one folder, one file per key."""

    def __init__(self, root: Path):
        self.root = root

    def _path(self, key: str) -> Path:
        return self.root / f"{key}{_SUFFIX}"

    def get(self, key: str) -> CacheEntry | None:
        path = self._path(key)
        try:
            blob = path.read_bytes()
        except OSError:
            return None
        try:
            return decode_entry(blob)
        except (ValueError, KeyError, TypeError, struct.error) as exc:
            warn_once("corrupt", str(path), f"kgen: cache entry {path} is corrupt ({exc}); rebuilding it")
            return None

    def put(self, key: str, entry: CacheEntry) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.root, prefix=".", suffix=".tmp")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(encode_entry(entry))
            os.replace(tmp, self._path(key))
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise

    def lock(self, key: str) -> filelock.FileLock:
        """The build lock of ``key``; acquiring it creates the folder (and raises ``OSError`` if it cannot)."""
        locks = self.root / "locks"
        locks.mkdir(parents=True, exist_ok=True)
        return filelock.FileLock(locks / f"{key}.lock")

    def entries(self) -> list[Path]:
        return sorted(self.root.glob(f"*{_SUFFIX}")) if self.root.is_dir() else []

    def clear(self) -> int:
        """Remove every entry and lock; return how many entries there were."""
        count = len(self.entries())
        for path in self.entries():
            path.unlink(missing_ok=True)
        shutil.rmtree(self.root / "locks", ignore_errors=True)
        return count
