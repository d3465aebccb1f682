"""The ``kgen`` command: list, render, build every variant, manage the cache.

Tables and listings go to stdout. Errors, skipped variants and progress go to
stderr as plain, unwrapped text with control characters escaped (NVRTC logs
carry NUL bytes); progress is a bar on a terminal and a line every few seconds
in a log. Bad input (a spec, an arch, a family, a setting) exits 2 with one
``error: ...`` message; a variant that fails to build exits 1 after the table.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from pathlib import Path
from typing import Callable, Iterator

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kgen import __version__, config, jit, layout, registry as registry_module
from kgen.arch import Arch, ArchError
from kgen.arch import parse as parse_arch
from kgen.cache import (ARCHIVE_SUFFIXES, ArchiveError, DiskCache, cache_layers, collect_entries, import_entries,
                        read_archive, write_archive, write_wheel)
from kgen.compiler import CompileError
from kgen.registry import Variant
from kgen.render import RenderError, render
from kgen.spec import SpecError

console = Console()
_stderr = Console(stderr=True)
#: Seconds between two progress lines when stderr is not a terminal.
PROGRESS_INTERVAL_S = 5.0
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


def printable(text: str) -> str:
    """``text`` with control characters other than tab and newline escaped (``\\x00``)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def echo_error(text: str) -> None:
    click.echo(printable(text), err=True)


class CommandError(click.ClickException):
    """A command refused its input; printed as ``error: ...`` like main()'s errors."""

    exit_code = 2

    def show(self, file=None) -> None:
        echo_error(f"error: {self.message}")


def _variant_label(variant: Variant) -> str:
    return escape(variant.name[len(variant.family.name):])


