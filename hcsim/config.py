"""Reading YAML specs: the only module that sees raw YAML.

Specs are checked at this boundary with the field path of every value
(``links.cxl.bandwidth``), unknown keys are rejected with a suggestion, and
all problems of a file are reported at once in one ConfigError.

Every spec file (scenario, platform, device catalog, workload, experiment)
and every ``--set`` value is read by :func:`load_yaml` / :func:`parse_yaml`,
which bound what a file may cost before any of it is used: its size
(:data:`MAX_SPEC_BYTES`; regular files only, so ``/dev/zero`` or a pipe is
refused), its nesting depth (:data:`MAX_DEPTH`, aliases included) and the
size of its tree once aliases are expanded (:data:`MAX_NODES`: a "billion
laughs" file is refused). A key given twice in one mapping is an error.
"""

from __future__ import annotations

import copy
import difflib
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from hcsim.errors import ConfigError, brief
from hcsim.units import parse_quantity

__all__ = ["REPO_ROOT", "load_yaml", "parse_yaml", "read_text", "resolve_spec", "Fields", "parse_settings",
           "apply_overrides", "check_output_folder", "check_output_file", "MAX_SPEC_BYTES", "MAX_DEPTH", "MAX_NODES"]

REPO_ROOT = Path(__file__).resolve().parents[1]

MAX_SPEC_BYTES = 8 * 2**20  # a spec file is at most 8 MiB (the built-in ones are a few kB)
MAX_DEPTH = 64  # mappings and lists nested at most this deep (aliases expanded)
MAX_NODES = 2_000_000  # values in a spec once its aliases are expanded


def resolve_spec(name: str | Path, folder: str, base: Path | None = None) -> Path:
    """Find a spec: a path (relative to `base` or the working directory), or a built-in name.

    `folder` is ``platforms``, ``workloads`` or ``experiments``; a bare name
    such as ``paper-cxl`` means ``REPO_ROOT/folder/paper-cxl.yaml``.
    """
    if not isinstance(name, (str, Path)) or not str(name).strip():
        raise ConfigError(f"{folder[:-1]} spec: expected a file path or a built-in name, got {brief(name)}")
    path = Path(name)
    candidates = [path] if path.is_absolute() else [(base or Path.cwd()) / path]
    candidates += [REPO_ROOT / folder / path, REPO_ROOT / folder / f"{path}.yaml"]
    for candidate in candidates:
        try:
            if candidate.is_file():
                if candidate.parent == REPO_ROOT / folder and candidate.stem in _NOT_SPECS.get(folder, ()):
                    continue
                return candidate
        except OSError:  # a name too long for the file system, a path through a file
            continue
    for candidate in candidates[:1]:
        try:
            there = candidate.exists()
        except OSError as err:  # a name longer than the file system allows, say
            raise ConfigError(f"{brief(name)}: cannot be a file here ({err.strerror}); give a YAML file or a "
                              f"built-in {folder} spec name") from None
        if there:
            raise ConfigError(f"{name}: not a regular file (a folder, device or pipe); give a YAML file")
    builtin = sorted(p.stem for p in (REPO_ROOT / folder).glob("*.yaml") if p.stem not in _NOT_SPECS.get(folder, ()))
    raise ConfigError(f"{name}: no such file, nor a built-in {folder} spec; built-in ones: {', '.join(builtin)}")


_NOT_SPECS = {"platforms": ("devices", "compute-model")}  # the device catalog and the roofline factors: not platforms


def read_text(path: str | Path, limit: int = MAX_SPEC_BYTES, what: str = "a spec") -> str:
    """The UTF-8 text of a regular file of at most `limit` bytes.

    Raises
    ------
    ConfigError
        naming the file: missing, not a regular file (``/dev/zero``, a pipe, a
        folder), larger than `limit`, or not UTF-8 text.
    """
    path = Path(path)
    try:
        info = os.stat(path)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from err
    if stat.S_ISDIR(info.st_mode):
        raise ConfigError(f"{path}: is a folder; expected {what} file")
    if not stat.S_ISREG(info.st_mode):
        raise ConfigError(f"{path}: not a regular file (a device, pipe or socket); expected {what} file")
    too_big = ConfigError(f"{path}: larger than {limit / 2**20:g} MiB, the limit for {what} file; "
                          "is it the right file?")
    if info.st_size > limit:
        raise too_big
    try:
        with open(path, "rb") as stream:
            data = stream.read(limit + 1)
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror or err}") from err
    if len(data) > limit:
        raise too_big
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ConfigError(f"{path}:{line}: not UTF-8 text (byte 0x{data[err.start]:02x} at offset {err.start}); "
                          f"expected {what} file saved as UTF-8") from None


