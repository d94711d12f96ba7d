"""A sweep's report beside its CSV: plots, findings and the markdown summary (:func:`write_report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hcsim.run.results import TIME_PARTS, column_unit, rows_for
from hcsim.errors import ConfigError
from hcsim.study.experiment import Experiment, Point, describe
from hcsim.study.store import columns, read_results

__all__ = ["write_report", "results_table", "discussion", "report_only", "read_rows", "write_rows"]


def write_report(experiment: Experiment, csv_path: Path, out: Path) -> list[Path]:
    """Draw the experiment's plots (PNG and SVG) and write its markdown summary; return the files."""
    from hcsim.run.report import atomic_write
    from hcsim.study.findings import evaluate
    from hcsim.study.plotting import plot_experiment

    points = experiment.points()
    rows = read_results(csv_path, columns(experiment, points), points)
    check_current(experiment, csv_path, rows, points, out)
    outputs = plot_experiment(experiment, rows, out)
    findings = [evaluate(spec, rows, experiment.axis_columns()) for spec in experiment.findings]
    summary = out / f"{experiment.name}.md"
    atomic_write(summary, _summary(experiment, rows, findings, outputs, out))
    return [*outputs, summary]


def check_current(experiment: Experiment, csv_path: Path, rows: list[dict[str, Any]], points: list[Point],
                  out: Path) -> None:
    """ConfigError naming `csv_path` and what differs unless its rows are those of the experiment's points:
    one point key per point, none of another (a report of such a CSV would show numbers of other scenarios).

    A point without rows was added to the experiment or not run yet; rows of a key that is no point are of a
    point since removed, or changed (the same axis values, another scenario: the base or a spec edited)."""
    keys = {p.key for p in points}
    found = {r["point"]: r for r in rows}
    missing = [p for p in points if p.key not in found]
    stray = [r for k, r in found.items() if k not in keys]
    axes = [c for c in experiment.axis_columns() if c in (rows[0] if rows else {})]

    def labels(row: dict[str, Any]) -> str:
        return describe({c: row[c] for c in axes}) or f"point {row['point']}"

    def same(row: dict[str, Any], point: Point) -> bool:
        return bool(axes) and all(str(row[c]) == str(point.labels.get(c)) or row[c] == point.labels.get(c)
                                  for c in axes)

    changed = [(r, p) for r in stray for p in missing if same(r, p)]
    changed_rows, changed_points = {id(r) for r, _ in changed}, {p.key for _, p in changed}
    removed = [r for r in stray if id(r) not in changed_rows]
    added = [p for p in missing if p.key not in changed_points]
    if not (added or removed or changed):
        return

    def listed(names: list[str]) -> str:
        return "; ".join(names[:3]) + (f"; and {len(names) - 3} more" if len(names) > 3 else "")

    parts = []
    if added:
        parts.append(f"{len(added)} point{'s' if len(added) > 1 else ''} without a row (added to the experiment, or "
                     f"not run yet: {listed([describe(p.labels) or p.key for p in added])})")
    if removed:
        parts.append(f"rows of {len(removed)} point{'s' if len(removed) > 1 else ''} the experiment no longer has "
                     f"({listed([labels(r) for r in removed])})")
    if changed:
        parts.append(f"{len(changed)} point{'s' if len(changed) > 1 else ''} changed (the same axis values, another "
                     f"scenario: the base, a spec or a default edited since: {listed([labels(r) for r, _ in changed])})")
    spec = experiment.path or f"{experiment.name}.yaml"
    raise ConfigError(f"{csv_path}: its rows are not the points of {spec}: {', '.join(parts)}. Fix: hcsim sweep {spec} --out {out} --resume (runs the "
                      "points without a row; rows of no point are moved to "
                      f"{csv_path.stem}.dropped.csv), or --overwrite to start over")


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
        lines += [f"- {describe({c: r[c] for c in shown})}: {r['error']}"  # as the table, not as they failed
                  for r in sorted(failed, key=lambda r: [_sort_key(r[c]) for c in shown])]
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


def results_table(rows: list[dict[str, Any]], columns: list[str]) -> list[str]:
    """A results section in markdown for experiment scripts that write their own report: `rows` under
    `columns`, numbers to 4 significant digits (ints as floats: a count reads the same from a run and from the
    CSV, where every number comes back a float)."""
    def cell(value: Any) -> str:
        return f"{value:.4g}" if isinstance(value, (int, float)) and not isinstance(value, bool) else str(value)

    return ["", "## Results\n", "| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)] + [
        "| " + " | ".join(cell(row[c]) for c in columns) + " |" for row in rows]


def write_rows(path: Path, rows: list[dict[str, Any]], columns) -> None:
    """An experiment script's results table as CSV at `path` (its folder made): `columns` in order, a row each."""
    import csv

    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, columns, lineterminator="\n")
        writer.writeheader()
        writer.writerows(rows)


def read_rows(path: Path, text=()) -> list[dict[str, Any]]:
    """The rows :func:`write_rows` wrote at `path`, each value a float except those of the `text` columns."""
    import csv

    with open(path, newline="") as handle:
        return [{k: (v if k in text else float(v)) for k, v in row.items()} for row in csv.DictReader(handle)]


def report_only(doc: str) -> bool:
    """An experiment script's command line: --report-only (redraw and rewrite from the CSV) or not; --help prints
    the script's docstring `doc`."""
    import argparse

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--report-only", action="store_true", help="redraw the plots and rewrite the report from "
                        "the committed CSV, simulating nothing")
    return parser.parse_args().report_only


def discussion(notes: Path) -> list[str]:
    """The discussion section from an experiment's notes file (markdown), [] where it has none."""
    return ["", "## Discussion\n", notes.read_text().strip()] if notes.exists() else []

