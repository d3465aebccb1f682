"""The spec search path, and the kernel families and variants it declares.

Spec folders are searched in order: folders added with :func:`add_spec_path`,
then ``KGEN_SPEC_PATH``, then the built-in ``specs/``. All files that name the
same family pool their variants, so a user folder can add a head dim or a tile
size to a built-in family; exactly one file names the family's template and
entries, and the other files must agree with it on the axes, on which axes
the configs set, and on any family-wide key they repeat (``entries``,
``allow_spills``, ``min_sm``, ``defaults``). When an op asks for a variant,
the dispatcher picks among the matching ones from the spec alone: those that
agree with the family's defaults first, then the earliest on the search path.
An op that chooses per call among several configurations (attention's tile
shapes) asks for the best variant of each, in search-path order, so a user
folder's configurations lead.

The module keeps one registry, for the current path: switching folders
replaces it rather than keeping one per folder. The only list that grows is
that of the folders a caller adds with :func:`add_spec_path`, each once.
"""

from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kgen import config
from kgen.spec import SpecError, SpecFile, load_spec_file
from kgen.spec_schema import MAX_VARIANTS, yaml_spelling


class UnsupportedVariantError(ValueError):
    """No variant of a family matches what an op asked for."""


class SpecPathWarning(UserWarning):
    """Files on the spec path that look like specs but are not read."""


class SpecPathError(FileNotFoundError, ValueError):
    """A folder on the spec search path is missing or is not a folder.

    A ``FileNotFoundError`` for :func:`add_spec_path`'s callers, and a
    ``ValueError`` like every other bad-input error (the CLI exits 2 on those).
    """


#: Family-wide keys: the file naming the template sets them, another may only repeat them.
_FAMILY_KEYS = ("entries", "host", "allow_spills", "min_sm", "sm_only", "score_cost", "defaults")


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

    def supports_sm(self, sm: int) -> bool:
        """Whether this variant runs on arch ``sm`` (``90`` for sm_90a): its family's ``min_sm`` and ``sm_only`` allow it."""
        return self.arch_refusal(sm) is None

    @property
    def score_cost(self) -> float:
        """The cost of a unit of this variant's work relative to others, by its spec's ``score_cost`` (1 by default)."""
        cost = 1.0
        for axis, table in self.family.score_cost.items():
            cost *= table.get(yaml_spelling(self.param_dict.get(axis)), 1.0)
        return cost

    def arch_refusal(self, sm: int) -> str | None:
        """Why this variant cannot run on arch ``sm``, as the spec says it; None if it can."""
        family = self.family
        if family.min_sm is not None and sm < family.min_sm:
            return f"need sm_{family.min_sm} or newer (min_sm in its spec)"
        for axis, table in family.sm_only.items():
            value = self.param_dict.get(axis)
            only = table.get(yaml_spelling(value))
            if only is not None and sm not in only:
                return f"with {axis}={value} run on {', '.join(f'sm_{n}' for n in only)} only (sm_only in its spec)"
        return None


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
    #: The oldest arch (``90`` for sm_90) the variants run on; None: any.
    min_sm: int | None = None
    #: The axes the spec's configs set together (a tile shape), in the spec's order; empty without configs.
    config_axes: tuple[str, ...] = ()
    #: Axis values that run on some archs alone (see ``sm_only`` in kgen.spec_schema).
    sm_only: dict = field(default_factory=dict)
    #: Cost factors of axis values for planners (see ``score_cost`` in kgen.spec_schema).
    score_cost: dict = field(default_factory=dict)
    #: The package whose ``contract`` module declares the family's launch contracts (None: kgen cannot launch it).
    host: str | None = None

    def axis_values(self, axis: str, **fixed: Any) -> list:
        """The values of ``axis`` over the variants that agree with ``fixed``, in search-path and spec order."""
        values = (v.param_dict[axis] for v in self.variants
                  if all(v.param_dict.get(k) == x for k, x in fixed.items()))
        return list(dict.fromkeys(values))

    def supported(self, axis: str, **fixed: Any) -> list:
        """The values of ``axis`` over the variants that agree with ``fixed``, sorted."""
        return sorted(self.axis_values(axis, **fixed), key=lambda x: (type(x).__name__, x))

    def select(self, /, **required: Any) -> Variant:
        """The variant for these axis values, or an error listing what is supported."""
        # Checked here first: a caller's key (kgen render's, say) must not reach preferred's own group_by.
        self._check_axes(required)
        return self.preferred(**required)[0]

    def preferred(self, /, *, group_by: tuple[str, ...] = (), **required: Any) -> list[Variant]:
        """The variants with these axis values that agree best with the spec's defaults.

        With ``group_by`` (say the tile shape), the defaults choose within each group of
        variants that share those axes' values, and one variant per group comes back, in
        search-path order (the first seen of each group leads): an op then picks among
        the groups itself. Without it, the one best variant comes back.
        """
        self._check_axes([*required, *group_by])
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

    def _check_axes(self, names) -> None:
        unknown = sorted(set(names) - set(self.axes))
        if unknown:
            raise UnsupportedVariantError(f"{self.name}: no axis {unknown}; axes: {list(self.axes)}")

    def _agreement_with_defaults(self, variant: Variant) -> int:
        return sum(variant.param_dict[k] == x for k, x in self.defaults.items())


