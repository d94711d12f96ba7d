"""Qualitative findings checked against sweep results: the paper's claims as data.

A finding is a mapping in an experiment's ``findings:`` list; ``check`` names
its kind. Rows are compared within groups that agree on every other axis
column (so "at every scale and device mix" is the default), failed points left
out. Kinds:

``better``
    ``axis``, ``better``, ``worse``: in every group, ``metric`` at
    axis=better exceeds it at axis=worse (``strict: false``: is not below it,
    relative tolerance 1e-9).
``close``
    ``axis``, ``reference``, ``other``, ``tolerance`` (relative, default 1 %):
    in every group, ``metric`` at axis=other is within `tolerance` of it at
    axis=reference (a cheaper model against an exact one).
``step``
    ``along``, ``from``, ``to``, ``expect`` (lower | higher), ``min_change``
    (relative, default 0): ``metric`` changes that way between the two values.
``saturating``
    ``along``: ``metric`` never decreases as `along` grows, grows by more than
    ``min_gain`` (default 1 %) in all, and grows less over the upper half of
    the range (log scale) than over the lower half.
``threshold``
    ``along``, ``flat_below``, ``steep_above``, ``scale`` (an axis): ``metric``
    moves by at most ``flat_tolerance`` (default 2 %) from the smallest value
    up to `flat_below`; at the largest scale it has lost at least ``min_loss``
    (default 10 %) at `steep_above`; its loss over the whole range grows with
    `scale`. The detail names where the steepest drop is.

``metric`` defaults to ``batches_per_s``; ``where`` keeps only rows whose
columns have the given values. Quantities are written with units
(``flat_below: 1us``).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from hcsim.errors import HcsimError, brief

__all__ = ["Finding", "evaluate", "check_spec", "check_where", "selected", "KINDS"]

KINDS = {
    "better": ("axis", "better", "worse"),
    "close": ("axis", "reference", "other"),
    "step": ("along", "from", "to", "expect"),
    "saturating": ("along",),
    "threshold": ("along", "flat_below", "steep_above", "scale"),
}
_OPTIONAL = ("claim", "check", "metric", "where", "strict", "min_change", "min_gain", "flat_tolerance", "min_loss",
             "tolerance")
_DIMENSIONS = {"B/s": "bandwidth", "s": "time"}  # unit of a scenario column -> its dimension
_SPEC_COLUMNS = ("axis", "along", "scale", "metric")


@dataclass(frozen=True, slots=True, kw_only=True)
class Finding:
    """The verdict on one claim: whether the results bear it out, and the numbers that say so."""

    claim: str
    ok: bool
    detail: str


_NUMBERS = {"tolerance": "a relative tolerance >= 0", "min_change": "a relative change >= 0",
            "min_gain": "a relative gain >= 0", "flat_tolerance": "a relative tolerance >= 0",
            "min_loss": "a relative loss >= 0"}


def check_spec(spec: dict[str, Any], columns: list[str] | None = None, numeric: list[str] | None = None,
               values: dict[str, list[Any]] | None = None) -> list[str]:
    """The problems of one finding spec (empty when it is valid), each starting with its key.

    With `columns` (the CSV header), `numeric` (its numeric columns) and
    `values` (axis column -> the values the points take), every column and
    compared value is checked against what the experiment will produce.
    """
    kind = spec.get("check")
    if kind not in KINDS:
        return [f"check: {brief(kind)} is not one of {', '.join(KINDS)}"]
    problems = [f"{key}: required for check {kind!r}" for key in KINDS[kind] if key not in spec]
    known = set(KINDS[kind]) | set(_OPTIONAL)
    problems += [f"{key}: unknown key for check {kind!r}; keys: {', '.join(sorted(known))}"
                 for key in spec if key not in known]
    if kind == "step" and spec.get("expect") not in ("lower", "higher"):
        problems.append(f"expect: {brief(spec.get('expect'))} is not one of lower, higher")
    for key, meaning in _NUMBERS.items():
        value = spec.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0 or math.isinf(value):
            problems.append(f"{key}: expected {meaning} (a number such as 0.01), got {brief(value)}")
    if not isinstance(spec.get("strict", True), bool):
        problems.append(f"strict: expected true or false, got {brief(spec['strict'])}")
    if not isinstance(spec.get("claim", ""), str):
        problems.append(f"claim: expected a sentence, got {brief(spec['claim'])}")
    problems += check_where(spec.get("where"), columns)
    if columns is None:
        return problems
    metric = spec.get("metric", "batches_per_s")
    if not isinstance(metric, str) or metric not in (numeric or columns):
        problems.append(f"metric: {brief(metric)} is not a numeric column of the results; "
                        f"numeric columns: {', '.join(numeric or columns)}")
    axes = list(values or {})
    for key in ("axis", "along", "scale"):
        if key in spec and (not isinstance(spec[key], str) or spec[key] not in axes):
            problems.append(f"{key}: {brief(spec[key])} is not an axis of this experiment; axes: {', '.join(axes)}")
    for key in ("along", "scale"):
        column = spec.get(key)
        if column in axes and not all(isinstance(v, (int, float)) and not isinstance(v, bool)
                                      for v in values[column]):
            problems.append(f"{key}: {column!r} is not numeric, so it cannot be ordered; give a numeric axis")
    axis = spec.get("axis") if "axis" in spec else spec.get("along")
    for key in ("better", "worse", "reference", "other", "from", "to"):
        if key not in spec or axis not in axes:
            continue
        try:
            wanted = _value(spec, key, axis)
        except HcsimError as err:
            problems.append(f"{key}: {err}")
            continue
        if not any(_equal(v, wanted) for v in values[axis]):
            shown = ", ".join(dict.fromkeys(_show(axis, v) for v in values[axis]))
            problems.append(f"{key}: {brief(spec[key])} is not a value of {axis}; its values: {shown}")
    for key in ("flat_below", "steep_above"):
        if key in spec and spec.get("along") in axes:
            try:
                value = _value(spec, key, spec["along"])
            except HcsimError as err:
                problems.append(f"{key}: {err}")
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                problems.append(f"{key}: expected a value of {spec['along']} (a number, or a quantity with a unit), "
                                f"got {brief(spec[key])}")
    return problems


def check_where(where: Any, columns: list[str] | None = None) -> list[str]:
    """The problems of a ``where:`` selection: a mapping of columns to a value or a list of values."""
    if where is None:
        return []
    if not isinstance(where, dict):
        return [f"where: expected a mapping of columns to values, got {brief(where)}"]
    problems = []
    for key, wanted in where.items():
        if columns is not None and key not in columns:
            problems.append(f"where.{key}: not a column of this experiment's results; columns: {', '.join(columns)}")
            continue
        for value in wanted if isinstance(wanted, list) else [wanted]:
            if isinstance(value, (dict, list)):
                problems.append(f"where.{key}: expected a value or a list of values, got {brief(wanted)}")
            elif _dimension(key) and isinstance(value, str):
                from hcsim.units import parse_quantity

                try:
                    parse_quantity(value, _dimension(key), f"where.{key}")
                except HcsimError as err:
                    problems.append(str(err))
    return problems


def evaluate(spec: dict[str, Any], rows: list[dict[str, Any]], axes: list[str]) -> Finding:
    """Check one finding against result `rows`; `axes` are the experiment's axis columns.

    A device column as metric (``idle_s``...) is compared per device type, never averaged over them."""
    from hcsim.run.results import DEVICE_COLUMNS, rows_for, spec_columns

    spec = spec_columns({"metric": "batches_per_s", **spec}, _SPEC_COLUMNS)
    metric = spec["metric"]
    rows = [r for r in rows_for(rows, metric) if r.get("status") == "ok" and selected(r, spec.get("where") or {})]
    if metric in DEVICE_COLUMNS:
        axes = [*axes, "device"]
    claim = spec.get("claim") or spec["check"]
    if not rows:
        return Finding(claim=claim, ok=False, detail="no results to check")
    ok, detail = _CHECKS[spec["check"]](spec, rows, axes, metric)
    return Finding(claim=claim, ok=ok, detail=detail)


def selected(row: dict[str, Any], where: dict[str, Any]) -> bool:
    """Whether a result row matches every `where` key (a value or a list; quantities may carry units)."""
    for key, wanted in where.items():
        wanted = wanted if isinstance(wanted, list) else [wanted]
        dimension = _dimension(key)
        if dimension:
            from hcsim.units import parse_quantity

            wanted = [parse_quantity(w, dimension, f"findings.where.{key}") if isinstance(w, str) else w
                      for w in wanted]
        if row.get(key) not in wanted and str(row.get(key)) not in map(str, wanted):
            return False
    return True


def _dimension(column: str) -> str | None:
    """"bandwidth" or "time" for a scenario column with that unit (cxl_latency_s), else None."""
    from hcsim.run.results import column_unit

    return _DIMENSIONS.get(column_unit(column) or "")


def _value(spec: dict[str, Any], key: str, column: str) -> Any:
    value = spec[key]
    if isinstance(value, str) and _dimension(column):
        from hcsim.units import parse_quantity

        return parse_quantity(value, _dimension(column), f"findings.{key}")
    return value


def _groups(rows, axes, exclude) -> dict[tuple, list[dict[str, Any]]]:
    """Rows grouped by every axis column but `exclude` and the columns that vary with them (zip groups)."""
    exclude = set(exclude) | {a for a in axes for e in exclude if _varies_with(rows, a, e)}
    keys = [a for a in axes if a not in exclude]
    groups: dict[tuple, list[dict[str, Any]]] = defaultdict(list)
    for row in rows:
        groups[tuple((k, row.get(k)) for k in keys)].append(row)
    return groups


def _varies_with(rows, column: str, axis: str) -> bool:
    """True when `column` takes several values, each fixed by the value of `axis` (set by the same zip group).

    In a grid two independent axes never do, so this finds exactly a zip group's other columns.
    """
    seen: dict[str, Any] = {}
    for row in rows:
        value = seen.setdefault(str(row.get(axis)), row.get(column))
        if value != row.get(column):
            return False
    return len({str(v) for v in seen.values()}) > 1


def _name(group: tuple) -> str:
    return ", ".join(f"{k}={_show(k, v)}" for k, v in group) or "all"


def _show(column: str, value: Any) -> str:
    """A value as people read it: 128 GB/s, 200 ns; others as they are."""
    if _dimension(column) and isinstance(value, (int, float)):
        from hcsim.units import format_quantity

        return format_quantity(value, "B/s" if _dimension(column) == "bandwidth" else "s").replace(" ", "")
    return str(value)


def _order(group: tuple) -> list:
    return [(0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v)) for _, v in group]


def _equal(a: Any, b: Any) -> bool:
    return a == b or str(a) == str(b)


def _at(rows, column, value):
    return [r for r in rows if _equal(r[column], value)]


def _pairs(rows, axes, axis, first, second):
    """(group, row at axis=first, row at axis=second) for every group of rows that has both."""
    for group, members in sorted(_groups(rows, axes, {axis}).items(), key=lambda g: _order(g[0])):
        a, b = _at(members, axis, first), _at(members, axis, second)
        if a and b:
            yield group, a[0], b[0]


def _ratio(a: float, b: float) -> float:
    """a / b, where b may be 0 (a metric such as exposed dp communication with dp 1): 1 when both are, else
    +-infinity with a's sign."""
    if b:
        return a / b
    return 1.0 if a == 0 else math.copysign(math.inf, a)


