"""Rendering a variant's Jinja template into the exact CUDA source NVRTC compiles.

Shared device headers (``templates/common/*.cuh``) are pulled in with Jinja's
``{% include %}``, so the rendered text is self-contained: what ``kgen render``
prints is byte for byte what is compiled and what the cache key hashes.
Undefined template variables are errors (``StrictUndefined``), never empty text.
A family with a host package gets its launch contract (:mod:`kgen.contract`) as
``contract``: the template renders its kernels' signatures from it and asserts
that its own sizes agree.
"""

from __future__ import annotations

import functools
from pathlib import Path

import jinja2

from kgen.dtypes import ELEMENT_TYPES
from kgen.contract import contract_of
from kgen.registry import Variant


class RenderError(RuntimeError):
    """A template could not be rendered (syntax error, undefined variable, missing file)."""


# One environment per template search path (a family's spec folder, then the built-ins);
# bounded, so that a process cycling through many spec folders does not keep them all.
@functools.lru_cache(maxsize=32)
def _environment(template_dirs: tuple[Path, ...]) -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader([str(d) for d in template_dirs]),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )


def render(variant: Variant) -> str:
    """The CUDA source of ``variant``."""
    family = variant.family
    params = variant.param_dict
    context = dict(params, family=family.name, variant_name=variant.name, entries=family.entries,
                   contract=contract_of(variant))
    if "dtype" in params:
        context["cuda_type"] = ELEMENT_TYPES[params["dtype"]].cuda
    try:
        template = _environment(family.template_dirs).get_template(family.template)
        body = template.render(**context)
    except jinja2.TemplateSyntaxError as exc:
        raise RenderError(f"{variant.name}: {exc.filename or family.template}:{exc.lineno}: {exc.message}") from None
    except jinja2.TemplateError as exc:
        raise RenderError(f"{variant.name}: cannot render {family.template}: {exc}") from None
    return f"// kgen: {variant.name}\n" + body
