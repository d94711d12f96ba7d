"""Quantities with units, parsed at the configuration boundary only.

Inside hcsim every quantity is a float in SI base units: bytes, seconds,
FLOP, FLOP/s and bytes/s. Specs write them as strings with a unit
("128GB/s", "200ns", "80GiB", "67TFLOPS"); GB means 1e9 bytes, GiB 2**30, and
bits are spelled out ("200Gbit/s"). A bare number for a quantity that has a
unit is an error, never a guess.
"""

from __future__ import annotations

import functools
import math
import re

from hcsim.errors import ConfigError

__all__ = [
    "Bytes", "Seconds", "Flop", "FlopsPerSecond", "BytesPerSecond",
    "DIMENSIONS", "parse_quantity", "format_quantity", "format_percent",
]

Bytes = float
Seconds = float
Flop = float
FlopsPerSecond = float
BytesPerSecond = float

# dimension name -> (pint unit of the SI value, example for messages)
DIMENSIONS: dict[str, tuple[str, str]] = {
    "bandwidth": ("byte / second", "128GB/s or 200Gbit/s"),
    "time": ("second", "200ns or 5us"),
    "size": ("byte", "80GiB or 1.5GB"),
    "flops": ("FLOP / second", "67TFLOPS"),
    "flop": ("FLOP", "195GFLOP"),
}


@functools.cache
def _registry():
    import pint  # imported on first use: keeps `import hcsim` light

    registry = pint.UnitRegistry()
    registry.define("FLOP = [flop]")
    registry.define("FLOPS = FLOP / second")
    return registry


def parse_quantity(text: object, dimension: str, where: str = "value") -> float:
    """Parse a string with a unit into a float in SI base units.

    Parameters
    ----------
    text : the value from the spec, e.g. ``"128GB/s"``.
    dimension : one of ``DIMENSIONS`` ("bandwidth", "time", "size", "flops", "flop").
    where : the file and field path, for error messages.

    Raises
    ------
    ConfigError
        if `text` is not a string, has no or the wrong unit, or is not finite.

    >>> parse_quantity("128GB/s", "bandwidth")
    128000000000.0
    >>> parse_quantity("80GiB", "size")
    85899345920.0
    """
    unit, example = DIMENSIONS[dimension]
    if not isinstance(text, str):
        raise ConfigError(f"{where}: {text!r} has no unit; write it with one, for example {example!r}")
    value = _parse_simple(text, dimension)
    if value is not None:
        return value
    registry = _registry()
    try:
        quantity = registry.Quantity(text.strip())
        value = float(quantity.to(unit).magnitude)
    except Exception as err:  # pint raises several unrelated types
        raise ConfigError(f"{where}: cannot read {text!r} as a {dimension}; write it as {example!r}") from err
    if not math.isfinite(value):
        raise ConfigError(f"{where}: {text!r} is not finite")
    return _round_decimal(value)


# The forms specs use, read without pint (whose import and registry take about 2 s): a number, then a
# decimal or binary prefix and B, bit, FLOP or FLOPS, optionally per second, or a time in s, ms, us, µs,
# ns, ps (no leading zeros: pint reads '039' oddly). Everything else goes to pint; tests check both
# readings agree.
_SIMPLE = re.compile(r"\s*([+-]?(?:(?:0|[1-9]\d*)(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?)\s*"
                     r"(?:(?P<big>[kMGTP]i?|Ki)?(?P<unit>B|bit|FLOPS|FLOP)(?P<per>/s)?|(?P<small>[munµp]?)s)\s*")
_BIG = {"": 1.0, "k": 1e3, "M": 1e6, "G": 1e9, "T": 1e12, "P": 1e15,
        "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30, "Ti": 2.0**40, "Pi": 2.0**50}
_SMALL = {"": 1.0, "m": 1e-3, "u": 1e-6, "µ": 1e-6, "n": 1e-9, "p": 1e-12}
_SIMPLE_DIMENSION = {("B", False): "size", ("bit", False): "size", ("B", True): "bandwidth",
                     ("bit", True): "bandwidth", ("FLOP", False): "flop", ("FLOP", True): "flops",
                     ("FLOPS", False): "flops"}


def _parse_simple(text: str, dimension: str) -> float | None:
    """`text` in SI base units if it is one of the simple forms above and of `dimension`, else None."""
    match = _SIMPLE.fullmatch(text)
    if match is None or match["big"] == "ki":
        return None
    number = float(match[1])
    if match["unit"] is None:
        if dimension != "time":
            return None
        return _round_decimal(number * _SMALL[match["small"]])
    if _SIMPLE_DIMENSION.get((match["unit"], match["per"] is not None)) != dimension:
        return None
    value = number * _BIG[match["big"] or ""]
    if match["unit"] == "bit":
        value /= 8
    return _round_decimal(value) if math.isfinite(value) else None


def _round_decimal(value: float) -> float:
    """Undo pint's binary scaling noise (200ns -> 2.0000000000000002e-07)."""
    return float(f"{value:.15g}")


_PREFIXES = [(1e15, "P"), (1e12, "T"), (1e9, "G"), (1e6, "M"), (1e3, "k"), (1.0, "")]
_SUBSECOND = [(1.0, "s"), (1e-3, "ms"), (1e-6, "µs"), (1e-9, "ns")]


def format_quantity(value: float, unit: str) -> str:
    """Human-readable form of an SI value: 1.28e11, "B/s" -> "128 GB/s".

    >>> format_quantity(2e-7, "s")
    '200 ns'
    """
    if unit == "s":
        if abs(value) < 1e-12:  # below a picosecond: rounding noise of the simulation clock
            return "0 s"
        for scale, name in _SUBSECOND:
            if abs(value) >= scale or scale == 1e-9:
                return f"{value / scale:.4g} {name}"
    for scale, prefix in _PREFIXES:
        if abs(value) >= scale or scale == 1.0:
            return f"{value / scale:.4g} {prefix}{unit}"
    raise AssertionError("unreachable")


def format_percent(fraction: float) -> str:
    """A fraction (a utilization) as a percentage people read: whole percents from 1 % up, one significant
    digit below, so a small load never shows as 0 %.

    >>> format_percent(0.62), format_percent(0.003), format_percent(0.0)
    ('62%', '0.3%', '0%')
    """
    if fraction == 0 or abs(fraction) >= 0.01:
        return f"{fraction:.0%}"
    return f"{fraction * 100:.1g}%"
