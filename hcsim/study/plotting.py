"""Plots of sweep results: one figure per plot spec of an experiment, as PNG and SVG.

A plot spec (a mapping in the experiment's ``plots:`` list)::

    x: xpus                        # a column of the results (an axis); scenario keys name their column
    y: batches_per_s               # a result column (a device column, such as idle_s: one line per device)
    series: [devices, coherent]    # one line (or bar) per combination: colour by the first, dash by the second
    panels: cxl_bandwidth          # optional: one subplot per value of this column
    kind: line                     # line | bar (bar: x is categorical, series side by side)
    logx: true                     # log axes (base 2 for xpus), labelled so, ticks at the values
    logy: false
    where: {devices: [H100]}       # optional: keep only these rows
    title: "..."                   # optional; xlabel and ylabel are optional too
    name: fig8-per-xpu             # optional: file stem (default: the experiment's name)
    labels: {coherent: {true: with coherence, false: without coherence}}   # optional legend text

matplotlib is imported inside the functions (Agg backend): ``import hcsim``
stays light.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from hcsim.errors import brief
from hcsim.run.results import DEVICE_COLUMNS, column_unit, rows_for, spec_columns
from hcsim.study.findings import selected

__all__ = ["plot_experiment", "plot_rows", "default_title", "plot_plans", "check_plot", "PLOT_KEYS"]

PLOT_KEYS = ("x", "y", "series", "panels", "kind", "logx", "logy", "where", "title", "xlabel", "ylabel",
             "name", "labels", "legend", "legend_loc")

# Axis labels of the columns the paper's figures use (units in brackets).
_LABELS = {
    "xpus": "Scale (number of XPUs)",
    "batches_per_s": "Performance (batch/s)",
    "batches_per_s_per_xpu": "Performance per XPU (batch/s)",
    "samples_per_s": "Throughput (samples/s)",
    "iteration_time_s": "Iteration time (s)",
    "cxl_bandwidth_Bps": "CXL_link bandwidth (GB/s)",
    "cxl_latency_s": "CXL_link latency (µs)",
    "exposed_comm_s": "Exposed communication per iteration (s)",
    "idle_s": "Idle (waiting for peers) per iteration (s)",
    "idle_peers_s": "Waiting for peers per iteration (s)",
    "idle_bubble_s": "Pipeline bubble per iteration (s)",
    "memory_stall_s": "Memory stall per iteration (s)",
    "compute_s": "Compute per iteration (s)",
    "busiest_link_utilization": "Busiest link, mean utilization",
    "tokens_per_s": "Throughput (tokens/s)",
    "mfu": "Model FLOPs utilization",
    **{f"comm_{kind}_s": f"Exposed {name} communication per iteration (s)" for kind, name in (
        ("tp", "tensor-parallel"), ("cp", "context-parallel"), ("pp", "pipeline"), ("dp", "data-parallel"),
        ("ep", "expert-parallel"), ("offload", "offload"), ("other", "other"))},
}
# Display scale of SI columns (the CSV keeps SI units).
_SCALES = {"cxl_bandwidth_Bps": 1e-9, "cxl_latency_s": 1e6}
_SPEC_COLUMNS = ("x", "y", "series", "panels")
_COLOURS = ["#1f4e9c", "#c0392b", "#2e8b57", "#e08e0b", "#7d3c98", "#17a2b8", "#6d4c41", "#555555"]
_DASHES = ["-", "--", ":", "-."]
_MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*"]


def check_plot(spec: dict[str, Any], columns: list[str] | None = None, numeric: list[str] | None = None) -> list[str]:
    """The problems of one plot spec (empty when it is valid), each starting with its key.

    With `columns` (the experiment's CSV header) every column named must be one
    of them, and `y` one of the `numeric` columns.
    """
    from hcsim.study.findings import check_where

    problems = [f"{key}: unknown plot key; plot keys: {', '.join(PLOT_KEYS)}" for key in spec if key not in PLOT_KEYS]
    known = f"; columns: {', '.join(columns)}" if columns else ""
    for key in ("x", "y"):
        if not isinstance(spec.get(key), str):
            problems.append(f"{key}: required, the name of a results column{known}")
        elif columns is not None and spec[key] not in columns:
            problems.append(f"{key}: {spec[key]!r} is not a column of this experiment's results{known}")
    if columns is not None and numeric is not None and spec.get("y") in columns and spec["y"] not in numeric:
        problems.append(f"y: {spec['y']!r} is not a numeric column; numeric columns: {', '.join(numeric)}")
    if spec.get("kind", "line") not in ("line", "bar"):
        problems.append(f"kind: {brief(spec['kind'])} is not one of line, bar")
    for key in ("logx", "logy", "legend"):
        if key in spec and not isinstance(spec[key], bool):
            problems.append(f"{key}: expected true or false, got {brief(spec[key])}")
    for key in ("title", "xlabel", "ylabel", "name", "legend_loc"):
        if key in spec and not isinstance(spec[key], str):
            problems.append(f"{key}: expected a string, got {brief(spec[key])}")
    if isinstance(spec.get("name"), str) and ("/" in spec["name"] or not spec["name"].strip()):
        problems.append(f"name: {spec['name']!r} cannot name a file; use letters, digits, '-' and '_'")
    series = spec.get("series", [])
    if not (isinstance(series, str) or (isinstance(series, list) and all(isinstance(s, str) for s in series))):
        problems.append(f"series: expected a column name or a list of them, got {brief(series)}")
    elif columns is not None:
        problems += [f"series: {s!r} is not a column of this experiment's results{known}"
                     for s in ([series] if isinstance(series, str) else series) if s not in columns]
    panels = spec.get("panels")
    if panels is not None and (not isinstance(panels, str) or (columns is not None and panels not in columns)):
        problems.append(f"panels: expected a column name, got {brief(panels)}{known}")
    labels = spec.get("labels")
    if labels is not None and not (isinstance(labels, dict) and all(isinstance(v, dict) for v in labels.values())):
        problems.append("labels: expected a mapping of column -> {value: legend text}")
    problems += [f"where.{p}" if not p.startswith("where") else p for p in check_where(spec.get("where"), columns)]
    return problems


def plot_experiment(experiment, rows: list[dict[str, Any]], out: Path) -> list[Path]:
    """Draw every plot of `experiment` from its result rows into `out`; return the files (PNG, SVG)."""
    files: list[Path] = []
    points = experiment.points()
    order = {c: list(dict.fromkeys(p.labels[c] for p in points)) for c in experiment.axis_columns()}
    for i, spec in enumerate(experiment.plots):
        stem = spec.get("name") or (experiment.name if i == 0 else f"{experiment.name}-{i + 1}")
        files += plot_rows(rows, {**spec, "title": spec.get("title") or default_title(experiment.name, spec)},
                           Path(out) / stem, order)
    return files


def default_title(name: str, spec: dict[str, Any]) -> str:
    """The title of a plot spec without one: the experiment's name and what the plot draws against what.

    >>> default_title("allreduce-training", {"x": "algorithm", "y": "iteration_time_s", "series": "xpus"})
    'allreduce-training: iteration time (s) by algorithm and xpus'
    >>> default_title("fig8", {"x": "xpus", "y": "batches_per_s", "panels": "coherent"})
    'fig8: performance (batch/s) by scale (number of XPUs), panels: coherent'
    """
    spec = spec_columns(spec, _SPEC_COLUMNS)
    series = [spec["series"]] if isinstance(spec.get("series"), str) else list(spec.get("series") or [])

    def label(axis: str) -> str:
        text = spec.get(f"{axis}label") or _LABELS.get(spec[axis], spec[axis])
        return text[:1].lower() + text[1:] if text[1:2].islower() else text

    text = f"{name}: {label('y')} by {label('x')}"
    if series:
        text += " and " + ", ".join(s.rsplit(".", 1)[-1] for s in series)
    if spec.get("panels"):
        text += f", panels: {spec['panels'].rsplit('.', 1)[-1]}"
    return text


def save_png_svg(figure, stem: Path) -> list[Path]:
    """Write `figure` as STEM.png (150 dpi) and STEM.svg, the SVG the same bytes on every run: its element ids
    salted with a fixed string (matplotlib salts them at random by default) and no date in its metadata."""
    import matplotlib.pyplot as plt

    files = [stem.with_suffix(".png"), stem.with_suffix(".svg")]
    figure.savefig(files[0], dpi=150)
    with plt.rc_context({"svg.hashsalt": "hcsim"}):
        figure.savefig(files[1], metadata={"Date": None})
    return files


def plot_rows(rows: list[dict[str, Any]], spec: dict[str, Any], stem: Path,
              order: dict[str, list[Any]] | None = None) -> list[Path]:
    """Draw one plot spec from result rows (failed points left out); write STEM.png and STEM.svg.

    `order` gives, per column, the order of its values in legends and panels (default: sorted numbers,
    other values as they come).
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    spec = spec_columns(spec, _SPEC_COLUMNS)
    rows = [r for r in rows_for(rows, spec["y"]) if r.get("status") == "ok" and selected(r, spec.get("where") or {})]
    spec = {**spec, "_order": order or {}}
    series = [spec["series"]] if isinstance(spec.get("series"), str) else list(spec.get("series") or [])
    if spec["y"] in DEVICE_COLUMNS and "device" not in series and len({r.get("device") for r in rows}) > 1:
        series.append("device")  # a per-device quantity: one line per device type, never their mean
    panel_key = spec.get("panels")
    panels = (_values(rows, panel_key, spec) if panel_key else []) or [None]  # no row ok: one empty panel
    bar = spec.get("kind", "line") == "bar"
    with plt.rc_context({"font.family": "serif", "font.size": 10, "axes.grid": True, "grid.alpha": 0.3,
                         "axes.spines.top": False, "axes.spines.right": False}):
        per_panel = max(4.2, 0.95 * len(_values(rows, spec["x"], spec))) if bar else 4.2  # room for each category
        width = min(per_panel * len(panels), 16)
        figure, axes = plt.subplots(1, len(panels), figsize=(max(width, 5.2), 3.8), squeeze=False, sharey=True)
        for ax, panel in zip(axes[0], panels):
            chosen = [r for r in rows if panel_key is None or r[panel_key] == panel]
            if spec.get("kind", "line") == "bar":
                _bars(ax, chosen, spec, series)
            else:
                _lines(ax, chosen, spec, series)
            if panel_key:
                ax.set_title(_legend_text(spec, panel_key, panel), fontsize=10)
            ax.set_xlabel(_axis_label(spec, "x"))
        axes[0][0].set_ylabel(_axis_label(spec, "y"))
        handles, labels = axes[0][0].get_legend_handles_labels()
        legend = None
        if handles and spec.get("legend", True):
            legend = axes[0][-1].legend(handles, labels, fontsize=8, frameon=False,
                                        loc=spec.get("legend_loc", "best"))
        if spec.get("title"):
            figure.suptitle(spec["title"], fontsize=11)
        figure.tight_layout()
        if legend is not None and "legend_loc" not in spec and _covers(legend, axes[0][-1]):
            _legend_outside(figure, axes[0][-1], handles, labels)
        if bar:
            for ax in axes[0]:
                _stand_up_crowded_ticks(figure, ax)
        if spec.get("title"):
            _fit_title(figure)
        figure.tight_layout()
        stem.parent.mkdir(parents=True, exist_ok=True)
        files = save_png_svg(figure, stem)
        plt.close(figure)
    return files


def _covers(legend, ax) -> bool:
    """Whether `legend` lies over a line, a marker, a bar or a bar's label of `ax` (matplotlib's "best" place
    can still cover one when every place does)."""
    renderer = ax.figure.canvas.get_renderer()
    box = legend.get_window_extent(renderer).padded(2)
    for line in ax.get_lines():
        path = line.get_transform().transform_path(line.get_path())
        if len(path.vertices) > 1 and path.intersects_bbox(box, filled=False):
            return True
        if any(box.contains(x, y) for x, y in path.vertices):
            return True
    # a bar or a bar's value label
    return any(box.overlaps(artist.get_window_extent(renderer)) for artist in [*ax.patches, *ax.texts])


def _legend_outside(figure, ax, handles, labels) -> None:
    """Move the legend of `ax` right of the axes, widening the figure by the legend's width."""
    legend = ax.legend(handles, labels, fontsize=8, frameon=False, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                       borderaxespad=0.0)
    renderer = figure.canvas.get_renderer()
    figure.set_figwidth(figure.get_figwidth() + legend.get_window_extent(renderer).width / figure.dpi)
    figure.tight_layout()


def _stand_up_crowded_ticks(figure, ax) -> None:
    """When two neighbouring x tick labels of `ax` would run into each other, break the labels at every
    '_', '+' and space, and if they still would, stand them upright."""
    renderer = figure.canvas.get_renderer()

    def crowded() -> bool:
        boxes = [t.get_window_extent(renderer) for t in ax.get_xticklabels() if t.get_text()]
        return any(a.x1 + 2 > b.x0 for a, b in zip(boxes, boxes[1:]))

    if not crowded():
        return
    for tick in ax.get_xticklabels():
        tick.set_text(_wrap(tick.get_text().replace("\n", " "), width=1))
    ax.set_xticks(ax.get_xticks(), [t.get_text() for t in ax.get_xticklabels()])
    if crowded():
        ax.set_xticks(ax.get_xticks(), [t.get_text().replace("\n", " ") for t in ax.get_xticklabels()],
                      rotation=90)


def _fit_title(figure) -> None:
    """Wrap the figure's title onto more lines until it is narrower than the figure."""
    import textwrap

    title = figure._suptitle
    text = title.get_text().replace("\n", " ")
    renderer = figure.canvas.get_renderer()
    room = 0.96 * figure.bbox.width
    width = len(text)
    while title.get_window_extent(renderer).width > room and width > 10:
        width = int(width * min(0.95, room / title.get_window_extent(renderer).width))
        title.set_text(textwrap.fill(text, width, break_on_hyphens=False))


def _axis_label(spec: dict[str, Any], axis: str) -> str:
    """The spec's label, or the column's; a log axis says so (a log x axis makes linear growth look steep)."""
    label = spec.get(f"{axis}label") or _LABELS.get(spec[axis], spec[axis])
    if spec.get(f"log{axis}") and spec.get("kind", "line") == "line":
        label += f", log{'2' if axis == 'x' and spec['x'] == 'xpus' else ''} scale"
    return label


def _values(rows: list[dict[str, Any]], key: str, spec: dict[str, Any]) -> list[Any]:
    values = list(dict.fromkeys(r[key] for r in rows))
    known = spec["_order"].get(key)
    if known is not None:
        return [v for v in known if v in values] + [v for v in values if v not in known]
    numeric = all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
    return sorted(values) if numeric else values


def _legend_text(spec: dict[str, Any], key: str, value: Any) -> str:
    names = (spec.get("labels") or {}).get(key) or {}
    for candidate in (value, str(value), str(value).lower()):
        if candidate in names:
            return str(names[candidate])
    unit = column_unit(key)
    if unit is not None and isinstance(value, (int, float)):
        from hcsim.units import format_quantity

        return f"{key.removeprefix('cxl_').rsplit('_', 1)[0]} {format_quantity(value, unit)}"
    if key == "xpus":
        return f"{value} XPUs"
    if isinstance(value, bool):
        return f"{key}: {str(value).lower()}"
    if key == "device":
        return str(value)
    return f"{key.rsplit('.', 1)[-1]} = {value}"  # the series named: "pp = 1", "sequence = 8192", not "1"


def _series_label(spec: dict[str, Any], series: list[str], combination: tuple) -> str:
    return ", ".join(_legend_text(spec, k, v) for k, v in zip(series, combination)) or spec["y"]


def _lines(ax, rows, spec, series) -> None:
    x, y = spec["x"], spec["y"]
    scale = _SCALES.get(x, 1.0)
    firsts = _values(rows, series[0], spec) if series else [None]
    seconds = _values(rows, series[1], spec) if len(series) > 1 else [None]
    combos = list(dict.fromkeys(tuple(r[k] for k in series) for r in rows))
    combos.sort(key=lambda c: [_values(rows, k, spec).index(v) for k, v in zip(series, c)])
    points = {combo: sorted(((r[x] * scale, r[y]) for r in rows if tuple(r[k] for k in series) == combo))
              for combo in combos}
    for i, combo in enumerate(combos):
        colour = firsts.index(combo[0]) if series else 0
        dash = seconds.index(combo[1]) if len(series) > 1 else 0
        # a line that later ones would hide (same points) is drawn wider, so it shows around them
        under = sum(_same_line(points[combo], points[later]) for later in combos[i + 1:])
        ax.plot([p[0] for p in points[combo]], [p[1] for p in points[combo]],
                label=_series_label(spec, series, combo), color=_COLOURS[colour % len(_COLOURS)],
                linestyle=_DASHES[dash % len(_DASHES)], marker=_MARKERS[colour % len(_MARKERS)],
                markersize=4 + 2.5 * under, linewidth=1.4 + 1.8 * under, zorder=2 - 0.01 * under)
    if spec.get("logx"):
        ax.set_xscale("log", base=2 if x == "xpus" else 10)
    if spec.get("logy"):
        _log_y(ax)
    xs = sorted({r[x] * scale for r in rows})
    if xs and len(xs) <= 12:
        ax.set_xticks(xs)
        ax.set_xticklabels([f"{v:g}" for v in xs], rotation=0 if len(xs) <= 7 else 45)
        ax.minorticks_off()


def _same_line(a: list[tuple[float, float]], b: list[tuple[float, float]]) -> bool:
    """Whether two lines' points coincide on a plot (x equal, y within 0.5 %): one would hide the other.

    >>> _same_line([(1, 2.0), (2, 3.0)], [(1, 2.001), (2, 3.0)]), _same_line([(1, 2.0)], [(1, 2.5)])
    (True, False)
    """
    return len(a) == len(b) and all(xa == xb and abs(ya - yb) <= 0.005 * max(abs(ya), abs(yb), 1e-300)
                                    for (xa, ya), (xb, yb) in zip(a, b))


def _log_y(ax) -> None:
    """A log y axis whose ticks read as values (5, 10, 20, 50...), not powers of ten."""
    from matplotlib.ticker import FuncFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda value, _: f"{value:g}"))
    ax.yaxis.set_minor_formatter(NullFormatter())


