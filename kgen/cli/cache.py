"""``kgen cache ...``: inspect, clear, export, import and verify the on-disk cubin cache."""

from __future__ import annotations

import collections
import os
import sys
from pathlib import Path

import click

from kgen import config, registry as registry_module
from kgen.arch import parse as parse_arch
from kgen.cache import (ARCHIVE_SUFFIXES, ArchiveError, DiskCache, cache_layers, collect_entries, import_entries,
                        read_archive, verify_caches, write_archive, write_wheel)
from kgen.cache.verify import VERDICTS
from kgen.cli.errors import CommandError, echo_error, plural
from kgen.cli.progress import progress


@click.group("cache")
def cache_group() -> None:
    """Inspect, clear, export, import or verify the on-disk cubin cache."""


@cache_group.command("info")
def cache_info() -> None:
    """Each layer of the cache, in the order it is searched, and what it holds."""
    layers = cache_layers()
    if layers.writable is None:
        click.echo("writable: none (no folder on the cache path is writable: new builds compile in memory)")
    for layer in layers.layers:
        entries = layer.cache.entries()
        size = sum(_size(p) for p in entries)
        origin = f" from {layer.origin}" if layer.origin else ""
        click.echo(f"{layer.role}: {layer.cache.root} ({plural(len(entries), 'entry', 'entries')}, "
                   f"{plural(size, 'byte')}){origin}")


@cache_group.command("clear")
def cache_clear() -> None:
    """Delete every cubin of the writable layer (and temporary files a killed build left); other layers stay."""
    cache = _writable_layer("clear")
    click.echo(f"removed {plural(cache.clear(), 'entry', 'entries')} from {cache.root}")


@cache_group.command("export")
@click.argument("path", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--wheel", "wheel_dir", type=click.Path(file_okay=False),
              help="Write a pip-installable wheel into this folder instead of an archive.")
@click.option("--arch", "arch_names", multiple=True, help="Only entries for this arch; repeatable.")
def cache_export(path: Path | None, wheel_dir: str | None, arch_names: tuple[str, ...]) -> None:
    """Pack every entry of every layer into PATH (.tar, .tar.gz or .tgz), or into a wheel with --wheel DIR.

    Both carry a manifest (kgen's and NVRTC's versions, and per entry its key,
    variant, arch, size and SHA-256) that 'kgen cache import' and an
    installed wheel are checked against.
    """
    if (path is None) == (wheel_dir is None):
        raise click.UsageError("give PATH (an archive) or --wheel DIR (a wheel), one of the two")
    if path is not None and not path.name.endswith(ARCHIVE_SUFFIXES):
        raise click.BadParameter(f"{path.name!r} does not end in {', '.join(ARCHIVE_SUFFIXES)}", param_hint="PATH")
    if wheel_dir == "":  # as a Path it would be ".", and the wheel would land in the current folder unasked
        raise click.BadParameter("is empty; give a folder", param_hint="'--wheel'")
    archs = {parse_arch(name, "--arch").name for name in arch_names}
    packed, invalid = collect_entries([layer.cache for layer in cache_layers().layers], archs)
    if invalid:
        echo_error(f"skip: {plural(invalid, 'file')} not exported: not a valid entry of this kgen (corrupt, or of "
                   f"another entry format)")
    if not packed:
        raise CommandError(f"nothing to export: the cache holds no entries{f' for {sorted(archs)}' if archs else ''}")
    if wheel_dir is not None:
        written = write_wheel(Path(wheel_dir), packed)
    else:
        write_archive(path, packed)
        written = path
    counts = collections.Counter(p.entry.record.arch for p in packed)
    click.echo(f"exported {plural(len(packed), 'entry', 'entries')} ({', '.join(f'{a}: {n}' for a, n in sorted(counts.items()))}) "
               f"to {written}")


@cache_group.command("verify")
@click.option("--arch", "arch_names", multiple=True, help="Only entries for this arch; repeatable.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=os.cpu_count() or 1, show_default=True,
              help="Parallel compiles.")
def cache_verify(arch_names: tuple[str, ...], jobs: int) -> None:
    """Recompile the variant of every entry of every layer and compare the cubins.

    Entries are checked for integrity when loaded, not for who wrote them: this
    is how a fleet checks a cache others can write to. Exits 1 if a cubin kgen
    would load is not what its variant compiles to (or cannot be recompiled);
    entries kgen never loads (corrupt, of a variant no longer on the spec path,
    or of a changed source) are reported and do not fail.
    """
    config.check_settings()  # a bad knob is one error, not every entry failing to recompile
    archs = {parse_arch(name, "--arch").name for name in arch_names}
    caches = [layer.cache for layer in cache_layers().layers]
    total = sum(len(cache.entries()) for cache in caches)
    if total == 0:
        raise CommandError("nothing to verify: the cache holds no entries")
    with progress(total, "cache", job="verify") as show:
        verdicts = verify_caches(caches, registry_module.current().variants(), jobs, archs, show)
    counts = collections.Counter(v.status for v in verdicts)
    for verdict in verdicts:
        if verdict.status != "match":
            echo_error(verdict.line())
    summary = ", ".join(f"{counts[s]} {s}" for s in VERDICTS if counts[s])
    click.echo(f"verified {plural(len(verdicts), 'entry', 'entries')}: {summary or 'none'}")
    if any(v.failed for v in verdicts):
        sys.exit(1)


@cache_group.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def cache_import(path: Path) -> None:
    """Add the entries of an archive made by 'kgen cache export' to the writable layer.

    Every member, digest and entry is checked first: if any is off, or the
    archive was made by another kgen or NVRTC, nothing is added.
    """
    try:
        packed = read_archive(path)
    except ArchiveError as exc:
        raise CommandError(f"cannot import {path}: {exc}; nothing was imported") from None
    cache = _writable_layer("import into")
    added = import_entries(packed, cache)
    there = len(packed) - added
    click.echo(f"imported {plural(added, 'entry', 'entries')} into {cache.root} "
               f"({there} {'was' if there == 1 else 'were'} there already)")


def _size(path: Path) -> int:
    # A broken link or a file removed meanwhile counts as nothing: info reports, it does not stop at a bad file.
    try:
        return path.stat().st_size
    except OSError:
        return 0


def _writable_layer(action: str) -> DiskCache:
    writable = cache_layers().writable
    if writable is None:
        raise CommandError(f"no folder on the cache path {os.pathsep.join(map(str, config.cache_dirs()))} is "
                           f"writable: there is no cache to {action}")
    return writable
