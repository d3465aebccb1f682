"""What ``kgen build`` says about one arch's variants: a line each on stdout, and the gates' problems.

One line per variant, however narrow the terminal, so a log can be grepped and
counted: the numbers first, in fixed columns, then the variant by the axes that
vary within its family (the others are the same in every row: they would only
push the line past the terminal's width).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from kgen import build_gates
from kgen.contract import contract_of
from kgen.arch import Arch
from kgen.cli.errors import plural
from kgen.registry import Variant

_ROW = "  {:>4}  {:>6}  {:>6}  {:>8}  {:>6}  {:<6}  {}"
HEADER = _ROW.format("regs", "spills", "smem", "dyn smem", "ms", "cache", "variant")


@dataclass
class ArchReport:
    """One arch's lines (stdout), problems (stderr), and counts for the summary."""

    arch: str
    total: int
    lines: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    hits: int = 0
    compiled: int = 0
    #: The variants with a problem: a failure, spills, too much shared memory.
    failed: set[str] = field(default_factory=set)


def variant_label(variant: Variant) -> str:
    """The axes that tell this variant from its family's others, as ``axis=value`` separated by one space."""
    varying = {axis for axis in variant.family.axes if len(variant.family.supported(axis)) > 1}
    return " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}"
                    for k, v in variant.params if k in varying) or "(only variant)"


def report(variants: list[Variant], results: dict, failures: dict[str, str], target: Arch) -> ArchReport:
    """A line per variant of ``variants`` (grouped by family, a title and a header each) and the problems.

    ``results`` and ``failures`` are by variant name: what kgen.jit.build returned, or the message it raised.
    """
    out = ArchReport(target.name, len(variants))
    for name, message in failures.items():
        out.problems.append(f"FAILED {name}\n{message}")
        out.failed.add(name)
    by_family: dict[str, list[Variant]] = {}
    for variant in variants:
        by_family.setdefault(variant.family.name, []).append(variant)
    for family_name, members in by_family.items():
        out.lines += [f"{family_name} ({plural(len(members), 'variant')}) for {target.name}", HEADER]
        out.lines += [_row(variant, results.get(variant.name), target, out) for variant in members]
    return out


def _row(variant: Variant, result, target: Arch, out: ArchReport) -> str:
    label = variant_label(variant)
    if result is None:
        return _ROW.format("-", "-", "-", "-", "-", "FAILED", label)
    entries = result.record.entries.values()
    static, dynamic = _largest_shared_memory(result.record.entries, contract_of(variant))
    spills = result.record.spills
    for problem in (build_gates.spills(variant.name, spills, variant.family.allow_spills),
                    build_gates.shared_memory(variant.name, static, dynamic, target.max_smem_per_block, target.name)):
        if problem:
            out.problems.append(problem)
            out.failed.add(variant.name)
    if result.cache_hit:
        out.hits += 1
    else:
        out.compiled += 1
    return _ROW.format(max((e.registers for e in entries), default=0), spills, static,
                       "-" if dynamic is None else dynamic,
                       "-" if result.cache_hit else f"{result.record.compile_ms:.0f}",
                       "hit" if result.cache_hit else "miss", label)


def _largest_shared_memory(entries: dict, contract) -> tuple[int, int | None]:
    """(static, dynamic) shared-memory bytes of the entry that needs the most: each entry's dynamic bytes are its
    contract's (None without a contract)."""
    if contract is None:
        return max((e.static_smem_bytes for e in entries.values()), default=0), None
    sizes = [(e.static_smem_bytes, contract.launch_shape(name)[1]) for name, e in entries.items()]
    return max(sizes, key=sum, default=(0, contract.dynamic_smem_bytes))
