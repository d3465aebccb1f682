"""Rendering a variant's Jinja template into the exact CUDA source NVRTC compiles.

Shared device headers (``templates/common/*.cuh``) are pulled in with Jinja's
``{% include %}``, so the rendered text is self-contained: what ``kgen render``
prints is byte for byte what is compiled and what the cache key hashes.
Undefined template variables are errors (``StrictUndefined``), never empty text.

Templates are code that runs at build time, from any folder on the spec path
(trusted like ``PYTHONPATH``). They still render in Jinja's sandbox, so a
template cannot reach Python's internals (``os.system`` through a global, say);
a template file or include that resolves outside its search folder (``..``, a
link to ``/etc/passwd``) is refused; and a render that outgrows
:data:`MAX_SOURCE_CHARS` or :data:`MAX_RENDER_SECONDS` stops with an error
instead of exhausting memory in NVRTC, a value too large to render included
(``"x" * 10**10``), and loops that print nothing.
A family with a host package gets its launch contract (:mod:`kgen.contract`) as
``contract``: the template renders its kernels' signatures from it and asserts
that its own sizes agree.
"""

from __future__ import annotations

import contextvars
import functools
import math
import os
import time
from pathlib import Path

import jinja2
import jinja2.sandbox

from kgen.dtypes import ELEMENT_TYPES
from kgen.contract import ContractError, contract_function, contract_of
from kgen.registry import Variant

#: The most characters a rendered source may have (the largest built-in kernel renders to about 60 kB).
MAX_SOURCE_CHARS = 8 << 20
#: The longest a render may take (a built-in one takes milliseconds).
MAX_RENDER_SECONDS = 30.0


class RenderError(RuntimeError):
    """A template could not be rendered (syntax error, undefined variable, missing file, too large)."""


#: What loading or rendering a template raises for a bad template file: Jinja's errors, and the reader's for a
#: file that is not UTF-8 (UnicodeDecodeError) or cannot be read (OSError), which name neither file nor family.
_LOAD_ERRORS = (jinja2.TemplateError, UnicodeDecodeError, OSError)


class _ContainedLoader(jinja2.FileSystemLoader):
    """A file loader that refuses a template whose real path lies outside the search folder it was found in."""

    def get_source(self, environment, template):
        source, filename, uptodate = super().get_source(environment, template)
        real = Path(os.path.realpath(filename))
        if not any(real.is_relative_to(Path(os.path.realpath(folder))) for folder in self.searchpath):
            raise jinja2.TemplateNotFound(f"{template} (resolves to {real}, outside the template folders "
                                          f"{self.searchpath})")
        return source, filename, uptodate


#: When the render under way must stop (the calling thread's or task's; none outside a render).
_render_deadline: contextvars.ContextVar[float] = contextvars.ContextVar("kgen_render_deadline", default=math.inf)


class _BoundedSandbox(jinja2.sandbox.SandboxedEnvironment):
    """Jinja's sandbox, with the limits holding where output is not produced: ``*`` and ``**`` that would make a
    value larger than any source kgen compiles are refused before Python computes them, and every ``range`` a
    template makes (the sandbox caps each one's length; loops within loops make many) checks the render's time."""

    intercepted_binops = frozenset({"*", "**"})

    def call_binop(self, context, operator, left, right):
        if operator == "*" and _repeat_size(left, right) > MAX_SOURCE_CHARS:
            raise jinja2.sandbox.SecurityError(f"a repetition of over {MAX_SOURCE_CHARS} items")
        if (operator == "**" and isinstance(left, int) and isinstance(right, int) and abs(left) > 1
                and right * math.log2(abs(left)) > 8 * MAX_SOURCE_CHARS):
            raise jinja2.sandbox.SecurityError(f"a power of over {8 * MAX_SOURCE_CHARS} bits")
        return super().call_binop(context, operator, left, right)


def _repeat_size(left, right) -> int:
    """Items ``left * right`` makes where it repeats a sequence (0 otherwise)."""
    for sequence, times in ((left, right), (right, left)):
        if isinstance(sequence, (str, bytes, list, tuple)) and isinstance(times, int):
            return len(sequence) * times
    return 0


def _timed_range(*args):
    if time.monotonic() > _render_deadline.get():
        raise jinja2.sandbox.SecurityError(f"rendering took over {MAX_RENDER_SECONDS:.0f} s")
    return jinja2.sandbox.safe_range(*args)


# One environment per template search path (a family's spec folder, then the built-ins);
# bounded, so that a process cycling through many spec folders does not keep them all.
@functools.lru_cache(maxsize=32)
def _environment(template_dirs: tuple[Path, ...]) -> jinja2.Environment:
    environment = _BoundedSandbox(
        loader=_ContainedLoader([str(d) for d in template_dirs]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    environment.globals["range"] = _timed_range
    return environment


def check_family(family) -> None:
    """Refuse, in one line, what would fail every variant of ``family`` (a :class:`kgen.registry.Family`) before
    anything is compiled: a template that cannot be found, lies outside its folder or does not parse, and a host
    package that declares no contract for the family. ``kgen list`` checks this much, as ``kgen build`` does."""
    try:
        _environment(family.template_dirs).get_template(family.template)
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError(f"family {family.name!r}: {exc.filename or family.template}:{exc.lineno}: "
                          f"{exc.message}") from None
    except _LOAD_ERRORS as exc:
        raise RenderError(f"family {family.name!r}: cannot load its template {family.template}: {exc}") from None
    if family.host is not None:
        try:
            contract_function(family.host, family.name)
        except ContractError as exc:
            raise RenderError(str(exc)) from None


def render(variant: Variant) -> str:
    """The CUDA source of ``variant``."""
    family = variant.family
    params = variant.param_dict
    try:
        contract = contract_of(variant)
    except ContractError as exc:
        raise RenderError(f"{variant.name}: {exc}") from None
    context = dict(params, family=family.name, variant_name=variant.name, entries=family.entries, contract=contract)
    if "dtype" in params:
        context["cuda_type"] = ELEMENT_TYPES[params["dtype"]].cuda
    deadline = _render_deadline.set(time.monotonic() + MAX_RENDER_SECONDS)
    try:
        template = _environment(family.template_dirs).get_template(family.template)
        body = _bounded(template.generate(**context), variant.name)
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError(f"{variant.name}: {exc.filename or family.template}:{exc.lineno}: {exc.message}") from None
    except _LOAD_ERRORS as exc:
        raise RenderError(f"{variant.name}: cannot render {family.template}: {exc}") from None
    finally:
        _render_deadline.reset(deadline)
    return f"// kgen: {variant.name}\n" + body


def _bounded(pieces, name: str) -> str:
    """The rendered pieces joined, stopping at the size and time limits."""
    out, size, start = [], 0, time.monotonic()
    for piece in pieces:
        size += len(piece)
        if size > MAX_SOURCE_CHARS:
            raise RenderError(f"{name}: the rendered source passes {MAX_SOURCE_CHARS} characters, the most kgen compiles")
        if time.monotonic() - start > MAX_RENDER_SECONDS:
            raise RenderError(f"{name}: rendering took over {MAX_RENDER_SECONDS:.0f} s")
        out.append(piece)
    return "".join(out)
