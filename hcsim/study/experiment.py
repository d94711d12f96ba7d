"""Experiment files: a base scenario, axes to sweep, plots and findings (:func:`load_experiment`).

An experiment is a YAML file::

    name: fig8                      # results/fig8.csv, .png, .svg, .md
    description: one paragraph      # printed at the top of the summary
    base:                           # scenario keys shared by every point
      scenario: my-scenario.yaml    # optional: a scenario file to start from (relative to this file)
      granularity: decoder
      cxl_latency: 200ns
    axes:                           # the grid: the product of every axis's values, in this order
      devices: [[H100], [H100, A100]]
      coherent: [true, false]
      xpus: [64, 128, 256]
      system:                       # a zip group: each entry sets several keys together
        - {label: 64 H100, xpus: 64, devices: [H100]}
        - {label: 128 H100 + 128 A100, xpus: 256, devices: [H100, A100]}
    plots: [...]                    # see hcsim.study.plotting.PlotSpec
    findings: [...]                 # see hcsim.study.findings
    notes: |                        # markdown appended to the summary (discussion, disagreements)

An axis is any scenario key (``xpus``, ``cxl_bandwidth``, ``devices``,

An axis is any scenario key (``xpus``, ``cxl_bandwidth``, ``devices``,
``coherent``, ``collective``...) or a dotted override
(``platform_overrides.rack.servers``); an axis whose values are all mappings
is a zip group, named freely. :mod:`hcsim.study.sweep` runs its points.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hcsim.config import Fields, load_yaml
from hcsim.errors import ConfigError, HcsimError, brief
from hcsim.run.results import resolve_scenario, scenario_column
from hcsim.run.scenario import SCENARIO_KEYS, Scenario, apply_settings, load_scenario, renamed
from hcsim.study.store import TEXT_COLUMNS, columns

__all__ = ["Axis", "Experiment", "Point", "check_specs", "describe", "load_experiment"]


@dataclass(frozen=True, slots=True, kw_only=True)
class Axis:
    """One dimension of the grid: a scenario key and its values, or a zip group of mappings."""

    name: str
    values: tuple[Any, ...]
    group: bool = False  # True: each value is a mapping of several keys set together

    def settings(self, value: Any) -> dict[str, Any]:
        """The scenario settings one value of this axis makes."""
        if self.group:
            return {k: v for k, v in value.items() if k != "label"}
        return {self.name: value}

    def label(self, value: Any) -> Any:
        """The value written in this axis's own column."""
        if self.group:
            return value.get("label") or ", ".join(f"{k}={_text(v)}" for k, v in value.items())
        return value

    def keys(self) -> list[str]:
        """The scenario keys this axis sets, in first-seen order."""
        if not self.group:
            return [self.name]
        return list(dict.fromkeys(k for value in self.values for k in value if k != "label"))


@dataclass(frozen=True, slots=True, kw_only=True)
class Point:
    """One point of an experiment's grid: its CSV key, its axis columns and its scenario."""

    index: int
    key: str                      # the scenario's digest: what --resume matches
    labels: dict[str, Any]        # axis column -> value, as written in the CSV
    scenario: Scenario
    inputs: dict[str, Any] = field(default_factory=dict)  # scenario column -> resolved value, as in the CSV

    @property
    def cost(self) -> float:
        """A rough relative run time, for the progress bar and the order of submission.

        Flow-model collectives cost about one unit per XPU; step-exact ones (up to
        ``step_limit`` ranks) about n^2/4: measured, 64 XPUs step-exact ~ 1024 XPUs flow.
        """
        s = self.scenario
        step = s.collective_model == "step" or (s.collective_model == "auto" and s.xpus <= s.step_limit)
        return float(s.iterations * (s.xpus + (s.xpus * s.xpus / 4 if step else 0)))


