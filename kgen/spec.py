"""Reading one spec file: safe YAML, schema validation, errors that point at a line.

A spec file declares a kernel family's variant space: axes with allowed values
(their cross product), optionally crossed with a list of configs (axes set
together, such as a head dim with its tile shape), exclusions and defaults. Every problem, whatever its
kind (bad YAML, a wrong type, an unknown key, an exclusion naming an axis the
file does not have, a cross product over :data:`~kgen.spec_schema.MAX_VARIANTS`)
is raised as :class:`SpecError` carrying the file, the key path and the line, so
a user never sees a stray traceback from a YAML file. A :class:`SpecFile` keeps
the line of each of its keys, so that checks spanning several files (the
registry's) can point at a line too.
"""

from __future__ import annotations

import itertools
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from kgen.files import FileTooLarge, NotARegularFile, read_regular_file
from kgen.spec_schema import VALIDATOR, variant_count_problem, yaml_spelling

#: Aliases can make a tiny file expand to a huge document; refuse anything this large.
_MAX_EXPANDED_NODES = 100_000
#: The deepest nesting a spec may have (the schema's deepest is four: sm_only -> axis -> value -> archs).
_MAX_DEPTH = 16
#: The deepest nesting the parser is let compose: libyaml's binding recurses per level without Python's
#: recursion limit, and 50,000 levels (100 kB of ``[``) crash the process.
_MAX_PARSE_DEPTH = 1000
_OPENING, _CLOSING = (yaml.SequenceStartEvent, yaml.MappingStartEvent), (yaml.SequenceEndEvent, yaml.MappingEndEvent)
#: The longest problem a schema error quotes (its message repeats the offending value, maybe a whole list).
_MAX_PROBLEM_CHARS = 400
#: The largest spec file kgen reads (the largest built-in one is a few kB).
MAX_SPEC_BYTES = 1 << 20
#: What YAML counts as a line break, to give the line of a byte that is not UTF-8.
_LINE_BREAK = re.compile("\r\n|[\r\n\x85\u2028\u2029]")


class SpecError(ValueError):
    """A spec file is malformed. ``str()`` reads ``file:line: key.path: problem``."""

    def __init__(self, file: Path | str, key_path: str, line: int | None, problem: str):
        self.file, self.key_path, self.line, self.problem = str(file), key_path, line, problem
        where = f"{self.file}:{line}" if line else self.file
        super().__init__(f"{where}: {key_path or '<top>'}: {problem}")


@dataclass(frozen=True)
class SpecFile:
    """One validated spec file."""

    path: Path
    family: str
    template: str | None
    entries: tuple[str, ...] | None
    #: The Python package whose ``contract`` module declares the family's launch contracts; None: none.
    host: str | None
    allow_spills: bool
    #: The oldest arch (``90`` for sm_90) the variants run on; None: any.
    min_sm: int | None
    #: Axis -> value (as spelled in YAML, a string) -> the only archs it runs on: ``{"mma": {"wgmma": (90,)}}``.
    sm_only: dict[str, dict[str, tuple[int, ...]]]
    #: Axis -> value (as spelled in YAML, a string) -> its cost factor for planners: ``{"mma": {"mma_sync": 1.25}}``.
    score_cost: dict[str, dict[str, float]]
    #: Every axis and its values: the axes the configs set, then the ``axes`` lists.
    axes: dict[str, tuple]
    #: The axes each config sets, in the first config's order; empty without configs.
    config_axes: tuple[str, ...]
    defaults: dict[str, Any]
    #: Each variant as (axis, value) pairs in axis order, after exclusions.
    assignments: tuple[tuple[tuple[str, Any], ...], ...]
    #: The line of each top-level key the file gives, and of each ``axes.<name>`` key.
    lines: dict[str, int]

    def error(self, key: str, problem: str) -> SpecError:
        """A :class:`SpecError` at ``key`` (a top-level key or ``axes.<name>``), on its line when the file has it."""
        return SpecError(self.path, key, self.lines.get(key), problem)


def _format_path(path) -> str:
    out = ""
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out


def _child(node: yaml.Node, part) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key, value in node.value:
            if key.value == str(part):
                return value
    elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
        return node.value[part]
    return None


def _key_node(node: yaml.Node, key: str) -> yaml.Node | None:
    if isinstance(node, yaml.MappingNode):
        for key_node, _ in node.value:
            if key_node.value == key:
                return key_node
    return None


