"""The disk cache: keys, self-checking entries, corrupt-entry recovery, unusable folders, atomic publish, single flight."""

from __future__ import annotations

import multiprocessing
import os
import stat
import warnings
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import kgen.cache.store
import kgen.compiler
import kgen.config
import kgen.jit
import kgen.registry
import kgen.render
from kgen.cache import LOCK_STRIPES, CacheEntry, CacheError, DiskCache, cache_key, decode_entry, encode_entry
from kgen.compiler import BuildRecord, EntryResources

ARCH = "sm_90a"
SOURCE = 'extern "C" __global__ void k(int* p) { p[threadIdx.x] = 1; }\n'


def _merge_variant(**params):
    base = dict(dtype="bf16", head_dim=128, has_incomplete_tile=True)
    base.update(params)
    return kgen.registry.current().family("merge_attention_states").select(**base)


def _sample_entry(cubin: bytes = b"\x7fELF" + bytes(range(256)) * 3, key: str = "aa") -> CacheEntry:
    record = BuildRecord(arch=ARCH, compile_ms=12.5, entries={
        "merge_states_2": EntryResources(registers=48, spill_stores=4, spill_loads=8, stack_bytes=16,
                                         static_smem_bytes=1024),
        "merge_states_n": EntryResources(registers=64),
    })
    return CacheEntry(key=key, cubin=cubin, record=record, variant_name="fam[a=1,b=true]")


def _stray_files(folder: Path) -> list[Path]:
    return [p for p in folder.rglob("*") if p.is_file() and not p.name.endswith(".cubin.kgen")
            and p.parent.name != "locks"]


# --------------------------------------------------------------------------- cache key


def test_cache_key_is_deterministic_hex():
    key = cache_key(SOURCE, ARCH)
    assert key == cache_key(SOURCE, ARCH) == cache_key(str(SOURCE), ARCH)
    assert len(key) == 64 and int(key, 16) >= 0


@settings(max_examples=200, deadline=None)
@given(st.text(max_size=200), st.text(max_size=200))
def test_cache_key_separates_sources(a, b):
    if a == b:
        assert cache_key(a, ARCH) == cache_key(b, ARCH)
    else:
        assert cache_key(a, ARCH) != cache_key(b, ARCH)


@settings(max_examples=100, deadline=None)
@given(st.text(max_size=200))
def test_cache_key_of_a_source_is_stable(source):
    assert cache_key(source, ARCH) == cache_key(source, ARCH)


def test_cache_key_depends_on_arch():
    keys = {arch: cache_key(SOURCE, arch) for arch in ("sm_90a", "sm_90", "sm_80", "sm_100a")}
    assert len(set(keys.values())) == len(keys), keys


def test_cache_key_depends_on_kgen_version(monkeypatch):
    before = cache_key(SOURCE, ARCH)
    monkeypatch.setattr(kgen.cache.store, "__version__", "999.0.0")
    bumped = cache_key(SOURCE, ARCH)
    assert bumped != before
    monkeypatch.setattr(kgen.cache.store, "__version__", kgen.__version__)
    assert cache_key(SOURCE, ARCH) == before


@pytest.fixture
def include_folder(tmp_path, monkeypatch):
    """A private include path, in place of the CUDA runtime headers."""
    folder = tmp_path / "include"
    folder.mkdir()
    fake = lambda: (str(folder),)  # noqa: E731
    monkeypatch.setattr(kgen.compiler, "include_dirs", fake)
    monkeypatch.setattr(kgen.cache.store, "include_dirs", fake, raising=False)
    return folder


def edit_header(path, text):
    """Write a header and tell kgen, which reads headers once per process."""
    path.write_text(text)
    kgen.compiler.forget_headers()


