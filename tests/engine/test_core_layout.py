"""The core's input layout is written once in Python (hcsim.engine.core.workload.ARRAY_TYPES) and read by two
C++ files: the struct the executor reads (workload.hpp's WorkloadArrays) and the binding that fills it
(module.cpp's field<T>(a, "name", ...)). Each array must be in all three, with the same element type."""

import re
from pathlib import Path

from hcsim.engine.core.workload import ARRAY_TYPES

CORE = Path(__file__).parents[2] / "hcsim" / "engine" / "core"
CODES = {"std::uint8_t": "B", "std::int32_t": "i", "std::int64_t": "q", "double": "d"}  # array.array's type codes


def _struct_fields() -> dict[str, str]:
    text = (CORE / "workload.hpp").read_text()
    body = text[text.index("struct WorkloadArrays {"):text.index("};", text.index("struct WorkloadArrays {"))]
    return {name: CODES[kind] for kind, name in re.findall(r"const (std::\w+|double)\* (\w+) = nullptr;", body)}


def _bound_fields() -> dict[str, str]:
    text = (CORE / "module.cpp").read_text()
    return {name: CODES[kind] for kind, name in re.findall(r"field<(std::\w+|double)>\(a, \"(\w+)\"", text)}


def test_every_array_has_one_layout_in_python_the_struct_and_the_binding():
    python = dict(ARRAY_TYPES)
    assert len(python) == len(ARRAY_TYPES)  # no name twice
    assert _struct_fields() == python
    assert _bound_fields() == python


def test_the_layout_check_reads_the_cpp_files():
    assert _struct_fields()["u_flops"] == "d" and _struct_fields()["v_kind"] == "B"
    assert len(_bound_fields()) > 40
