"""How the ``kgen`` command reports: plain, unwrapped lines on stderr, and one ``error: ...`` line for a refusal.

NVRTC logs carry NUL bytes, so control characters are escaped before they
reach a terminal or a CI log.
"""

from __future__ import annotations

import re
import sys

import click

from kgen.compiler import CompileError
from kgen.render import RenderError
from kgen.spec import SpecError

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")

#: Click 8.2 and later raise it for a group named without a command (8.1 prints the help itself).
_NO_ARGS_IS_HELP = getattr(click.exceptions, "NoArgsIsHelpError", ())

#: What kgen raises for bad input or an unusable environment: reported in one message, never as a traceback.
KGEN_ERRORS = (SpecError, CompileError, RenderError, ValueError, OSError)


def printable(text: str) -> str:
    """``text`` with control characters other than tab and newline escaped (``\\x00``)."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m.group()):02x}", text)


def one_line(text: str) -> str:
    """``text`` with its line breaks escaped (``\\n``): a refusal is one line, even when it quotes a file name
    that holds a newline."""
    return text.replace("\r", "\\r").replace("\n", "\\n")


def echo_error(text: str) -> None:
    click.echo(printable(text), err=True)


class OneLineErrors(click.Group):
    """A group whose refusals are one ``error: ...`` line and exit status 2, never click's usage block.

    Click prints a usage error as ``Usage: ...``, ``Try '... --help'`` and
    ``Error: ...`` on three lines; kgen's every refusal is one line, so a script
    or a CI log can tell them apart from output by their first word.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode, **extra)
        try:
            code = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except _NO_ARGS_IS_HELP as exc:  # a group named without a command: its help
            click.echo(exc.ctx.get_help())
            sys.exit(0)
        except click.ClickException as exc:
            echo_error(f"error: {' '.join(exc.format_message().split())}")
            sys.exit(2)
        except click.Abort:
            echo_error("error: aborted")
            sys.exit(1)
        sys.exit(code if isinstance(code, int) else 0)


class CommandError(click.ClickException):
    """A command refused its input; printed as ``error: ...`` like main()'s errors."""

    exit_code = 2

    def show(self, file=None) -> None:
        echo_error(f"error: {self.message}")


def plural(n: int, noun: str, nouns: str | None = None) -> str:
    """``1 variant``, ``2 variants``: the count with its noun."""
    return f"{n} {noun if n == 1 else nouns or noun + 's'}"