def test_cache_key_depends_on_included_header_bytes(include_folder):
    source = '#include "kgen_test_outer.h"\n' + SOURCE
    edit_header((include_folder / "kgen_test_outer.h"), '#pragma once\n#include <sub/kgen_test_inner.h>\n#define OUTER 1\n')
    (include_folder / "sub").mkdir()
    inner = include_folder / "sub" / "kgen_test_inner.h"
    edit_header(inner, "#define INNER 1\n")
    edit_header((include_folder / "kgen_test_unused.h"), "#define UNUSED 1\n")

    original = cache_key(source, ARCH)
    assert cache_key(source, ARCH) == original

    # A header the source includes directly.
    edit_header((include_folder / "kgen_test_outer.h"), '#pragma once\n#include <sub/kgen_test_inner.h>\n#define OUTER 2\n')
    changed_outer = cache_key(source, ARCH)
    assert changed_outer != original

    # A header included by that header.
    edit_header(inner, "#define INNER 2\n")
    changed_inner = cache_key(source, ARCH)
    assert changed_inner not in (original, changed_outer)

    # A header nobody includes does not matter.
    edit_header((include_folder / "kgen_test_unused.h"), "#define UNUSED 2\n")
    assert cache_key(source, ARCH) == changed_inner

    # Same bytes, same key.
    edit_header((include_folder / "kgen_test_outer.h"), '#pragma once\n#include <sub/kgen_test_inner.h>\n#define OUTER 1\n')
    edit_header(inner, "#define INNER 1\n")
    assert cache_key(source, ARCH) == original


def test_cache_key_follows_includes_relative_to_the_including_header(include_folder):
    # Like cooperative_groups/reduce.h including "details/reduce.h" in the CUDA runtime headers.
    (include_folder / "sub").mkdir()
    edit_header((include_folder / "sub" / "outer.h"), '#include "inner.h"\n')
    inner = include_folder / "sub" / "inner.h"
    edit_header(inner, "#define VALUE 3\n")
    source = '#include <sub/outer.h>\nextern "C" __global__ void k(int* p) { p[0] = VALUE; }\n'
    kgen.compiler.compile_cubin(source, ARCH, "relative_include")  # NVRTC does find sub/inner.h
    before = cache_key(source, ARCH)
    edit_header(inner, "#define VALUE 4\n")
    assert cache_key(source, ARCH) != before


def test_cache_key_names_no_include_folder_only_header_content(tmp_path, monkeypatch):
    # The same headers in two venvs (two folders) give one key; the folder is not part of it.
    source = '#include "kgen_test_same.h"\n' + SOURCE
    keys = {}
    for name, text in [("venv_a", "#define SAME 1\n"), ("venv_b", "#define SAME 1\n"), ("venv_c", "#define SAME 2\n")]:
        folder = tmp_path / name / "include"
        folder.mkdir(parents=True)
        (folder / "kgen_test_same.h").write_text(text)
        monkeypatch.setattr(kgen.compiler, "include_dirs", lambda folder=folder: (str(folder),))
        kgen.compiler.forget_headers()
        keys[name] = cache_key(source, ARCH)
    assert keys["venv_a"] == keys["venv_b"] != keys["venv_c"]


@pytest.mark.parametrize("name,value", [
    ("nvrtc_version", lambda: "13.0 nvidia-cuda-nvrtc 13.0.999"),
    ("RECORD_FORMAT", 999),
    ("_MAGIC", b"KGENCUBIN999"),
], ids=["nvrtc-full-version", "record-format", "entry-format"])
def test_cache_key_depends_on_toolchain_and_formats(monkeypatch, name, value):
    before = cache_key(SOURCE, ARCH)
    monkeypatch.setattr(kgen.cache.store, name, value)
    assert cache_key(SOURCE, ARCH) != before


def test_nvrtc_version_is_more_precise_than_major_minor():
    import importlib.metadata

    version = kgen.compiler.nvrtc_version()
    # nvrtcVersion says 13.0; the wheel the loaded library comes from says 13.0.<patch>.
    assert version == f"13.0 nvidia-cuda-nvrtc {importlib.metadata.version('nvidia-cuda-nvrtc')}"


def test_cache_key_changes_when_included_header_appears(include_folder):
    source = '#include "kgen_test_late.h"\n' + SOURCE
    missing = cache_key(source, ARCH)
    edit_header((include_folder / "kgen_test_late.h"), "#define LATE 1\n")
    assert cache_key(source, ARCH) != missing


# --------------------------------------------------------------------------- entries


entry_records = st.builds(
    BuildRecord,
    arch=st.sampled_from(["sm_90a", "sm_100a", "sm_80"]),
    compile_ms=st.floats(min_value=0, max_value=1e6, allow_nan=False),
    entries=st.dictionaries(
        st.from_regex(r"[A-Za-z_][A-Za-z0-9_]{0,20}", fullmatch=True),
        st.builds(EntryResources, *[st.integers(0, 1 << 20)] * 5),
        max_size=4,
    ),
)