#: What a spec file's name ends with, in any case.
SPEC_SUFFIXES = (".yaml", ".yml")


def _spec_files(folder: Path) -> list[Path]:
    """The spec files of ``folder``: its own files named ``*.yaml`` or ``*.yml`` (any case), hidden ones
    (an editor's ``.#spec.yaml`` lock, say) excepted. Specs in its subfolders are not read: a warning
    names each such subfolder, which can join the search path itself."""
    found, skipped = [], []
    try:
        listing = sorted(folder.iterdir())
    except OSError as exc:  # unreadable: an error naming the folder, not a bare errno
        raise SpecPathError(f"spec folder {folder} cannot be read: {exc.strerror or exc}") from None
    for entry in listing:
        if entry.suffix.lower() not in SPEC_SUFFIXES and not entry.is_dir():
            continue
        if entry.name.startswith("."):
            continue
        if entry.is_dir():
            if any(p.suffix.lower() in SPEC_SUFFIXES and not p.name.startswith(".") for p in _first(entry)):
                skipped.append(entry)
            continue
        found.append(entry)
    for subfolder in skipped:
        warnings.warn(f"spec folder {folder}: specs in the subfolder {subfolder.name}/ are not read "
                      f"(add {subfolder} to the spec path to read them)", SpecPathWarning, stacklevel=2)
    return found


def _first(subfolder: Path, limit: int = 1000) -> list:
    """At most ``limit`` entries of ``subfolder``: a look into it must stay cheap however large it is, and one that
    cannot be read (it is only looked into for a warning) has none."""
    try:
        return list(itertools.islice(subfolder.iterdir(), limit))
    except OSError:
        return []


def _check_folder(folder: Path, where: str = "") -> None:
    if not folder.is_dir():
        problem = "is not a folder" if folder.exists() else "does not exist"
        raise SpecPathError(f"spec folder {folder} {where}{problem}")


def _where(spec: SpecFile, key: str) -> str:
    line = spec.lines.get(key)
    return f"{spec.path}:{line}" if line else str(spec.path)


def _template_owner(specs: list[SpecFile]) -> SpecFile:
    """The one file of a family that names its template."""
    owners = [s for s in specs if s.template is not None]
    name = specs[0].family
    if not owners:
        raise specs[0].error("family", f"family {name!r} needs exactly one spec naming its template; found 0 in "
                                       f"{[str(s.path) for s in specs]}")
    if len(owners) > 1:
        raise owners[1].error("template", f"family {name!r} needs exactly one spec naming its template; found "
                                          f"{len(owners)} in {[_where(s, 'template') for s in owners]}")
    return owners[0]


def _check_agrees_with_owner(spec: SpecFile, owner: SpecFile) -> None:
    """A file adding variants to a family must have the family's axes, configs and family-wide keys."""
    extra = [a for a in spec.axes if a not in owner.axes]
    # An axis the family gained after this file was written takes the family's default (the file keeps working);
    # one without a default is ambiguous, and named.
    missing = [a for a in owner.axes if a not in spec.axes and a not in owner.defaults]
    if missing and not extra:
        raise spec.error("axes", f"family {spec.family!r} has the axis {missing[0]!r} ({_where(owner, 'axes')}), "
                                 f"which this file does not give and the family has no default for: give "
                                 f"{missing[0]} in this file's axes or configs")
    if extra or missing:
        key = "axes"
        if extra:  # the first extra axis's own line, or the configs' line when a config sets it
            key = f"axes.{extra[0]}" if f"axes.{extra[0]}" in spec.lines else "configs"
        difference = "".join(f"; {label}: {axes}" for label, axes in (("missing", missing), ("extra", extra)) if axes)
        raise spec.error(key, f"family {spec.family!r} has axes {sorted(owner.axes)} ({_where(owner, 'axes')}); "
                              f"this file has {sorted(spec.axes)}{difference}")
    defaulted = {a for a in owner.axes if a not in spec.axes}
    if set(spec.config_axes) | (defaulted & set(owner.config_axes)) != set(owner.config_axes):
        raise spec.error("configs" if spec.config_axes else "axes",
                         f"the configs of family {spec.family!r} set {list(owner.config_axes)} "
                         f"({_where(owner, 'configs')}); this file's set {list(spec.config_axes)}")
    for key in _FAMILY_KEYS:
        if spec is not owner and key in spec.lines and getattr(spec, key) != getattr(owner, key):
            raise spec.error(key, f"{key} is the same for the whole family and set by the file naming its "
                                  f"template, {_where(owner, key if key in owner.lines else 'template')}: "
                                  f"{getattr(owner, key)!r}; this file gives {getattr(spec, key)!r}")


