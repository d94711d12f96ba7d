"""Validation against measured training runs: `hcsim validate RUNS.csv --platform SPEC`.

A RUNS file is a CSV with one measured run per row (:data:`COLUMNS`). Each row
becomes a scenario on its platform (its ``platform`` cell, else --platform; the model
shape and kinds overriding a base workload, ``gpt-megatron`` unless the row names
another; its ``set`` cell any other scenario key). Every row's cells, keys and specs
are checked before the first simulation (:func:`check_rows`). Each is simulated in a fresh
process (one SimGrid engine per process). The result table has the measured and
simulated iteration times and the signed error (simulated - measured) /
measured; rows that cannot be simulated keep their reason. Throughputs are
compared as the iteration times they imply:

- ``s`` / ``ms``: seconds (milliseconds) per iteration;
- ``samples/s``, ``tokens/s``: global_batch (x sequence) / iteration time;
- ``tflops/gpu``: TFLOP/s per GPU counted as Narayanan et al. 2021 count them,
  96·B·s·L·h²·(1 + s/6h + V/16Lh) FLOP per iteration (B global batch,
  L layers, V vocabulary; full recomputation), over the GPUs.

Rows whose ``role`` is ``calibration`` set factors (platforms/compute-model.yaml
says which); the summary reports them apart from the held-out rows.
"""

from __future__ import annotations

import contextlib
import csv
import io
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hcsim.errors import ConfigError, HcsimError, SimulationError, brief
from hcsim.study.points import run_points

__all__ = ["COLUMNS", "UNITS", "RunRow", "read_runs", "row_scenario", "check_rows", "validate", "summarize_rows", "write_report",
           "measured_seconds", "DEFAULT_SETTINGS"]

# column -> meaning; `name`, `gpus`, `measured` and `unit` are required, the rest optional
COLUMNS = {
    "name": "a label for the row",
    "role": "calibration (the row sets a factor) or empty (held out)",
    "workload": "base workload spec (name or path; default gpt-megatron)",
    "layers": "decoders L", "hidden": "h", "heads": "a", "ffn": "f (default 4h)",
    "vocabulary": "V", "sequence": "s",
    "gpu": "device name in the platform's catalog (default: the platform's)",
    "gpus": "GPUs of the run", "tp": "tensor-parallel size", "pp": "pipeline stages",
    "dp": "data-parallel replicas (default gpus / (tp x pp))", "micro_batch": "samples per micro-batch",
    "global_batch": "samples per iteration", "recompute": "none | selective | full",
    "schedule": "gpipe | 1f1b | interleaved | zb-h1", "virtual_stages": "chunks per stage (interleaved)",
    "sequence_parallel": "true | false", "attention": "standard | flash",
    "cp": "context-parallel size", "ep": "expert-parallel size", "zero": "ZeRO stage 0-3",
    "precision": "fp32 | fp16 | bf16 | fp8 (FP8: Transformer Engine's recipe; default: the workload's)",
    "kv_heads": "key/value heads (grouped-query attention; default: heads)", "mlp": "gelu | swiglu",
    "norm": "layernorm | rmsnorm", "kernels": "kernel inventory: megatron | pytorch-eager | torch-compile",
    "platform": "platform spec of this run (built-in name, or path relative to the CSV; default: --platform)",
    "set": "any other scenario keys of this run: KEY=VALUE;KEY=VALUE (e.g. offload=cpu;cp_algorithm=all_to_all)",
    "measured": "the measured value", "unit": "s | ms | samples/s | tokens/s | tflops/gpu",
    "source": "where the measurement comes from",
}
REQUIRED = ("name", "gpus", "measured", "unit")
MEASURED_SECONDS = (1e-6, 1e7)  # a measured iteration: 1 us to about four months
UNITS = ("s", "ms", "samples/s", "tokens/s", "tflops/gpu")
# Scenario settings every row gets unless --set says otherwise: the roofline model, one iteration (a
# Megatron iteration ends in a synchronous optimizer step, so iteration 1 is the steady state), every XPU
# simulated (on the engine core), and tensor-parallel collectives inside a DGX node as closed
# forms (exact there: nothing else crosses the NVSwitch meanwhile).
DEFAULT_SETTINGS = {"compute_model": "roofline", "iterations": 1,
                    "collective_model": "flow", "local_collectives": "analytic"}
_SHAPE = {"layers": "model.decoders", "hidden": "model.hidden", "heads": "model.heads", "ffn": "model.ffn",
          "vocabulary": "model.vocabulary", "sequence": "model.sequence"}
