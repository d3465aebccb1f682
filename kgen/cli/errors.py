"""How the ``kgen`` command reports: plain, unwrapped lines on stderr, and one ``error: ...`` line for a refusal.

NVRTC logs carry NUL bytes, so control characters are escaped before they
reach a terminal or a CI log.
"""

from __future__ import annotations

import re

import click

from kgen.compiler import CompileError
from kgen.render import RenderError
from kgen.spec import SpecError

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

#: What kgen raises for bad input or an unusable environment: reported in one message, never as a traceback.
KGEN_ERRORS = (SpecError, CompileError, RenderError, ValueError, OSError)


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


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 variant``, ``2 variants``: the count with its noun."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"