@dataclass(frozen=True, kw_only=True)
class Experiment:
    """A sweep: base scenario settings, axes, and what to draw and check from the results."""

    name: str
    path: Path | None = None
    description: str = ""
    base_scenario: Path | None = None
    base: dict[str, Any] = field(default_factory=dict)
    axes: tuple[Axis, ...] = ()
    plots: tuple[dict[str, Any], ...] = ()
    findings: tuple[dict[str, Any], ...] = ()
    notes: str = ""

    def axis_columns(self) -> list[str]:
        """The axis columns of the CSV: each axis's column, then the columns of the keys its zip groups set
        (a scenario key's column carries its unit: ``cxl_bandwidth_Bps``)."""
        names: list[str] = []
        for axis in self.axes:
            names.append(axis.name if axis.group else scenario_column(axis.name))
            names.extend(scenario_column(k) for k in axis.keys() if k != axis.name)
        return list(dict.fromkeys(names))

    def points(self) -> list[Point]:
        """Every point of the grid, in grid order (the last axis varies fastest).

        Raises
        ------
        ConfigError
            if a point's settings do not make a valid scenario (the message names the point).
        """
        from hcsim.limits import MAX_SWEEP_POINTS, check_limit

        check_limit(math.prod(len(axis.values) for axis in self.axes), MAX_SWEEP_POINTS, "the grid's points "
                    f"({' x '.join(str(len(axis.values)) for axis in self.axes)} axis values)",
                    f"{self.path or self.name}: axes", "fewer axis values, or split the experiment")
        points = []
        for index, combination in enumerate(itertools.product(*(axis.values for axis in self.axes))):
            settings = dict(self.base)
            origin = {str(key).partition(".")[0]: "base." for key in self.base}  # where a key's value was written
            labels: dict[str, Any] = {}
            for axis, value in zip(self.axes, combination):
                settings.update(axis.settings(value))
                origin.update({str(key).partition(".")[0]: "" for key in axis.settings(value)})  # the point's own
                labels[axis.name] = axis.label(value)
            where = f"{self.path or self.name}: point {index} ({describe(labels)})"
            try:
                data = apply_settings({}, {**settings, "name": self.name}, where)
                scenario = load_scenario(self.base_scenario, data, {**origin, "name": ""})
            except ConfigError as err:
                raise ConfigError(f"{where}: {err}") from err
            inputs = resolve_scenario(scenario)
            for axis in self.axes:
                for key in axis.keys():
                    if key != axis.name or not axis.group:
                        column = scenario_column(key)
                        labels.pop(key, None)
                        labels[column] = inputs[column] if column in inputs else _text_of(settings.get(key))
            points.append(Point(index=index, key=scenario.digest(), labels=labels, scenario=scenario, inputs=inputs))
        _check_graph_sources(points, self.path or self.name)
        problems = check_specs([(f"{self.path or self.name}: point {p.index} ({describe(p.labels)})", p.scenario)
                                for p in points], "sweep")
        if problems:
            from hcsim.errors import invalid

            raise ConfigError(problems[0] if len(problems) == 1 else invalid(str(self.path or self.name),
                                                                              problems[:20]))
        keys = [p.key for p in points]
        if len(set(keys)) != len(keys):
            raise ConfigError(f"{self.path or self.name}: axes: two points make the same scenario; "
                              "remove the repeated axis values")
        return points


def check_specs(scenarios: Sequence[tuple[str, Scenario]], command: str) -> list[str]:
    """The problems of the platform and workload specs of `scenarios` ((where, scenario) pairs), each distinct
    spec and settings read once, before any of them runs: a value that only the spec reader checks (a bare
    number for a bandwidth in platform_overrides, a model key) fails here, not when its point runs. A serving
    workload (``kind: serving``) is refused: `command` (sweep, validate) compares training iterations."""
    problems, seen = [], {}
    for where, scenario in scenarios:
        if scenario.jobs:  # several jobs on one fabric: a result per job, not one row per point
            problems.append(f"{where}: jobs: hcsim {command} compares one job's iterations per point, and this "
                            f"scenario runs {len(scenario.jobs)} jobs; run it with hcsim simulate (docs/jobs.md)")
            continue
        for kind, name, settings in (("platform", scenario.platform, scenario.platform_settings()),
                                     ("workload", scenario.workload, scenario.workload_settings())):
            key = (kind, name, scenario.base, json.dumps(settings, sort_keys=True, default=str))
            if key not in seen:
                seen[key] = _spec_problem(kind, name, settings, Path(scenario.base), command)
            if seen[key]:
                problems.append(f"{where}: {seen[key]}")
    return problems


def _spec_problem(kind: str, name: str, settings: dict[str, Any], base: Path, command: str) -> str | None:
    """What is wrong with one platform or workload spec under `settings`, or None."""
    from hcsim.config import load_yaml, resolve_spec
    from hcsim.platform import load_platform_spec
    from hcsim.workload import load_workload_spec
    from hcsim.workload.serving import is_serving
    from hcsim.workload.sources import is_graph_source

    if kind == "workload" and is_graph_source(name):
        return None  # _check_graph_sources reads those
    try:
        path = resolve_spec(name, f"{kind}s", base)
        if kind == "platform":
            load_platform_spec(path, settings)
        elif is_serving(load_yaml(path)):
            return (f"workload {name}: a serving workload (kind: serving); hcsim {command} runs training workloads "
                    f"and compares their iterations: run a serving workload with hcsim simulate")
        else:
            load_workload_spec(path, settings)
    except HcsimError as err:
        return str(err)
    return None