_INTS = ("layers", "hidden", "heads", "ffn", "vocabulary", "sequence", "gpus", "tp", "pp", "dp", "micro_batch",
         "global_batch", "virtual_stages", "cp", "ep", "kv_heads")
# the scenario keys a cell gives as it is, and the workload spec keys (workload_overrides) a cell sets
_SCENARIO_CELLS = ("tp", "pp", "dp", "micro_batch", "global_batch", "recompute", "schedule", "virtual_stages",
                   "sequence_parallel", "cp", "ep", "zero", "precision")
_WORKLOAD_CELLS = {"kv_heads": "model.kv_heads", "mlp": "model.mlp", "norm": "model.norm",
                   "kernels": "training.kernels", "attention": "training.attention"}


def _choices() -> dict[str, tuple[str, ...]]:
    """The columns whose cell is one word of a list, and the list."""
    from hcsim.workload.graph import PRECISIONS
    from hcsim.workload.model import MLP_TYPES, NORM_TYPES, RECOMPUTATION
    from hcsim.workload.ops import KERNEL_INVENTORIES
    from hcsim.workload.schedules import SCHEDULES
    from hcsim.workload.transformer import ATTENTION

    return {"precision": PRECISIONS, "mlp": MLP_TYPES, "norm": NORM_TYPES, "kernels": KERNEL_INVENTORIES,
            "recompute": RECOMPUTATION, "schedule": SCHEDULES, "attention": ATTENTION}


@dataclass(frozen=True, kw_only=True)
class RunRow:
    """One measured run: its CSV line number, the cells as read, and the measured value in `unit`."""

    line: int
    cells: dict[str, str]
    where: str = ""  # FILE:LINE of the row in its CSV (comment lines counted), for messages; default "line N"

    @property
    def name(self) -> str:
        return self.cells.get("name", "") or f"line {self.line}"

    @property
    def place(self) -> str:
        return self.where or f"line {self.line}"

    def value(self, key: str) -> Any:
        """The cell `key` typed (int, bool, str), None when empty; ConfigError naming the line and column."""
        text = (self.cells.get(key) or "").strip()
        if not text:
            return None
        if key in _INTS:
            try:
                number = int(text)
            except ValueError:
                raise ConfigError(f"line {self.line}: {key}: expected an integer, got {brief(text)}") from None
            if number < 1:
                raise ConfigError(f"line {self.line}: {key}: must be an integer >= 1, got {brief(text)}")
            return number
        if key == "zero":
            if text not in ("0", "1", "2", "3"):
                raise ConfigError(f"line {self.line}: zero: expected a ZeRO stage 0, 1, 2 or 3, got {brief(text)}")
            return int(text)
        choices = _choices().get(key)
        if choices is not None and text not in choices:
            raise ConfigError(f"line {self.line}: {key}: {brief(text)} is not one of {', '.join(choices)}")
        if key == "set":
            return _set_cell(text, self.line)
        if key == "sequence_parallel":
            if text.lower() not in ("true", "false", "yes", "no", "1", "0"):
                raise ConfigError(f"line {self.line}: sequence_parallel: expected true or false, got {brief(text)}")
            return text.lower() in ("true", "yes", "1")
        if key == "measured":
            try:
                value = float(text)
            except ValueError:
                raise ConfigError(f"line {self.line}: measured: expected a number, got {brief(text)}") from None
            if not (value > 0 and math.isfinite(value)):
                raise ConfigError(f"line {self.line}: measured: must be a finite number > 0, got {brief(text)}")
            return value
        return text


def _set_cell(text: str, line: int) -> dict[str, Any]:
    """A ``set`` cell, ``KEY=VALUE;KEY=VALUE``, as scenario settings (values read as YAML, as --set reads them)."""
    from hcsim.config import parse_yaml

    settings: dict[str, Any] = {}
    for item in text.split(";"):
        if not item.strip():
            continue
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or not key:
            raise ConfigError(f"line {line}: set: {brief(item.strip())}: expected KEY=VALUE (a scenario key, e.g. "
                              f"offload=cpu); separate several with ';'")
        if key in settings:
            raise ConfigError(f"line {line}: set: {key}: given twice; keep one")
        settings[key] = parse_yaml(value, f"line {line}: set: {key}") if value else ""
    return settings