def _wrap(name: str, width: int = 12) -> str:
    """`name` on lines of about `width` characters, broken after an underscore or a '+' or at a space, never
    inside a word: halving_doubling -> halving_ / doubling, H100+A100 proportional -> H100+A100 / proportional."""
    lines = [""]
    for piece in re.split(r"(?<=[_ +])", name):
        if lines[-1] and len(lines[-1] + piece.rstrip()) > width:
            lines.append("")
        lines[-1] += piece
    return "\n".join(line.rstrip() for line in lines)


def _bar_text(height: float) -> str:
    """A bar's value in three digits, thousands, millions and billions as k, M and G (322k, not 3.22e+05)."""
    rounded = float(f"{height:.3g}")  # 999.7 rounds to 1,000: 1k
    for scale, suffix in ((1e9, "G"), (1e6, "M"), (1e3, "k")):
        if abs(rounded) >= scale:
            return f"{rounded / scale:.3g}{suffix}"
    return f"{height:.3g}"


def _bars(ax, rows, spec, series) -> None:
    x, y = spec["x"], spec["y"]
    categories = _values(rows, x, spec)
    combos = list(dict.fromkeys(tuple(r[k] for k in series) for r in rows)) or [()]
    combos.sort(key=lambda c: [_values(rows, k, spec).index(v) for k, v in zip(series, c)])
    width = 0.8 / len(combos)
    for i, combo in enumerate(combos):
        heights = []
        for category in categories:
            match = [r[y] for r in rows if r[x] == category and tuple(r[k] for k in series) == combo]
            heights.append(match[0] if match else 0.0)
        positions = [c + (i - (len(combos) - 1) / 2) * width for c in range(len(categories))]
        bars = ax.bar(positions, heights, width, label=_series_label(spec, series, combo),
                      color=_COLOURS[i % len(_COLOURS)])
        crowded = len(categories) * len(combos) > 6  # side by side the labels would overlap: stand them up
        ax.bar_label(bars, labels=[_bar_text(h) for h in heights], fontsize=7, padding=2,
                     rotation=90 if crowded else 0)
    ax.margins(y=0.3 if crowded else 0.18)  # room above the tallest bar for its label (standing: taller)
    ax.set_xticks(range(len(categories)))
    named = x in (spec.get("labels") or {})  # categories given legend text by the spec's labels read as it
    ax.set_xticklabels([_wrap(_legend_text(spec, x, c) if named else str(c)) for c in categories], fontsize=8)
    if spec.get("logy"):
        _log_y(ax)