def _line_of(root: yaml.Node, path) -> int | None:
    node = root
    for part in path:
        nxt = _child(node, part)
        if nxt is None:
            break
        node = nxt
    return node.start_mark.line + 1


def _key_lines(root: yaml.MappingNode) -> dict[str, int]:
    """The line of each top-level key and of each key under ``axes`` (of a file that passed the schema)."""
    lines = {}
    for key, value in root.value:
        lines[key.value] = key.start_mark.line + 1
        if key.value == "axes":
            lines.update((f"axes.{axis.value}", axis.start_mark.line + 1) for axis, _ in value.value)
    return lines


def _children(node: yaml.Node, path: tuple) -> list[tuple[yaml.Node, tuple]]:
    if isinstance(node, yaml.MappingNode):
        return [(value, path + (key.value,)) for key, value in node.value]
    if isinstance(node, yaml.SequenceNode):
        return [(item, path + (i,)) for i, item in enumerate(node.value)]
    return []


def _check_nodes(root: yaml.Node, file: Path) -> None:
    """Refuse duplicate keys, self-referencing aliases, alias bombs and deep nesting, walking the node graph
    without recursion.

    PyYAML keeps the last of two equal keys, which in a spec hides a mistake; an
    alias inside its own anchor would make validation recurse forever; aliases
    of aliases can expand a few lines into millions of values.
    """
    stack: list[tuple[yaml.Node, tuple, bool]] = [(root, (), False)]
    on_path: set[int] = set()
    expanded: dict[int, int] = {}  # node -> number of nodes it expands to, once fully walked
    while stack:
        node, path, leaving = stack.pop()
        children = _children(node, path)
        if leaving:
            on_path.discard(id(node))
            expanded[id(node)] = 1 + sum(expanded[id(child)] for child, _ in children)
            if expanded[id(node)] > _MAX_EXPANDED_NODES:
                raise SpecError(file, _format_path(path), node.start_mark.line + 1,
                                f"aliases expand this spec past {_MAX_EXPANDED_NODES} values")
            continue
        if id(node) in expanded:
            continue  # an alias of a node already checked
        if id(node) in on_path:
            raise SpecError(file, _format_path(path), node.start_mark.line + 1, "an alias refers to its own anchor")
        if len(path) > _MAX_DEPTH:  # the schema's validator recurses per level, as any reader of the value would
            raise SpecError(file, _format_path(path[:2]), node.start_mark.line + 1,
                            f"nested deeper than {_MAX_DEPTH} levels; a spec needs four")
        if isinstance(node, yaml.MappingNode):
            seen = set()
            for key, _ in node.value:
                if key.value in seen:
                    raise SpecError(file, _format_path(path + (key.value,)), key.start_mark.line + 1, "duplicate key")
                seen.add(key.value)
        on_path.add(id(node))
        stack.append((node, path, True))
        stack.extend((child, child_path, False) for child, child_path in reversed(children))


def _unconstructible_line(root: yaml.Node) -> int | None:
    """The line of the first scalar PyYAML cannot turn into a value (``!!int abc``)."""
    loader = yaml.SafeLoader("")
    stack, visited = [root], set()
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        if isinstance(node, yaml.ScalarNode):
            try:
                loader.construct_object(node)
            except Exception:
                return node.start_mark.line + 1
        stack.extend(child for child, _ in _children(node, ()))
    return None


def _schema_error(error: jsonschema.ValidationError, root: yaml.Node, file: Path) -> SpecError:
    path = tuple(error.absolute_path)
    if error.validator == "additionalProperties" and isinstance(error.instance, dict):
        allowed = set(error.schema.get("properties", {}))
        unknown = sorted(str(k) for k in error.instance if k not in allowed)
        parent = root
        for part in path:
            parent = _child(parent, part) or parent
        key = _key_node(parent, unknown[0]) if unknown else None
        line = key.start_mark.line + 1 if key is not None else _line_of(root, path)
        return SpecError(file, _format_path(path + tuple(unknown[:1])), line,
                         f"unknown key {_shortened(repr(unknown[0]))}; allowed: {sorted(allowed)}")
    return SpecError(file, _format_path(path), _line_of(root, path), _shortened(error.message))