def read_runs(path: str | Path) -> list[RunRow]:
    """Read a RUNS CSV ('#' lines are comments; a spreadsheet's UTF-8 BOM and CRLF line ends are read as they
    are) and check every row before anything is simulated.

    Raises
    ------
    ConfigError
        naming the file (and line and column) of every problem at once: not UTF-8 text, unknown or missing
        columns, no rows, a row with more cells than the header, a run name given twice, a cell that is not
        of its column's type, a measured value that is not a finite number in range or an unknown unit.
    """
    from hcsim.config import read_text

    path = Path(path)
    text = read_text(path, 64 * 2**20, "a runs CSV")
    numbered = [(n, line) for n, line in enumerate(text.splitlines(), start=1) if not line.lstrip().startswith("#")]
    reader = csv.DictReader(io.StringIO("\n".join(line for _, line in numbered)))
    header = [c.strip() for c in reader.fieldnames or []]
    unknown = [c for c in header if c not in COLUMNS]
    missing = [c for c in REQUIRED if c not in header]
    if unknown or missing:
        raise ConfigError(f"{path}: " + "; ".join(
            ([f"unknown columns {', '.join(brief(c)[1:-1] for c in unknown)}"] if unknown else [])
            + ([f"missing columns {', '.join(missing)}"] if missing else []))
            + f". Columns: {', '.join(COLUMNS)}")
    rows, problems, names = [], [], {}
    records = enumerate(reader, start=2)
    while True:
        try:
            number, record = next(records)
        except StopIteration:
            break
        except csv.Error as err:  # a cell beyond the csv module's field limit (131,072 characters), a stray NUL
            physical = numbered[min(reader.line_num, len(numbered) - 1)][0]
            problems.append(f"{path}:{physical}: not a CSV row hcsim reads ({err}); each cell holds one short value")
            break
        physical = numbered[min(reader.line_num, len(numbered)) - 1][0]  # the file's own line, comments counted
        if None in record:
            problems.append(f"{path}:{physical}: {len(header) + len(record[None])} cells, the header has "
                            f"{len(header)}; remove the extra cells (quote a cell that holds a comma)")
            continue
        cells = {k.strip(): (v or "").strip() for k, v in record.items() if k}
        if not any(cells.values()):
            continue
        row = RunRow(line=number, cells=cells, where=f"{path}:{physical}")
        name = cells.get("name", "")
        if name and name in names:
            problems.append(f"{path}:{physical}: name: {brief(name)} is also the name of line {names[name]}; "
                            f"give each run its own name")
        names.setdefault(name, physical)
        for key in [*_INTS, "sequence_parallel", "zero", *_choices(), "set"]:
            try:
                row.value(key)
            except ConfigError as err:
                problems.append(f"{path}:{physical}: {str(err).split(': ', 1)[1]}")
        try:
            seconds = measured_seconds(row)
        except ConfigError as err:
            problems.append(f"{path}:{physical}: {str(err).split(': ', 1)[1]}")
        else:
            if not MEASURED_SECONDS[0] <= seconds <= MEASURED_SECONDS[1]:
                problems.append(f"{path}:{physical}: measured: {cells.get('measured')} {cells.get('unit')} is "
                                f"{seconds:.3g} s per iteration, outside {MEASURED_SECONDS[0]:g} to "
                                f"{MEASURED_SECONDS[1]:g} s; check the value and its unit")
        rows.append(row)
    if problems:
        from hcsim.errors import invalid

        raise ConfigError(problems[0] if len(problems) == 1 else invalid(str(path), problems[:20]))
    if not rows:
        raise ConfigError(f"{path}: no runs, only a header; add one measured run per line "
                          f"(name, gpus, measured, unit at least)")
    return rows


def measured_seconds(row: RunRow) -> float:
    """The row's measured iteration time in s (module docstring); ConfigError when it cannot be derived."""
    value, unit = row.value("measured"), row.value("unit")
    if value is None:
        raise ConfigError(f"line {row.line}: measured: empty")
    if unit not in UNITS:
        raise ConfigError(f"line {row.line}: unit: {unit!r} is not one of {', '.join(UNITS)}")
    if unit in ("s", "ms"):
        return value * (1e-3 if unit == "ms" else 1.0)
    batch = row.value("global_batch")
    if batch is None:
        raise ConfigError(f"line {row.line}: unit {unit} needs global_batch")
    if unit == "samples/s":
        return batch / value
    sequence = row.value("sequence")
    if sequence is None:
        raise ConfigError(f"line {row.line}: unit {unit} needs sequence")
    if unit == "tokens/s":
        return batch * sequence / value
    layers, hidden, vocabulary, gpus = (row.value(k) for k in ("layers", "hidden", "vocabulary", "gpus"))
    if None in (layers, hidden, vocabulary, gpus):
        raise ConfigError(f"line {row.line}: unit tflops/gpu needs layers, hidden, vocabulary and gpus")
    flops = 96.0 * batch * sequence * layers * hidden ** 2 * (1 + sequence / (6 * hidden)
                                                              + vocabulary / (16 * layers * hidden))
    return flops / (value * 1e12 * gpus)


