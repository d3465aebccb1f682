"""Caches for a fleet: export and import, layered cache folders, caches installed as wheels, the debugging knobs.

A few small variants are built once for the module (``prebuilt``); a test that
changes a cache copies that folder first. CLI commands run in process through
click's CliRunner, with the cache path set by ``kgen.config.overrides``.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tracemalloc
import warnings
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner

import kgen
import kgen.arch
import kgen.cache.layers
import kgen.cache.store
import kgen.compiler
import kgen.config
import kgen.jit
import kgen.registry
from kgen.cache import DiskCache, cache_key, decode_entry
from kgen.cli import cli
from kgen.config import SettingError
from kgen.render import render
from zero_stream import Zeros

ARCH = "sm_90a"
FAMILY = "merge_attention_states"
REPO_ROOT = Path(__file__).resolve().parent.parent


def variants() -> list:
    family = kgen.registry.current().family(FAMILY)
    return [family.select(dtype=dtype, head_dim=head_dim, has_incomplete_tile=True)
            for dtype, head_dim in [("bf16", 64), ("fp16", 128), ("fp32", 64)]]


@pytest.fixture(scope="module")
def prebuilt(tmp_path_factory) -> Path:
    """A cache folder holding the entries of ``variants()`` for sm_90a; copy it before changing it."""
    folder = tmp_path_factory.mktemp("prebuilt") / "cache"
    with kgen.config.overrides(KGEN_CACHE_DIR=str(folder)):
        assert [kgen.jit.build(v, ARCH).cache_hit for v in variants()] == [False] * 3
    return folder


@pytest.fixture(autouse=True)
def fresh_reports(monkeypatch):
    """Each test sees its own once-only warnings, and looks installed caches up again."""
    monkeypatch.setattr(kgen.cache.store, "_warned", set())
    kgen.cache.layers._installed_caches.cache_clear()
    yield
    kgen.cache.layers._installed_caches.cache_clear()


def cache_path(*folders: Path) -> str:
    return os.pathsep.join(str(f) for f in folders)


def kgen_cli(args: list[str], *folders: Path):
    """``kgen ARGS`` in process, with the cache path ``folders``."""
    with kgen.config.overrides(KGEN_CACHE_DIR=cache_path(*folders)):
        return CliRunner().invoke(cli, args, env={"KGEN_SPEC_PATH": None, "KGEN_ARCH": None, "COLUMNS": "400"})


def build_all(*folders: Path) -> list[bool]:
    """Build ``variants()`` with the cache path ``folders``; return which were cache hits."""
    with kgen.config.overrides(KGEN_CACHE_DIR=cache_path(*folders)):
        return [kgen.jit.build(v, ARCH).cache_hit for v in variants()]


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file under ``folder`` by relative path, with its bytes; {} for a folder that does not exist."""
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def under_a_file(tmp_path: Path, name: str) -> Path:
    # Tests run as root, where chmod makes nothing read-only; a path beneath a regular file is never writable.
    blocker = tmp_path / f"{name}_is_a_file"
    blocker.write_bytes(b"not a folder")
    return blocker / "cache"


# --------------------------------------------------------------------------- export and import


@pytest.mark.parametrize("suffix", [".tar", ".tar.gz"])
def test_export_then_import_into_a_fresh_cache_hits_every_variant(prebuilt, tmp_path, suffix):
    archive = tmp_path / f"cubins{suffix}"
    exported = kgen_cli(["cache", "export", str(archive)], prebuilt)
    assert exported.exit_code == 0, exported.output
    assert exported.stdout == f"exported 3 entries (sm_90a: 3) to {archive}\n"

    with tarfile.open(archive) as tar:
        names = tar.getnames()
        manifest = json.loads(tar.extractfile("manifest.json").read())
    entry_files = {p.name: p.read_bytes() for p in DiskCache(prebuilt).entries()}
    assert sorted(names) == sorted(["manifest.json", *(f"entries/{name}" for name in entry_files)])
    assert manifest["kgen"] == kgen.__version__ and manifest["nvrtc"] == kgen.compiler.nvrtc_version()
    assert manifest["archs"] == [ARCH]
    assert {row["file"]: row["sha256"] for row in manifest["entries"]} == \
        {name: hashlib.sha256(blob).hexdigest() for name, blob in entry_files.items()}
    assert sorted(row["variant"] for row in manifest["entries"]) == sorted(v.name for v in variants())

    fresh = tmp_path / "fresh"
    imported = kgen_cli(["cache", "import", str(archive)], fresh)
    assert imported.exit_code == 0, imported.output
    assert imported.stdout == f"imported 3 entries into {fresh} (0 were there already)\n"
    assert {p.name: p.read_bytes() for p in DiskCache(fresh).entries()} == entry_files
    assert build_all(fresh) == [True] * 3

    again = kgen_cli(["cache", "import", str(archive)], fresh)
    assert again.stdout == f"imported 0 entries into {fresh} (3 were there already)\n"


