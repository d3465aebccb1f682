"""Recompile cache entries and compare their cubins: how a fleet checks a cache that others can write to.

An entry's digest proves only that it is whole, not who wrote it: anyone who
can write to a cache folder can plant a cubin with a matching digest under the
key of a real variant. Keys are content addresses, so an entry can be checked
by doing its work again: render its variant from the current specs, check that
the source has the entry's key (else kgen would never load the entry), compile
it, and compare the cubin bytes (NVRTC's output is a function of the source,
options and toolchain, all of which the key covers).

Each entry file gets one :class:`Verdict`. Only a cubin kgen would load that
differs from a fresh compile (``mismatch``), or one that could not be checked
(``unchecked``), is a failure; an entry that is corrupt, of a variant that no
longer exists, or of a source that has changed (``stale``) is never loaded, and
is reported only.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable

from kgen.cache.store import ENTRY_SUFFIX, DiskCache, cache_key
from kgen.compiler import CompileError, compile_cubin
from kgen.registry import Variant
from kgen.render import RenderError, render

#: Every verdict, failures first; the failures fail a verification.
VERDICTS = ("mismatch", "unchecked", "match", "stale", "gone", "corrupt")
FAILURES = VERDICTS[:2]


@dataclass(frozen=True)
class Verdict:
    path: Path
    #: match, mismatch, unchecked (it could not be recompiled), stale, gone (no such variant) or corrupt.
    status: str
    variant: str = ""
    arch: str = ""
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.status in FAILURES

    def line(self) -> str:
        what = f"{self.variant} for {self.arch}: " if self.variant else ""
        return f"{self.status}: {what}{self.path}{f': {self.detail}' if self.detail else ''}"


def verify_entry(cache: DiskCache, path: Path, variants: dict[str, Variant],
                 archs: set[str] | None = None) -> Verdict | None:
    """The verdict on the entry file ``path`` of ``cache``, against ``variants`` (the spec path's, by name).

    None for an entry of an arch not in ``archs`` (when given).
    """
    try:
        entry = cache.read(path.name[:-len(ENTRY_SUFFIX)])[0]
    except (OSError, ValueError) as exc:
        return Verdict(path, "corrupt", detail=f"{exc}; kgen never loads it")
    if archs and entry.record.arch not in archs:
        return None
    found = Verdict(path, "", entry.variant_name, entry.record.arch)
    variant = variants.get(entry.variant_name)
    if variant is None:
        return _as(found, "gone", "no such variant on the spec path")
    try:
        source = render(variant)
        if cache_key(source, entry.record.arch) != entry.key:
            return _as(found, "stale", "its variant's source (spec, template, headers or settings) has changed; "
                                       "kgen never loads it")
        cubin, _ = compile_cubin(source, entry.record.arch, variant.name)
    except (CompileError, RenderError, ValueError) as exc:
        return _as(found, "unchecked", f"its variant does not compile now: {str(exc).splitlines()[0]}")
    if cubin != entry.cubin:
        return _as(found, "mismatch", f"its cubin ({len(entry.cubin)} bytes) is not what its variant compiles to "
                                      f"({len(cubin)} bytes)")
    return _as(found, "match", "")


def verify_caches(caches: Iterable[DiskCache], variants: list[Variant], jobs: int = 1,
                  archs: set[str] | None = None, done: Callable[[int], None] | None = None) -> list[Verdict]:
    """A verdict on every entry file of ``caches`` (with ``archs``, only theirs), in the caches' order.

    ``done`` is told how many files have been looked at, after each.

    Every file is checked, even one whose key another cache also holds: a planted
    copy in one folder is not vouched for by a good one in another.
    """
    by_name = {v.name: v for v in variants}
    files = [(cache, path) for cache in caches for path in cache.entries()]
    verdicts: list[Verdict | None] = []
    with ThreadPoolExecutor(max_workers=jobs) as pool:
        for verdict in pool.map(lambda item: verify_entry(*item, by_name, archs), files):
            verdicts.append(verdict)
            if done is not None:
                done(len(verdicts))
    return [v for v in verdicts if v is not None]


def _as(found: Verdict, status: str, detail: str) -> Verdict:
    return Verdict(found.path, status, found.variant, found.arch, detail)
