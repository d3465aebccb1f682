"""Shared fixtures for kgen's CPU tests."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

import kgen.config


@pytest.fixture
def cache_dir(tmp_path: Path) -> Iterator[Path]:
    """Point kgen at a fresh, not yet created cache folder for the duration of the test."""
    path = tmp_path / "cache"
    with kgen.config.overrides(KGEN_CACHE_DIR=str(path)):
        yield path