@settings(max_examples=100, deadline=None)
@given(cubin=st.binary(max_size=2048), record=entry_records, name=st.text(max_size=60))
def test_entry_round_trip(cubin, record, name):
    entry = CacheEntry(key="k" * 64, cubin=cubin, record=record, variant_name=name)
    assert decode_entry(encode_entry(entry)) == entry


def test_entry_round_trip_of_a_real_build(cache_dir):
    result = kgen.jit.build(_merge_variant(), ARCH)
    entry = decode_entry(DiskCache(cache_dir).entries()[0].read_bytes())
    assert entry == CacheEntry(result.key, result.cubin, result.record, result.variant.name)


SAMPLE_BLOB = encode_entry(_sample_entry())


@settings(max_examples=300, deadline=None)
@given(st.integers(0, len(SAMPLE_BLOB) - 1))
def test_decode_rejects_truncated_entries(length):
    with pytest.raises(ValueError):
        decode_entry(SAMPLE_BLOB[:length])


@given(st.binary(min_size=1, max_size=64))
def test_decode_rejects_trailing_bytes(extra):
    with pytest.raises(ValueError):
        decode_entry(SAMPLE_BLOB + extra)


@settings(max_examples=500, deadline=None)
@given(st.integers(0, len(SAMPLE_BLOB) - 1), st.integers(1, 255))
def test_decode_rejects_flipped_bytes(position, mask):
    blob = bytearray(SAMPLE_BLOB)
    blob[position] ^= mask
    with pytest.raises(ValueError):
        decode_entry(bytes(blob))


@pytest.mark.parametrize("field,original,tampered", [
    ("registers", b'"registers": 48', b'"registers": 98'),
    ("compile time", b'"compile_ms": 12.5', b'"compile_ms": 12.6'),
    ("variant name", b'"fam[a=1,b=true]"', b'"fam[a=2,b=true]"'),
])
def test_decode_rejects_a_changed_header_field(field, original, tampered):
    # Same length, still valid JSON: only a digest over the header can tell.
    assert SAMPLE_BLOB.count(original) == 1
    with pytest.raises(ValueError):
        decode_entry(SAMPLE_BLOB.replace(original, tampered))


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(position=st.integers(0, len(SAMPLE_BLOB) - 1), mask=st.integers(1, 255))
def test_disk_cache_get_treats_any_flipped_byte_as_a_miss(tmp_path, position, mask):
    cache = DiskCache(tmp_path)
    blob = bytearray(SAMPLE_BLOB)
    blob[position] ^= mask
    cache._path("aa").write_bytes(bytes(blob))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        assert cache.get("aa") is None


def test_an_entry_under_another_key_is_corrupt(cache_dir, monkeypatch):
    # A valid entry of one variant copied over another's file must not be served for the other.
    monkeypatch.setattr(kgen.cache.store, "_warned", set())
    a, b = _merge_variant(head_dim=64), _merge_variant(head_dim=128)
    first_a, first_b = kgen.jit.build(a, ARCH), kgen.jit.build(b, ARCH)
    cache = DiskCache(cache_dir)
    cache._path(first_b.key).write_bytes(cache._path(first_a.key).read_bytes())
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert cache.get(first_b.key) is None
        again = kgen.jit.build(b, ARCH)
    [warning] = [w for w in caught if "corrupt" in str(w.message)]
    assert first_a.key in str(warning.message) and str(cache._path(first_b.key)) in str(warning.message)
    assert again.cache_hit is False and again.cubin == first_b.cubin
    assert kgen.jit.build(b, ARCH).cache_hit is True


# --------------------------------------------------------------------------- corrupt entries through build