def _check_value_tables(family: Family, owner: SpecFile) -> None:
    """Each ``sm_only`` and ``score_cost`` entry names an axis of the family and one of its values (in any file):
    an entry that matches nothing, a typo such as ``wgmmma``, would silently lift an arch restriction or a cost."""
    for key in ("sm_only", "score_cost"):
        for axis, table in getattr(family, key).items():
            if axis not in family.axes:
                raise SpecError(owner.path, f"{key}.{axis}", owner.lines.get(key),
                                f"{axis!r} is not an axis of family {family.name!r}; axes: {list(family.axes)}")
            spelled = [yaml_spelling(value) for value in family.axis_values(axis)]
            for value in table:
                if value not in spelled:
                    raise SpecError(owner.path, f"{key}.{axis}.{value}", owner.lines.get(key),
                                    f"{value!r} is not a value of the family's axis {axis!r}; its values: {spelled}")


class Registry:
    """All families found on a search path."""

    def __init__(self, spec_dirs: list[Path]):
        self.spec_dirs = spec_dirs
        self.families: dict[str, Family] = {}
        # A folder listed twice (the built-in one in KGEN_SPEC_PATH, say) is searched once, where it first appears.
        folders: dict[Path, Path] = {}
        for folder in spec_dirs:
            _check_folder(folder, "on the spec search path ")
            folders.setdefault(folder.resolve(), folder)
        specs = [load_spec_file(p) for d in folders.values() for p in _spec_files(d)]
        for family_name in dict.fromkeys(s.family for s in specs):
            self.families[family_name] = self._merge([s for s in specs if s.family == family_name])

    @staticmethod
    def _merge(specs: list[SpecFile]) -> Family:
        owner = _template_owner(specs)
        family = Family(
            name=owner.family, template=owner.template, entries=owner.entries, host=owner.host,
            template_dirs=(owner.path.parent, config.BUILTIN_TEMPLATE_DIR),
            allow_spills=owner.allow_spills, axes=tuple(owner.axes), defaults=owner.defaults,
            min_sm=owner.min_sm, config_axes=owner.config_axes, sm_only=owner.sm_only,
            score_cost=owner.score_cost,
        )
        seen = set()
        for spec in specs:
            _check_agrees_with_owner(spec, owner)
            for assignment in spec.assignments:
                given = dict(assignment)
                ordered = tuple((axis, given[axis] if axis in given else family.defaults[axis]) for axis in family.axes)
                if ordered not in seen:
                    seen.add(ordered)
                    family.variants.append(Variant(family, ordered, spec.path))
            if len(family.variants) > MAX_VARIANTS:
                raise spec.error("axes", f"family {family.name!r} reaches {len(family.variants)} variants with "
                                         f"this file; a family may have at most {MAX_VARIANTS}")
        _check_value_tables(family, owner)
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
    path = config.expand_user(str(folder), "add_spec_path").resolve()
    _check_folder(path)
    if path in _extra_dirs:
        return
    _extra_dirs.insert(0, path)
    try:
        current()  # validate the new folder's specs now, and let ops see them
    except Exception:
        _extra_dirs.remove(path)
        raise


def current() -> Registry:
    """The registry for the current search path, rebuilt when the path changes.

    Cheap when nothing changed (ops ask on every call, through :class:`kgen.runtime.dispatch.SpecPathMemo`): the
    folders added here and ``KGEN_SPEC_PATH`` as set are compared, and the folders are only resolved and checked
    when they differ."""
    global _current, generation
    setting = (tuple(_extra_dirs), config.spec_path_setting())
    if _current is None or _current[0] != setting:
        _current = (setting, Registry(spec_path()))
        generation += 1
    return _current[1]
