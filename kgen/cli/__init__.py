"""The ``kgen`` command: list, render, build every variant, manage the cache.

One module per job: kgen.cli.specs (``list``, ``render``), kgen.cli.build
(``build``, with kgen.cli.progress), kgen.cli.cache (``cache ...``);
kgen.cli.errors says how everything is reported. Tables and listings go to
stdout. Errors, skipped variants and progress go to stderr as plain, unwrapped
text with control characters escaped. Bad input (a spec, an arch, a family, a
setting) exits 2 with one ``error: ...`` message; a variant that fails to build
exits 1 after the table.
"""

from __future__ import annotations

import os
import sys

import click

from kgen import __version__, registry as registry_module
from kgen.cli.build import build_cmd
from kgen.cli.cache import cache_group
from kgen.cli.errors import KGEN_ERRORS, CommandError, OneLineErrors, echo_error, one_line, printable
from kgen.cli.specs import list_cmd, render_cmd

__all__ = ["CommandError", "cli", "main", "printable"]


@click.group(cls=OneLineErrors)
@click.version_option(__version__, prog_name="kgen")
@click.option("--spec-path", "spec_paths", multiple=True, type=click.Path(exists=True, file_okay=False),
              help="Also search this folder for specs (before KGEN_SPEC_PATH and the built-ins); repeatable.")
def cli(spec_paths: tuple[str, ...]) -> None:
    """kgen: CUDA kernels declared in YAML, compiled at run time with NVRTC."""
    # Each added folder goes first on the path, so add the last one first: the order given is the search order.
    # Absolute, so that add_spec_path does not expand a leading ~ again: the shell expanded the user's, and click
    # checked the folder as given (a folder named ~bob in the current one is not bob's home).
    for folder in reversed(spec_paths):
        registry_module.add_spec_path(os.path.abspath(folder))


for _command in (list_cmd, render_cmd, build_cmd, cache_group):
    cli.add_command(_command)


def main() -> None:
    try:
        cli(standalone_mode=True)
    except KGEN_ERRORS as exc:
        echo_error(f"error: {one_line(str(exc))}")
        sys.exit(2)
