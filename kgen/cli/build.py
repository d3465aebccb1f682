"""``kgen build``: compile every variant on the spec path for each arch, report it, and gate it.

Skips, per arch, the variants whose spec rules that arch out (min_sm,
sm_only), with one line per family and reason. kgen.cli.report prints a line
per variant and applies the gates (kgen.build_gates); a problem is a line on
stderr and exit 1, as is a compiled variant the cache could not keep. The
summary line comes last, with ``--quiet`` alone with the errors.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait

import click

import kgen.cli.progress as progress_module
from kgen import config, jit, registry as registry_module
from kgen.arch import Arch, ArchError
from kgen.arch import parse as parse_arch
from kgen.cache import CacheWarning, UnwritableCacheWarning, cache_layers
from kgen.cli.errors import CommandError, echo_error, plural
from kgen.cli.report import ArchReport, report
from kgen.compiler import CompileError
from kgen.registry import Variant
from kgen.render import RenderError


@click.command("build")
@click.option("--arch", "arch_names", multiple=True,
              help="Target arch (sm_90a, sm_100f, ...); repeatable. Default KGEN_ARCH or the current GPU's.")
@click.option("--jobs", "-j", type=click.IntRange(min=1), default=os.cpu_count() or 1, show_default=True,
              help="Parallel compiles.")
@click.option("--family", "families", multiple=True, help="Only these families; repeatable.")
@click.option("--quiet", "-q", is_flag=True, help="Print only the summary line and errors.")
def build_cmd(arch_names: tuple[str, ...], jobs: int, families: tuple[str, ...], quiet: bool) -> None:
    """Compile every variant on the spec path for each arch; print a line per variant and a summary.

    Each line shows registers, spilled bytes, static and dynamic shared memory,
    compile time and whether the cache had it, and names the variant by the axes
    that vary within its family. Skips, per arch, the variants whose spec rules
    that arch out (min_sm, sm_only). Exits 1 if any variant fails to compile,
    spills registers (unless its spec sets allow_spills) or needs more shared
    memory than a block may have on its arch, or if the cache could not keep
    what was compiled; exits 2 if no arch has anything to build.
    """
    config.check_settings()
    targets = _targets(arch_names)
    reg = registry_module.current()
    for name in families:
        reg.family(name)  # an unknown name is an error listing the known families
    chosen = [v for v in reg.variants() if not families or v.family.name in families]
    say = (lambda line: None) if quiet else echo_error
    plan = {target: _variants_to_build(chosen, target, say) for target in targets}
    if not any(plan.values()):
        where = f"families {list(families)}" if families else f"the spec path {[str(d) for d in reg.spec_dirs]}"
        these = "this arch" if len(targets) == 1 else "these archs"
        raise CommandError(f"nothing to build for {' or '.join(t.name for t in targets)}: {where} "
                           f"{f'has no variant for {these}' if chosen else 'declares no variant'}")
    reports, errors = [], []
    for target, variants in plan.items():
        if not variants:
            continue  # its skip lines said why
        if target.max_smem_per_block is None:
            say(f"note: kgen knows no shared-memory limit for {target.name}; shared memory is not checked")
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always", CacheWarning)
            results, failures = _build_all(variants, target.name, jobs, quiet)
        arch_report = report(variants, results, failures, target)
        if not quiet:
            click.echo(f"kgen build for {target.name} ({plural(len(variants), 'variant')})")
            for line in arch_report.lines:
                click.echo(line)
        unkept = _not_cached(list(results.values()), target.name, caught, say)
        for line in arch_report.problems + unkept:
            echo_error(line)
        reports.append(arch_report)
        errors += arch_report.problems + unkept
    skipped = sum(len(chosen) - len(variants) for variants in plan.values())
    click.echo(_summary(reports, skipped))
    if errors:
        sys.exit(1)


def _summary(reports: list[ArchReport], skipped: int) -> str:
    """``summary: 12 variants for sm_90a: 10 hits, 2 compiled, 1 failed, 3 skipped`` (failed: any problem)."""
    line = (f"summary: {plural(sum(r.total for r in reports), 'variant')} for {', '.join(r.arch for r in reports)}: "
            f"{plural(sum(r.hits for r in reports), 'hit')}, {sum(r.compiled for r in reports)} compiled, "
            f"{sum(len(r.failed) for r in reports)} failed")
    return line + (f", {skipped} skipped" if skipped else "")


def _not_cached(results: list, arch: str, caught: list[warnings.WarningMessage], say) -> list[str]:
    """One line if some variant this build compiled is not in the cache (its job is to fill it), else none.

    The cache's warnings during the build say why (a read-only folder, a path
    that is a file, a full disk); they are folded into that line, and others
    are passed to ``say`` as one ``warning:`` line each.
    """
    reasons = []
    for warning in caught:
        text = str(warning.message).removeprefix("kgen: ")
        if issubclass(warning.category, UnwritableCacheWarning):
            reasons.append(text.removesuffix("; compiling in memory"))
        else:
            say(f"warning: {text}")
    compiled = [r for r in results if not r.cache_hit]
    writable = cache_layers().writable
    unkept = [r for r in compiled if writable is None or not writable.holds(r.key)]
    if not unkept:
        return []
    if not reasons:
        reasons = [f"no folder on the cache path {os.pathsep.join(map(str, config.cache_dirs()))} is writable"
                   if writable is None else f"{writable.root} does not hold their entries"]
    kept = "none" if len(unkept) == len(compiled) else str(len(compiled) - len(unkept))
    return [f"error: the cache kept {kept} of the {plural(len(compiled), 'variant')} compiled for {arch}: "
            f"{'; '.join(reasons)}"]


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


def _variants_to_build(chosen: list[Variant], target: Arch, say) -> list[Variant]:
    """The variants of ``chosen`` that can run on ``target``; one line per family about those that cannot."""
    skipped: dict[tuple[str, str], list[Variant]] = {}
    for variant in chosen:
        reason = variant.arch_refusal(target.sm)
        if reason is not None:
            skipped.setdefault((variant.family.name, reason), []).append(variant)
    for (name, reason), members in skipped.items():
        of = len(members[0].family.variants)
        say(f"skip: {name}: {len(members)} of {plural(of, 'variant')} not built for {target.name}: "
            f"its variants {reason}")
    return [v for v in chosen if v.supports_sm(target.sm)]


def _build_all(variants: list[Variant], arch: str, jobs: int, quiet: bool) -> tuple[dict, dict[str, str]]:
    """Build on ``jobs`` threads; return the results and the failures (messages), both by variant name."""
    results, failures = {}, {}
    shown = contextlib.nullcontext(lambda done: None) if quiet else progress_module.progress(len(variants), arch)
    with shown as show, ThreadPoolExecutor(max_workers=jobs) as pool:
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