def plot_plans(rows: list[dict[str, Any]], path: Path, title: str = "") -> None:
    """Bars of simulated iteration time per plan (best first), the closed-form estimate as a marker; `title`
    names the model and cluster."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    done = [r for r in rows if r["simulated_s"] is not None]
    fig, ax = plt.subplots(figsize=(10, 0.4 * len(done) + 2.0))
    positions = range(len(done))
    ax.barh(positions, [r["simulated_s"] for r in done], color="#4c72b0", label="simulated (with contention)")
    ax.plot([r["estimated_s"] for r in done], positions, "k|", markersize=14, markeredgewidth=2,
            label="closed-form estimate")
    ax.set_yticks(list(positions), [f"#{r['rank']} {r['plan']}" for r in done], fontsize=8)
    ax.invert_yaxis()
    ax.set_ylim(len(done) - 0.5 + 0.9, -0.5)  # room below the last bar for the legend, inside the axes
    ax.set_xlabel("Iteration time (s)")
    ax.set_ylabel("Plan (#: rank by the estimate)")
    ax.legend(loc="lower right", fontsize=8, framealpha=0.9)
    failed = len(rows) - len(done)
    ax.set_title((f"hcsim plan: {title}" if title else "hcsim plan") + "\nsimulated plans, fastest first"
                 + (f" ({failed} failed, not shown)" if failed else ""), fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
