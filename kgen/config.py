"""Every setting kgen reads from the environment, in one place.

Each knob is read when it is asked for, so a test (or a user) can change the
environment, or use :func:`overrides`, without reloading modules. Nothing else
in kgen touches ``os.environ``.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Iterator

#: The source checkout kgen was imported from; ``templates/``, ``specs/`` and
#: the default ``cache/`` live here.
REPO_ROOT = Path(__file__).resolve().parent.parent
BUILTIN_TEMPLATE_DIR = REPO_ROOT / "templates"
BUILTIN_SPEC_DIR = REPO_ROOT / "specs"

_overrides: dict[str, str | None] = {}


def _get(name: str) -> str | None:
    if name in _overrides:
        return _overrides[name]
    value = os.environ.get(name)
    return value if value else None


def cache_dir() -> Path:
    """``KGEN_CACHE_DIR``, else the checkout's ``cache/``."""
    value = _get("KGEN_CACHE_DIR")
    return Path(value).expanduser() if value else REPO_ROOT / "cache"


def user_spec_dirs() -> list[Path]:
    """``KGEN_SPEC_PATH``: extra spec folders, ``os.pathsep``-separated, searched before the built-in one."""
    value = _get("KGEN_SPEC_PATH")
    if not value:
        return []
    return [Path(p).expanduser() for p in value.split(os.pathsep) if p]


def arch_override() -> str | None:
    """``KGEN_ARCH`` (say ``sm_90a``): compile for this arch instead of the current device's."""
    return _get("KGEN_ARCH")


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