def _check_graph_sources(points: list[Point], where: object) -> None:
    """Refuse a graph workload (a .json file, ``chakra:PREFIX``) that is not there before any point runs: each
    point would fail alike, and not all of them would say why."""
    from hcsim.workload.chakra import trace_files
    from hcsim.workload.sources import is_graph_source

    for workload, base in sorted({(p.scenario.workload, p.scenario.base) for p in points}):
        if not is_graph_source(workload):
            continue
        if workload.startswith("chakra:"):
            prefix = Path(workload[len("chakra:"):])
            try:
                trace_files(prefix if prefix.is_absolute() else Path(base) / prefix)
            except HcsimError as err:
                raise ConfigError(f"{where}: workload {workload}: {str(err).split(': ', 1)[-1]}") from err
        else:
            path = Path(workload) if Path(workload).is_absolute() else Path(base) / workload
            if not path.is_file():
                raise ConfigError(f"{where}: workload {workload}: no such graph file (looked for {path})")


def describe(labels: dict[str, Any]) -> str:
    return ", ".join(f"{k}={_text(v)}" for k, v in labels.items())


def _text(value: Any) -> str:
    if isinstance(value, (list, tuple)):
        return "+".join(map(str, value))
    return str(value)


def _text_of(raw: Any) -> Any:
    """A dotted override's value for the CSV (lists joined with +)."""
    return _text(raw) if isinstance(raw, (list, tuple)) else raw


MAX_NAME_BYTES = 200  # an experiment's name names its files (NAME.csv.partial, .NAME.lock): within 255 bytes


def load_experiment(path: str | Path) -> Experiment:
    """Read an experiment YAML; every problem of the file is reported at once.

    Raises
    ------
    ConfigError
        naming the file and field: unknown keys, an axis with no values, a bad plot or finding.
    """
    if not isinstance(path, (str, Path)):
        raise ConfigError(f"experiment: expected the path of an experiment YAML, got {brief(path)}")
    path = Path(path)
    data = load_yaml(path)
    if data is None or data == {}:
        raise ConfigError(f"{path}: the experiment is empty; it needs at least `axes:` (a mapping of scenario keys "
                          "to lists of values), see hcsim/study/experiment.py or experiments/paper/fig8.yaml")
    fields = Fields(data, f"{path}: ")
    name = fields.string("name", path.stem)
    if isinstance(name, str) and (not name.strip() or "/" in name or "\0" in name or name.startswith(".")
                                  or len(name.encode()) > MAX_NAME_BYTES):
        fields.problems.append(f"{fields.path('name')}: {brief(name)} cannot name the result files; "
                               f"use letters, digits, '-' and '_', at most {MAX_NAME_BYTES} bytes")
        name = path.stem
    description = fields.string("description", "")
    notes = fields.string("notes", "")
    base = fields.raw("base") or {}
    base_scenario = None
    if not isinstance(base, dict):
        fields.problems.append(f"{fields.path('base')}: expected a mapping of scenario keys to values")
        base = {}
    base = renamed(dict(base), f"{fields.path('base')}.")
    if "scenario" in base:
        base_scenario = (path.parent / str(base.pop("scenario"))).resolve()
        if not base_scenario.is_file():
            fields.problems.append(f"{fields.path('base.scenario')}: no such file {base_scenario}")
            base_scenario = None
    for key in base:
        _check_key(str(key), f"{fields.path('base')}.{key}", fields.problems)
    axes = _axes(fields)
    plots = _mappings(fields, "plots")
    findings = _mappings(fields, "findings")
    from hcsim.study.findings import check_spec
    from hcsim.study.plotting import check_plot

    for i, plot in enumerate(plots):
        fields.problems += [f"{path}: plots[{i}]: {p}" for p in check_plot(plot)]
    for i, finding in enumerate(findings):
        fields.problems += [f"{path}: findings[{i}]: {p}" for p in check_spec(finding)]
    fields.done()
    experiment = Experiment(name=name, path=path, description=description.strip(), base_scenario=base_scenario,
                            base=base, axes=axes, plots=tuple(plots), findings=tuple(findings), notes=notes.strip())
    _check_outputs(experiment)
    return experiment


