"""A sweep's report beside its CSV: plots, findings and the markdown summary (:func:`write_report`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hcsim.run.results import TIME_PARTS, column_unit, rows_for
from hcsim.study.experiment import Experiment, describe
from hcsim.study.store import columns, read_results

__all__ = ["write_report"]


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
        lines += [f"- {describe({c: r[c] for c in shown})}: {r['error']}" for r in failed]
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