def _row_settings(row: RunRow, platform: str | None, settings: dict[str, Any] | None
                  ) -> tuple[dict[str, Any], dict[str, str]]:
    """The scenario settings of `row` (its cells over DEFAULT_SETTINGS, then --set `settings`, then its ``set``
    column) and where each key was written, for messages (:func:`hcsim.run.scenario.load_scenario`'s origin)."""
    place = row.place
    values: dict[str, Any] = {"name": row.name, "workload": row.value("workload") or "gpt-megatron",
                              **DEFAULT_SETTINGS}
    origin = {"workload": f"{place}: "} if row.value("workload") else {}
    platform = row.value("platform") or platform
    if platform is None:
        raise ConfigError(f"{place}: platform: empty, and no --platform given; name the platform the run ran on "
                          f"(a built-in name or a spec path) in the column or with --platform")
    values["platform"] = platform
    if row.value("platform"):
        origin["platform"] = f"{place}: "
    gpus = row.value("gpus")
    if gpus is None:
        raise ConfigError(f"{place}: gpus: empty")
    values["xpus"] = gpus
    origin["xpus"] = f"{place}: gpus as "
    for key in _SCENARIO_CELLS:
        if row.value(key) is not None:
            values[key], origin[key] = row.value(key), f"{place}: "
    overrides = {path: row.value(key) for key, path in _SHAPE.items() if row.value(key) is not None}
    if row.value("hidden") is not None and row.value("ffn") is None:
        overrides["model.ffn"] = 4 * row.value("hidden")
    overrides.update({path: row.value(key) for key, path in _WORKLOAD_CELLS.items() if row.value(key) is not None})
    overrides["model.name"] = row.name
    values["workload_overrides"] = overrides
    if row.value("gpu"):
        values["devices"], origin["devices"] = [row.value("gpu")], f"{place}: gpu as "
    for key, value in (settings or {}).items():
        values[key] = value
        origin.pop(str(key).partition(".")[0], None)  # --set's, blamed on --set
    for key, value in (row.value("set") or {}).items():
        head = str(key).partition(".")[0]
        if head in values and head in origin:
            raise ConfigError(f"{place}: set: {key}: given in its own column too; keep one")
        if head in ("platform_overrides", "workload_overrides") and "." in str(key):
            values[head] = {**values.get(head, {}), str(key).partition(".")[2]: value}
        else:
            values[key] = value
        origin[head] = f"{place}: set: "
    return values, origin


def row_scenario(row: RunRow, platform: str | None, settings: dict[str, Any] | None = None, base: str = "."):
    """The scenario that simulates `row` on its platform (its ``platform`` cell, else `platform`); ConfigError
    naming the row (FILE:LINE) and the column of what is missing or wrong."""
    from dataclasses import replace

    from hcsim.run.scenario import load_scenario

    values, origin = _row_settings(row, platform, settings)
    if row.value("micro_batch") is None and "micro_batch" not in values:
        raise ConfigError(f"{row.place}: micro_batch: not given (the simulated pipeline depends on it)")
    scenario = load_scenario(None, values, origin)
    return replace(scenario, base=base)


def check_rows(runs: list[RunRow], platform: str | None, settings: dict[str, Any] | None = None, base: str = ".",
               where: str = "runs") -> None:
    """Check every row's keys and specs before any row is simulated: its settings make a scenario, its platform
    and workload specs load with its values (each distinct one read once), and the workload is a training one.

    Raises
    ------
    ConfigError
        listing every row's problem (under `where`, the runs file), each naming the row (FILE:LINE) and the
        column or key.
    """
    from dataclasses import replace

    from hcsim.errors import invalid
    from hcsim.run.scenario import load_scenario
    from hcsim.study.experiment import check_specs

    problems, scenarios = [], []
    for row in runs:
        try:
            values, origin = _row_settings(row, platform, settings)
            scenarios.append((row.place, replace(load_scenario(None, values, origin), base=base)))
        except ConfigError as err:
            problems.append(str(err))
    problems += check_specs(scenarios, "validate")
    if problems:
        raise ConfigError(problems[0] if len(problems) == 1 else invalid(where, problems[:20]))