def test_export_takes_only_the_archs_asked_for(prebuilt, tmp_path):
    folder = tmp_path / "cache"
    shutil.copytree(prebuilt, folder)
    with kgen.config.overrides(KGEN_CACHE_DIR=str(folder)):
        blackwell = kgen.jit.build(variants()[0], "sm_100a")
    archive = tmp_path / "sm_100a.tgz"
    result = kgen_cli(["cache", "export", str(archive), "--arch", "sm_100a"], folder)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"exported 1 entry (sm_100a: 1) to {archive}\n"
    with tarfile.open(archive) as tar:
        manifest = json.loads(tar.extractfile("manifest.json").read())
    assert manifest["archs"] == ["sm_100a"]
    assert [row["key"] for row in manifest["entries"]] == [blackwell.key]


@pytest.mark.parametrize("args,needle", [
    ([], "give PATH (an archive) or --wheel DIR (a wheel), one of the two"),
    (["out.tar", "--wheel", "dist"], "give PATH (an archive) or --wheel DIR (a wheel), one of the two"),
    (["out.zip"], "Invalid value for PATH: 'out.zip' does not end in .tar, .tar.gz, .tgz"),
])
def test_export_refuses_bad_arguments(prebuilt, tmp_path, args, needle):
    result = kgen_cli(["cache", "export", *args], prebuilt)
    assert result.exit_code == 2
    assert needle in result.stderr


def test_export_refuses_an_unknown_arch(prebuilt, tmp_path):
    # As `build --arch` does: ArchError, which kgen.cli.main reports in one line with exit status 2.
    result = kgen_cli(["cache", "export", str(tmp_path / "out.tar"), "--arch", "sm_91"], prebuilt)
    assert isinstance(result.exception, kgen.arch.ArchError)
    assert str(result.exception).startswith("--arch: 'sm_91' is not an arch kgen can build cubins for")
    assert not (tmp_path / "out.tar").exists()


def test_export_of_an_empty_cache_is_an_error(tmp_path):
    result = kgen_cli(["cache", "export", str(tmp_path / "out.tar")], tmp_path / "empty")
    assert result.exit_code == 2
    assert result.stderr == "error: nothing to export: the cache holds no entries\n"
    assert not (tmp_path / "out.tar").exists()


def test_export_leaves_out_invalid_entries_and_says_so(prebuilt, tmp_path):
    folder = tmp_path / "cache"
    shutil.copytree(prebuilt, folder)
    (folder / f"{'0' * 64}.cubin.kgen").write_bytes(b"KGENCUBIN3 an entry of an older kgen")
    result = kgen_cli(["cache", "export", str(tmp_path / "out.tar")], folder)
    assert result.exit_code == 0, result.output
    assert "exported 3 entries" in result.stdout
    assert result.stderr == ("skip: 1 file not exported: not a valid entry of this kgen (corrupt, or of another entry "
                             "format)\n")


def rewrite(archive: Path, out: Path, change) -> Path:
    """Copy the tar ``archive`` to ``out`` as ``change(members, manifest)`` leaves them (name -> bytes, dict)."""
    with tarfile.open(archive) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    manifest = json.loads(members.pop("manifest.json"))
    extra = change(members, manifest)
    with tarfile.open(out, "w") as tar:
        for name, data in {"manifest.json": json.dumps(manifest).encode(), **members}.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra or ():
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isreg() else None)
    return out


