"""Experiments: a base scenario, axes to sweep, plots and findings; the runner that sweeps them.

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
``coherent``, ``collective``...) or a dotted override
(``platform_overrides.rack.servers``); an axis whose values are all mappings
is a zip group, named freely.

The runner runs every point in a fresh process of its own (SimGrid allows one
Engine per process, ever): a `concurrent.futures` executor (threads locally,
a Dask cluster with ``dask://HOST:PORT``) hands each point to
:func:`run_point`, which starts ``python -m hcsim.study.sweep`` and waits for it. A
child that crashes (a C++ abort takes the whole process down) costs only its
own point, which is recorded with its error. Each finished point is appended
to the CSV as one line, with one ``os.write`` on an ``O_APPEND`` descriptor
followed by ``fsync``, so a killed sweep loses no finished point and never
leaves half a row; ``resume`` skips the points already in the file, matched
by their key (the hash of the point's full scenario).
"""

from __future__ import annotations

import contextlib
import csv
import dataclasses
import functools
import io
import itertools
import json
import logging
import math
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hcsim.config import Fields, load_yaml
from hcsim.errors import ConfigError, HcsimError, OutputError, brief
from hcsim.run.results import (DEVICE_COLUMNS, MEMORY_COLUMNS, SPLIT_PARTS, TIME_PARTS, column_unit, csv_cell,
                           resolve_scenario, rows_for, scenario_column, scenario_columns)
from hcsim.run.scenario import SCENARIO_KEYS, Scenario, apply_settings, load_scenario, renamed

__all__ = ["Experiment", "Axis", "Point", "SweepReport", "load_experiment", "run_sweep", "run_point", "run_points",
           "check_executor", "result_rows", "read_results", "upgrade_records", "write_report", "columns", "RESULT_COLUMNS",
           "TEXT_COLUMNS", "FolderLock", "append_whole", "check_resume"]

log = logging.getLogger(__name__)

# Every row records the point's whole scenario, resolved (defaults replaced by the platform's and
# workload's values) and in SI units named in the column: hcsim.run.results.scenario_columns(), one per
# Scenario field. A point has one row per device type (hcsim.run.results.DEVICE_COLUMNS: the device, its XPU
# count and where its XPUs' iteration goes, mean over them), each with the point's results below; a failed
# point has one row.
# What a row records of a point's result; every row has all of them (blank for a failed point).
RESULT_COLUMNS = (
    "iteration_time_s",        # s, mean over the steady-state iterations (all but the first)
    "batches_per_s",           # the paper's throughput: XPUs x batches per XPU / iteration time
    "samples_per_s",
    "batches_per_s_per_xpu",   # batches_per_s / xpus: where a slower device type enters, it drops
    "busiest_link",            # "kind u -> v": the link direction with the highest mean utilization
    "busiest_link_utilization",  # its bytes / (bandwidth x simulated time)
    "iteration_times_s",       # s, each iteration's, joined with + (text)
    "measured_iterations",     # "2..N": the iterations the device columns and iteration_time_s average
    "device_counts",           # "128 H100 + 128 A100"
    "activities",
    "wall_time_s",             # s of the simulation process (setup included)
    "peak_rss_mb",
    "inputs_hash",
    "hcsim_version",
    "simgrid_version",
    # added later: blank in the rows of a CSV written before they existed (see _upgrade)
    "tokens_per_s",            # blank for a workload without tokens per sample
    "model_flops_per_s_per_xpu",  # FLOP/s: the model's FLOPs (as Megatron-LM counts them) per XPU
    "mfu",                     # model FLOP/s over the XPUs' peak at the workload's precision (0..1)
)
ADDED_RESULT_COLUMNS = ("tokens_per_s", "model_flops_per_s_per_xpu", "mfu", *SPLIT_PARTS, *MEMORY_COLUMNS)
# whole mappings written as JSON before each of their keys had a column: read from the CSVs of then
LEGACY_MAPPINGS = ("platform_overrides", "workload_overrides")
STATUS_COLUMNS = ("status", "error")  # status: ok | error
MAX_CSV_BYTES = 2**30  # a results CSV read back (--resume, --report-only) is at most 1 GiB
# Columns read back as text whatever they look like (a point key such as 36725e2733359637 is no number).
TEXT_COLUMNS = ("point", "inputs_hash", "hcsim_version", "simgrid_version", "status", "error", "busiest_link",
                "iteration_times_s", "measured_iterations", "device_counts", "device", "least_idle_xpu", "breakdown",
                "devices", "collective", "granularity", "collective_model", "ring_order", "layer_split",
                "batch_split", "offload_state", "trace_xpus", "trace_iterations", "platform_overrides",
                "workload_overrides")
