"""``kgen build``: compile every variant on the spec path for each arch, print what ptxas reported, gate it.

Skips, per arch, the variants whose spec rules that arch out (min_sm,
sm_only), with one line per family and reason. The gates (kgen.build_gates)
turn a spill or too much shared memory into a problem line on stderr and exit 1.
"""

from __future__ import annotations

import os
import sys
import warnings
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import click
from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

import kgen.cli.progress as progress_module
from kgen import build_gates, config, jit, layout, registry as registry_module
from kgen.arch import Arch, ArchError
from kgen.arch import parse as parse_arch
from kgen.cache import CacheWarning, UnwritableCacheWarning, cache_layers
from kgen.cli.errors import CommandError, echo_error
from kgen.compiler import CompileError
from kgen.registry import Variant
from kgen.render import RenderError

console = Console()


@click.command("build")
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
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CacheWarning)
            results, failures = _build_all(variants, target.name, jobs)
        console.print(f"kgen build for {target.name} ({len(variants)} variants)", highlight=False)
        problems = _report(variants, results, failures, target)
        unkept = _not_cached(list(results.values()), target.name, caught)
        for line in problems + unkept:
            echo_error(line)
        failed = failed or bool(problems or unkept)
    if failed:
        sys.exit(1)


def _not_cached(results: list, arch: str, caught: list[warnings.WarningMessage]) -> list[str]:
    """One line if some variant this build compiled is not in the cache (its job is to fill it), else none.

    The cache's warnings during the build say why (a read-only folder, a path
    that is a file, a full disk); they are folded into that line, and others
    are printed as one ``warning:`` line each.
    """
    reasons = []
    for warning in caught:
        text = str(warning.message).removeprefix("kgen: ")
        if issubclass(warning.category, UnwritableCacheWarning):
            reasons.append(text.removesuffix("; compiling in memory"))
        else:
            echo_error(f"warning: {text}")
    compiled = [r for r in results if not r.cache_hit]
    writable = cache_layers().writable
    unkept = [r for r in compiled if writable is None or not writable.holds(r.key)]
    if not unkept:
        return []
    if not reasons:
        reasons = [f"no folder on the cache path {os.pathsep.join(map(str, config.cache_dirs()))} is writable"
                   if writable is None else f"{writable.root} does not hold their entries"]
    kept = "none" if len(unkept) == len(compiled) else str(len(compiled) - len(unkept))
    return [f"error: the cache kept {kept} of the {_count(len(compiled))} compiled for {arch}: {'; '.join(reasons)}"]


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
    with progress_module.progress(len(variants), arch) as show, ThreadPoolExecutor(max_workers=jobs) as pool:
        futures = {pool.submit(jit.build, v, arch): v for v in variants}
        pending = set(futures)
        try:
            while pending:
                # A timeout, so that a log gets its progress line even while one long compile runs.
                done, pending = wait(pending, timeout=progress_module.PROGRESS_INTERVAL_S,
                                     return_when=FIRST_COMPLETED)
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


def _short_label(variant: Variant) -> str:
    """The axes that tell this variant from its family's others: all of them would not fit a table."""
    varying = {axis for axis in variant.family.axes if len(variant.family.supported(axis)) > 1}
    return escape(" ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                           for k, v in variant.params if k in varying) or "(only variant)")


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
            too_much = build_gates.shared_memory(variant.name, static, dynamic, limit, target.name)
            problems += [p for p in (build_gates.spills(variant.name, spills, variant.family.allow_spills), too_much)
                         if p]
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


def _count(n: int, noun: str = "variant") -> str:
    return f"{n} {noun}{'' if n == 1 else 's'}"
