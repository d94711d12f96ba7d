"""Parameter constraints declared once per dataclass and checked when it is built (scikit-learn style).

A frozen dataclass lists its constraints in a class attribute
``_constraints: ClassVar[dict[str, Constraint]]`` and calls
:func:`check_params` from ``__post_init__``; the YAML readers use the same
declarations (the choices, the minimums), so a value refused from YAML is
refused from Python too, with the same words::

    >>> check_params({"xpus": Integer(minimum=1)}, {"xpus": "8"}, "Scenario")
    Traceback (most recent call last):
    ...
    hcsim.errors.ConfigError: Scenario: xpus: expected an integer >= 1, got '8'
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from hcsim.errors import ConfigError, brief

__all__ = ["Constraint", "Integer", "Number", "Choice", "Text", "Flag", "Texts", "Integers", "Either", "Optional",
           "StringMapping", "NumberMapping", "check_params"]


class Constraint:
    """What a parameter may be: ``describe()`` says it in words, ``accepts(value)`` checks it."""

    def describe(self) -> str:
        raise NotImplementedError

    def accepts(self, value: Any) -> bool:
        raise NotImplementedError


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class Integer(Constraint):
    """An int (not a bool) in [minimum, maximum]."""

    minimum: int | None = None
    maximum: int | None = None

    def describe(self) -> str:
        bounds = [f">= {self.minimum}" if self.minimum is not None else "", f"<= {self.maximum}" if self.maximum is not None else ""]
        return "an integer" + (" " + " and ".join(b for b in bounds if b) if any(bounds) else "")

    def accepts(self, value: Any) -> bool:
        return (_is_int(value) and (self.minimum is None or value >= self.minimum)
                and (self.maximum is None or value <= self.maximum))


@dataclass(frozen=True)
class Number(Constraint):
    """A finite int or float (not a bool); `positive`: > 0; `minimum`: >= it."""

    positive: bool = False
    unit: str = ""
    minimum: float | None = None

    def describe(self) -> str:
        bound = " > 0" if self.positive else f" >= {self.minimum:g}" if self.minimum is not None else ""
        return f"a finite number{bound}{f' in {self.unit}' if self.unit else ''}"

    def accepts(self, value: Any) -> bool:
        return (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
                and (not self.positive or value > 0) and (self.minimum is None or value >= self.minimum))


@dataclass(frozen=True)
class Choice(Constraint):
    """One of `options`."""

    options: tuple[str, ...]

    def describe(self) -> str:
        return "one of " + ", ".join(self.options)

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and value in self.options


@dataclass(frozen=True)
class Text(Constraint):
    """A non-empty string."""

    def describe(self) -> str:
        return "a non-empty string"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, str) and bool(value.strip())


@dataclass(frozen=True)
class Flag(Constraint):
    """True or False."""

    def describe(self) -> str:
        return "true or false"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, bool)


@dataclass(frozen=True)
class Texts(Constraint):
    """A non-empty tuple of non-empty strings."""

    what: str = "names"

    def describe(self) -> str:
        return f"a non-empty tuple of {self.what}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, tuple) and bool(value) and all(Text().accepts(v) for v in value)


@dataclass(frozen=True)
class Integers(Constraint):
    """A non-empty tuple of integers >= `minimum`."""

    minimum: int = 0

    def describe(self) -> str:
        return f"a non-empty tuple of integers >= {self.minimum}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, tuple) and bool(value) and all(_is_int(v) and v >= self.minimum for v in value)


@dataclass(frozen=True)
class StringMapping(Constraint):
    """A dict whose keys are non-empty strings (dotted override keys)."""

    def describe(self) -> str:
        return "a mapping of dotted keys (strings) to values"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, Mapping) and all(Text().accepts(k) for k in value)


@dataclass(frozen=True)
class NumberMapping(Constraint):
    """A dict of non-empty strings (`what`) to finite numbers (not bools); `positive`: each > 0."""

    what: str = "names"
    positive: bool = False

    def describe(self) -> str:
        return f"a mapping of {self.what} to finite numbers{' > 0' if self.positive else ''}"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, Mapping) and all(Text().accepts(k) and Number(self.positive).accepts(v)
                                                  for k, v in value.items())


@dataclass(frozen=True)
class Either(Constraint):
    """Any of several constraints."""

    alternatives: tuple[Constraint, ...]

    def describe(self) -> str:
        return " or ".join(c.describe() for c in self.alternatives)

    def accepts(self, value: Any) -> bool:
        return any(c.accepts(value) for c in self.alternatives)


def Optional(constraint: Constraint, meaning: str = "") -> Constraint:  # noqa: N802 (reads as a type)
    """`constraint`, or None (`meaning` says what None stands for, in messages)."""
    return Either((constraint, _None(meaning)))


@dataclass(frozen=True)
class _None(Constraint):
    meaning: str = ""

    def describe(self) -> str:
        return f"None ({self.meaning})" if self.meaning else "None"

    def accepts(self, value: Any) -> bool:
        return value is None


def check_params(constraints: Mapping[str, Constraint], values: Any, where: str) -> None:
    """Raise one ConfigError listing every value of `values` (a mapping or an object) its constraint refuses."""
    get = values.get if isinstance(values, Mapping) else lambda name: getattr(values, name)
    problems = [f"{where}: {name}: expected {constraint.describe()}, got {brief(get(name))}"
                for name, constraint in constraints.items() if not constraint.accepts(get(name))]
    if problems:
        raise ConfigError("\n".join(problems))