def _better(spec, rows, axes, metric):
    axis = spec["axis"]
    strict = spec.get("strict", True)
    ratios, failures = [], []
    for group, good, bad in _pairs(rows, axes, axis, _value(spec, "better", axis), _value(spec, "worse", axis)):
        ratio = _ratio(good[metric], bad[metric])
        ratios.append(ratio)
        if not (ratio > 1 if strict else ratio >= 1 - 1e-9):
            failures.append(f"{_name(group)}: {ratio:.4f}x")
    if not ratios:
        return False, f"no pair of {axis}={spec['better']} and {axis}={spec['worse']} to compare"
    detail = (f"{metric} at {axis}={spec['better']} / at {axis}={spec['worse']}: "
              f"{min(ratios):.4g}x to {max(ratios):.4g}x over {len(ratios)} pairs")
    return not failures, detail + (f"; fails at {'; '.join(failures)}" if failures else "")


def _close(spec, rows, axes, metric):
    axis, tolerance = spec["axis"], spec.get("tolerance", 0.01)
    errors, failures = [], []
    for group, reference, other in _pairs(rows, axes, axis, _value(spec, "reference", axis),
                                          _value(spec, "other", axis)):
        error = _ratio(other[metric], reference[metric]) - 1
        errors.append(abs(error))
        if abs(error) > tolerance:
            failures.append(f"{_name(group)}: {error:+.2%}")
    if not errors:
        return False, f"no pair of {axis}={spec['reference']} and {axis}={spec['other']} to compare"
    detail = (f"{metric} at {axis}={spec['other']} against {axis}={spec['reference']}: at most "
              f"{max(errors):.2%} apart over {len(errors)} pairs (tolerance {tolerance:.0%})")
    return not failures, detail + (f"; off at {'; '.join(failures)}" if failures else "")


