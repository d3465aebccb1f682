"""Hostile audit of the cache (issue 22): files that are not entries, entries that are well made but malformed,
archives that are tar bombs, and a lock that is never released.

Each fault must end in a miss that is reported and rebuilt (an entry), one refusal naming the file (an archive),
or a warning and a compile in memory (a lock): never a hang, a traceback or memory without bound. Cases that
would hang or fill memory if the guard against them were lost run in a child process with a memory limit.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import struct
import subprocess
import sys
import tarfile
import threading
import tracemalloc
import warnings
from pathlib import Path

import pytest
from click.testing import CliRunner

import kgen.cache.archive
import kgen.cache.store
import kgen.config
import kgen.jit
from zero_stream import Zeros
import kgen.registry
from kgen.cache import (ArchiveError, CacheEntry, CacheError, CacheWarning, DiskCache, UnwritableCacheWarning,
                        collect_entries, decode_entry, read_archive, write_archive)
from kgen.cache.manifest import PackedEntry
from kgen.cache.verify import verify_entry
from kgen.cli import cli

ARCH = "sm_90a"


def variant():
    return kgen.registry.current().family("merge_attention_states").select(dtype="bf16", head_dim=64,
                                                                              has_incomplete_tile=True)


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory) -> Path:
    """A cache folder holding one real entry for sm_90a; copy its entry before changing anything."""
    folder = tmp_path_factory.mktemp("prebuilt") / "cache"
    with kgen.config.overrides(KGEN_CACHE_DIR=str(folder)):
        assert kgen.jit.build(variant(), ARCH).cache_hit is False
    return folder


@pytest.fixture(autouse=True)
def fresh_reports(monkeypatch):
    monkeypatch.setattr(kgen.cache.store, "_warned", set())


def the_entry(folder: Path) -> Path:
    [path] = DiskCache(folder).entries()
    return path


def rewritten(blob: bytes, change) -> bytes:
    """``blob`` with its JSON header replaced by ``change(header)`` (bytes), and a digest that matches again."""
    (length,) = struct.unpack_from("<I", blob, 42)
    header, cubin = json.loads(blob[46:46 + length]), blob[46 + length:]
    new = change(header)
    payload = struct.pack("<I", len(new)) + new + cubin
    return b"KGENCUBIN4" + hashlib.sha256(payload).digest() + payload


# --------------------------------------------------------------------------- entry files that are not entries


_SPECIAL_FILES = r"""
import os, resource, sys, warnings
from pathlib import Path
resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
from kgen.cache import ArchiveError, DiskCache, read_archive
folder = Path(sys.argv[1])
def fifo(p): os.mkfifo(p)
def zero(p): p.symlink_to("/dev/zero")
def sparse(p): p.write_bytes(b"KGENCUBIN4"); os.truncate(p, 2 << 30)
def directory(p): p.mkdir()
for i, (name, make) in enumerate([("fifo", fifo), ("dev-zero", zero), ("sparse-2GiB", sparse), ("folder", directory)]):
    folder.mkdir(parents=True, exist_ok=True)
    key = f"{i:064x}"  # one key each: a file is reported once per process
    path = folder / f"{key}.cubin.kgen"
    make(path)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        print(name, "entry", DiskCache(folder).get(key), "|", *[str(w.message) for w in caught])
    os.rmdir(path) if path.is_dir() and not path.is_symlink() else path.unlink()
for name, archive in [("fifo", folder / "a.tar"), ("dev-zero", Path("/dev/zero"))]:
    if name == "fifo":
        os.mkfifo(archive)
    try:
        read_archive(archive)
    except ArchiveError as exc:
        print(name, "archive", exc)