def _entry_names(members):
    return sorted(name for name in members if name.startswith("entries/"))


def flip_entry_byte(members, manifest):
    name = _entry_names(members)[0]
    blob = bytearray(members[name])
    blob[len(blob) // 2] ^= 0x01
    members[name] = bytes(blob)


def flip_entry_byte_and_fix_its_digest(members, manifest):
    flip_entry_byte(members, manifest)
    name = _entry_names(members)[0]
    row = next(r for r in manifest["entries"] if f"entries/{r['file']}" == name)
    row["sha256"] = hashlib.sha256(members[name]).hexdigest()


def change_a_manifest_digest(members, manifest):
    manifest["entries"][0]["sha256"] = "0" * 64


def swap_two_entries(members, manifest):
    # Each file and its digest moved to the other's name: the digests agree, the keys inside do not.
    a, b = _entry_names(members)[:2]
    members[a], members[b] = members[b], members[a]
    rows = {f"entries/{r['file']}": r for r in manifest["entries"]}
    rows[a]["sha256"], rows[b]["sha256"] = rows[b]["sha256"], rows[a]["sha256"]


def drop_an_entry(members, manifest):
    del members[_entry_names(members)[0]]


def another_kgen(members, manifest):
    manifest["kgen"] = "0.0.1"


def member(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> list[tarfile.TarInfo]:
    info = tarfile.TarInfo(name)
    info.type, info.linkname, info.size = kind, target, 1 if kind == tarfile.REGTYPE else 0
    return [info]


@pytest.mark.parametrize("change,reason", [
    (flip_entry_byte, "does not match its SHA-256 in manifest.json"),
    (change_a_manifest_digest, "does not match its SHA-256 in manifest.json"),
    (flip_entry_byte_and_fix_its_digest, "is not a valid entry (entry does not match its digest)"),
    (swap_two_entries, "but manifest.json says"),
    (drop_an_entry, "manifest.json does not list exactly its entries (missing: ["),
    (another_kgen, f"it was made by kgen 0.0.1 with NVRTC {kgen.compiler.nvrtc_version()}, and this is kgen "
                   f"{kgen.__version__} with NVRTC {kgen.compiler.nvrtc_version()}: its entries' keys would never "
                   "match a build here"),
    (lambda m, _: member("../escape.cubin.kgen"), "member '../escape.cubin.kgen' has an unsafe path"),
    (lambda m, _: member("entries/../../escape"), "member 'entries/../../escape' has an unsafe path"),
    (lambda m, _: member("/tmp/absolute"), "member '/tmp/absolute' has an unsafe path"),
    (lambda m, _: member(f"entries/{'a' * 64}.cubin.kgen", tarfile.SYMTYPE, "/etc/passwd"),
     f"member 'entries/{'a' * 64}.cubin.kgen' is a symbolic link, not a regular file"),
    (lambda m, _: member("entries/hard", tarfile.LNKTYPE, "manifest.json"), "is a hard link, not a regular file"),
    (lambda m, _: member("notes.txt"), "member 'notes.txt' is neither manifest.json nor entries/<key>.cubin.kgen"),
], ids=["entry-byte-flipped", "manifest-digest-changed", "entry-and-digest-changed", "entries-swapped",
        "entry-missing", "other-kgen-version", "dotdot", "dotdot-inside", "absolute", "symlink", "hardlink",
        "unexpected-file"])
def test_import_refuses_a_tampered_archive_and_adds_nothing(prebuilt, tmp_path, change, reason):
    archive = tmp_path / "cubins.tar"
    assert kgen_cli(["cache", "export", str(archive)], prebuilt).exit_code == 0
    tampered = rewrite(archive, tmp_path / "tampered.tar", change)
    target = tmp_path / "target"
    result = kgen_cli(["cache", "import", str(tampered)], target)
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: cannot import {tampered}: ")
    assert reason in result.stderr
    assert result.stderr.endswith("; nothing was imported\n") and result.stderr.count("\n") == 1
    assert not target.exists()


@pytest.mark.parametrize("content,reason", [
    (b"not a tar file at all", "it is not a tar archive kgen can read"),
    (None, "it has no manifest.json"),
])
def test_import_refuses_what_is_not_a_kgen_archive(tmp_path, content, reason):
    path = tmp_path / "odd.tar"
    if content is None:
        with tarfile.open(path, "w"):
            pass
    else:
        path.write_bytes(content)
    result = kgen_cli(["cache", "import", str(path)], tmp_path / "target")
    assert result.exit_code == 2 and reason in result.stderr, result.output
    assert not (tmp_path / "target").exists()


def test_import_errors_are_one_line_from_the_command(prebuilt, tmp_path):
    archive = tmp_path / "cubins.tar"
    assert kgen_cli(["cache", "export", str(archive)], prebuilt).exit_code == 0
    tampered = rewrite(archive, tmp_path / "tampered.tar", change_a_manifest_digest)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KGEN_")}
    proc = subprocess.run([sys.executable, "-m", "kgen", "cache", "import", str(tampered)], cwd=REPO_ROOT,
                          env={**env, "KGEN_CACHE_DIR": str(tmp_path / "target")}, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.startswith("error: cannot import ") and proc.stderr.count("\n") == 1, proc.stderr


def bomb(archive: Path, out: Path, target: str, size: int, manifest_first: bool) -> Path:
    """``archive`` as a .tar.gz whose member ``target`` (an entry's name, or manifest.json) is ``size`` zero bytes;
    the manifest still describes the real entry, so it declares that member small."""
    with tarfile.open(archive) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar.getmembers()}
    names = sorted(members, key=lambda name: (name == "manifest.json") != manifest_first)
    target = _entry_names(members)[0] if target == "entry" else target
    with tarfile.open(out, "w:gz", compresslevel=1) as tar:
        for name in names:
            info = tarfile.TarInfo(name)
            info.size = size if name == target else len(members[name])
            tar.addfile(info, Zeros(size) if name == target else io.BytesIO(members[name]))
    assert out.stat().st_size < 1 << 20  # a small file
    return out


@pytest.mark.parametrize("target,size,manifest_first,reason", [
    ("entry", 200 << 20, True, "over the 64 MiB kgen accepts"),
    ("entry", 200 << 20, False, "over the 64 MiB kgen accepts"),
    ("entry", 8 << 20, True, "bytes, but manifest.json says"),
    ("entry", 8 << 20, False, "bytes, but manifest.json says"),
    ("manifest.json", 200 << 20, True, "over the 16 MiB kgen accepts"),
], ids=["entry-200MB", "entry-200MB-manifest-last", "entry-8MB", "entry-8MB-manifest-last", "manifest-200MB"])
def test_import_of_a_gzip_bomb_refuses_it_without_holding_it_in_memory(prebuilt, tmp_path, target, size,
                                                                       manifest_first, reason):
    archive = tmp_path / "cubins.tar"
    assert kgen_cli(["cache", "export", str(archive)], prebuilt).exit_code == 0
    bombed = bomb(archive, tmp_path / "bomb.tar.gz", target, size, manifest_first)
    destination = tmp_path / "target"
    tracemalloc.start()
    try:
        result = kgen_cli(["cache", "import", str(bombed)], destination)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert result.exit_code == 2, result.output
    assert result.stderr.startswith(f"error: cannot import {bombed}: ") and result.stderr.count("\n") == 1
    assert reason in result.stderr, result.stderr
    assert result.stderr.endswith("; nothing was imported\n")
    assert peak < 4 << 20, f"peak {peak} bytes"  # the archive's few real entries, not the bomb
    assert not destination.exists()


# --------------------------------------------------------------------------- verify


def plant(folder: Path, key: str, cubin: bytes, variant_name: str, record) -> Path:
    """An entry with a valid digest, written as anyone who can write to ``folder`` could; returns its path."""
    path = folder / f"{key}.cubin.kgen"
    path.write_bytes(kgen.cache.store.encode_entry(kgen.cache.store.CacheEntry(key, cubin, record, variant_name)))
    return path


def test_cache_verify_passes_a_cache_of_what_its_variants_compile_to(prebuilt, tmp_path):
    shared = tmp_path / "shared"
    shutil.copytree(prebuilt, shared)
    result = kgen_cli(["cache", "verify", "-j", "2"], shared)
    assert result.exit_code == 0, result.output
    assert result.stdout == "verified 3 entries: 3 match\n"
    assert [line for line in result.stderr.splitlines() if not line.startswith("verify: ")] == []


def test_cache_verify_fails_a_planted_cubin_and_reports_entries_kgen_never_loads(prebuilt, tmp_path):
    shared = tmp_path / "shared"
    shutil.copytree(prebuilt, shared)
    entries = [kgen.cache.store.decode_entry(p.read_bytes()) for p in DiskCache(shared).entries()]
    victim, other = entries[0], entries[1]
    # Another variant's cubin under the victim's key, with a digest that matches: loading checks only the digest.
    planted = plant(shared, victim.key, other.cubin, victim.variant_name, victim.record)
    assert DiskCache(shared).get(victim.key).cubin == other.cubin
    stale = plant(shared, "0" * 64, victim.cubin, victim.variant_name, victim.record)
    gone = plant(shared, "1" * 64, victim.cubin, "no_such_family[x=1]", victim.record)
    (shared / f"{'2' * 64}.cubin.kgen").write_bytes(b"not an entry")

    result = kgen_cli(["cache", "verify"], shared)
    assert result.exit_code == 1, result.output
    assert result.stdout == "verified 6 entries: 1 mismatch, 2 match, 1 stale, 1 gone, 1 corrupt\n"
    lines = [line for line in result.stderr.splitlines() if not line.startswith("verify: ")]
    assert len(lines) == 4
    assert f"mismatch: {victim.variant_name} for {ARCH}: {planted}: its cubin ({len(other.cubin)} bytes) is not " \
           f"what its variant compiles to ({len(victim.cubin)} bytes)" in lines
    assert any(line.startswith(f"stale: {victim.variant_name} for {ARCH}: {stale}: ") for line in lines)
    assert f"gone: no_such_family[x=1] for {ARCH}: {gone}: no such variant on the spec path" in lines
    assert any(line.startswith(f"corrupt: {shared / ('2' * 64 + '.cubin.kgen')}: ") for line in lines)

    # Only the entries kgen never loads: reported, and the cache passes.
    planted.unlink()
    result = kgen_cli(["cache", "verify", "--arch", ARCH], shared)
    assert result.exit_code == 0, result.output
    assert result.stdout == "verified 5 entries: 2 match, 1 stale, 1 gone, 1 corrupt\n"


def test_cache_verify_of_an_empty_cache_is_an_error(tmp_path):
    result = kgen_cli(["cache", "verify"], tmp_path / "empty")
    assert result.exit_code == 2
    assert result.stderr == "error: nothing to verify: the cache holds no entries\n"


# --------------------------------------------------------------------------- layers


def test_a_read_only_layer_serves_every_hit_and_nothing_is_written(prebuilt, tmp_path):
    writable = tmp_path / "writable"
    writable.mkdir()
    before = snapshot(prebuilt)
    assert build_all(writable, prebuilt) == [True] * 3
    assert snapshot(prebuilt) == before
    assert list(writable.iterdir()) == []
    # A writable folder that does not exist yet is not created by hits either.
    assert build_all(tmp_path / "not_yet", prebuilt) == [True] * 3
    assert not (tmp_path / "not_yet").exists()


def test_new_entries_go_to_the_first_writable_folder(prebuilt, tmp_path):
    blocked = under_a_file(tmp_path, "first")
    writable, read_only = tmp_path / "second", tmp_path / "third"
    shutil.copytree(prebuilt, read_only)
    other = kgen.registry.current().family(FAMILY).select(dtype="bf16", head_dim=256, has_incomplete_tile=False)
    with kgen.config.overrides(KGEN_CACHE_DIR=cache_path(blocked, writable, read_only)):
        result = kgen.jit.build(other, ARCH)
    assert result.cache_hit is False
    assert [p.name for p in DiskCache(writable).entries()] == [f"{result.key}.cubin.kgen"]
    assert snapshot(read_only) == snapshot(prebuilt)

    info = kgen_cli(["cache", "info"], blocked, writable, read_only)
    assert info.exit_code == 0, info.output
    size = DiskCache(writable).entries()[0].stat().st_size
    ro_size = sum(p.stat().st_size for p in DiskCache(read_only).entries())
    assert info.stdout.splitlines() == [
        f"writable: {writable} (1 entry, {size} bytes)",
        f"read-only: {blocked} (0 entries, 0 bytes)",
        f"read-only: {read_only} (3 entries, {ro_size} bytes)",
    ]


def test_a_corrupt_entry_in_a_read_only_layer_is_reported_once_and_rebuilt_into_the_writable_one(prebuilt, tmp_path):
    read_only, writable = tmp_path / "read_only", tmp_path / "writable"
    shutil.copytree(prebuilt, read_only)
    variant = variants()[1]
    with kgen.config.overrides(KGEN_CACHE_DIR=str(read_only)):
        key = cache_key(render(variant), ARCH)
    damaged = read_only / f"{key}.cubin.kgen"
    blob = bytearray(damaged.read_bytes())
    blob[-100] ^= 0x01
    damaged.write_bytes(bytes(blob))
    before = snapshot(read_only)

    with kgen.config.overrides(KGEN_CACHE_DIR=cache_path(writable, read_only)), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        first = kgen.jit.build(variant, ARCH)
        second = kgen.jit.build(variant, ARCH)
    corrupt = [str(w.message) for w in caught if "corrupt" in str(w.message)]
    assert len(corrupt) == 1 and str(damaged) in corrupt[0], corrupt
    assert (first.cache_hit, second.cache_hit) == (False, True)
    assert [p.name for p in DiskCache(writable).entries()] == [damaged.name]
    assert decode_entry((writable / damaged.name).read_bytes()).cubin == first.cubin
    assert snapshot(read_only) == before  # a read-only layer is never repaired in place


def test_with_no_writable_folder_kgen_compiles_in_memory_and_warns_once(prebuilt, tmp_path):
    archive = tmp_path / "cubins.tar"
    assert kgen_cli(["cache", "export", str(archive)], prebuilt).exit_code == 0
    folders = [under_a_file(tmp_path, "one"), under_a_file(tmp_path, "two")]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert build_all(*folders) == [False] * 3
    messages = [str(w.message) for w in caught if issubclass(w.category, RuntimeWarning)]
    assert messages == [f"kgen: no folder on the cache path {cache_path(*folders)} is writable; compiling in memory"]

    info = kgen_cli(["cache", "info"], *folders)
    assert info.stdout.splitlines()[0] == ("writable: none (no folder on the cache path is writable: new builds "
                                           "compile in memory)")
    for command, action in [(["clear"], "clear"), (["import", str(archive)], "import into")]:
        result = kgen_cli(["cache", *command], *folders)
        assert result.exit_code == 2
        assert result.stderr == (f"error: no folder on the cache path {cache_path(*folders)} is writable: "
                                 f"there is no cache to {action}\n")


def test_cache_clear_clears_only_the_writable_layer(prebuilt, tmp_path):
    writable, read_only = tmp_path / "writable", tmp_path / "read_only"
    shutil.copytree(prebuilt, read_only)
    with kgen.config.overrides(KGEN_CACHE_DIR=cache_path(writable, read_only)):
        kgen.jit.build(variants()[0], "sm_100a")
    result = kgen_cli(["cache", "clear"], writable, read_only)
    assert result.exit_code == 0, result.output
    assert result.stdout == f"removed 1 entry from {writable}\n"
    assert DiskCache(writable).entries() == []
    assert snapshot(read_only) == snapshot(prebuilt)


def test_the_cache_path_skips_empty_items_and_repeated_folders(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    with kgen.config.overrides(KGEN_CACHE_DIR=os.pathsep.join(["", str(a), "", str(b), str(a), ""])):
        assert kgen.config.cache_dirs() == [a, b]
        assert kgen.config.cache_dir() == a


# --------------------------------------------------------------------------- caches installed as wheels


@pytest.fixture(scope="module")
def installed_site(prebuilt, tmp_path_factory) -> tuple[Path, Path]:
    """The wheel that ``kgen cache export --wheel`` makes of ``prebuilt``, and the folder pip installed it into."""
    out = tmp_path_factory.mktemp("wheel")
    result = kgen_cli(["cache", "export", "--wheel", str(out)], prebuilt)
    assert result.exit_code == 0, result.output
    [wheel] = out.glob("*.whl")
    site = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-index", "--target", str(site),
                    str(wheel)], check=True, capture_output=True, timeout=300)
    return wheel, site


def test_the_wheel_is_well_formed(installed_site):
    wheel, _ = installed_site
    version = f"{kgen.__version__}+nvrtc.{kgen.compiler.nvrtc_version().split()[-1]}"
    assert wheel.name == f"kgen_cache_sm_90a-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel) as archive:
        files = {name: archive.read(name) for name in archive.namelist()}
    info = f"kgen_cache_sm_90a-{version}.dist-info"
    entry_points = files[f"{info}/entry_points.txt"].decode()
    assert entry_points == "[kgen.caches]\nkgen_cache_sm_90a = kgen_cache_sm_90a:CACHE_DIR\n"
    assert f"Requires-Dist: kgen=={kgen.__version__}\n" in files[f"{info}/METADATA"].decode()
    assert "Tag: py3-none-any\n" in files[f"{info}/WHEEL"].decode()
    record = [line.split(",") for line in files[f"{info}/RECORD"].decode().splitlines()]
    assert sorted(row[0] for row in record) == sorted(files)
    for name, digest, size in record:
        if name == f"{info}/RECORD":
            assert (digest, size) == ("", "")
            continue
        expected = base64.urlsafe_b64encode(hashlib.sha256(files[name]).digest()).rstrip(b"=").decode()
        assert (digest, int(size)) == (f"sha256={expected}", len(files[name])), name
    assert len([n for n in files if n.endswith(".cubin.kgen")]) == 3


def test_an_installed_wheel_is_found_and_serves_every_hit(installed_site, tmp_path, monkeypatch):
    _, site = installed_site
    monkeypatch.syspath_prepend(str(site))
    [layer] = kgen.cache.layers.installed_caches()
    assert layer.cache.root == site / "kgen_cache_sm_90a" / "cache"
    assert layer.origin.startswith(f"kgen-cache-sm-90a {kgen.__version__}+nvrtc.")
    writable = tmp_path / "writable"
    assert build_all(writable) == [True] * 3
    assert not writable.exists()
    info = kgen_cli(["cache", "info"], writable)
    size = sum(p.stat().st_size for p in layer.cache.entries())
    assert info.stdout.splitlines() == [f"writable: {writable} (0 entries, 0 bytes)",
                                        f"installed: {layer.cache.root} (3 entries, {size} bytes) from {layer.origin}"]


def test_an_installed_cache_of_another_kgen_is_reported_and_not_used(installed_site, tmp_path, monkeypatch):
    _, site = installed_site
    stale = tmp_path / "site"
    shutil.copytree(site, stale)
    manifest_path = stale / "kgen_cache_sm_90a" / "cache" / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["kgen"] = "0.0.1"
    manifest_path.write_text(json.dumps(manifest))
    monkeypatch.syspath_prepend(str(stale))
    monkeypatch.delitem(sys.modules, "kgen_cache_sm_90a", raising=False)  # not the copy another test imported
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        assert kgen.cache.layers.installed_caches() == []
        assert build_all(tmp_path / "writable")[0] is False
    [message] = [str(w.message) for w in caught if "installed cache" in str(w.message)]
    assert "kgen-cache-sm-90a" in message and "made by kgen 0.0.1" in message and "is not used" in message


# --------------------------------------------------------------------------- debugging knobs


def test_lineinfo_is_part_of_the_key_and_of_the_cubin(cache_dir):
    variant = variants()[0]
    plain = kgen.jit.build(variant, ARCH)
    with kgen.config.overrides(KGEN_LINEINFO="1"):
        with_lines = kgen.jit.build(variant, ARCH)
        assert kgen.jit.build(variant, ARCH).cache_hit is True
    assert with_lines.cache_hit is False and with_lines.key != plain.key
    assert b".nv_debug_line_sass" in with_lines.cubin and b".nv_debug_line_sass" not in plain.cubin
    with kgen.config.overrides(KGEN_LINEINFO="0"):
        assert kgen.jit.build(variant, ARCH).key == plain.key


@pytest.mark.parametrize("knob", ["KGEN_SAVE_SOURCE", "KGEN_ALWAYS_COMPILE"])
def test_knobs_that_leave_the_cubin_alone_leave_the_key_alone(knob):
    source = render(variants()[0])
    plain = cache_key(source, ARCH)
    with kgen.config.overrides(**{knob: "1"}):
        assert cache_key(source, ARCH) == plain


def test_save_source_writes_the_rendered_source_beside_the_entry(cache_dir):
    first, second = variants()[:2]
    without = kgen.jit.build(first, ARCH)
    with kgen.config.overrides(KGEN_SAVE_SOURCE="1"):
        saved = kgen.jit.build(second, ARCH)
    assert (cache_dir / f"{saved.key}.cu").read_text() == render(second)
    assert not (cache_dir / f"{without.key}.cu").exists()
    assert len(DiskCache(cache_dir).entries()) == 2  # a source is not an entry
    assert DiskCache(cache_dir).clear() == 2
    assert not list(cache_dir.glob("*.cu"))


def test_always_compile_compiles_despite_a_hit_and_still_writes(prebuilt, tmp_path, monkeypatch):
    writable = tmp_path / "writable"
    published = []
    real_put = DiskCache.put
    monkeypatch.setattr(DiskCache, "put", lambda self, entry, source=None: (published.append(entry.key),
                                                                            real_put(self, entry, source))[1])
    with kgen.config.overrides(KGEN_ALWAYS_COMPILE="1"):
        assert build_all(writable, prebuilt) == [False] * 3  # a hit in any layer is ignored
        assert build_all(writable, prebuilt) == [False] * 3  # even in the writable one
    assert len(published) == 6
    names = [[p.name for p in DiskCache(folder).entries()] for folder in (writable, prebuilt)]
    assert names[0] == names[1]
    assert build_all(writable) == [True] * 3


@pytest.mark.parametrize("knob", ["KGEN_LINEINFO", "KGEN_SAVE_SOURCE", "KGEN_ALWAYS_COMPILE"])
@pytest.mark.parametrize("value", ["yes", "true", "2", " 1", "on"])
def test_a_knob_is_0_or_1_else_an_error_naming_it(knob, value):
    read = {"KGEN_LINEINFO": kgen.config.lineinfo, "KGEN_SAVE_SOURCE": kgen.config.save_source,
            "KGEN_ALWAYS_COMPILE": kgen.config.always_compile}[knob]
    for accepted, expected in [("1", True), ("0", False), (None, False), ("", False)]:
        with kgen.config.overrides(**{knob: accepted}):
            assert read() is expected
    with kgen.config.overrides(**{knob: value}), pytest.raises(SettingError) as info:
        read()
    assert str(info.value) == f"{knob}: {value!r} is neither 0 nor 1"


def test_build_stops_at_a_bad_knob_before_building(tmp_path):
    with kgen.config.overrides(KGEN_LINEINFO="yes"):
        result = kgen_cli(["build", "--arch", ARCH, "--family", FAMILY], tmp_path / "cache")
    assert isinstance(result.exception, SettingError) and "KGEN_LINEINFO" in str(result.exception)
    assert not (tmp_path / "cache").exists()
