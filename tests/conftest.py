"""Shared fixtures for kgen's CPU tests."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

import kgen.config
import kgen.registry


@pytest.fixture
def cache_dir(tmp_path: Path) -> Iterator[Path]:
    """Point kgen at a fresh, not yet created cache folder for the duration of the test."""
    path = tmp_path / "cache"
    with kgen.config.overrides(KGEN_CACHE_DIR=str(path)):
        yield path


@pytest.fixture
def isolated_search_path() -> Iterator[None]:
    """``--spec-path`` and add_spec_path change module state; restore it, and keep KGEN_SPEC_PATH out."""
    saved = list(kgen.registry._extra_dirs)
    with kgen.config.overrides(KGEN_SPEC_PATH=None):
        yield
    kgen.registry._extra_dirs[:] = saved
