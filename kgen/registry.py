"""The spec search path, and the kernel families and variants it declares.

Spec folders are searched in order: folders added with :func:`add_spec_path`,
then ``KGEN_SPEC_PATH``, then the built-in ``specs/``. All files that name the
same family pool their variants, so a user folder can add a head dim or a tile
size to a built-in family; exactly one file names the family's template and
entries. When an op asks for a variant, the dispatcher picks among the
matching ones from the spec alone: those that agree with the family's
defaults first, then the earliest on the search path. An op that chooses per
call among several configurations (attention's tile shapes) asks for the best
variant of each, in search-path order, so a user folder's configurations lead.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgen import config
from kgen.spec import SpecError, SpecFile, load_spec_file


class UnsupportedVariantError(ValueError):
    """No variant of a family matches what an op asked for."""


@dataclass(frozen=True)
class Variant:
    family: "Family" = field(repr=False, compare=False, hash=False)
    params: tuple[tuple[str, Any], ...]
    spec_path: Path = field(compare=False, hash=False)

    @property
    def name(self) -> str:
        """``family[axis=value,...]``, unique within the search path."""
        body = ",".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in self.params)
        return f"{self.family.name}[{body}]"

    @property
    def param_dict(self) -> dict[str, Any]:
        return dict(self.params)


@dataclass
class Family:
    name: str
    template: str
    entries: tuple[str, ...]
    #: Where the template is looked up: the folder of the spec that names it, then the built-ins.
    template_dirs: tuple[Path, ...]
    allow_spills: bool
    axes: tuple[str, ...]
    defaults: dict[str, Any]
    variants: list[Variant] = field(default_factory=list)

    def supported(self, axis: str, **fixed: Any) -> list:
        """The values of ``axis`` over the variants that agree with ``fixed``."""
        values = {v.param_dict[axis] for v in self.variants
                  if all(v.param_dict.get(k) == x for k, x in fixed.items())}
        return sorted(values, key=lambda x: (type(x).__name__, x))

    def select(self, **required: Any) -> Variant:
        """The variant for these axis values, or an error listing what is supported."""
        return self.preferred(**required)[0]

    def preferred(self, *, group_by: tuple[str, ...] = (), **required: Any) -> list[Variant]:
        """The variants with these axis values that agree best with the spec's defaults.

        With ``group_by`` (say the tile shape), the defaults choose within each group of
        variants that share those axes' values, and one variant per group comes back, in
        search-path order (the first seen of each group leads): an op then picks among
        the groups itself. Without it, the one best variant comes back.
        """
        unknown = sorted((set(required) | set(group_by)) - set(self.axes))
        if unknown:
            raise UnsupportedVariantError(f"{self.name}: no axis {unknown}; axes: {list(self.axes)}")
        matches = [v for v in self.variants if all(v.param_dict[k] == x for k, x in required.items())]
        if not matches:
            fixed: dict[str, Any] = {}
            for axis, value in required.items():
                options = self.supported(axis, **fixed)
                if value not in options:
                    where = f" with {fixed}" if fixed else ""
                    raise UnsupportedVariantError(
                        f"{self.name}: {axis}={value!r} is not supported{where}; supported: {options}")
                fixed[axis] = value
        groups: dict[tuple, list[Variant]] = {}
        for v in matches:
            groups.setdefault(tuple(v.param_dict[axis] for axis in group_by), []).append(v)
        return [max(group, key=self._agreement_with_defaults) for group in groups.values()]

    def _agreement_with_defaults(self, variant: Variant) -> int:
        return sum(variant.param_dict[k] == x for k, x in self.defaults.items())


def _spec_files(folder: Path) -> list[Path]:
    return sorted(p for p in folder.glob("*.yaml")) + sorted(folder.glob("*.yml"))


class Registry:
    """All families found on a search path."""

    def __init__(self, spec_dirs: list[Path]):
        self.spec_dirs = spec_dirs
        self.families: dict[str, Family] = {}
        specs = [load_spec_file(p) for d in spec_dirs if d.is_dir() for p in _spec_files(d)]
        for family_name in dict.fromkeys(s.family for s in specs):
            self.families[family_name] = self._merge([s for s in specs if s.family == family_name])

    @staticmethod
    def _merge(specs: list[SpecFile]) -> Family:
        owners = [s for s in specs if s.template is not None]
        if len(owners) != 1:
            files = [str(s.path) for s in owners] or [str(s.path) for s in specs]
            raise SpecError(specs[0].path, "template", None,
                            f"family {specs[0].family!r} needs exactly one spec naming its template; "
                            f"found {len(owners)} in {files}")
        owner = owners[0]
        if owner.entries is None:
            raise SpecError(owner.path, "entries", None, "a spec that names a template must list its entries")
        family = Family(
            name=owner.family, template=owner.template, entries=owner.entries,
            template_dirs=(owner.path.parent, config.BUILTIN_TEMPLATE_DIR),
            allow_spills=owner.allow_spills, axes=tuple(owner.axes), defaults=owner.defaults,
        )
        seen = set()
        for spec in specs:
            if set(spec.axes) != set(owner.axes):
                raise SpecError(spec.path, "axes", None,
                                f"family {family.name!r} has axes {sorted(owner.axes)}; this file has {sorted(spec.axes)}")
            for assignment in spec.assignments:
                ordered = tuple((axis, dict(assignment)[axis]) for axis in family.axes)
                if ordered not in seen:
                    seen.add(ordered)
                    family.variants.append(Variant(family, ordered, spec.path))
        return family

    def family(self, name: str) -> Family:
        try:
            return self.families[name]
        except KeyError:
            raise UnsupportedVariantError(
                f"no kernel family {name!r} on the spec path {[str(d) for d in self.spec_dirs]}; "
                f"families: {sorted(self.families)}") from None

    def variants(self) -> list[Variant]:
        return [v for f in self.families.values() for v in f.variants]


_extra_dirs: list[Path] = []
_current: tuple[tuple[Path, ...], Registry] | None = None
#: Bumped whenever the registry is rebuilt; ops compare it to drop stale dispatch caches.
generation = 0


def spec_path() -> list[Path]:
    return [*_extra_dirs, *config.user_spec_dirs(), config.BUILTIN_SPEC_DIR]


def add_spec_path(folder: str | Path) -> None:
    """Search ``folder`` for specs too (before ``KGEN_SPEC_PATH`` and the built-ins)."""
    path = Path(folder).expanduser().resolve()
    if not path.is_dir():
        raise FileNotFoundError(f"spec folder {path} does not exist")
    if path in _extra_dirs:
        return
    _extra_dirs.insert(0, path)
    try:
        current()  # validate the new folder's specs now, and let ops see them
    except Exception:
        _extra_dirs.remove(path)
        raise


def current() -> Registry:
    """The registry for the current search path, rebuilt when the path changes."""
    global _current, generation
    dirs = tuple(spec_path())
    if _current is None or _current[0] != dirs:
        _current = (dirs, Registry(list(dirs)))
        generation += 1
    return _current[1]