def _step(spec, rows, axes, metric):
    along = spec["along"]
    low, high = _value(spec, "from", along), _value(spec, "to", along)
    minimum = spec.get("min_change", 0.0)
    changes, failures = [], []
    for group, members in sorted(_groups(rows, axes, {along}).items(), key=lambda g: _order(g[0])):
        a, b = _at(members, along, low), _at(members, along, high)
        if not a or not b:
            continue
        change = b[0][metric] / a[0][metric] - 1
        changes.append(f"{_name(group)}: {change:+.1%}")
        wanted = change <= -minimum if spec["expect"] == "lower" else change >= minimum
        if not wanted or change == 0:
            failures.append(_name(group))
    if not changes:
        return False, f"no rows at both {along}={low} and {along}={high}"
    detail = f"{metric} from {along}={_show(along, low)} to {along}={_show(along, high)}: " + "; ".join(changes)
    return not failures, detail


def _curve(members, along, metric):
    points = sorted((r[along], r[metric]) for r in members)
    return [p[0] for p in points], [p[1] for p in points]


def _saturating(spec, rows, axes, metric):
    along = spec["along"]
    min_gain = spec.get("min_gain", 0.01)
    parts, failures = [], []
    for group, members in sorted(_groups(rows, axes, {along}).items(), key=lambda g: _order(g[0])):
        xs, ys = _curve(members, along, metric)
        if len(xs) < 3:
            continue
        middle = math.sqrt(xs[0] * xs[-1])
        m = min(range(len(xs)), key=lambda i: abs(math.log(xs[i] / middle)))
        lower, upper = ys[m] / ys[0] - 1, ys[-1] / ys[m] - 1
        monotone = all(b >= a * (1 - 1e-9) for a, b in zip(ys, ys[1:]))
        total = ys[-1] / ys[0] - 1
        parts.append(f"{_name(group)}: +{total:.1%} in all, +{lower:.1%} up to {along}={_show(along, xs[m])}, "
                     f"+{upper:.1%} above")
        if not (monotone and total > min_gain and upper < lower):
            failures.append(_name(group) + ("" if monotone else " (not monotone)"))
    if not parts:
        return False, f"fewer than 3 values of {along} in every group"
    return not failures, "; ".join(parts) + (f". Fails at {'; '.join(failures)}" if failures else "")