class _TooLarge(HcsimError):
    """A row whose simulation would exceed the run limit."""


def _simulate_row(scenario, max_runs: int | None) -> dict[str, Any]:
    from hcsim.run.simulation import run_here, total_runs

    def check(prepared):
        runs = total_runs(prepared.workload, scenario.iterations)
        if max_runs is not None and runs > max_runs:
            raise _TooLarge(f"not simulated: {runs:,} vertex runs exceed --max-runs {max_runs:,} "
                            f"(simulating it would take too long; raise --max-runs to run it)")

    try:
        result = run_here(scenario, check=check)
    except HcsimError as err:
        return {"reason": str(err).splitlines()[0]}
    return {key: result[key] for key in ("iteration_time_s", "mfu", "wall_time_s", "activities", "breakdown",
                                          "stages") if key in result}


def validate(runs: list[RunRow], platform: str, settings: dict[str, Any] | None = None, jobs: int = 1,
             max_runs: int | None = None, base: str = ".", progress=None, journal=None) -> list[dict[str, Any]]:
    """Simulate every row (each in a fresh process, `jobs` at a time); one record per row, in order.

    A record has name, role, measured, unit, measured_s, and either simulated_s, error (signed,
    (simulated - measured) / measured, on the iteration time), mfu and wall_s, or a reason. With a
    :class:`hcsim.study.journal.Journal`, each row's simulation is recorded there as it finishes, and a row
    whose simulation it already holds (a resumed run) is not simulated again."""
    records: list[dict[str, Any]] = []
    work = []
    for row in runs:
        record = {"name": row.name, "role": row.value("role") or "", "measured": row.cells.get("measured", ""),
                  "unit": row.cells.get("unit", ""), "measured_s": None, "simulated_s": None, "error": None,
                  "mfu": None, "wall_s": None, "reason": ""}
        records.append(record)
        try:
            record["measured_s"] = measured_seconds(row)
            work.append((record, row_scenario(row, platform, settings, base), row))
        except HcsimError as err:
            record["reason"] = str(err).splitlines()[0]
    keys = [f"{scenario.digest()} max_runs {max_runs}" for _, scenario, _ in work]  # --max-runs decides a row too
    done = journal.done if journal is not None else {}
    for (record, _, _), key in zip(work, keys):
        if key in done:
            _apply(record, done[key], progress)
    todo = [(record, scenario, key, row) for (record, scenario, row), key in zip(work, keys) if key not in done]
    died = []  # (row, why): a row's process that died (killed, crashed) gives it no result
    # each row in a process of its own (study.points: killed with this one, reaped when it ends, a death its row's)
    with contextlib.closing(run_points([(_simulate_row, (scenario, max_runs)) for _, scenario, _, _ in todo],
                                       jobs=max(1, jobs))) as finished:
        for index, outcome in finished:  # each recorded as it ends: a kill loses none that ended
            record, _, key, row = todo[index]
            if "error" in outcome:  # no outcome of the row's own: not journaled, so --resume runs it again
                died.append((row, outcome["error"]))
                continue
            if journal is not None:
                journal.record(key, outcome)
            _apply(record, outcome, progress)
    if died:
        kept = (f"the other rows' simulations are kept in {journal.path}: run again with --resume"
                if journal is not None else "the other rows were simulated")
        raise SimulationError("; ".join(f"{row.place} ({row.name}): {why}" for row, why in died[:3])
                              + (f"; and {len(died) - 3} more rows" if len(died) > 3 else "") + f"; {kept}")
    return records


def _apply(record: dict[str, Any], outcome: dict[str, Any], progress) -> None:
    """Fill a row's record from its simulation's outcome (:func:`_simulate_row`)."""
    if "reason" in outcome:
        record["reason"] = outcome["reason"]
    else:
        record["simulated_s"] = outcome["iteration_time_s"]
        record["error"] = (record["simulated_s"] - record["measured_s"]) / record["measured_s"]
        record["mfu"] = outcome.get("mfu")
        record["wall_s"] = outcome["wall_time_s"]
    if progress is not None:
        progress(record)


