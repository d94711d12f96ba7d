"""Quantities read without pint agree with pint's reading, and pint still reads the rest."""

import itertools
import math
import re
from pathlib import Path

import pytest

from hcsim import units
from hcsim.config import REPO_ROOT
from hcsim.errors import ConfigError

NUMBERS = ("1", "0", "128", "12.5", "0.9", ".5", "3.35", "1e3", "2.5E-2", "989", "100000", "7.25", "-4")
UNITS = {
    "size": [p + u for p in ("", "k", "M", "G", "T", "P", "Ki", "Mi", "Gi", "Ti", "Pi") for u in ("B", "bit")],
    "bandwidth": [p + u + "/s" for p in ("", "k", "M", "G", "T", "Ki", "Gi") for u in ("B", "bit")],
    "time": ["s", "ms", "us", "µs", "ns", "ps"],
    "flops": [p + u for p in ("", "G", "T", "P") for u in ("FLOPS", "FLOP/s")],
    "flop": [p + "FLOP" for p in ("", "k", "G", "T", "P")],
}


def _pint_reading(text, dimension):
    unit, _ = units.DIMENSIONS[dimension]
    return units._round_decimal(float(units._registry().Quantity(text.strip()).to(unit).magnitude))


@pytest.mark.parametrize("dimension", sorted(UNITS))
def test_the_simple_forms_read_as_pint_reads_them(dimension):
    for number, unit, space in itertools.product(NUMBERS, UNITS[dimension], ("", " ")):
        text = f"{number}{space}{unit}"
        simple = units._parse_simple(text, dimension)
        assert simple is not None, f"{text!r} is not read without pint"
        assert simple == _pint_reading(text, dimension), text


def test_every_quantity_in_the_repository_specs_reads_as_pint_reads_it():
    quantity = re.compile(r"""["' :\[,]([+-]?[0-9][0-9.eE+-]*\s?(?:[kMGTP]i?)?(?:B/s|bit/s|B|bit|FLOPS|FLOP|[mnuµp]?s))\b""")
    seen = 0
    for path in itertools.chain(*(Path(REPO_ROOT, folder).rglob("*.yaml") for folder in ("platforms", "workloads", "experiments"))):
        for text in quantity.findall(path.read_text()):
            for dimension in units.DIMENSIONS:
                simple = units._parse_simple(text, dimension)
                if simple is not None:
                    seen += 1
                    assert simple == _pint_reading(text, dimension), f"{path.name}: {text!r}"
    assert seen > 100


@pytest.mark.parametrize("text, dimension", [("2min", "time"), ("1 kilobyte", "size"), ("3 hour", "time"),
                                             ("10 gigabyte / second", "bandwidth")])
def test_other_forms_still_go_to_pint(text, dimension):
    assert units._parse_simple(text, dimension) is None
    assert units.parse_quantity(text, dimension) == _pint_reading(text, dimension)


@pytest.mark.parametrize("text, dimension", [("5us", "bandwidth"), ("128GB", "bandwidth"), ("128GB/s", "size"),
                                             ("67TFLOPS", "time"), ("1e999GB", "size")])
def test_a_wrong_dimension_is_still_an_error(text, dimension):
    assert units._parse_simple(text, dimension) is None
    with pytest.raises(ConfigError, match=re.escape(f"cannot read {text!r} as a {dimension}")
                       if "e999" not in text else "not finite"):
        units.parse_quantity(text, dimension, "x")
    assert math.isfinite(units.parse_quantity("1GB", "size"))
