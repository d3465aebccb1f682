"""``kgen list`` and ``kgen render``: what the spec path declares, and the exact source of one variant."""

from __future__ import annotations

import re

import click
from rich.console import Console
from rich.markup import escape

from kgen import config, registry as registry_module
from kgen.cli.errors import printable
from kgen.registry import Family
from kgen.render import check_family, render
from kgen.spec_schema import yaml_spelling

console = Console()


@click.command("list")
def list_cmd() -> None:
    """List kernel families and their variants, checked as kgen build checks them before compiling."""
    config.check_settings()
    reg = registry_module.current()
    for family in reg.families.values():
        check_family(family)
    # soft_wrap: one line per variant however narrow the terminal, so the listing can be grepped.
    # highlight=False: rich's highlighter backtracks for minutes over a long name.
    for family in reg.families.values():
        console.print(f"[bold]{escape(family.name)}[/bold]  template={escape(_one_line(family.template))}  "
                      f"entries={escape(str(list(family.entries)))}  variants={len(family.variants)}",
                      highlight=False, soft_wrap=True)
        for variant in family.variants:
            label = escape(variant.name[len(family.name):])
            console.print(f"  {label}  [dim]{escape(_one_line(variant.spec_path))}[/dim]", highlight=False,
                          soft_wrap=True)


def _one_line(path) -> str:
    """``path`` as printable text on one line: a byte that is not UTF-8 (a lone surrogate to Python, which a
    strict UTF-8 stdout refuses to write) and control characters, newlines included, escaped."""
    text = str(path).encode("utf-8", "backslashreplace").decode("utf-8")
    return printable(text).replace("\n", "\\n").replace("\t", "\\t")


@click.command("render")
@click.argument("family")
@click.argument("params", nargs=-1)
def render_cmd(family: str, params: tuple[str, ...]) -> None:
    """Print the exact CUDA source compiled for FAMILY's variant matching PARAMS (key=value ...)."""
    chosen = registry_module.current().family(family)
    variant = chosen.select(**_parse_assignments(params, chosen))
    click.echo(render(variant), nl=False)


def _parse_assignments(pairs: tuple[str, ...], family: Family) -> dict:
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not key=value")
        if key in out:
            raise click.BadParameter(f"{key!r} is given twice")
        out[key] = _axis_value(family, key, raw)
    return out


def _axis_value(family: Family, axis: str, raw: str):
    """The value ``raw`` names on ``axis``: the family's value that ``kgen list`` spells so (a boolean in any case),
    else an int where the axis takes ints, else the text itself, which select then refuses naming the axis.

    Matching the axis's own spellings keeps ``true`` from meaning 1 on an int axis (True == 1 in Python), and
    ``²`` (a digit to str.isdigit, not to int) or a 5,000-digit number from failing without naming the axis.
    """
    values = family.axis_values(axis) if axis in family.axes else []
    for value in values:
        if yaml_spelling(value) == (raw.lower() if isinstance(value, bool) else raw):
            return value
    takes_ints = any(isinstance(v, int) and not isinstance(v, bool) for v in values)
    return int(raw) if takes_ints and re.fullmatch(r"-?[0-9]{1,18}", raw) else raw