def _short_label(variant: Variant) -> str:
    """The axes that tell this variant from its family's others: all of them would not fit a table."""
    varying = {axis for axis in variant.family.axes if len(variant.family.supported(axis)) > 1}
    return escape(" ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                           for k, v in variant.params if k in varying) or "(only variant)")


def _parse_assignments(pairs: tuple[str, ...]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not key=value")
        out[key] = {"true": True, "false": False}.get(raw.lower(), int(raw) if raw.lstrip("-").isdigit() else raw)
    return out


def _targets(arch_names: tuple[str, ...]) -> list[Arch]:
    """The archs ``--arch`` names, each once in the order given; without any, KGEN_ARCH's or the current GPU's."""
    if arch_names:
        return list(dict.fromkeys(parse_arch(name, "--arch") for name in arch_names))
    try:
        return [parse_arch(jit.device_arch(), "the current GPU's arch")]
    except ArchError:  # KGEN_ARCH or the GPU's arch is not one NVRTC builds for: say so, not "no GPU"
        raise
    except Exception as exc:  # no driver or no GPU on this machine
        raise click.UsageError(f"cannot read the current GPU's arch ({exc}); pass --arch (e.g. sm_90a) or set KGEN_ARCH")


@click.group()
@click.version_option(__version__, prog_name="kgen")
@click.option("--spec-path", "spec_paths", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="Also search this folder for specs (before KGEN_SPEC_PATH and the built-ins); repeatable.")
def cli(spec_paths: tuple[str, ...]) -> None:
    """kgen: CUDA kernels declared in YAML, compiled at run time with NVRTC."""
    # Each added folder goes first on the path, so add the last one first: the order given is the search order.
    for folder in reversed(spec_paths):
        registry_module.add_spec_path(folder)


@cli.command("list")
def list_cmd() -> None:
    """List kernel families and their variants."""
    reg = registry_module.current()
    # soft_wrap: one line per variant however narrow the terminal, so the listing can be grepped.
    for family in reg.families.values():
        console.print(f"[bold]{escape(family.name)}[/bold]  template={escape(family.template)}  "
                      f"entries={escape(str(list(family.entries)))}  variants={len(family.variants)}", soft_wrap=True)
        for variant in family.variants:
            console.print(f"  {_variant_label(variant)}  [dim]{escape(str(variant.spec_path))}[/dim]", highlight=False,
                          soft_wrap=True)


@cli.command("render")
@click.argument("family")
@click.argument("params", nargs=-1)
def render_cmd(family: str, params: tuple[str, ...]) -> None:
    """Print the exact CUDA source compiled for FAMILY's variant matching PARAMS (key=value ...)."""
    variant = registry_module.current().family(family).select(**_parse_assignments(params))
    click.echo(render(variant), nl=False)


@cli.command("build")
@click.option("--arch", "arch_names", multiple=True,
              help="Target arch (sm_90a, sm_100f, ...); repeatable. Default KGEN_ARCH or the current GPU's.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=os.cpu_count() or 1, show_default=True,
              help="Parallel compiles.")
@click.option("--family", "families", multiple=True, help="Only these families; repeatable.")
def build_cmd(arch_names: tuple[str, ...], jobs: int, families: tuple[str, ...]) -> None:
    """Compile every variant on the spec path for each arch and print a resource table per family and arch.

    Skips, per arch, the variants whose spec rules that arch out (min_sm,
    sm_only). Exits non-zero if no arch has anything to build, or if any
    variant fails to compile, spills registers (unless its spec sets
    allow_spills) or needs more shared memory than a block may have on its arch.
    """
    config.check_settings()
    targets = _targets(arch_names)
    reg = registry_module.current()
    for name in families:
        reg.family(name)  # an unknown name is an error listing the known families
    chosen = [v for v in reg.variants() if not families or v.family.name in families]
    plan = {target: _variants_to_build(chosen, target) for target in targets}
    if not any(plan.values()):
        where = f"families {list(families)}" if families else f"the spec path {[str(d) for d in reg.spec_dirs]}"
        these = "this arch" if len(targets) == 1 else "these archs"
        raise CommandError(f"nothing to build for {' or '.join(t.name for t in targets)}: {where} "
                           f"{f'has no variant for {these}' if chosen else 'declares no variant'}")
    failed = False
    for target, variants in plan.items():
        if not variants:
            continue  # its skip lines said why
        results, failures = _build_all(variants, target.name, jobs)
        console.print(f"kgen build for {target.name} ({len(variants)} variants)", highlight=False)
        problems = _report(variants, results, failures, target)
        for line in problems:
            echo_error(line)
        failed = failed or bool(problems)
    if failed:
        sys.exit(1)


def _variants_to_build(chosen: list[Variant], target: Arch) -> list[Variant]:
    """The variants of ``chosen`` that can run on ``target``; one line per family about those that cannot."""
    skipped: dict[tuple[str, str], list[Variant]] = {}
    for variant in chosen:
        reason = variant.arch_refusal(target.sm)
        if reason is not None:
            skipped.setdefault((variant.family.name, reason), []).append(variant)
    for (name, reason), members in skipped.items():
        echo_error(f"skip: {name}: {len(members)} of {len(members[0].family.variants)} variants {reason}; "
                   f"not built for {target.name}")
    return [v for v in chosen if v.supports_sm(target.sm)]


def _build_all(variants: list[Variant], arch: str, jobs: int) -> tuple[dict, dict[str, str]]:
    """Build on ``jobs`` threads; return the results and the failures (messages), both by variant name."""
    results, failures = {}, {}
    with _progress(len(variants), arch) as show, ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(jit.build, v, arch): v for v in variants}
        pending = set(futures)
        try:
            while pending:
                # A timeout, so that a log gets its progress line even while one long compile runs.
                done, pending = wait(pending, timeout=PROGRESS_INTERVAL_S, return_when=FIRST_COMPLETED)
                for future in done:
                    name = futures[future].name
                    try:
                        results[name] = future.result()
                    except (CompileError, RenderError, ValueError) as exc:  # this variant cannot be built
                        failures[name] = str(exc)
                show(len(variants) - len(pending))
        except BaseException:
            pool.shutdown(cancel_futures=True)  # an error or Ctrl-C: do not compile the rest first
            raise
    return results, failures


@contextlib.contextmanager
def _progress(total: int, arch: str) -> Iterator[Callable[[int], None]]:
    """A function taking the number of variants done: a rich bar on a terminal, else a line every few seconds."""
    if _stderr.is_terminal:
        bar = Progress(TextColumn("[bold]build[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                       TimeElapsedColumn(), console=_stderr, transient=True)
        with bar:
            task = bar.add_task(arch, total=total)
            yield lambda done: bar.update(task, completed=done)
        return
    started = last = time.monotonic()

    def line(done: int) -> None:
        nonlocal last
        now = time.monotonic()
        if now - last >= PROGRESS_INTERVAL_S or done == total:
            last = now
            echo_error(f"build: {done}/{total} done, {now - started:.1f} s")

    yield line


def _report(variants: list[Variant], results: dict, failures: dict[str, str], target: Arch) -> list[str]:
    """Print one resource table per family; return a line per problem (a failure, spills, too much shared memory)."""
    problems = [f"FAILED {name}\n{message}" for name, message in failures.items()]
    limit = target.max_smem_per_block
    if limit is None:
        echo_error(f"note: kgen knows no shared-memory limit for {target.name}; shared memory is not checked")
    by_family: dict[str, list[Variant]] = {}
    for variant in variants:
        by_family.setdefault(variant.family.name, []).append(variant)
    for family_name, members in by_family.items():
        # No vertical rules: at 80 columns the label needs the room (a row of attention's is about 100 characters).
        table = Table(title=f"{escape(family_name)} ({len(members)} variants) for {target.name}", title_justify="left",
                      box=box.SIMPLE_HEAD, show_lines=True, pad_edge=False, collapse_padding=True)
        table.add_column("variant")
        for column in ("regs", "spills", "smem", "dyn smem", "ms", "cache"):
            table.add_column(column, justify="right", no_wrap=True)
        for variant in members:
            result = results.get(variant.name)
            if result is None:
                table.add_row(_short_label(variant), "-", "-", "-", "-", "-", "[red]FAILED[/red]")
                continue
            entries = result.record.entries.values()
            static = max((e.static_smem_bytes for e in entries), default=0)
            kernel_layout = layout.layout_of(variant)
            dynamic = kernel_layout.dynamic_smem_bytes if kernel_layout is not None else None
            spills = result.record.spills
            if spills and not variant.family.allow_spills:
                problems.append(f"SPILLS {variant.name} spills registers and its spec does not allow spills")
            total = static + (dynamic or 0)
            too_much = limit is not None and total > limit
            if too_much:
                problems.append(f"SMEM {variant.name} needs {total} bytes of shared memory ({static} static + "
                                f"{dynamic or 0} dynamic), over the {limit} a block may have on {target.name}")
            table.add_row(
                _short_label(variant),
                str(max((e.registers for e in entries), default=0)),
                f"[red]{spills}[/red]" if spills else "0",
                str(static),
                "-" if dynamic is None else f"[red]{dynamic}[/red]" if too_much else str(dynamic),
                "-" if result.cache_hit else f"{result.record.compile_ms:.0f}",
                "hit" if result.cache_hit else "miss",
            )
        console.print(table)
    return problems


@cli.group("cache")
def cache_group() -> None:
    """Inspect, clear, export or import the on-disk cubin cache."""


@cache_group.command("info")
def cache_info() -> None:
    """Each layer of the cache, in the order it is searched, and what it holds."""
    layers = cache_layers()
    if layers.writable is None:
        click.echo("writable: none (no folder on the cache path is writable: new builds compile in memory)")
    for layer in layers.layers:
        entries = layer.cache.entries()
        size = sum(p.stat().st_size for p in entries)
        origin = f" from {layer.origin}" if layer.origin else ""
        click.echo(f"{layer.role}: {layer.cache.root} ({len(entries)} entries, {size} bytes){origin}")


@cache_group.command("clear")
def cache_clear() -> None:
    """Delete every cubin of the writable layer (and temporary files a killed build left); other layers stay."""
    cache = _writable_layer("clear")
    click.echo(f"removed {cache.clear()} entries from {cache.root}")


@cache_group.command("export")
@click.argument("path", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--wheel", "wheel_dir", type=click.Path(file_okay=False, path_type=Path),
              help="Write a pip-installable wheel into this folder instead of an archive.")
@click.option("--arch", "arch_names", multiple=True, help="Only entries for this arch; repeatable.")
def cache_export(path: Path | None, wheel_dir: Path | None, arch_names: tuple[str, ...]) -> None:
    """Pack every entry of every layer into PATH (.tar, .tar.gz or .tgz), or into a wheel with --wheel DIR.

    Both carry a manifest (kgen's and NVRTC's versions, and per entry its key,
    variant, arch and SHA-256) that ``kgen cache import`` and an installed
    wheel are checked against.
    """
    if (path is None) == (wheel_dir is None):
        raise click.UsageError("give PATH (an archive) or --wheel DIR (a wheel), one of the two")
    if path is not None and not path.name.endswith(ARCHIVE_SUFFIXES):
        raise click.BadParameter(f"{path.name!r} does not end in {', '.join(ARCHIVE_SUFFIXES)}", param_hint="PATH")
    archs = {parse_arch(name, "--arch").name for name in arch_names}
    packed, invalid = collect_entries([layer.cache for layer in cache_layers().layers], archs)
    if invalid:
        echo_error(f"skip: {invalid} files that are not valid entries of this kgen (corrupt, or of another "
                   f"entry format): not exported")
    if not packed:
        raise CommandError(f"nothing to export: the cache holds no entries{f' for {sorted(archs)}' if archs else ''}")
    if wheel_dir is not None:
        written = write_wheel(wheel_dir, packed)
    else:
        write_archive(path, packed)
        written = path
    counts = collections.Counter(p.entry.record.arch for p in packed)
    click.echo(f"exported {len(packed)} entries ({', '.join(f'{a}: {n}' for a, n in sorted(counts.items()))}) "
               f"to {written}")


@cache_group.command("import")
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def cache_import(path: Path) -> None:
    """Add the entries of an archive made by ``kgen cache export`` to the writable layer.

    Every member, digest and entry is checked first: if any is off, or the
    archive was made by another kgen or NVRTC, nothing is added.
    """
    try:
        packed = read_archive(path)
    except ArchiveError as exc:
        raise CommandError(f"cannot import {path}: {exc}; nothing was imported") from None
    cache = _writable_layer("import into")
    added = import_entries(packed, cache)
    click.echo(f"imported {added} entries into {cache.root} ({len(packed) - added} were there already)")


def _writable_layer(action: str) -> DiskCache:
    writable = cache_layers().writable
    if writable is None:
        raise CommandError(f"no folder on the cache path {os.pathsep.join(map(str, config.cache_dirs()))} is "
                           f"writable: there is no cache to {action}")
    return writable


#: What kgen raises for bad input or an unusable environment: reported in one message, never as a traceback.
KGEN_ERRORS = (SpecError, CompileError, RenderError, ValueError, OSError)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except KGEN_ERRORS as exc:
        echo_error(f"error: {exc}")
        sys.exit(2)


if __name__ == "__main__":
    main()