class _NoDuplicateKeys:
    """A SafeConstructor mix-in that refuses a key given twice in one mapping (yaml.safe_load keeps the last)."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            seen: dict[tuple[str, str], Any] = {}
            for key, _ in node.value:
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    first = seen.setdefault((key.tag, key.value), key.start_mark)
                    if first is not key.start_mark:
                        raise _TooLarge(f"key {brief(key.value)} given twice in one mapping (first on line "
                                        f"{first.line + 1}); keep one", key.start_mark)
        return super().construct_mapping(node, deep)


class _SpecLoader(_NoDuplicateKeys, yaml.SafeLoader):
    """The pure-Python safe loader, refusing duplicate keys and nesting deeper than MAX_DEPTH as it composes."""

    def __init__(self, stream):
        super().__init__(stream)
        self.depth = 0

    def compose_node(self, parent, index):
        self.depth += 1
        try:
            if self.depth > MAX_DEPTH:
                raise _TooLarge(f"nested more than {MAX_DEPTH} levels deep", self.peek_event().start_mark)
            return super().compose_node(parent, index)
        finally:
            self.depth -= 1


class _TooLarge(yaml.YAMLError):
    def __init__(self, problem: str, mark):
        super().__init__(problem)
        self.problem, self.problem_mark = problem, mark


def _check_expansion(root: yaml.Node) -> None:
    """Refuse a tree whose aliases expand it beyond MAX_NODES values or MAX_DEPTH levels, or into itself."""
    known: dict[int, tuple[int, int]] = {}  # id(node) -> (values, levels) once expanded
    active: set[int] = set()

    def walk(node: yaml.Node, depth: int) -> tuple[int, int]:
        if id(node) in active:
            raise _TooLarge("an alias refers to a value that contains it (a recursive alias)", node.start_mark)
        if id(node) not in known:
            if depth > MAX_DEPTH:
                raise _TooLarge(f"nested more than {MAX_DEPTH} levels deep once its aliases are expanded",
                                node.start_mark)
            children = (node.value if isinstance(node, yaml.SequenceNode) else
                        [n for pair in node.value for n in pair] if isinstance(node, yaml.MappingNode) else [])
            active.add(id(node))
            below = [walk(child, depth + 1) for child in children]
            active.discard(id(node))
            known[id(node)] = (1 + sum(b[0] for b in below), 1 + max((b[1] for b in below), default=0))
        values, levels = known[id(node)]
        if depth + levels - 1 > MAX_DEPTH:
            raise _TooLarge(f"nested more than {MAX_DEPTH} levels deep once its aliases are expanded", node.start_mark)
        if values > MAX_NODES:
            raise _TooLarge(f"more than {MAX_NODES:,} values once its aliases are expanded (an alias bomb?)",
                            node.start_mark)
        return values, levels

    walk(root, 1)


# libyaml's loader when PyYAML has it (several times faster); it composes nested flow collections
# recursively in C (100,000 "[" crash the process), so text nested deeper than MAX_DEPTH in flow style
# goes to the pure-Python loader, which refuses it with a message.
_FastLoader = (type("_FastLoader", (_NoDuplicateKeys, yaml.CSafeLoader), {}) if hasattr(yaml, "CSafeLoader")
               else None)


def _flow_depth(text: str) -> int:
    """An upper bound of the nesting of flow collections ([...], {...}) in YAML `text`."""
    if text.count("[") + text.count("{") <= MAX_DEPTH:
        return 0
    depth = deepest = 0
    for match in re.finditer(r"[\[\]{}]", text):
        depth = depth + 1 if match.group() in "[{" else max(depth - 1, 0)
        deepest = max(deepest, depth)
    return deepest


def parse_yaml(text: str, where: str) -> Any:
    """Parse YAML `text` with ``yaml.safe_load``'s types, within the bounds above; errors start with `where`."""
    loader = None
    try:
        fast = _FastLoader is not None and _flow_depth(text) <= MAX_DEPTH
        loader = _FastLoader(text) if fast else _SpecLoader(text)
        node = loader.get_single_node()
        if node is None:
            return None
        _check_expansion(node)
        return loader.construct_document(node)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark and where and not where.startswith("--") else ""
        problem = getattr(err, "problem", None) or getattr(err, "reason", None) or str(err).split("\n")[0]
        raise ConfigError(f"{where}{line}: not valid YAML: {problem}") from None
    except RecursionError:
        raise ConfigError(f"{where}: not valid YAML: nested too deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


def load_yaml(path: str | Path) -> Any:
    """Read and parse a YAML spec file within the bounds above; errors name the file and line."""
    return parse_yaml(read_text(path), str(path))


class Fields:
    """A mapping from a spec, read field by field with its path and problems collected.

    >>> f = Fields({"bandwidth": "128GB/s"}, "pod.yaml: links.cxl")
    >>> f.quantity("bandwidth", "bandwidth")
    128000000000.0
    >>> f.done()
    """

    def __init__(self, data: Any, where: str, problems: list[str] | None = None,
                 origins: Mapping[str, str] | None = None):
        self.where = where
        self.origins = origins or {}  # key -> where its value was written, when not in `where` (e.g. "--set ")
        self.problems = problems if problems is not None else []
        self.seen: set[str] = set()
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            self.problems.append(f"{where}: expected a mapping, got {type(data).__name__}")
            data = {}
        self.data = data

    def path(self, key: str) -> str:
        if key in self.origins:
            return f"{self.origins[key]}{key}"
        return f"{self.where}.{key}" if self.where and not self.where.endswith(": ") else f"{self.where}{key}"

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        return self.data.get(key, default)

    def _fail(self, key: str, message: str, default: Any) -> Any:
        self.problems.append(f"{self.path(key)}: {message}")
        return None if default is ... else default

    def quantity(self, key: str, dimension: str, default: Any = ..., positive: bool = True,
                 physical: str | None = None) -> Any:
        """A value with a unit, in SI base units; `positive` rejects zero and negatives; a value outside the
        physical range of `physical` (default: of `dimension`; hcsim.limits.PHYSICAL_RANGES) is refused."""
        if key not in self.data:
            return self._missing(key, default)
        try:
            value = parse_quantity(self.raw(key), dimension, self.path(key))
        except ConfigError as err:  # its message already names the field
            self.problems.append(str(err))
            return None
        if positive and not value > 0:
            return self._fail(key, f"must be > 0, got {brief(self.data[key])}", None)
        return self._in_range(value, physical or dimension, key, self.data[key])

    def _in_range(self, value: Any, quantity: str | None, key: str, text: Any) -> Any:
        """`value`, or None with a problem recorded when it is outside the physical range of `quantity`."""
        from hcsim.limits import check_range

        problem = check_range(value, quantity, self.path(key), text) if quantity else None
        if problem:
            self.problems.append(problem)
            return None
        return value

    def number(self, key: str, default: Any = ..., kind: type = float, minimum: float | None = None,
               maximum: float | None = None, physical: str | None = None) -> Any:
        """A plain number (a count or a ratio: no unit), within [minimum, maximum] when given, and within the
        physical range of `physical` (hcsim.limits.PHYSICAL_RANGES) when given."""
        if key not in self.data:
            return self._missing(key, default)
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            return self._fail(key, f"expected {'an integer' if kind is int else 'a number'}, got {brief(value)}", default)
        if minimum is not None and value < minimum:
            return self._fail(key, f"must be >= {minimum}, got {brief(value)}", default)
        if maximum is not None and value > maximum:
            return self._fail(key, f"must be <= {maximum:,} (hcsim.limits), got {brief(value)}", default)
        return self._in_range(kind(value), physical, key, value)

    def choice(self, key: str, options: Iterable[str], default: Any = ...) -> Any:
        if key not in self.data:
            return self._missing(key, default)
        value = self.raw(key)
        options = list(options)
        if value not in options:
            return self._fail(key, f"{brief(value)} is not one of {', '.join(map(str, options))}{_suggest(value, options)}", default)
        return value

    def string(self, key: str, default: Any = ...) -> Any:
        if key not in self.data:
            return self._missing(key, default)
        value = self.raw(key)
        if not isinstance(value, str):
            return self._fail(key, f"expected a string, got {brief(value)}", default)
        return value

    def flag(self, key: str, default: Any = ...) -> Any:
        if key not in self.data:
            return self._missing(key, default)
        value = self.raw(key)
        if not isinstance(value, bool):
            return self._fail(key, f"expected true or false, got {brief(value)}", default)
        return value

    def sub(self, key: str) -> "Fields":
        """The nested mapping under `key` (empty when absent), sharing this reader's problems."""
        return Fields(self.raw(key), self.path(key), self.problems)

    def _missing(self, key: str, default: Any) -> Any:
        self.seen.add(key)  # a known key, for suggestions
        if default is ...:
            return self._fail(key, "is required", None)
        return default

    def check_unknown(self, known: Iterable[str] = ()) -> None:
        """Record every key not read so far (nor in `known`) as unknown, with a suggestion."""
        valid = self.seen | set(known)
        listed = False  # the valid keys once per mapping, with its first unknown key that has no near match
        for key in sorted(set(map(str, self.data)) - valid):
            hint = _suggest(key, valid)
            if not hint and not listed and valid:
                hint, listed = f"; valid keys: {', '.join(sorted(valid))}", True
            self.problems.append(f"{self.path(key)}: unknown key{hint}")

    def done(self) -> None:
        """Record unknown keys; raise one ConfigError listing every problem so far."""
        self.check_unknown()
        if self.problems:
            raise ConfigError("\n".join(dict.fromkeys(self.problems)))


def _suggest(value: object, options: Iterable[str]) -> str:
    if not isinstance(value, (str, int, float)) or len(str(value)) > 100:
        return ""
    close = difflib.get_close_matches(str(value), [str(o) for o in options], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_settings(items: Iterable[str] | Mapping[str, Any], example: str = "xpus=256") -> dict[str, Any]:
    """``KEY=VALUE`` strings (from ``--set``) to a mapping; values read as YAML (``true``, ``[H100, A100]``).

    A mapping is returned as a dict (keys as strings). Raises ConfigError for
    anything else: a plain string (``"xpus=8"``: give ``["xpus=8"]``), or items
    that are not ``KEY=VALUE`` strings.
    """
    if isinstance(items, Mapping):
        return {str(key): value for key, value in items.items()}
    if isinstance(items, (str, bytes)) or not isinstance(items, Iterable):
        raise ConfigError(f"settings: expected a list of KEY=VALUE strings or a mapping of keys to values, got "
                          f"{brief(items)}; e.g. [{example!r}] or {{{example.partition('=')[0]!r}: ...}}")
    settings: dict[str, Any] = {}
    for item in items:
        if not isinstance(item, str):
            raise ConfigError(f"settings: expected KEY=VALUE strings, got {brief(item)}; e.g. {example}")
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {brief(item)}: expected KEY=VALUE, e.g. {example}")
        settings[key.strip()] = parse_yaml(value, f"--set {key.strip()}") if value.strip() else ""
    return settings


def apply_overrides(data: Any, overrides: Mapping[str, Any] | None, where: str) -> dict:
    """A copy of raw spec `data` with each dotted key set (``{"links.cxl.latency": "1us"}``).

    Raises ConfigError naming the key when a prefix of it is not a mapping.
    """
    where = where.rstrip(": ")
    data = copy.deepcopy(data) if isinstance(data, dict) else {}
    if overrides is not None and not isinstance(overrides, Mapping):
        raise ConfigError(f"{where}: overrides: expected a mapping of dotted keys to values, got {brief(overrides)}")
    for key, value in (overrides or {}).items():
        parts = str(key).split(".")
        if not all(parts):
            raise ConfigError(f"{where}: override {brief(key)}: expected a dotted key such as links.cxl.latency")
        node = data
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                prefix = ".".join(parts[:depth + 1])
                raise ConfigError(f"override {brief(key)}: {prefix} is {brief(child)} in {where}, not a mapping, "
                                  f"so {key} cannot be set; override {prefix} itself")
            node = child
        node[parts[-1]] = copy.deepcopy(value)
    return data


def check_output_folder(path: str | Path, what: str = "--out") -> Path:
    """Make sure results can be written into folder `path` (created if missing) before any work starts.

    Raises
    ------
    ConfigError
        naming `what` and the path: it is a file, lies under a file, or cannot be written.
    """
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ConfigError(f"{what} {path}: is a file (or lies under one); give a folder") from None
    except OSError as err:
        raise ConfigError(f"{what} {path}: cannot create this folder: {err.strerror or err}; give a writable folder") from None
    if not path.is_dir():
        raise ConfigError(f"{what} {path}: is a file (or lies under one); give a folder")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{what} {path}: the folder is not writable; give a writable folder")
    return path


def check_output_file(path: str | Path, what: str = "-o", suffixes: Iterable[str] | None = None) -> Path:
    """Make sure file `path` can be written (its folder exists and is writable) before any work starts.

    `suffixes`, if given, are the file types the writer knows (``.png``...).
    """
    path = Path(path)
    if suffixes is not None:
        suffixes = list(suffixes)
        if path.suffix.lower() not in suffixes:
            raise ConfigError(f"{what} {path}: unknown file type {path.suffix or '(none)'!r}; "
                              f"give a name ending in one of {', '.join(suffixes)}")
    folder = path.parent
    if "\0" in str(path):
        raise ConfigError(f"{what} {brief(str(path))}: holds a NUL character; give a file name without one")
    try:
        folder_there = folder.is_dir()
        if path.is_dir():
            raise ConfigError(f"{what} {path}: is a folder; give a file name")
    except OSError as err:  # a name longer than the file system allows
        raise ConfigError(f"{what} {brief(str(path))}: cannot be a file here ({err.strerror}); give a shorter "
                          f"path") from None
    if not folder_there:
        state = "lies under a file" if any(p.is_file() for p in folder.parents) or folder.is_file() else "does not exist"
        raise ConfigError(f"{what} {path}: the folder {folder} {state}; give a path in an existing folder")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ConfigError(f"{what} {path}: cannot be written (permission denied); give a writable path")
    return path
