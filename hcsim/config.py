"""Reading YAML specs: the only module that sees raw YAML.

Specs are checked at this boundary with the field path of every value
(``links.cxl.bandwidth``), unknown keys are rejected with a suggestion, and
all problems of a file are reported at once in one ConfigError.
"""

from __future__ import annotations

import copy
import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import yaml

from hcsim.errors import ConfigError
from hcsim.units import parse_quantity

__all__ = ["REPO_ROOT", "load_yaml", "resolve_spec", "Fields", "parse_settings", "apply_overrides"]

REPO_ROOT = Path(__file__).resolve().parents[1]


def resolve_spec(name: str | Path, folder: str, base: Path | None = None) -> Path:
    """Find a spec: a path (relative to `base` or the working directory), or a built-in name.

    `folder` is ``platforms``, ``workloads`` or ``experiments``; a bare name
    such as ``paper-cxl`` means ``REPO_ROOT/folder/paper-cxl.yaml``.
    """
    path = Path(name)
    candidates = [path] if path.is_absolute() else [(base or Path.cwd()) / path]
    candidates += [REPO_ROOT / folder / path, REPO_ROOT / folder / f"{path}.yaml"]
    for candidate in candidates:
        if candidate.is_file():
            return candidate
    builtin = sorted(p.stem for p in (REPO_ROOT / folder).glob("*.yaml"))
    raise ConfigError(f"{name}: no such file, nor a built-in {folder} spec; built-in ones: {', '.join(builtin)}")


_SAFE_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml(path: str | Path) -> Any:
    """Parse a YAML file as ``yaml.safe_load`` does (with libyaml's loader when PyYAML has it: several
    times faster); errors name the file and line."""
    path = Path(path)
    try:
        text = path.read_text()
    except OSError as err:
        raise ConfigError(f"{path}: cannot read: {err.strerror}") from err
    try:
        return yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError(f"{path}{line}: not valid YAML: {getattr(err, 'problem', err)}") from err


class Fields:
    """A mapping from a spec, read field by field with its path and problems collected.

    >>> f = Fields({"bandwidth": "128GB/s"}, "pod.yaml: links.cxl")
    >>> f.quantity("bandwidth", "bandwidth")
    128000000000.0
    >>> f.done()
    """

    def __init__(self, data: Any, where: str, problems: list[str] | None = None):
        self.where = where
        self.problems = problems if problems is not None else []
        self.seen: set[str] = set()
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            self.problems.append(f"{where}: expected a mapping, got {type(data).__name__}")
            data = {}
        self.data = data

    def path(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where and not self.where.endswith(": ") else f"{self.where}{key}"

    def has(self, key: str) -> bool:
        return key in self.data

    def raw(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        return self.data.get(key, default)

    def _fail(self, key: str, message: str, default: Any) -> Any:
        self.problems.append(f"{self.path(key)}: {message}")
        return default

    def quantity(self, key: str, dimension: str, default: Any = ..., positive: bool = True) -> Any:
        """A value with a unit, in SI base units; `positive` rejects zero and negatives."""
        if key not in self.data:
            return self._missing(key, default)
        try:
            value = parse_quantity(self.raw(key), dimension, self.path(key))
        except ConfigError as err:  # its message already names the field
            self.problems.append(str(err))
            return None
        if positive and not value > 0:
            return self._fail(key, f"must be > 0, got {self.data[key]!r}", None)
        return value

    def number(self, key: str, default: Any = ..., kind: type = float, minimum: float | None = None) -> Any:
        """A plain number (a count or a ratio: no unit)."""
        if key not in self.data:
            return self._missing(key, default)
        value = self.raw(key)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or (kind is int and not isinstance(value, int)):
            return self._fail(key, f"expected {'an integer' if kind is int else 'a number'}, got {value!r}", default)
        if minimum is not None and value < minimum:
            return self._fail(key, f"must be >= {minimum}, got {value!r}", default)
        return kind(value)

    def choice(self, key: str, options: Iterable[str], default: Any = ...) -> Any:
        if key not in self.data:
            return self._missing(key, default)
        value = self.raw(key)
        options = list(options)
        if value not in options:
            return self._fail(key, f"{value!r} is not one of {', '.join(map(str, options))}{_suggest(value, options)}", default)
        return value

    def string(self, key: str, default: Any = ...) -> Any:
        if key not in self.data:
            return self._missing(key, default)
        value = self.raw(key)
        if not isinstance(value, str):
            return self._fail(key, f"expected a string, got {value!r}", default)
        return value

    def flag(self, key: str, default: Any = ...) -> Any:
        if key not in self.data:
            return self._missing(key, default)
        value = self.raw(key)
        if not isinstance(value, bool):
            return self._fail(key, f"expected true or false, got {value!r}", default)
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
        for key in sorted(set(map(str, self.data)) - valid):
            self.problems.append(f"{self.path(key)}: unknown key{_suggest(key, valid)}")

    def done(self) -> None:
        """Record unknown keys; raise one ConfigError listing every problem so far."""
        self.check_unknown()
        if self.problems:
            raise ConfigError("\n".join(dict.fromkeys(self.problems)))


def _suggest(value: object, options: Iterable[str]) -> str:
    close = difflib.get_close_matches(str(value), [str(o) for o in options], n=1)
    return f" (did you mean {close[0]!r}?)" if close else ""


def parse_settings(items: Iterable[str], example: str = "xpus=256") -> dict[str, Any]:
    """``KEY=VALUE`` strings (from ``--set``) to a mapping; values read as YAML (``true``, ``[H100, A100]``)."""
    settings: dict[str, Any] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"--set {item!r}: expected KEY=VALUE, e.g. {example}")
        try:
            settings[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError as err:
            raise ConfigError(f"--set {item!r}: the value is not valid YAML") from err
    return settings


def apply_overrides(data: Any, overrides: Mapping[str, Any] | None, where: str) -> dict:
    """A copy of raw spec `data` with each dotted key set (``{"links.cxl.latency": "1us"}``).

    Raises ConfigError naming the key when a prefix of it is not a mapping.
    """
    data = copy.deepcopy(data) if isinstance(data, dict) else {}
    for key, value in (overrides or {}).items():
        parts = str(key).split(".")
        node = data
        for depth, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            if not isinstance(child, dict):
                raise ConfigError(f"{where}: override {key!r}: {'.'.join(parts[:depth + 1])} is not a mapping")
            node = child
        node[parts[-1]] = copy.deepcopy(value)
    return data
