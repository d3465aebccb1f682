"""The ``kgen`` command: list, render, build every variant, manage the cache.

Tables and listings go to stdout. Errors, skipped variants and progress go to
stderr as plain, unwrapped text with control characters escaped (NVRTC logs
carry NUL bytes); progress is a bar on a terminal and a line every few seconds
in a log. Bad input (a spec, an arch, a family, a setting) exits 2 with one
``error: ...`` message; a variant that fails to build exits 1 after the table.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
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
from kgen.cache import DiskCache
from kgen.compiler import CompileError
from kgen.registry import Registry, Variant
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


def _target(arch_name: str | None) -> Arch:
    if arch_name:
        return parse_arch(arch_name, "--arch")
    try:
        return parse_arch(jit.device_arch(), "the current GPU's arch")
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
@click.option("--arch", "arch_name", default=None,
              help="Target arch (sm_90a, sm_100f, ...); default KGEN_ARCH or the current GPU's.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=os.cpu_count() or 1, show_default=True,
              help="Parallel compiles.")
@click.option("--family", "families", multiple=True, help="Only these families; repeatable.")
def build_cmd(arch_name: str | None, jobs: int, families: tuple[str, ...]) -> None:
    """Compile every variant on the spec path and print a resource table per family.

    Skips the variants whose spec needs a newer arch (min_sm). Exits non-zero if
    there is nothing to build, or if any variant fails to compile, spills
    registers (unless its spec sets allow_spills) or needs more shared memory
    than a block may have on the arch.
    """
    target = _target(arch_name)
    variants = _variants_to_build(registry_module.current(), families, target)
    results, failures = _build_all(variants, target.name, jobs)
    console.print(f"kgen build for {target.name} ({len(variants)} variants)", highlight=False)
    problems = _report(variants, results, failures, target)
    for line in problems:
        echo_error(line)
    if problems:
        sys.exit(1)


def _variants_to_build(reg: Registry, families: tuple[str, ...], target: Arch) -> list[Variant]:
    """The chosen families' variants that can run on ``target``; one line per family about those that cannot."""
    for name in families:
        reg.family(name)  # an unknown name is an error listing the known families
    chosen = [v for v in reg.variants() if not families or v.family.name in families]
    variants = [v for v in chosen if v.supports_sm(target.sm)]
    skipped: dict[tuple[str, str], list[Variant]] = {}
    for variant in chosen:
        reason = variant.arch_refusal(target.sm)
        if reason is not None:
            skipped.setdefault((variant.family.name, reason), []).append(variant)
    for (name, reason), members in skipped.items():
        echo_error(f"skip: {name}: {len(members)} of {len(members[0].family.variants)} variants {reason}; "
                   f"not built for {target.name}")
    if not variants:
        where = f"families {list(families)}" if families else f"the spec path {[str(d) for d in reg.spec_dirs]}"
        raise CommandError(f"nothing to build for {target.name}: {where} "
                           f"{'declares no variant' if not chosen else 'has no variant for this arch'}")
    return variants


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
        table = Table(title=f"{escape(family_name)} ({len(members)} variants)", title_justify="left",
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
    """Inspect or clear the on-disk cubin cache."""


@cache_group.command("info")
def cache_info() -> None:
    """Where the cache is, and what it holds."""
    cache = DiskCache(config.cache_dir())
    entries = cache.entries()
    size = sum(p.stat().st_size for p in entries)
    click.echo(f"cache dir: {cache.root}\nentries: {len(entries)}\nbytes: {size}")


@cache_group.command("clear")
def cache_clear() -> None:
    """Delete every cached cubin (and temporary files a killed build left)."""
    cache = DiskCache(config.cache_dir())
    click.echo(f"removed {cache.clear()} entries from {cache.root}")


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
