"""Every setting kgen reads from the environment, and where its built-in files live, in one place.

Each knob is read when it is asked for, so a test (or a user) can change the
environment, or use :func:`overrides`, without reloading modules. Nothing else
in kgen touches ``os.environ``.

Built-in specs and templates: a source checkout (an editable install too) keeps
them in its top-level ``specs/`` and ``templates/``; the wheel carries the same
files inside the package, as ``kgen/_builtin/specs`` and
``kgen/_builtin/templates`` (``pyproject.toml`` maps them). Where the packaged
copy exists, kgen is installed.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

_PACKAGE_DIR = Path(__file__).resolve().parent
_PACKAGED_DATA = _PACKAGE_DIR / "_builtin"
#: True for a wheel install, False for a source checkout (editable or on ``sys.path``).
INSTALLED = (_PACKAGED_DATA / "specs").is_dir()
#: The source checkout kgen was imported from, or None when it is installed.
CHECKOUT = None if INSTALLED else _PACKAGE_DIR.parent
BUILTIN_TEMPLATE_DIR = (_PACKAGED_DATA if INSTALLED else CHECKOUT) / "templates"
BUILTIN_SPEC_DIR = (_PACKAGED_DATA if INSTALLED else CHECKOUT) / "specs"


class SettingError(ValueError):
    """An environment setting kgen cannot use; the message names the variable and the value."""


_overrides: dict[str, str | None] = {}


def _get(name: str) -> str | None:
    """The value of ``name``; an empty one is no value, as in a shell's ``NAME= command``."""
    value = _overrides[name] if name in _overrides else os.environ.get(name)
    return value if value else None


def expand_user(item: str, knob: str) -> Path:
    """``item`` with a leading ``~`` or ``~user`` expanded; an unknown user is a :class:`SettingError` naming ``knob``."""
    try:
        return Path(item).expanduser()
    except RuntimeError:  # pathlib's "Could not determine home directory"
        raise SettingError(f"{knob}: cannot expand {item!r}: no such user or home directory") from None


def cache_dirs() -> list[Path]:
    """``KGEN_CACHE_DIR``: the cache path, ``os.pathsep``-separated folders, else the one default folder.

    The default is the checkout's ``cache/``, else (installed) the user cache
    dir. kgen.cache makes the first writable folder take new entries and
    searches the others, read-only, after it. Empty items are skipped, as in
    ``PATH``; a folder that does not exist yet is fine (it is created on the
    first write).
    """
    value = _get("KGEN_CACHE_DIR")
    folders = [expand_user(item, "KGEN_CACHE_DIR") for item in value.split(os.pathsep) if item] if value else []
    if not folders:
        return [CHECKOUT / "cache" if CHECKOUT is not None else user_cache_dir()]
    return list(dict.fromkeys(folders))  # a folder named twice is one layer


def cache_dir() -> Path:
    """The first folder of the cache path: where new entries go, when it is writable."""
    return cache_dirs()[0]


def user_cache_dir() -> Path:
    """``$XDG_CACHE_HOME/kgen``, else ``~/.cache/kgen``.

    The XDG Base Directory spec says a relative ``XDG_CACHE_HOME`` is invalid and
    is to be ignored, so it is.
    """
    value = _get("XDG_CACHE_HOME")
    base = Path(value) if value and Path(value).is_absolute() else Path.home() / ".cache"
    return base / "kgen"


def spec_path_setting() -> str | None:
    """``KGEN_SPEC_PATH`` as set, unparsed: what the registry compares to know whether its folders changed."""
    return _get("KGEN_SPEC_PATH")


def user_spec_dirs() -> list[Path]:
    """``KGEN_SPEC_PATH``: extra spec folders, ``os.pathsep``-separated, searched before the built-in one.

    Empty items (``a::b``, a trailing separator) are skipped, as in ``PATH``; an
    item that is missing or not a folder is a :class:`SettingError`, since a
    mistyped folder would otherwise drop its variants without a word.
    """
    value = spec_path_setting()
    if not value:
        return []
    folders = []
    for item in value.split(os.pathsep):
        if not item:
            continue
        folder = expand_user(item, "KGEN_SPEC_PATH")
        if not folder.exists():
            raise SettingError(f"KGEN_SPEC_PATH: spec folder {folder} does not exist")
        if not folder.is_dir():
            raise SettingError(f"KGEN_SPEC_PATH: {folder} is not a folder")
        folders.append(folder)
    return folders


def arch_override() -> str | None:
    """``KGEN_ARCH`` (say ``sm_90a``): compile for this arch instead of the current device's (checked by kgen.arch)."""
    return _get("KGEN_ARCH")


def _switch(name: str) -> bool:
    # Only 0 and 1: tools read words such as "true", "yes" or "off" differently, so kgen does not guess at any.
    value = _get(name)
    if value is None or value == "0":
        return False
    if value == "1":
        return True
    raise SettingError(f"{name}: {value!r} is neither 0 nor 1")


def lineinfo() -> bool:
    """``KGEN_LINEINFO=1``: compile with line info (``-lineinfo``), for profilers and compute-sanitizer.

    It changes the cubin, so it is part of the cache key (through the NVRTC options).
    """
    return _switch("KGEN_LINEINFO")


def save_source() -> bool:
    """``KGEN_SAVE_SOURCE=1``: write the rendered source beside each entry kgen compiles (``<key>.cu``)."""
    return _switch("KGEN_SAVE_SOURCE")


def always_compile() -> bool:
    """``KGEN_ALWAYS_COMPILE=1``: compile every variant, ignoring cached entries (still writing the new ones)."""
    return _switch("KGEN_ALWAYS_COMPILE")


#: Where the gated delta rule's backward takes its per-chunk gradients (kgen.families.gated_delta_rule.backward),
#: the default first.
GDN_BACKWARD_PATHS = ("kernel", "torch")


def gdn_backward() -> str:
    """``KGEN_GDN_BACKWARD``: where the gated delta rule's backward (and so its autograd) takes the per-chunk
    gradients: ``kernel`` (the default, gated_delta_rule_chunk_grads) or ``torch`` (batched torch products, about
    6x slower at 1 x 32k; bench/NOTES.md)."""
    value = _get("KGEN_GDN_BACKWARD") or GDN_BACKWARD_PATHS[0]
    if value not in GDN_BACKWARD_PATHS:
        raise SettingError(f"KGEN_GDN_BACKWARD: {value!r} is none of {', '.join(GDN_BACKWARD_PATHS)}")
    return value


def check_settings() -> None:
    """Read every setting once, so that a bad value stops a command before it starts work.

    (``kgen build`` would otherwise report it as the failure of each variant.)
    """
    cache_dirs()
    user_spec_dirs()
    lineinfo()
    save_source()
    always_compile()
    gdn_backward()


@contextlib.contextmanager
def overrides(**values: str | None) -> Iterator[None]:
    """Set knobs for the duration of a ``with`` block (``overrides(KGEN_CACHE_DIR="/tmp/x")``)."""
    saved = dict(_overrides)
    _overrides.update(values)
    try:
        yield
    finally:
        _overrides.clear()
        _overrides.update(saved)