def summarize_rows(records: list[dict[str, Any]]) -> dict[str, dict[str, float | int]]:
    """Mean and max absolute error (fractions) and counts: all simulated rows, held-out rows, calibration rows."""
    groups = {"all": [r for r in records if r["error"] is not None]}
    groups["held_out"] = [r for r in groups["all"] if r["role"] != "calibration"]
    groups["calibration"] = [r for r in groups["all"] if r["role"] == "calibration"]
    summary = {}
    for key, rows in groups.items():
        errors = [abs(r["error"]) for r in rows]
        summary[key] = {"rows": len(rows), "mean_abs_error": math.fsum(errors) / len(errors) if errors else math.nan,
                        "max_abs_error": max(errors) if errors else math.nan}
    summary["not_simulated"] = {"rows": sum(1 for r in records if r["error"] is None)}
    return summary


# wall_s stays out of the written table: results must re-run bit for bit, a wall time does not
TABLE_COLUMNS = ("name", "role", "measured", "unit", "measured_s", "simulated_s", "error", "mfu", "reason")


def write_report(records: list[dict[str, Any]], out: Path, title: str = "validation") -> list[Path]:
    """Write validation.csv, validation.md (table and summary) and validation.png / .svg (measured vs
    simulated, log-log, y = x line) into `out`; return the paths."""
    from hcsim.run.report import atomic_write

    out.mkdir(parents=True, exist_ok=True)
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=TABLE_COLUMNS, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    for record in records:
        writer.writerow({k: ("" if record[k] is None else f"{record[k]:.6g}" if isinstance(record[k], float)
                             else record[k]) for k in TABLE_COLUMNS})
    paths = [out / "validation.csv", out / "validation.md"]
    atomic_write(paths[0], table.getvalue())
    atomic_write(paths[1], markdown(records, title))
    paths += _plot(records, out / "validation", title)
    return paths


def markdown(records: list[dict[str, Any]], title: str) -> str:
    """The table and the error summary as Markdown."""
    lines = [f"# {title}", "", "| run | role | measured | measured (s/iter) | simulated (s/iter) | error | MFU | "
             "not simulated because |", "|---|---|---|---|---|---|---|---|"]
    for r in records:
        def cell(value, form):
            return "" if value is None else format(value, form)
        lines.append(f"| {r['name']} | {r['role']} | {r['measured']} {r['unit']} | {cell(r['measured_s'], '.3f')} | "
                     f"{cell(r['simulated_s'], '.3f')} | {cell(r['error'], '+.1%')} | {cell(r['mfu'], '.1%')} | "
                     f"{r['reason']} |")
    summary = summarize_rows(records)
    lines += ["", "| rows | count | mean abs error | max abs error |", "|---|---|---|---|"]
    for key in ("held_out", "calibration", "all"):
        s = summary[key]
        errors = f"{s['mean_abs_error']:.1%} | {s['max_abs_error']:.1%}" if s["rows"] else "– | –"
        lines.append(f"| {key.replace('_', '-')} | {s['rows']} | {errors} |")
    lines.append(f"| not simulated | {summary['not_simulated']['rows']} | | |")
    return "\n".join(lines) + "\n"


def _plot(records: list[dict[str, Any]], stem: Path, title: str) -> list[Path]:
    import matplotlib

    from hcsim.study.plotting import save_png_svg

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in records if r["error"] is not None]
    if not done:
        return []
    fig, ax = plt.subplots(figsize=(5.5, 5))
    for role, marker in (("calibration", "s"), ("", "o")):
        rows = [r for r in done if (r["role"] == "calibration") == (role == "calibration")]
        if rows:
            ax.scatter([r["measured_s"] for r in rows], [r["simulated_s"] for r in rows], marker=marker,
                       label="calibration rows" if role else "held-out rows")
            for r in rows:
                ax.annotate(r["name"], (r["measured_s"], r["simulated_s"]), fontsize=7, xytext=(3, 3),
                            textcoords="offset points")
    values = [r["measured_s"] for r in done] + [r["simulated_s"] for r in done]
    low, high = min(values) / 1.3, max(values) * 1.3
    ax.plot([low, high], [low, high], color="grey", linewidth=0.8, label="simulated = measured")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel("measured iteration time (s)")
    ax.set_ylabel("simulated iteration time (s)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    box = ax.get_window_extent(fig.canvas.get_renderer())
    for note in ax.texts:  # a name that would run past the right edge is written left of its point
        if note.get_window_extent(fig.canvas.get_renderer()).x1 > box.x1:
            note.xyann = (-3, 3)
            note.set_horizontalalignment("right")
    paths = save_png_svg(fig, stem)
    plt.close(fig)
    return paths