def _shortened(text: str) -> str:
    """``text``, its middle elided past :data:`_MAX_PROBLEM_CHARS`: a schema error repeats the offending value."""
    half = _MAX_PROBLEM_CHARS // 2
    return text if len(text) <= _MAX_PROBLEM_CHARS else f"{text[:half]} ... {text[-half:]}"


# libyaml's parser where PyYAML was built with it: the pure-Python one is most of a process's first op
# call with a warm cache (reading the spec files).
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _parse(text: str, file: Path) -> tuple[Any, yaml.Node]:
    """The document's value and its node graph, from one pass of the YAML parser (after a pass over its events
    that bounds the nesting)."""
    root, loader = None, None
    try:
        _check_parse_depth(text, file)
        loader = _LOADER(text)  # reading starts here: it can refuse a control character
        root = loader.get_single_node()
        if root is None:
            raise SpecError(file, "", None, "empty spec file")
        _check_nodes(root, file)  # before constructing flattens merge keys (where an override looks like a duplicate)
        data = loader.construct_document(root)
    except SpecError:  # the checks' own refusals (ValueErrors, which the last clause would rewrap)
        raise
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        raise SpecError(file, "", mark.line + 1 if mark else None, f"invalid YAML: {exc.problem or exc}") from None
    except yaml.reader.ReaderError as exc:  # a control character; its str() spans two lines and counts bytes
        bad = yaml.reader.Reader.NON_PRINTABLE.search(text)
        raise SpecError(file, "", len(_LINE_BREAK.split(text[:bad.start()])) if bad else None,
                        f"invalid YAML: unacceptable character {bad and bad.group()!r}: {exc.reason}") from None
    except yaml.YAMLError as exc:
        raise SpecError(file, "", None, f"invalid YAML: {' '.join(str(exc).split())}") from None
    except RecursionError:
        raise SpecError(file, "", None, "invalid YAML: nested too deeply") from None
    except (ValueError, TypeError, IndexError, KeyError, AttributeError) as exc:
        # PyYAML's constructors raise these for a malformed tagged scalar (``!!int abc``).
        line = _unconstructible_line(root) if root is not None else None
        raise SpecError(file, "", line, f"invalid YAML value: {exc}") from None
    finally:
        if loader is not None:
            loader.dispose()
    return data, root


def _check_parse_depth(text: str, file: Path) -> None:
    """Refuse nesting past :data:`_MAX_PARSE_DEPTH` from the parser's events, which come one at a time,
    before anything composes the node graph recursively."""
    loader, depth = _LOADER(text), 0
    try:
        while loader.check_event():
            event = loader.get_event()
            depth += isinstance(event, _OPENING) - isinstance(event, _CLOSING)
            if depth > _MAX_PARSE_DEPTH:
                raise SpecError(file, "", event.start_mark.line + 1,
                                f"nested deeper than {_MAX_DEPTH} levels; a spec needs four")
    finally:
        loader.dispose()


def _read_bytes(file: Path) -> bytes:
    """The bytes of ``file``, a regular file of at most :data:`MAX_SPEC_BYTES` (see :mod:`kgen.files`)."""
    try:
        return read_regular_file(file, MAX_SPEC_BYTES)
    except NotARegularFile:
        raise SpecError(file, "", None, "not a regular file (a device, FIFO, socket or folder); specs are files") from None
    except FileTooLarge:
        raise SpecError(file, "", None, f"larger than {MAX_SPEC_BYTES} bytes, the most a spec may be") from None
    except OSError as exc:
        raise SpecError(file, "", None, f"cannot read: {exc}") from None


def _read_text(file: Path) -> str:
    raw = _read_bytes(file)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = len(_LINE_BREAK.split(raw[:exc.start].decode("utf-8")))  # the prefix before the bad byte is valid
        raise SpecError(file, "", line, f"not UTF-8 text: byte {exc.start} is {raw[exc.start]:#04x}") from None


def _axis_values(data: dict) -> dict[str, list]:
    """Every axis of the file and its values: the axes the configs set, then the ``axes`` lists."""
    values: dict[str, list] = {}
    for config in data.get("configs", []):
        for axis, value in config.items():
            bucket = values.setdefault(axis, [])
            if value not in bucket:
                bucket.append(value)
    values.update((axis, list(v)) for axis, v in data["axes"].items())
    return values


