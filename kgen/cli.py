"""The ``kgen`` command: list, render, build every variant, manage the cache."""

from __future__ import annotations

import os
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed

import click
from rich.console import Console
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from kgen import config, jit, registry as registry_module
from kgen.cache import DiskCache
from kgen.compiler import CompileError
from kgen.registry import Variant
from kgen.render import RenderError, render
from kgen.spec import SpecError

console = Console()


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


def _resolve_arch(arch: str | None) -> str:
    if arch:
        return arch
    try:
        return jit.device_arch()
    except Exception as exc:  # no driver or no GPU on this machine
        raise click.UsageError(f"cannot read the current GPU's arch ({exc}); pass --arch (e.g. sm_90a) or set KGEN_ARCH")


@click.group()
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
    for family in reg.families.values():
        console.print(f"[bold]{family.name}[/bold]  template={family.template}  entries={list(family.entries)}  "
                      f"variants={len(family.variants)}")
        for variant in family.variants:
            console.print(f"  {_variant_label(variant)}  [dim]{escape(str(variant.spec_path))}[/dim]", highlight=False)


@cli.command("render")
@click.argument("family")
@click.argument("params", nargs=-1)
def render_cmd(family: str, params: tuple[str, ...]) -> None:
    """Print the exact CUDA source compiled for FAMILY's variant matching PARAMS (key=value ...)."""
    variant = registry_module.current().family(family).select(**_parse_assignments(params))
    click.echo(render(variant), nl=False)


@cli.command("build")
@click.option("--arch", default=None, help="Target arch (sm_90a); default KGEN_ARCH or the current GPU's.")
@click.option("--jobs", "-j", default=os.cpu_count() or 1, show_default=True, help="Parallel compiles.")
@click.option("--family", "families", multiple=True, help="Only these families; repeatable.")
def build_cmd(arch: str | None, jobs: int, families: tuple[str, ...]) -> None:
    """Compile every variant on the spec path and print a resource table.

    Exits non-zero if any variant fails to compile or spills registers
    (unless its spec sets allow_spills).
    """
    arch = _resolve_arch(arch)
    reg = registry_module.current()
    variants = [v for v in reg.variants() if not families or v.family.name in families]
    results, failures = {}, {}
    progress = Progress(TextColumn("[bold]build[/bold] {task.description}"), BarColumn(), MofNCompleteColumn(),
                        TimeElapsedColumn(), console=console, transient=True)
    with progress, ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        task = progress.add_task(arch, total=len(variants))
        futures = {pool.submit(jit.build, v, arch): v for v in variants}
        for future in as_completed(futures):
            variant = futures[future]
            try:
                results[variant.name] = future.result()
            except (CompileError, RenderError) as exc:
                failures[variant.name] = str(exc)
            progress.advance(task)

    table = Table(title=f"kgen build for {arch} ({len(variants)} variants)")
    table.add_column("family", overflow="fold")
    table.add_column("variant", overflow="fold")
    for column in ("regs", "spills", "smem", "compile ms"):
        table.add_column(column, justify="right", no_wrap=True)
    table.add_column("cache", no_wrap=True)
    spilled = []
    for variant in variants:
        result = results.get(variant.name)
        if result is None:
            table.add_row(variant.family.name, _short_label(variant), "-", "-", "-", "-", "[red]FAILED[/red]")
            continue
        entries = result.record.entries.values()
        spills = result.record.spills
        if spills and not variant.family.allow_spills:
            spilled.append(variant.name)
        table.add_row(
            variant.family.name, _short_label(variant),
            str(max((e.registers for e in entries), default=0)),
            f"[red]{spills}[/red]" if spills else "0",
            str(max((e.static_smem_bytes for e in entries), default=0)),
            f"{result.record.compile_ms:.0f}",
            "hit" if result.cache_hit else "miss",
        )
    console.print(table)
    for name, message in failures.items():
        console.print(f"[red]FAILED[/red] {escape(name)}\n{escape(message)}", highlight=False)
    for name in spilled:
        console.print(f"[red]SPILLS[/red] {escape(name)} spills registers and its spec does not allow spills", highlight=False)
    if failures or spilled:
        sys.exit(1)


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
    """Delete every cached cubin."""
    cache = DiskCache(config.cache_dir())
    click.echo(f"removed {cache.clear()} entries from {cache.root}")


def main() -> None:
    try:
        cli(standalone_mode=True)
    except (SpecError, CompileError, RenderError, ValueError) as exc:
        console.print(f"[red]error:[/red] {escape(str(exc))}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