def _truncate(blob: bytes, cubin: bytes) -> bytes:
    return blob[: len(blob) - len(cubin) // 2]


def _flip_in_cubin(blob: bytes, cubin: bytes) -> bytes:
    at = blob.index(cubin)  # the cubin is stored as is
    damaged = bytearray(blob)
    damaged[at + len(cubin) // 2] ^= 0x01
    return bytes(damaged)


def _truncate_to_header(blob: bytes, cubin: bytes) -> bytes:
    return blob[: len(kgen.cache.store._MAGIC) + 2]


@pytest.mark.parametrize("damage", [_truncate, _flip_in_cubin, _truncate_to_header],
                         ids=["truncated", "cubin-byte-flipped", "cut-in-length-prefix"])
def test_corrupt_entry_is_reported_and_rebuilt(damage, cache_dir, monkeypatch):
    monkeypatch.setattr(kgen.cache.store, "_warned", set())
    variant = _merge_variant()
    first = kgen.jit.build(variant, ARCH)
    assert first.cache_hit is False
    [path] = DiskCache(cache_dir).entries()
    assert path.name == f"{first.key}.cubin.kgen"
    path.write_bytes(damage(path.read_bytes(), first.cubin))

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        second = kgen.jit.build(variant, ARCH)
    corrupt = [w for w in caught if issubclass(w.category, RuntimeWarning) and "corrupt" in str(w.message)]
    assert len(corrupt) == 1, [str(w.message) for w in caught]
    assert str(path) in str(corrupt[0].message)
    assert second.cache_hit is False
    assert second.cubin == first.cubin
    # The entry was rewritten, whole.
    assert DiskCache(cache_dir).entries() == [path]
    assert decode_entry(path.read_bytes()).cubin == first.cubin
    assert not _stray_files(cache_dir)

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        third = kgen.jit.build(variant, ARCH)
    assert third.cache_hit is True
    assert third.cubin == first.cubin and third.key == first.key
    assert not [w for w in caught if issubclass(w.category, RuntimeWarning)]


# --------------------------------------------------------------------------- unusable cache folder


def test_cache_folder_beneath_a_file(tmp_path, monkeypatch):
    # Tests run as root, where chmod cannot make a folder unwritable; a path under a regular file is never usable.
    monkeypatch.setattr(kgen.cache.store, "_warned", set())
    afile = tmp_path / "afile"
    afile.write_bytes(b"not a folder")
    root = afile / "cache"
    variants = [_merge_variant(head_dim=64), _merge_variant(head_dim=128)]
    with kgen.config.overrides(KGEN_CACHE_DIR=str(root)), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = [kgen.jit.build(v, ARCH) for v in variants]
        again = kgen.jit.build(variants[0], ARCH)
    for result in (*results, again):
        assert result.cache_hit is False
        assert result.cubin[:4] == b"\x7fELF"
    assert again.cubin == results[0].cubin
    runtime = [w for w in caught if issubclass(w.category, RuntimeWarning)]
    assert len(runtime) == 1, [str(w.message) for w in runtime]
    assert str(root) in str(runtime[0].message)
    # Nothing was written anywhere.
    assert afile.read_bytes() == b"not a folder"
    assert sorted(tmp_path.rglob("*")) == [afile]


# --------------------------------------------------------------------------- atomic publish


def test_put_leaves_only_the_entry(tmp_path):
    cache = DiskCache(tmp_path / "cache")
    assert cache.entries() == []  # no folder yet
    entry = _sample_entry(key="bb")
    cache.put(_sample_entry(key="aa"))
    cache.put(entry)
    cache.put(_sample_entry(b"other", key="aa"))  # replacing an entry
    assert sorted(p.name for p in cache.root.iterdir()) == ["aa.cubin.kgen", "bb.cubin.kgen"]
    assert cache.entries() == [cache.root / "aa.cubin.kgen", cache.root / "bb.cubin.kgen"]
    assert cache.get("aa").cubin == b"other"
    assert cache.get("bb") == entry


def test_entries_lists_only_entries_and_clear_removes_them_and_orphans(tmp_path):
    cache = DiskCache(tmp_path / "cache")
    cache.put(_sample_entry())
    with cache.lock("aa"):
        pass
    (cache.root / ".leftover.tmp").write_bytes(b"x")  # what a writer killed before its rename leaves
    (cache.root / "notes.txt").write_text("x")
    (cache.root / "sub").mkdir()
    (cache.root / "sub" / "cc.cubin.kgen").write_bytes(b"x")
    [lock_file] = (cache.root / "locks").iterdir()
    assert cache.entries() == [cache.root / "aa.cubin.kgen"]
    assert cache.clear() == 1
    assert cache.entries() == []
    assert not (cache.root / ".leftover.tmp").exists()
    # Lock files stay (there are at most LOCK_STRIPES of them); other files are not the cache's to remove.
    assert lock_file.exists()
    assert (cache.root / "notes.txt").exists() and (cache.root / "sub" / "cc.cubin.kgen").exists()


def test_put_saves_a_source_beside_its_entry_and_clear_removes_it(tmp_path):
    cache = DiskCache(tmp_path / "cache")
    key = "ab" * 32
    cache.put(_sample_entry(key=key), source=SOURCE)
    cache.put(_sample_entry(key="cd" * 32))
    (cache.root / "mine.cu").write_text("// not the cache's")
    assert cache.source_path(key) == cache.root / f"{key}.cu"
    assert cache.source_path(key).read_text() == SOURCE
    assert not cache.source_path("cd" * 32).exists()
    assert cache.clear() == 2
    assert sorted(p.name for p in cache.root.iterdir()) == ["locks", "mine.cu"]


def test_put_publishes_a_complete_file_by_rename(tmp_path, monkeypatch):
    cache = DiskCache(tmp_path / "cache")
    entry = _sample_entry()
    real_replace = os.replace
    calls = []

    def spy(src, dst):
        src, dst = Path(src), Path(dst)
        # At the moment of publication the entry does not exist yet, and the
        # temporary file beside it already holds the whole entry.
        calls.append((src, dst, dst.exists(), decode_entry(src.read_bytes())))
        real_replace(src, dst)

    monkeypatch.setattr(kgen.cache.store.os, "replace", spy)
    cache.put(entry)
    [(src, dst, existed, published)] = calls
    assert dst == cache.root / "aa.cubin.kgen"
    assert src.parent == cache.root and src != dst and not existed
    assert published == entry
    assert not src.exists()


@pytest.mark.parametrize("fail_in", ["encode_entry", "replace"])
def test_failed_put_leaves_nothing(tmp_path, monkeypatch, fail_in):
    cache = DiskCache(tmp_path / "cache")
    cache.put(_sample_entry(key="old"))

    def boom(*args, **kwargs):
        raise OSError(28, "No space left on device")

    if fail_in == "replace":
        monkeypatch.setattr(kgen.cache.store.os, "replace", boom)
    else:
        monkeypatch.setattr(kgen.cache.store, "encode_entry", boom)
    with pytest.raises(OSError, match="No space"):
        cache.put(_sample_entry())
    assert sorted(p.name for p in cache.root.iterdir()) == ["old.cubin.kgen"]
    assert cache.entries() == [cache.root / "old.cubin.kgen"]


# --------------------------------------------------------------------------- in-process reuse


def test_second_build_is_a_hit(cache_dir):
    variant = _merge_variant(dtype="fp16", head_dim=64)
    first = kgen.jit.build(variant, ARCH)
    second = kgen.jit.build(variant, ARCH)
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert second.key == first.key == cache_key(kgen.render.render(variant), ARCH)
    assert second.cubin == first.cubin
    assert second.record == first.record
    assert DiskCache(cache_dir).entries() == [cache_dir / f"{first.key}.cubin.kgen"]


def test_cache_is_per_folder(tmp_path):
    variant = _merge_variant(dtype="fp16", head_dim=64)
    for folder in ("one", "two"):
        with kgen.config.overrides(KGEN_CACHE_DIR=str(tmp_path / folder)):
            assert kgen.jit.build(variant, ARCH).cache_hit is False
            assert kgen.jit.build(variant, ARCH).cache_hit is True


def test_other_variant_or_arch_misses(cache_dir):
    a, b = _merge_variant(head_dim=64), _merge_variant(head_dim=96)
    assert kgen.jit.build(a, ARCH).cache_hit is False
    assert kgen.jit.build(b, ARCH).cache_hit is False
    assert kgen.jit.build(a, "sm_100a").cache_hit is False
    assert kgen.jit.build(a, ARCH).cache_hit is True
    assert len(DiskCache(cache_dir).entries()) == 3


# --------------------------------------------------------------------------- many processes, one compile


def _concurrent_build(cache_dir: str, variant_name: str, barrier, results) -> None:
    """Worker (spawned): build one variant into the shared cache once every worker is ready."""
    try:
        import kgen.config
        import kgen.jit
        import kgen.registry

        with kgen.config.overrides(KGEN_CACHE_DIR=cache_dir):
            [variant] = [v for v in kgen.registry.current().variants() if v.name == variant_name]
            barrier.wait(timeout=120)
            result = kgen.jit.build(variant, "sm_90a")
        results.put((os.getpid(), result.cache_hit, result.cubin, result.key, None))
    except BaseException as exc:  # report, do not hang the parent
        results.put((os.getpid(), None, None, None, repr(exc)))


def test_concurrent_builds_compile_once(tmp_path):
    workers = 4
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(workers)
    results = ctx.Queue()
    cache = tmp_path / "cache"
    variant = _merge_variant(dtype="fp32", head_dim=256)
    procs = [ctx.Process(target=_concurrent_build, args=(str(cache), variant.name, barrier, results))
             for _ in range(workers)]
    for p in procs:
        p.start()
    try:
        outcomes = [results.get(timeout=180) for _ in procs]
    finally:
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
    assert all(p.exitcode == 0 for p in procs)
    errors = [o[4] for o in outcomes if o[4] is not None]
    assert not errors, errors
    assert len({o[0] for o in outcomes}) == workers
    assert sorted(o[1] for o in outcomes) == [False] + [True] * (workers - 1)
    assert len({o[2] for o in outcomes}) == 1  # byte-identical cubins
    assert len({o[3] for o in outcomes}) == 1
    entries = DiskCache(cache).entries()
    assert [p.name for p in entries] == [f"{outcomes[0][3]}.cubin.kgen"]
    assert decode_entry(entries[0].read_bytes()).cubin == outcomes[0][2]
    assert not _stray_files(cache)


# --------------------------------------------------------------------------- shared caches: modes, locks, clear


@pytest.mark.parametrize("umask,mode", [(0o022, 0o644), (0o002, 0o664), (0o077, 0o600)])
def test_entries_are_created_under_the_umask(tmp_path, umask, mode):
    # A group-shared cache (umask 002) gets group-readable entries, as any file the user writes.
    previous = os.umask(umask)
    try:
        DiskCache(tmp_path / "cache").put(_sample_entry())
    finally:
        os.umask(previous)
    assert stat.S_IMODE((tmp_path / "cache" / "aa.cubin.kgen").stat().st_mode) == mode


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(key=st.text(min_size=1, max_size=80))
def test_a_key_s_lock_is_one_of_a_fixed_set(tmp_path, key):
    cache = DiskCache(tmp_path / "cache")
    path = Path(cache.lock(key).lock_file)
    assert path == Path(cache.lock(key).lock_file)  # the same key, the same lock, every time
    assert path.parent == cache.root / "locks"
    assert path.name in {f"{i:03d}.lock" for i in range(LOCK_STRIPES)}


def test_lock_files_do_not_grow_with_the_number_of_keys(tmp_path):
    cache = DiskCache(tmp_path / "cache")
    for n in range(3 * LOCK_STRIPES):
        with cache.lock(cache_key(f"// {n}\n" + SOURCE, ARCH)):
            pass
    assert len(list((cache.root / "locks").iterdir())) <= LOCK_STRIPES


def test_clear_waits_for_a_builder_holding_a_lock(tmp_path):
    # A builder between compiling and publishing holds its key's lock; clear must not delete its temporary file.
    import threading

    cache = DiskCache(tmp_path / "cache")
    cache.put(_sample_entry())
    lock = cache.lock("some key")
    lock.acquire()
    removed = []
    clearer = threading.Thread(target=lambda: removed.append(DiskCache(cache.root).clear()))
    clearer.start()
    clearer.join(timeout=1.0)
    assert clearer.is_alive() and not removed
    lock.release()
    clearer.join(timeout=30)
    assert removed == [1] and cache.entries() == []


def test_clear_of_an_unwritable_cache_says_so(tmp_path, monkeypatch):
    # Tests run as root, where chmod makes nothing read-only: the file system's answer is simulated.
    cache = DiskCache(tmp_path / "cache")
    cache.put(_sample_entry())
    entry = cache.entries()[0]

    def read_only(path, *args, **kwargs):
        raise PermissionError(13, "Permission denied", str(path))

    monkeypatch.setattr(kgen.cache.store.Path, "unlink", read_only)
    with pytest.raises(CacheError) as info:
        cache.clear()
    message = str(info.value)
    assert message == (f"cannot clear the cache {cache.root}: {entry}: Permission denied; "
                       "the cache is read-only to this user")
    assert isinstance(info.value, OSError)


def test_clear_of_a_missing_cache_creates_nothing(tmp_path):
    assert DiskCache(tmp_path / "nowhere").clear() == 0
    assert not (tmp_path / "nowhere").exists()


# --------------------------------------------------------------------------- dependencies

REPO_ROOT = Path(__file__).resolve().parent.parent
#: The modules that build, key and store cubins: they use cuda.core's public API only (a private module may
#: change in any release, and the dependency bound would not catch it).
def test_every_cuda_dependency_has_an_upper_bound():
    import tomllib

    dependencies = tomllib.loads((REPO_ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    cuda = [d for d in dependencies if d.startswith(("cuda-", "nvidia-"))]
    assert "cuda-pathfinder>=1.3,<2" in cuda
    assert all("<" in d for d in cuda), cuda