POINT_FOLDER_PREFIX = "hcsim-point-"  # + the sweep's process id: /tmp/hcsim-point-PID-XXXX, one per running point


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
            where = f"{self.path or self.name}: point {index} ({_describe(labels)})"
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
        problems = check_specs([(f"{self.path or self.name}: point {p.index} ({_describe(p.labels)})", p.scenario)
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


def _describe(labels: dict[str, Any]) -> str:
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
                          "to lists of values), see hcsim/study/sweep.py or experiments/paper/fig8.yaml")
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


def columns(experiment: Experiment, points: list[Point] | None = None) -> list[str]:
    """The CSV header of `experiment`: point key, axes, every scenario column, a column per key of
    platform_overrides and workload_overrides any point sets, device columns, results, status."""
    axes = experiment.axis_columns()
    scenario = scenario_columns()
    overrides = sorted({c for p in (experiment.points() if points is None else points) for c in p.inputs
                        if c.startswith(LEGACY_MAPPINGS) and "." in c})
    return ["point", *axes, *(c for c in [*scenario, *overrides] if c not in axes), *DEVICE_COLUMNS,
            *RESULT_COLUMNS, *STATUS_COLUMNS]


# --- running one point -------------------------------------------------------------------------


def run_point(scenario: Scenario, timeout: float | None = None,
              started: Callable[[subprocess.Popen], None] | None = None,
              progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    """Run `scenario` in a fresh Python process and return its result record, or ``{"error": message}``.

    This is what a sweep's executor runs (a local thread, or a Dask worker:
    the child is started with that worker's own Python). The child is killed
    if this process dies (Linux) or `timeout` (s) passes. `progress`, if given,
    is called about once a second with the fraction (0..1) of the point's vertex
    runs done so far.
    """
    with tempfile.TemporaryDirectory(prefix=f"{POINT_FOLDER_PREFIX}{os.getpid()}-") as folder:
        source, target = Path(folder) / "scenario.pickle", Path(folder) / "result.json"
        source.write_bytes(pickle.dumps(scenario))
        command = [sys.executable, "-m", "hcsim.study.sweep", str(source), str(target), str(os.getpid())]
        with open(Path(folder) / "stderr", "w+", errors="replace") as errors:
            process = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                       stderr=errors, text=True)
            if started is not None:
                started(process)
            deadline = None if timeout is None else time.monotonic() + timeout
            while True:
                wait = None if deadline is None else max(0.0, deadline - time.monotonic())
                try:
                    process.wait(timeout=wait if progress is None else min(wait or 1.0, 1.0))
                    break
                except subprocess.TimeoutExpired:
                    if deadline is not None and time.monotonic() >= deadline:
                        process.kill()
                        process.wait()
                        return {"error": f"timed out after {timeout:g} s"}
                    if progress is not None:
                        _report_progress(target.with_name("progress"), progress)
            errors.seek(0)
            stderr = errors.read()
        if target.is_file():
            return json.loads(target.read_text())
        code = process.returncode
        cause = f"signal {signal.Signals(-code).name}" if code < 0 else f"exit code {code}"
        lines = [line for line in stderr.splitlines() if line.strip()]
        return {"error": f"the simulation process died ({cause})" + (f": {lines[-1].strip()}" if lines else "")}


def _report_progress(path: Path, progress: Callable[[float], None]) -> None:
    """Pass on the fraction the point's process last wrote to `path` (none yet, or half written: nothing)."""
    try:
        fraction = float(path.read_text())
    except (OSError, ValueError):
        return
    progress(min(max(fraction, 0.0), 1.0))


def _progress_file(path: Path, every: float = 0.5):
    """A run_here progress factory that writes the fraction of vertex runs done to `path`, at most every
    `every` s."""
    def factory(total: int):
        state = {"done": 0, "written": 0.0}

        def update(count: int) -> None:
            state["done"] += count
            now = time.monotonic()
            if now - state["written"] >= every and total:
                state["written"] = now
                path.write_text(f"{state['done'] / total:.4f}")
        return update
    return factory


def _point_main(argv: Sequence[str]) -> int:
    """Child side of :func:`run_point`: run one pickled scenario, write its result as JSON."""
    source, target, parent = Path(argv[0]), Path(argv[1]), int(argv[2])
    _die_with_parent(parent)
    scenario = pickle.loads(source.read_bytes())
    from hcsim.run.report import atomic_write
    from hcsim.run.simulation import run_here

    try:
        result = run_here(scenario, progress=_progress_file(target.with_name("progress")))
    except HcsimError as err:
        result = {"error": str(err)}
    except Exception as err:  # a bug: record it and keep the traceback on stderr for the log
        import traceback

        traceback.print_exc()
        result = {"error": f"{type(err).__name__}: {err} (a bug in hcsim; please report it)"}
    atomic_write(target, json.dumps(result))
    return 0


def _die_with_parent(parent: int) -> None:
    """Ask Linux to kill this process when its parent dies, so a killed sweep leaves no orphans."""
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def result_rows(point: Point, result: dict[str, Any], header: Sequence[str]) -> list[dict[str, Any]]:
    """The CSV rows (column -> value) of one point: one per device type, or one for its error."""
    row: dict[str, Any] = dict.fromkeys(header, "")
    row["point"] = point.key
    row.update(point.inputs)
    row.update(point.labels)
    if "error" in result:
        row.update(status="error", error=result["error"])
        return [row]
    xpus = result["xpus"]
    kind, busiest = max(((k, rows[0]) for k, rows in result["links"].items()), key=lambda kr: kr[1]["utilization"])
    row.update(
        busiest_link=f"{kind} {busiest['link']}", busiest_link_utilization=busiest["utilization"],
        iteration_time_s=result["iteration_time_s"], batches_per_s=result["batches_per_s"],
        samples_per_s=result["samples_per_s"], batches_per_s_per_xpu=result["batches_per_s"] / xpus,
        iteration_times_s=csv_cell(result["iteration_times_s"]),
        tokens_per_s=result.get("tokens_per_s"), model_flops_per_s_per_xpu=result.get("model_flops_per_s_per_xpu"),
        mfu=result.get("mfu"),
        measured_iterations=result["measured_iterations"],
        device_counts=" + ".join(f"{n} {d}" for d, n in result["devices"].items()),
        activities=result["activities"], wall_time_s=round(result["wall_time_s"], 3),
        peak_rss_mb=round(result["peak_rss_mb"], 1), inputs_hash=result["inputs_hash"],
        hcsim_version=result["versions"]["hcsim"], simgrid_version=result["versions"]["simgrid"],
        status="ok")
    rows = []
    for device, parts in result["breakdown"].items():
        pace = result["pace"][device]
        memory = result.get("memory", {}).get(device, {})
        rows.append({**row, "device": device, "device_xpus": parts["xpus"],
                     **{part: parts[part] for part in TIME_PARTS},
                     "least_idle_xpu": pace["xpu"], "least_idle_s": pace["idle_s"],
                     **{part: parts.get(part) for part in SPLIT_PARTS},
                     "state_per_xpu_bytes": memory.get("state_bytes"), "spilled_per_xpu_bytes": memory.get("spilled_bytes"),
                     "offloaded_per_xpu_bytes": memory.get("offloaded_bytes")})
    return rows


# --- the CSV -------------------------------------------------------------------------------------


def _csv_line(values: Iterable[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(["" if v is None else v for v in values])
    return buffer.getvalue()


class _ResultsFile:
    """results/NAME.csv: a header written once, then whole rows appended one write each."""

    def __init__(self, path: Path, header: list[str]):
        self.path = path
        self.header = header
        self.lock = threading.Lock()
        if not path.exists() or path.stat().st_size == 0:
            from hcsim.run.report import atomic_write

            atomic_write(path, _csv_line(header))
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Append a point's rows (one per device type) in one write."""
        data = "".join(_csv_line(row[c] for c in self.header) for row in rows).encode()
        with self.lock:
            append_whole(self.fd, data, self.path)

    def close(self) -> None:
        os.close(self.fd)


def append_whole(fd: int, data: bytes, path: Path) -> None:
    """Append `data` to `path`, open as `fd` with ``O_APPEND``, in one write, then sync it: a process killed
    meanwhile leaves all of it or none (a power loss at most a torn last line, which readers drop)."""
    written = os.write(fd, data)
    if written != len(data):
        raise OSError(f"{path}: short write ({written} of {len(data)} bytes); the disk may be full")
    os.fsync(fd)


def check_resume(resume: bool, overwrite: bool, kept: str = "the rows already in the CSV") -> None:
    """--resume and --overwrite together are refused: `kept` are what --resume keeps."""
    if resume and overwrite:
        raise ConfigError(f"--resume, --overwrite: they contradict each other (keep {kept}, or start over "
                          "replacing them); give one")


def _existing(path: Path, header: list[str], points: Sequence[Point] = ()) -> dict[str, str]:
    """Point key -> status of the rows already in `path`; a torn last line (power loss) is dropped.

    Raises
    ------
    ConfigError
        naming the file and line of a line that is not a row of this experiment (garbage, binary, a
        wrong number of columns), or if the header is another experiment's.
    """
    if not path.exists() or path.stat().st_size == 0:
        return {}
    from hcsim.config import read_text

    text = read_text(path, MAX_CSV_BYTES, "a results CSV")
    if not text.endswith("\n"):
        from hcsim.run.report import atomic_write

        text = text[: text.rfind("\n") + 1]
        log.warning("%s: dropped an incomplete last line", path)
        atomic_write(path, text)
    rows = _parse_csv(path, text)
    found = rows[0][1] if rows else None
    whole = [(line, row) for line, row in rows[1:] if len(row) == len(found or ())]
    upgraded = upgrade_records(found or [], header, [dict(zip(found, row)) for _, row in whole], points)
    if upgraded is None:
        raise ConfigError(f"{path}: its columns are not this experiment's (were the axes changed?). "
                          "Fix: move the file away, or run with --overwrite to start over")
    new = [[record[c] for c in header] for record in upgraded]
    if found != header or any(row != old for row, (_, old) in zip(new, whole)):
        # written by an older hcsim: new columns (scenario keys at their defaults, results blank), cells as today
        from hcsim.run.report import atomic_write

        log.warning("%s: written by an older hcsim; adding the columns %s (scenario keys at their defaults, "
                    "results it did not record blank) and writing its cells as today's (no numbers change)", path,
                    ", ".join(c for c in header if c not in found) or "none")
        lines = dict(zip((line for line, _ in whole), new))
        rows = [(1, header)] + [(line, lines.get(line, row)) for line, row in rows[1:]]
        atomic_write(path, "".join(_csv_line(row) for _, row in rows))
    status_column, counts_column = header.index("status"), header.index("device_counts")
    status, counts, expected = {}, defaultdict(int), {}
    for line, row in rows[1:]:
        if len(row) != len(header) or row[status_column] not in ("ok", "error") or not row[0]:
            raise ConfigError(f"{path}:{line}: not a row of this experiment ({len(row)} of {len(header)} columns, "
                              f"status {brief(row[status_column] if len(row) > status_column else None)}); fix or "
                              "delete that line, or run with --overwrite to start over")
        key = row[0]
        status[key] = row[status_column]
        counts[key] += 1
        if status[key] == "ok":
            expected[key] = len(row[counts_column].split(" + "))
    torn = {k for k, n in expected.items() if counts[k] != n}  # a point's rows cut short by a power loss
    if torn:
        log.warning("%s: dropped %d points with some of their device rows missing", path, len(torn))
        _drop_rows(path, torn)
    return {k: v for k, v in status.items() if k not in torn}


def _parse_csv(path: Path, text: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of each non-empty record of CSV `text`; a line csv cannot read is a ConfigError."""
    reader = csv.reader(io.StringIO(text))
    rows = []
    while True:
        line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return rows
        except csv.Error as err:
            raise ConfigError(f"{path}:{line}: not a CSV row ({err}); fix or delete that line, or run with "
                              "--overwrite to start over") from None
        if row:
            rows.append((line, row))


def _drop_rows(path: Path, keys: set[str]) -> None:
    from hcsim.run.report import atomic_write

    lines = path.read_text().splitlines(keepends=True)
    keep = [lines[0]] + [line for line in lines[1:] if next(csv.reader([line]))[0] not in keys]
    atomic_write(path, "".join(keep))


def read_results(path: str | Path, header: Sequence[str] | None = None, points: Sequence[Point] = ()
                 ) -> list[dict[str, Any]]:
    """The rows of a sweep's CSV, with numbers, booleans and blanks (None) typed back; with `header` (today's
    columns of its experiment, :func:`columns`), an older CSV's rows as today's (:func:`upgrade_records`).

    A column is typed as a whole, as pandas does: numbers when every value in it is a finite number,
    booleans when every value is True or False; otherwise, and always for TEXT_COLUMNS (point keys
    such as ``36725e2733359637``, which Python and pandas would read as infinity), its values stay
    text. (``pandas.read_csv(path, dtype={"point": str, "inputs_hash": str})`` reads the same file.)
    """
    from hcsim.config import read_text

    wanted = header
    rows = _parse_csv(Path(path), read_text(path, MAX_CSV_BYTES, "a results CSV"))
    if not rows:
        return []
    found = rows[0][1]
    bad = next((line for line, row in rows[1:] if len(row) != len(found)), None)
    if bad is not None:
        raise ConfigError(f"{path}:{bad}: not a row of this file ({len(found)} columns in its header); fix or "
                          "delete that line")
    records = [dict(zip(found, row)) for _, row in rows[1:]]
    if wanted is not None:  # an older CSV of this experiment, as hcsim writes it today
        records = upgrade_records(found, list(wanted), records, points)
        if records is None:
            raise ConfigError(f"{path}: its columns are not this experiment's (were the axes changed?). Fix: run "
                              "the sweep again with --overwrite")
        header = list(wanted)
    else:
        header = found
    kinds = {column: _column_kind(column, [record[column] for record in records]) for column in header}
    return [{k: _typed(v, kinds[k]) for k, v in record.items()} for record in records]


def upgrade_records(found: list[str], header: list[str], records: list[dict[str, str]],
                    points: Sequence[Point] = ()) -> list[dict[str, str]] | None:
    """The rows (column -> CSV text) of a results CSV whose header is `found`, as rows of `header`, the header
    of today's hcsim for its experiment; None when `found` is another experiment's.

    A CSV written by an older hcsim lacks columns that came later: a scenario key's gets its default (every
    run of the file had it; a key whose default the specs resolve, such as precision, gets what it resolves
    to for the row's point among `points`: the same key, so the same scenario), a result's (:data:`ADDED_RESULT_COLUMNS`) stays blank (not recorded), a key of
    platform_overrides or workload_overrides gets its value from the mapping the file wrote as JSON. Cells
    written as they were then become today's (:func:`_today`): "none" and prose blank, JSON lists joined
    with +, a mapping its keys. No number changes."""
    if any(c not in header for c in found) or [c for c in header if c in found] != list(found):
        return None
    defaults = {scenario_column(f.name): csv_cell(f.default) for f in dataclasses.fields(Scenario)
                if f.default is not dataclasses.MISSING and f.default is not None}
    missing = [c for c in header if c not in found]
    mapped = [c for c in missing if c.startswith(LEGACY_MAPPINGS) and "." in c]
    scenario = set(scenario_columns())
    if any(c not in scenario and c not in ADDED_RESULT_COLUMNS and c not in mapped for c in missing):
        return None
    inputs = {p.key: p.inputs for p in points}
    upgraded = []
    for record in records:
        row = {c: _today(c, record[c]) if c in record else "" for c in header}
        for c in missing:
            if c in scenario and c not in defaults:
                value = inputs.get(record.get("point"), {}).get(c)
                row[c] = "" if value is None else str(value)
            elif c in defaults:
                row[c] = "" if defaults[c] is None else str(defaults[c])
            elif c in mapped:
                mapping, key = c.split(".", 1)
                value = _json_mapping(record.get(mapping, "")).get(key)
                row[c] = "" if value is None else str(csv_cell(value))
        upgraded.append(row)
    return upgraded


_NOTHING = {"cxl_bandwidth_Bps": "none", "cxl_latency_s": "none", "collective_chunks": "the algorithm's default",
            "devices": "per node (explicit topology)"}  # what older CSVs wrote where nothing exists


def _today(column: str, text: str) -> str:
    """A cell of an older CSV as hcsim writes it today."""
    if _NOTHING.get(column) == text:
        return ""
    if column in LEGACY_MAPPINGS and text.startswith("{"):
        return str(csv_cell(sorted(_json_mapping(text))) or "")
    if text.startswith("[") and column in TEXT_COLUMNS:
        try:
            value = json.loads(text)
        except ValueError:
            return text
        return str(csv_cell(value)) if isinstance(value, list) else text
    return text


def _json_mapping(text: str) -> dict:
    try:
        value = json.loads(text) if text.startswith("{") else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _column_kind(column: str, values: list[str]) -> str:
    present = [v for v in values if v != ""]
    if column in TEXT_COLUMNS or not present:
        return "text"
    if all(v in ("True", "False") for v in present):
        return "bool"
    if all(_number(v) is not None for v in present):
        return "number"
    return "text"


def _number(text: str) -> int | float | None:
    """`text` as an int or a finite float, or None."""
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        return value if kind is int or math.isfinite(value) else None
    return None


def _typed(text: str, kind: str) -> Any:
    if text == "":
        return None
    if kind == "bool":
        return text == "True"
    if kind == "number":
        return _number(text)
    return text


# --- the runner ----------------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SweepReport:
    """What a sweep did: the CSV, points run / skipped / failed, wall time (s), the report files."""

    csv: Path
    total: int
    ran: int
    skipped: int
    failed: int
    wall_time_s: float
    outputs: tuple[Path, ...] = ()


def run_sweep(experiment: Experiment, out: str | Path = "results", *, jobs: int = 1, resume: bool = False,
              overwrite: bool = False, retry_errors: bool = False, executor: str = "local",
              timeout: float | None = None, report: bool = True,
              progress: Callable[[Point, dict[str, Any], float], None] | None = None,
              planned: Callable[[list[Point]], None] | None = None,
              running: Callable[[Point, float], None] | None = None) -> SweepReport:
    """Run every point of `experiment` not yet in ``OUT/NAME.csv``, `jobs` at a time; then draw and summarise.

    Parameters
    ----------
    out : folder of NAME.csv, NAME.png, NAME.svg and NAME.md.
    jobs : points run at once (local executor; a Dask cluster runs as many as it has threads).
    resume : keep the rows already in the CSV and run only the missing points.
    overwrite : start over, replacing an existing CSV.
    retry_errors : with `resume`, run again the points recorded with an error.
    executor : ``local`` (threads, each waiting for its point's process) or ``dask://HOST:PORT``.
    timeout : s a point may run before it is killed and recorded as an error.
    report : draw the plots and write the summary at the end.
    progress : called in the calling thread after each point with (point, row, cost).
    planned : called once with the points about to run.
    running : called about once a second from a worker thread with (point, fraction done) while a point
        runs (local executor only), so a progress bar moves during long points.

    Raises
    ------
    ConfigError
        if the CSV exists and neither `resume` nor `overwrite` is given, or its columns differ.
    """
    from hcsim.config import check_output_folder

    started_at = time.perf_counter()
    if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float))
                                or not 0 < timeout < float("inf")):
        raise ConfigError(f"timeout: must be a number of seconds > 0, got {brief(timeout)}; None: no time limit")
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 1:
        raise ConfigError(f"jobs: must be an integer >= 1, got {brief(jobs)}")
    check_executor(executor)
    check_resume(resume, overwrite)
    out = check_output_folder(out, "--out")
    path = out / f"{experiment.name}.csv"
    points = experiment.points()
    header = columns(experiment, points)
    with FolderLock(path, "sweep"):
        _remove_stale_point_folders()
        return _run_locked(experiment, out, path, header, points, started_at, jobs=jobs, resume=resume,
                           overwrite=overwrite, retry_errors=retry_errors, executor=executor, timeout=timeout,
                           report=report, progress=progress, planned=planned, running=running)


def _run_locked(experiment, out, path, header, points, started_at, *, jobs, resume, overwrite, retry_errors,
                executor, timeout, report, progress, planned, running) -> SweepReport:
    """run_sweep once the experiment's results are locked for this process."""
    if path.exists() and path.stat().st_size and not (resume or overwrite):
        raise ConfigError(f"{path}: exists. Fix: --resume to run only the missing points, or --overwrite to start over")
    if overwrite and path.exists():
        path.unlink()
    done = _existing(path, header, points) if resume else {}
    if retry_errors:
        failed = {k for k, status in done.items() if status != "ok"}
        if failed:
            _drop_rows(path, failed)
            done = {k: s for k, s in done.items() if k not in failed}
    todo = [p for p in points if p.key not in done]
    todo.sort(key=lambda p: -p.cost)  # longest first: the last jobs to finish are short ones
    if planned is not None:
        planned(todo)
    results = _ResultsFile(path, header)
    failures = 0
    point_running = (lambda index, fraction: running(todo[index], fraction)) if running is not None else None
    try:
        with contextlib.closing(run_points([p.scenario for p in todo], jobs=jobs, executor=executor,
                                           timeout=timeout, running=point_running)) as finished:
            for index, result in finished:
                point = todo[index]
                rows = result_rows(point, result, header)
                results.append(rows)
                row = rows[0]
                failures += row["status"] != "ok"
                if row["status"] != "ok":
                    log.warning("point %d (%s) failed: %s", point.index, _describe(point.labels), row["error"])
                if progress is not None:
                    progress(point, row, point.cost)
    finally:
        results.close()
    try:
        outputs = write_report(experiment, path, out) if report else ()
    except OSError as err:
        raise OutputError(f"{err.filename or out}: could not write the plots and summary ({err.strerror or err}); "
                          f"every finished point is in {path}: run again with --report-only") from None
    return SweepReport(csv=path, total=len(points), ran=len(todo), skipped=len(points) - len(todo),
                       failed=failures, wall_time_s=time.perf_counter() - started_at, outputs=tuple(outputs))


class FolderLock:
    """An exclusive lock on OUT/.NAME.lock while a `what` (sweep, plan, validation) writes OUT/NAME.EXT
    (`guarded`): a second one into the same folder is refused instead of doubling its rows. The lock (flock)
    ends with the process, even a killed one; the file is removed on a normal exit."""

    def __init__(self, guarded: Path, what: str):
        self.guarded = guarded
        self.what = what
        self.path = guarded.parent / f".{guarded.stem}.lock"
        self.fd: int | None = None

    def __enter__(self) -> "FolderLock":
        import fcntl

        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise ConfigError(f"{self.guarded}: another {self.what} is writing it (lock {self.path} held); "
                                  "wait for it to end, or give another --out") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a lock file its previous owner removed meanwhile
                previous = os.read(fd, 64).decode(errors="replace").strip()
                if previous:  # its sweep was killed (SIGKILL, power loss) before it could remove the file
                    log.warning("%s: taking over the lock of %s process %s, which is no longer running (killed?); "
                                "what it finished is kept in %s", self.path, self.what, previous, self.guarded.name)
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self.fd = fd
                return self
            os.close(fd)
        raise ConfigError(f"{self.path}: could not take the {self.what} lock; try again")

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None


def _remove_stale_point_folders() -> None:
    """Remove the point folders (``/tmp/hcsim-point-PID-*``) of sweeps that died without cleaning up (SIGKILL)."""
    import shutil

    for folder in Path(tempfile.gettempdir()).glob(f"{POINT_FOLDER_PREFIX}*"):
        owner = folder.name[len(POINT_FOLDER_PREFIX):].partition("-")[0]
        if not folder.is_dir() or not owner.isdigit() or _alive(int(owner)):
            continue
        shutil.rmtree(folder, ignore_errors=True)
        log.info("removed %s, left by a sweep that was killed", folder)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process
        return True
    return True


class _Children:
    """The point processes a local sweep has started, to kill them when the sweep is interrupted."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.processes: list[subprocess.Popen] = []

    def add(self, process: subprocess.Popen) -> None:
        with self.lock:
            self.processes = [p for p in self.processes if p.poll() is None] + [process]

    def kill_all(self) -> None:
        with self.lock:
            for process in self.processes:
                if process.poll() is None:
                    process.kill()


def check_executor(executor: str) -> None:
    """Raise ConfigError unless `executor` is ``local`` or ``dask://HOST:PORT``."""
    if not isinstance(executor, str) or not (executor == "local" or executor.startswith("dask://")):
        raise ConfigError(f"--executor {brief(executor)}: expected 'local' or 'dask://HOST:PORT'")


def run_points(scenarios: Sequence[Scenario], *, jobs: int = 1, executor: str = "local",
               timeout: float | None = None, running: Callable[[int, float], None] | None = None
               ) -> Iterator[tuple[int, dict[str, Any]]]:
    """Run each scenario in a process of its own (:func:`run_point`) on `executor`, `jobs` at a time (local:
    threads; ``dask://HOST:PORT``: a Dask cluster's workers); yield (index in `scenarios`, result record) as
    each finishes. A failure of the executor itself (a lost Dask worker...) is that point's error. Stopping
    early (an exception, or closing the iterator) cancels the points not started and kills the local ones
    running. `running` as :func:`run_sweep`'s, with the index instead of the point."""
    with _PointExecutor(executor, jobs) as (pool, children):
        local = children is not None
        futures: dict[Future, int] = {
            pool.submit(run_point, scenario, timeout, children.add if local else None,
                        functools.partial(running, index) if local and running is not None else None): index
            for index, scenario in enumerate(scenarios)}
        try:
            for future in as_completed(futures):
                try:
                    result = future.result()
                except Exception as err:  # the executor itself failed (a lost Dask worker...)
                    result = {"error": f"the executor failed: {type(err).__name__}: {err}"}
                yield futures[future], result
        except BaseException:
            for future in futures:
                future.cancel()
            if children is not None:
                children.kill_all()
            raise


class _PointExecutor:
    """``local`` -> a thread pool of `jobs` threads; ``dask://HOST:PORT`` -> a Dask cluster's executor."""

    def __init__(self, spec: str, jobs: int):
        if jobs < 1:
            raise ConfigError(f"--jobs: must be >= 1, got {jobs}")
        self.spec, self.jobs, self.client = spec, jobs, None

    def __enter__(self) -> tuple[Executor, _Children | None]:
        if self.spec == "local":
            self.pool: Executor = ThreadPoolExecutor(max_workers=self.jobs, thread_name_prefix="hcsim-point")
            return self.pool, _Children()
        if self.spec.startswith("dask://"):
            try:
                import distributed
            except ImportError as err:
                raise ConfigError(f"--executor {self.spec}: Dask is not installed. "
                                  "Fix: pip install 'hcsim[dask]'") from err
            address = "tcp://" + self.spec.removeprefix("dask://")
            try:
                self.client = distributed.Client(address, timeout="10s")
            except OSError as err:
                raise ConfigError(f"--executor {self.spec}: cannot reach a Dask scheduler at {address}: {err}") from err
            self.pool = self.client.get_executor(pure=False)
            return self.pool, None
        raise ConfigError(f"--executor {self.spec!r}: expected 'local' or 'dask://HOST:PORT'")

    def __exit__(self, *exc) -> None:
        interrupted = exc[0] is not None
        if self.client is None:
            self.pool.shutdown(wait=not interrupted, cancel_futures=interrupted)
        else:
            self.pool.shutdown(wait=not interrupted)
        if self.client is not None:
            self.client.close()


# --- the report ----------------------------------------------------------------------------------


def write_report(experiment: Experiment, csv_path: Path, out: Path) -> list[Path]:
    """Draw the experiment's plots (PNG and SVG) and write its markdown summary; return the files."""
    from hcsim.run.report import atomic_write
    from hcsim.study.findings import evaluate
    from hcsim.study.plotting import plot_experiment

    points = experiment.points()
    rows = read_results(csv_path, columns(experiment, points), points)
    keys = {p.key for p in points}
    rows = [r for r in rows if r["point"] in keys]
    outputs = plot_experiment(experiment, rows, out)
    findings = [evaluate(spec, rows, experiment.axis_columns()) for spec in experiment.findings]
    summary = out / f"{experiment.name}.md"
    atomic_write(summary, _summary(experiment, rows, findings, outputs, out))
    return [*outputs, summary]


def _summary(experiment: Experiment, rows: list[dict[str, Any]], findings, figures: list[Path], out: Path) -> str:
    from hcsim.units import format_percent

    ok = [r for r in rows if r["status"] == "ok"]
    failed = [r for r in rows if r["status"] != "ok"]
    lines = [f"# {experiment.name}", ""]
    if experiment.description:
        lines += [experiment.description, ""]
    for figure in figures:
        if figure.suffix == ".png":
            lines += [f"![{figure.stem}]({figure.name})", ""]
    if findings:
        lines += ["## Findings", ""]
        for finding in findings:
            lines.append(f"- **{'holds' if finding.ok else 'does not hold'}**: {finding.claim} — {finding.detail}")
        lines.append("")
    if experiment.notes:
        lines += ["## Discussion", "", experiment.notes, ""]
    lines += ["## Results", ""]
    axes = experiment.axis_columns()
    shown = [c for c in axes if c in rows[0]] if rows else axes
    metrics = ["batches_per_s", "batches_per_s_per_xpu", "iteration_time_s"]
    parts = list(TIME_PARTS)
    iterations = sorted({r["measured_iterations"] for r in ok})
    lines.append("One row per point and device type. " + ", ".join(parts) + ": seconds per iteration, mean over that "
                 "device type's XPUs, averaged over iterations " + (" or ".join(iterations) or "-")
                 + "; the four add up to iteration_time_s. least idle: that type's XPU its peers wait for.")
    lines.append("")
    lines.append("| " + " | ".join(shown + metrics + ["device"] + parts) + " | least idle | wall_time_s | busiest link |")
    lines.append("|" + "---|" * (len(shown) + len(metrics) + len(parts) + 4))
    for row in sorted(ok, key=lambda r: [_sort_key(r[c]) for c in shown]):
        cells = [_cell(c, row[c]) for c in shown] + [f"{row[m]:.4g}" for m in metrics]
        cells += [f"{row['device_xpus']} {row['device']}"] + [f"{row[p]:.4g}" for p in parts]
        cells += [f"{row['least_idle_xpu']}", f"{row['wall_time_s']:.4g}",
                  f"{row['busiest_link']} {format_percent(row['busiest_link_utilization'])}"]
        lines.append("| " + " | ".join(cells) + " |")
    lines.append("")
    wall = sum(r["wall_time_s"] for r in rows_for(ok, "wall_time_s"))
    points = len({r["point"] for r in ok})
    lines.append(f"{points} points, {len(failed)} failed; {wall / 60:.1f} min of simulation process time in all.")
    if failed:
        lines += ["", "Failed points:", ""]
        lines += [f"- {_describe({c: r[c] for c in shown})}: {r['error']}" for r in failed]
    lines += ["", f"Columns and every metric: `{experiment.name}.csv` (`pandas.read_csv`; one row per point and "
              f"device type, every scenario key resolved). Regenerate with "
              f"`hcsim sweep {experiment.path or experiment.name + '.yaml'} --out {out} --resume`.", ""]
    return "\n".join(lines)


def _sort_key(value: Any) -> tuple:
    return (0, value, "") if isinstance(value, (int, float)) else (1, 0, str(value))


def _cell(column: str, value: Any) -> str:
    from hcsim.units import format_quantity

    unit = column_unit(column)
    if unit is not None and isinstance(value, (int, float)):
        return format_quantity(value, unit)
    return str(value)


if __name__ == "__main__":
    sys.exit(_point_main(sys.argv[1:]))