def _check_configs(data: dict, root: yaml.Node, file: Path) -> None:
    """Each config sets the same axes, none of which ``axes`` also lists."""
    configs = data.get("configs", [])
    for index, config in enumerate(configs):
        where = ("configs", index)
        for axis in config:
            if axis in data["axes"]:
                raise SpecError(file, _format_path(where + (axis,)), _line_of(root, where + (axis,)),
                                f"{axis!r} is set both here and in axes; give it in one place")
        if set(config) != set(configs[0]):
            raise SpecError(file, _format_path(where), _line_of(root, where),
                            f"every config must set the same axes; configs[0] sets {sorted(configs[0])}, "
                            f"this one {sorted(config)}")


def _check_assignment(data: dict, section: str, root: yaml.Node, file: Path) -> None:
    """Exclusions and defaults may only name this file's axes and their values."""
    values = _axis_values(data)
    items = data.get(section, [])
    for index, assignment in enumerate(items if isinstance(items, list) else [items]):
        base = (section, index) if isinstance(items, list) else (section,)
        for axis, value in assignment.items():
            if axis not in values:
                raise SpecError(file, _format_path(base + (axis,)), _line_of(root, base + (axis,)),
                                f"{axis!r} is not an axis of this spec; axes: {sorted(values)}")
            if value not in values[axis]:  # an exclusion of an absent value excludes nothing: a typo
                what = "default" if section == "defaults" else "excluded value"
                raise SpecError(file, _format_path(base + (axis,)), _line_of(root, base + (axis,)),
                                f"{what} {value!r} is not among the axis values {values[axis]}")


def _expand(data: dict) -> tuple[tuple[tuple[str, Any], ...], ...]:
    """The cross product of ``axes`` for each config (or once, without configs), less the exclusions."""
    axes = data["axes"]
    # Exclusions grouped by the axes they name, as sets of value tuples: testing a variant
    # costs one lookup per group, not one comparison per exclusion.
    excluded: dict[tuple[str, ...], set[tuple]] = {}
    for exclusion in data.get("exclude", []):
        names = tuple(sorted(exclusion))
        excluded.setdefault(names, set()).add(tuple(exclusion[n] for n in names))
    # The configs' axes (the head dim, say) lead each variant's name.
    order = list(_axis_values(data))
    out = []
    for config in data.get("configs") or [{}]:
        for values in itertools.product(*axes.values()):
            assignment = dict(zip(axes, values), **config)
            if any(tuple(assignment[n] for n in names) in rows for names, rows in excluded.items()):
                continue
            out.append(tuple((axis, assignment[axis]) for axis in order))
    return tuple(out)


def load_spec_file(path: Path | str) -> SpecFile:
    """Read, validate and expand one spec file, or raise :class:`SpecError`."""
    file = Path(path)
    data, root = _parse(_read_text(file), file)
    error = jsonschema.exceptions.best_match(VALIDATOR.iter_errors(data))
    if error is not None:
        raise _schema_error(error, root, file)
    lines = _key_lines(root)
    if "template" in data and "entries" not in data:
        raise SpecError(file, "template", lines["template"], "a spec that names a template must list its entries")
    if (problem := variant_count_problem(data)) is not None:  # from the axis sizes, before expanding anything
        raise SpecError(file, "axes", lines["axes"], problem)
    _check_configs(data, root, file)
    _check_assignment(data, "exclude", root, file)
    _check_assignment(data, "defaults", root, file)
    assignments = _expand(data)
    if not assignments:
        raise SpecError(file, "exclude", _line_of(root, ("exclude",)), "the exclusions remove every variant")
    entries = data.get("entries")
    configs = data.get("configs")
    return SpecFile(
        path=file,
        family=data["family"],
        template=data.get("template"),
        entries=tuple(entries) if entries else None,
        host=data.get("host"),
        allow_spills=data.get("allow_spills", False),
        min_sm=data.get("min_sm"),
        sm_only={axis: {yaml_spelling(value): tuple(sms) for value, sms in table.items()}
                 for axis, table in data.get("sm_only", {}).items()},
        score_cost={axis: {yaml_spelling(value): float(cost) for value, cost in table.items()}
                    for axis, table in data.get("score_cost", {}).items()},
        axes={k: tuple(v) for k, v in _axis_values(data).items()},
        config_axes=tuple(configs[0]) if configs else (),
        defaults=dict(data.get("defaults", {})),
        assignments=assignments,
        lines=lines,
    )