def _check_outputs(experiment: Experiment) -> None:
    """Check the plots and findings against the columns and axis values the experiment's points will produce."""
    from hcsim.study.findings import check_spec
    from hcsim.study.plotting import check_plot

    points = experiment.points()  # also checks every point's scenario
    header = columns(experiment, points)
    numeric = [c for c in header if c not in TEXT_COLUMNS]
    values = {c: [p.labels.get(c) for p in points] for c in experiment.axis_columns()}
    problems = []
    # a spec names a scenario key (cxl_bandwidth) where the CSV has its column with a unit (cxl_bandwidth_Bps)
    from hcsim.run.results import spec_columns
    from hcsim.study.findings import _SPEC_COLUMNS as FINDING_COLUMNS
    from hcsim.study.plotting import _SPEC_COLUMNS as PLOT_COLUMNS

    for i, plot in enumerate(experiment.plots):
        spec = spec_columns(plot, PLOT_COLUMNS)
        found = check_plot(spec, header, numeric)
        if not found and spec.get("kind", "line") == "line":
            found = _text_x(spec["x"], points, numeric)
        problems += [f"{experiment.path}: plots[{i}]: {p}" for p in found]
    for i, finding in enumerate(experiment.findings):
        problems += [f"{experiment.path}: findings[{i}]: {p}"
                     for p in check_spec(spec_columns(finding, FINDING_COLUMNS), header, numeric, values)]
    if problems:
        raise ConfigError("\n".join(problems))


def _text_x(column: str, points: list[Point], numeric: list[str]) -> list[str]:
    """The problem of a line plot whose x column will hold text at some point (a zip group's label, a key
    set by only some of its entries, a string axis, a text result column): a line needs numbers along x."""
    if points and column not in points[0].labels and column not in points[0].inputs and column not in numeric:
        inputs = points[0].inputs
        numbers = [c for c in numeric if c not in inputs or isinstance(inputs[c], (int, float))]
        return [f"x: {column!r} is a text column; a line plot needs a numeric x: use kind: bar, or one of the "
                f"numeric columns: {', '.join(numbers)}"]
    for point in points:
        value = point.labels[column] if column in point.labels else point.inputs.get(column, 0)
        if isinstance(value, str) or not isinstance(value, (int, float)):
            return [f"x: {column!r} holds text at point {point.index} ({brief(value)}); a line plot needs a numeric "
                    f"x: use kind: bar, or a numeric column as x"]
    return []


def _check_key(key: str, where: str, problems: list[str]) -> None:
    head = key.partition(".")[0]
    if head not in SCENARIO_KEYS:
        import difflib

        close = difflib.get_close_matches(head, SCENARIO_KEYS, n=1)
        problems.append(f"{where}: not a scenario key{f' (did you mean {close[0]!r}?)' if close else ''}; "
                        f"scenario keys: {', '.join(SCENARIO_KEYS)}")


def _axes(fields: Fields) -> tuple[Axis, ...]:
    raw = fields.raw("axes") or {}
    where = fields.path("axes")
    if not isinstance(raw, dict):
        fields.problems.append(f"{where}: expected a mapping of scenario keys to lists of values")
        return ()
    axes = []
    if not raw:
        fields.problems.append(f"{where}: is required: a mapping of scenario keys to lists of values "
                               "(one axis with one value runs a single point)")
        return ()
    raw = renamed({str(k): v for k, v in raw.items()}, f"{where}.")
    for name, values in raw.items():
        if not isinstance(values, list) or not values:
            fields.problems.append(f"{where}.{name}: expected a non-empty list of values, got {brief(values)}")
            continue
        group = all(isinstance(v, dict) for v in values)
        if group:
            values = [renamed({str(k): v for k, v in value.items()}, f"{where}.{name}[{i}].")
                      for i, value in enumerate(values)]
            seen: dict[str, int] = {}
            for i, value in enumerate(values):
                for key in value:
                    if key != "label":
                        _check_key(str(key), f"{where}.{name}[{i}].{key}", fields.problems)
                label = Axis(name=name, values=(), group=True).label(value)
                if str(label) in seen:
                    fields.problems.append(f"{where}.{name}[{i}].label: {brief(label)} is also the label of entry "
                                           f"{seen[str(label)]}; give each entry its own label (its CSV cell and "
                                           f"legend entry)")
                seen.setdefault(str(label), i)
        else:
            _check_key(name, f"{where}.{name}", fields.problems)
        axes.append(Axis(name=name, values=tuple(values), group=group))
    return tuple(axes)


def _mappings(fields: Fields, key: str) -> list[dict[str, Any]]:
    raw = fields.raw(key) or []
    if not isinstance(raw, list) or not all(isinstance(item, dict) for item in raw):
        fields.problems.append(f"{fields.path(key)}: expected a list of mappings")
        return []
    return [dict(item) for item in raw]