"""


def test_an_entry_that_is_a_fifo_a_device_a_huge_file_or_a_folder_is_a_reported_miss(tmp_path):
    # Each used to hang (a FIFO), or read until memory ran out (/dev/zero, a 2 GiB sparse file): run apart.
    done = subprocess.run([sys.executable, "-c", _SPECIAL_FILES, str(tmp_path / "cache")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    entry = [tmp_path / "cache" / f"{i:064x}.cubin.kgen" for i in range(4)]
    assert lines[:4] == [
        f"fifo entry None | kgen: cache entry {entry[0]} is corrupt (it is a FIFO, not a regular file); "
        f"rebuilding it",
        f"dev-zero entry None | kgen: cache entry {entry[1]} is corrupt (it is a device, not a regular file); "
        f"rebuilding it",
        f"sparse-2GiB entry None | kgen: cache entry {entry[2]} is corrupt (it is {2 << 30} bytes, over the 64 MiB "
        f"kgen reads); rebuilding it",
        f"folder entry None | kgen: cache entry {entry[3]} is corrupt (it is a folder, not a regular file); "
        f"rebuilding it",
    ]
    assert lines[4:] == ["fifo archive it is not a regular file", "dev-zero archive it is not a regular file"]


def test_a_fifo_named_like_an_entry_is_rebuilt_over_and_then_hits(prebuilt, tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir()
    fifo = folder / the_entry(prebuilt).name
    os.mkfifo(fifo)
    results = []

    def build_twice():
        with kgen.config.overrides(KGEN_CACHE_DIR=str(folder)), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            results.append([kgen.jit.build(variant(), ARCH).cache_hit for _ in range(2)])
            results.append([str(w.message) for w in caught])

    builder = threading.Thread(target=build_twice, daemon=True)
    builder.start()
    builder.join(timeout=120)
    if builder.is_alive():  # blocked opening the FIFO: give it a writer, so that the thread ends
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))
        pytest.fail("a build blocked on a FIFO named like its entry")
    assert results[0] == [False, True]
    assert results[1] == [f"kgen: cache entry {fifo} is corrupt (it is a FIFO, not a regular file); rebuilding it"]
    assert fifo.is_file() and decode_entry(fifo.read_bytes()).cubin == decode_entry(
        the_entry(prebuilt).read_bytes()).cubin


def test_cache_info_counts_a_broken_link_instead_of_failing(prebuilt, tmp_path):
    folder = tmp_path / "cache"
    folder.mkdir()
    (folder / the_entry(prebuilt).name).symlink_to(tmp_path / "nowhere")
    with kgen.config.overrides(KGEN_CACHE_DIR=str(folder)):
        result = CliRunner().invoke(cli, ["cache", "info"], env={"KGEN_SPEC_PATH": None})
    assert result.exit_code == 0, result.output
    assert result.stdout == f"writable: {folder} (1 entry, 0 bytes)\n"


# --------------------------------------------------------------------------- entries well made but malformed


@pytest.mark.parametrize("change,reason", [
    (lambda h: json.dumps({**h, "record": {**h["record"], "entries": [1]}}).encode(), "AttributeError"),
    (lambda h: b"[" * 100_000 + b"]" * 100_000, "RecursionError"),
    (lambda h: b"[]", "TypeError"),
    (lambda h: json.dumps({**h, "record": None}).encode(), "TypeError"),
    (lambda h: json.dumps({**h, "record": {**h["record"], "arch": 7}}).encode(), "a field of the wrong type"),
    (lambda h: json.dumps({**h, "variant": ["x"]}).encode(), "a field of the wrong type"),
    (lambda h: json.dumps({**h, "record": {**h["record"], "compile_ms": "fast"}}).encode(),
     "a field of the wrong type"),
    (lambda h: json.dumps({**h, "record": {**h["record"], "entries": {"e": {"registers": "many"}}}}).encode(),
     "a field of the wrong type"),
    (lambda h: json.dumps({**h, "size": float(h["size"])}).encode(), "cubin size does not match its header"),
    (lambda h: b"\xff{", "its header is malformed"),
], ids=["entries-a-list", "nested-json", "header-a-list", "record-null", "arch-a-number", "variant-a-list",
        "compile-ms-a-string", "registers-a-string", "size-a-float", "not-utf8"])
def test_an_entry_with_a_valid_digest_but_a_malformed_header_is_corrupt_everywhere(prebuilt, tmp_path, change,
                                                                                   reason):
    # The digest proves an entry whole, not well made: its header must never raise anything but ValueError.
    blob = rewritten(the_entry(prebuilt).read_bytes(), change)
    with pytest.raises(ValueError, match=reason):
        decode_entry(blob)
    folder = tmp_path / "cache"
    folder.mkdir()
    path = folder / the_entry(prebuilt).name
    path.write_bytes(blob)
    key = path.name[:-len(".cubin.kgen")]
    with pytest.warns(CacheWarning, match="is corrupt"):
        assert DiskCache(folder).get(key) is None
    assert collect_entries([DiskCache(folder)]) == ([], 1)
    assert verify_entry(DiskCache(folder), path, {}).status == "corrupt"
    # In an archive (its manifest made to agree), it is refused with one message.
    packed = PackedEntry(decode_entry(the_entry(prebuilt).read_bytes()), blob)
    archive = tmp_path / "cubins.tar"
    write_archive(archive, [packed])
    with pytest.raises(ArchiveError, match="is not a valid entry"):
        read_archive(archive)


# --------------------------------------------------------------------------- archives that are tar bombs


def raw_member(name: str, size: int, kind: bytes) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size, info.type = size, kind
    return info


@pytest.mark.parametrize("kind,name", [(tarfile.XHDTYPE, "././@PaxHeader"), (tarfile.XGLTYPE, "pax_global_header"),
                                       (tarfile.GNUTYPE_LONGNAME, "././@LongLink")],
                         ids=["pax", "pax-global", "gnu-long-name"])
def test_an_extended_header_bomb_is_refused_before_tarfile_reads_it(tmp_path, kind, name):
    # tarfile reads an extended header whole before its member is seen: 64 MiB of zeros is a 64 KiB file here,
    # and 4 GiB (as the audit made) a 4 MiB one.
    archive = tmp_path / "bomb.tar.gz"
    with open(archive, "wb") as raw, tarfile.open(fileobj=raw, mode="w:gz", compresslevel=1,
                                                  format=tarfile.USTAR_FORMAT) as tar:
        tar.fileobj.write(raw_member(name, 64 << 20, kind).tobuf(tarfile.USTAR_FORMAT))
        zeros = Zeros(64 << 20)
        while chunk := zeros.read(1 << 20):
            tar.fileobj.write(chunk)
    tracemalloc.start()
    try:
        with pytest.raises(ArchiveError, match=r"it has an extended tar header of 67108864 bytes, over the 1 MiB"):
            read_archive(archive)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 8 << 20, f"peak {peak} bytes"


def test_a_sparse_member_is_refused(tmp_path):
    archive = tmp_path / "sparse.tar"
    with tarfile.open(archive, "w", format=tarfile.GNU_FORMAT) as tar:
        info = raw_member("entries/" + "ab" * 32 + ".cubin.kgen", 0, tarfile.GNUTYPE_SPARSE)
        tar.addfile(info)
    with pytest.raises(ArchiveError, match="is a sparse file"):
        read_archive(archive)


def test_an_archive_of_many_empty_members_is_refused_by_count(tmp_path, monkeypatch):
    # Empty members take nothing from the size caps, but each one walked is kept in memory.
    monkeypatch.setattr(kgen.cache.archive, "MAX_MEMBERS", 50)
    archive = tmp_path / "many.tar"
    with tarfile.open(archive, "w") as tar:
        for i in range(51):
            tar.addfile(raw_member(f"entries/{i:064x}.cubin.kgen", 0, tarfile.REGTYPE), io.BytesIO())
    with pytest.raises(ArchiveError, match="it has over the 50 members kgen accepts"):
        read_archive(archive)


def test_a_deeply_nested_manifest_is_malformed_not_a_recursion_error(tmp_path):
    archive = tmp_path / "nested.tar"
    manifest = b"[" * 200_000 + b"]" * 200_000
    with tarfile.open(archive, "w") as tar:
        tar.addfile(raw_member("manifest.json", len(manifest), tarfile.REGTYPE), io.BytesIO(manifest))
    with pytest.raises(ArchiveError, match=r"its manifest.json is malformed \(RecursionError"):
        read_archive(archive)


# --------------------------------------------------------------------------- a lock never released


def test_a_lock_held_without_end_makes_a_build_compile_in_memory_not_hang(prebuilt, tmp_path, monkeypatch):
    monkeypatch.setattr(kgen.cache.store, "LOCK_TIMEOUT_S", 0.2)
    folder = tmp_path / "cache"
    key = the_entry(prebuilt).name[:-len(".cubin.kgen")]
    held = DiskCache(folder).lock(key)
    held.acquire()  # another open file description: to flock, another holder
    try:
        with kgen.config.overrides(KGEN_CACHE_DIR=str(folder)), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = kgen.jit.build(variant(), ARCH)
        assert result.cache_hit is False and result.key == key
        [warning] = caught
        assert warning.category is UnwritableCacheWarning
        assert str(warning.message) == (f"kgen: cache folder {folder} is not usable (The file lock "
                                         f"'{held.lock_file}' could not be acquired.); compiling in memory")
        DiskCache(folder).put(CacheEntry(key, b"x", result.record, "v"))
        with pytest.raises(CacheError, match=f"cannot clear the cache {folder}: .*could not be acquired"):
            DiskCache(folder).clear()
    finally:
        held.release()
    assert DiskCache(folder).clear() == 1


def test_a_builder_waiting_on_a_lock_says_so_then_builds(prebuilt, tmp_path, monkeypatch):
    monkeypatch.setattr(kgen.jit, "LOCK_NOTICE_S", 0.05)
    folder = tmp_path / "cache"
    key = the_entry(prebuilt).name[:-len(".cubin.kgen")]
    held, taken = DiskCache(folder).lock(key), threading.Event()

    def other_builder():  # filelock's locks are per thread: this one takes it, holds it a while, gives it back
        with held:
            taken.set()
            threading.Event().wait(0.5)

    thread = threading.Thread(target=other_builder)
    thread.start()
    taken.wait()
    try:
        with kgen.config.overrides(KGEN_CACHE_DIR=str(folder)), warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            result = kgen.jit.build(variant(), ARCH)
    finally:
        thread.join()
    assert result.key == key
    assert any(f"kgen: waiting for {held.lock_file}" in str(w.message) for w in caught)