def _threshold(spec, rows, axes, metric):
    along, scale = spec["along"], spec["scale"]
    flat_below, steep_above = _value(spec, "flat_below", along), _value(spec, "steep_above", along)
    tolerance, min_loss = spec.get("flat_tolerance", 0.02), spec.get("min_loss", 0.10)
    parts, failures = [], []
    for group, members in sorted(_groups(rows, axes, {along, scale}).items(), key=lambda g: _order(g[0])):
        losses = []
        for size in sorted({r[scale] for r in members}):
            xs, ys = _curve(_at(members, scale, size), along, metric)
            flat = [i for i, x in enumerate(xs) if x <= flat_below * (1 + 1e-9)]
            steep = [i for i, x in enumerate(xs) if x >= steep_above * (1 - 1e-9)]
            if len(xs) < 3 or not flat or not steep:
                continue
            flat_change = ys[flat[-1]] / ys[0] - 1
            loss = 1 - ys[steep[0]] / ys[0]
            worst = max(range(len(xs) - 1), key=lambda i: ys[i] - ys[i + 1])
            losses.append((size, 1 - ys[-1] / ys[0], loss))
            show = lambda x: _show(along, x)  # noqa: E731
            parts.append(f"{scale}={size}: {flat_change:+.2%} up to {show(flat_below)}, {-loss:+.1%} at "
                         f"{show(xs[steep[0]])}, {ys[-1] / ys[0] - 1:+.1%} at {show(xs[-1])} "
                         f"(steepest between {show(xs[worst])} and {show(xs[worst + 1])})")
            if abs(flat_change) > tolerance:
                failures.append(f"{_name(group)} {scale}={size}: not flat below {flat_below:g}")
        if len(losses) >= 2 and not (all(b[1] >= a[1] - 1e-9 for a, b in zip(losses, losses[1:]))
                                     and losses[-1][1] > losses[0][1]):
            failures.append(f"{_name(group)}: the loss does not grow with {scale}")
        if losses and losses[-1][2] < min_loss:
            failures.append(f"{_name(group)}: loss {losses[-1][2]:.1%} < {min_loss:.0%} at {steep_above:g}, "
                            f"{scale}={losses[-1][0]}")
    if not parts:
        return False, f"no curve reaches both {flat_below:g} and {steep_above:g} in {along}"
    return not failures, "; ".join(parts) + (f". Fails: {'; '.join(failures)}" if failures else "")


_CHECKS = {"better": _better, "close": _close, "step": _step, "saturating": _saturating, "threshold": _threshold}
