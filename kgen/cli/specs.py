"""``kgen list`` and ``kgen render``: what the spec path declares, and the exact source of one variant."""

from __future__ import annotations

import click
from rich.console import Console
from rich.markup import escape

from kgen import config, registry as registry_module
from kgen.render import check_family, render

console = Console()


@click.command("list")
def list_cmd() -> None:
    """List kernel families and their variants, checked as kgen build checks them before compiling."""
    config.check_settings()
    reg = registry_module.current()
    for family in reg.families.values():
        check_family(family)
    # soft_wrap: one line per variant however narrow the terminal, so the listing can be grepped.
    for family in reg.families.values():
        console.print(f"[bold]{escape(family.name)}[/bold]  template={escape(family.template)}  "
                      f"entries={escape(str(list(family.entries)))}  variants={len(family.variants)}", soft_wrap=True)
        for variant in family.variants:
            label = escape(variant.name[len(family.name):])
            console.print(f"  {label}  [dim]{escape(str(variant.spec_path))}[/dim]", highlight=False, soft_wrap=True)


@click.command("render")
@click.argument("family")
@click.argument("params", nargs=-1)
def render_cmd(family: str, params: tuple[str, ...]) -> None:
    """Print the exact CUDA source compiled for FAMILY's variant matching PARAMS (key=value ...)."""
    variant = registry_module.current().family(family).select(**_parse_assignments(params))
    click.echo(render(variant), nl=False)


def _parse_assignments(pairs: tuple[str, ...]) -> dict:
    out = {}
    for pair in pairs:
        key, sep, raw = pair.partition("=")
        if not sep:
            raise click.BadParameter(f"{pair!r} is not key=value")
        out[key] = {"true": True, "false": False}.get(raw.lower(), int(raw) if raw.lstrip("-").isdigit() else raw)
    return out
