"""One run's pictures: where each XPU's iteration goes (xpus.png), a serving run's KV cache over time (kv.png) and
its requests' latencies (latency.png).

Matplotlib is imported when a picture is drawn (_pyplot), so a run that draws nothing never loads it.
"""

from __future__ import annotations

import math
import statistics
from pathlib import Path
from typing import Any

__all__ = ["plot_xpu_times", "plot_kv_occupancy", "plot_latencies", "xpu_classes"]

# The segments of a bar: the iteration split the summary prints (hcsim.run.results), in its order.
_SEGMENTS = (("compute_s", "compute", "#1f4e9c"), ("memory_stall_s", "memory stall", "#e08e0b"),
             ("comm_tp_s", "comm tp", "#c0392b"), ("comm_cp_s", "comm cp", "#e74c3c"),
             ("comm_pp_s", "comm pp", "#8e44ad"), ("comm_dp_s", "comm dp", "#d35400"),
             ("comm_ep_s", "comm ep", "#16a085"), ("comm_offload_s", "comm offload", "#7f8c8d"),
             ("comm_other_s", "comm other", "#a0522d"), ("idle_bubble_s", "bubble", "#cccccc"),
             ("idle_peers_s", "waiting for peers", "#8c8c8c"))
DIFFERS = 0.01  # an XPU differs from its class when a part of its split is off the class median by > 1 % of the iteration
PER_XPU_MOST = 32  # the per-XPU panel is drawn up to this many XPUs (when some differ), else only the ones that differ
MARKED_PER_CLASS = 3  # beyond PER_XPU_MOST, the XPUs of a class that differ most, drawn under its bar
_STYLE = {"font.family": "serif", "font.size": 9, "axes.spines.top": False, "axes.spines.right": False}


def _pyplot():
    """matplotlib.pyplot, drawing off screen (imported here: a run that draws nothing never loads it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _save(figure, path: Path) -> Path:
    """`figure` written to `path` (PNG, 150 dpi; its folder made) and closed."""
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=150)
    plt.close(figure)
    return path


def plot_xpu_times(rows: list[dict[str, Any]], path: Path, title: str = "") -> Path:
    """Where the iteration goes (rows of ``xpus.csv``), per pipeline stage and device type; write `path` (PNG).

    One stacked bar per class (a pipeline stage's XPUs of one device type): the mean over its XPUs of the
    split the summary prints (compute, memory stall, exposed communication per kind, pipeline bubble,
    waiting for peers), labelled with its XPU count and how many of them differ from it (:func:`xpu_classes`).
    XPUs that differ are drawn too: with up to PER_XPU_MOST XPUs, every XPU in a panel of its own (only when
    some differ: alike XPUs say nothing their class bar does not), beyond, under their class bar the
    MARKED_PER_CLASS that differ most. The dashed line is the iteration time. The classes and the marks keep
    the picture the same size at 1,024 XPUs as at 64.
    """
    plt = _pyplot()
    classes, differing = xpu_classes(rows)
    period = max((r["iteration_time_s"] for r in rows), default=0.0)
    few = len(rows) <= PER_XPU_MOST and any(differing.values())
    bars = []
    for key, members in classes.items():
        bars.append((_class_label(key, members, differing[key], len(classes)), _mean(members), False))
        if not few:
            shown = differing[key][:MARKED_PER_CLASS]
            bars += [(f"{r['xpu']} differs", r, True) for r in shown]
    per_xpu = [(f"{r['xpu']} ({_place(r)})", r, any(r is d for d in differing[_key(r)])) for r in rows] if few else []
    visible = 1e-4 * period  # a part too small to see (clock noise) gets no legend entry
    used = [seg for seg in _SEGMENTS if any(bar[seg[0]] > visible for _, bar, _ in bars + per_xpu)] \
        or list(_SEGMENTS[:1])
    heights = [len(bars)] + ([len(per_xpu)] if per_xpu else [])
    with plt.rc_context(_STYLE):
        figure, axes = plt.subplots(len(heights), 1, figsize=(8.0, 1.5 + 0.24 * sum(heights) + 0.4 * len(heights)),
                                    gridspec_kw={"height_ratios": [h + 1 for h in heights]}, squeeze=False)
        _draw_bars(axes[0][0], bars, used, period)
        axes[0][0].set_title("per pipeline stage and device type (mean over its XPUs)", fontsize=8, loc="left")
        if per_xpu:
            _draw_bars(axes[1][0], per_xpu, used, period)
            axes[1][0].set_title("per XPU (bold: differs from its class)", fontsize=8, loc="left")
        axes[-1][0].set_xlabel("Seconds per iteration (dashed: the iteration time)")
        handles = [plt.Rectangle((0, 0), 1, 1, color=colour) for _, _, colour in used]
        lines = (len(used) - 1) // 6 + 1  # legend rows of at most 6 entries, filled evenly
        figure.legend(handles, [name for _, name, _ in used], fontsize=7, frameon=False, ncol=-(-len(used) // lines),
                      loc="upper center", bbox_to_anchor=(0.5, 0.995 - 0.25 / figure.get_figheight()))
        if title:
            figure.suptitle(title, fontsize=9, y=0.999, va="top")
        figure.tight_layout(rect=(0, 0, 1, 1 - (0.08 + 0.17 * lines) / figure.get_figheight()))
        return _save(figure, path)


def xpu_classes(rows: list[dict[str, Any]]) -> tuple[dict[tuple, list[dict]], dict[tuple, list[dict]]]:
    """The classes of `rows` (``xpus.csv`` rows) by (stage, device), in stage then device order, and per
    class its XPUs that differ from it: off its typical XPU (the median of each part, which a few outliers
    do not move) by more than DIFFERS of the iteration in some part of the split, the most different first.

    >>> row = dict.fromkeys([seg for seg, _, _ in _SEGMENTS], 0.0)
    >>> rows = [dict(row, xpu=f"xpu{i}", stage=0, device="H100", compute_s=1.0 + (i == 3), iteration_time_s=2.0)
    ...         for i in range(8)]
    >>> classes, differing = xpu_classes(rows)
    >>> [len(m) for m in classes.values()], [r["xpu"] for r in differing[(0, "H100")]]
    ([8], ['xpu3'])
    """
    classes: dict[tuple, list[dict]] = {}
    for row in rows:
        classes.setdefault(_key(row), []).append(row)
    classes = dict(sorted(classes.items(), key=lambda item: (-1 if item[0][0] is None else item[0][0], item[0][1])))
    differing = {}
    for key, members in classes.items():
        typical = {seg: statistics.median(r[seg] for r in members) for seg, _, _ in _SEGMENTS}
        tolerance = DIFFERS * max(r["iteration_time_s"] for r in members)
        off = [(max(abs(r[seg] - typical[seg]) for seg, _, _ in _SEGMENTS), r) for r in members]
        differing[key] = [r for d, r in sorted(off, key=lambda item: -item[0]) if d > tolerance]
    return classes, differing


def _key(row: dict[str, Any]) -> tuple:
    stage = row.get("stage")
    return (None if stage in (None, "") else int(stage), str(row.get("device")))


def _mean(members: list[dict[str, Any]]) -> dict[str, float]:
    return {seg: sum(r[seg] for r in members) / len(members) for seg, _, _ in _SEGMENTS}


def _place(row: dict[str, Any]) -> str:
    stage = row.get("stage")
    return str(row["device"]) + ("" if stage in (None, "") else f", stage {stage}")


def _class_label(key: tuple, members: list[dict], differing: list[dict], classes: int) -> str:
    stage, device = key
    name = device if stage is None else f"stage {stage}, {device}"
    note = (f", {len(differing)} differ{'s' if len(differing) == 1 else ''}" if differing else
            ", alike" if len(members) > 1 else "")
    return f"{name} ({len(members)} XPU{'s' if len(members) > 1 else ''}{note})"


def _draw_bars(ax, bars: list[tuple[str, dict, bool]], used, period: float) -> None:
    """Horizontal stacked bars, the first at the top; a marked bar is thinner, its label bold."""
    positions = list(range(len(bars)))[::-1]
    left = [0.0] * len(bars)
    heights = [0.45 if marked else 0.75 for _, _, marked in bars]
    for key, _, colour in used:
        widths = [bar[key] for _, bar, _ in bars]
        ax.barh(positions, widths, left=left, color=colour, height=heights)
        left = [a + b for a, b in zip(left, widths)]
    if period > 0:
        ax.axvline(period, color="black", linestyle="--", linewidth=0.7)
    ax.set_ylim(-0.6, len(bars) - 0.4)
    ax.set_yticks(positions)
    ax.set_yticklabels([label for label, _, _ in bars], fontsize=7 if len(bars) > 24 else 8)
    for tick, (_, _, marked) in zip(ax.get_yticklabels(), bars):
        if marked:
            tick.set_fontweight("bold")


def plot_kv_occupancy(result: dict[str, Any], path: Path) -> Path:
    """The KV cache of a serving run over time: tokens in HBM and in extended memory (replica 0), and the
    sequences running; write `path` (PNG)."""
    plt = _pyplot()
    rows = [row for row in result["occupancy"] if row[0] == 0]
    offload = result.get("scheduler", {}).get("kv_offload")  # (serving.kv_offload: the tier holds offloaded blocks)
    times = [row[1] for row in rows]
    with plt.rc_context(_STYLE):
        figure, ax = plt.subplots(figsize=(7.5, 3.2))
        ax.stackplot(times, [row[2] for row in rows], [row[3] for row in rows], step="post",
                     labels=["KV tokens in HBM", f"KV tokens {'offloaded to' if offload else 'in'} "
                                                  f"{result['kv']['spilled_to'] or 'extended memory'}"],
                     colors=["#1f4e9c", "#e08e0b"])
        ax.axhline(result["kv"]["hbm_tokens_per_replica"], color="#1f4e9c", linestyle=":", linewidth=1,
                   label="HBM capacity")
        running = ax.twinx()
        running.step(times, [row[4] for row in rows], where="post", color="#c0392b", linewidth=1)
        running.set_ylabel("Sequences running", color="#c0392b")
        ax.set_xlabel("Time (s)")
        ax.set_ylabel("KV cache (tokens)")
        # under the axes, in one row: inside, the capacity line or the running sequences would cross it
        handles, labels = ax.get_legend_handles_labels()
        ax.legend(handles + running.get_lines(), labels + ["sequences running (right axis)"], fontsize=7,
                  frameon=False, ncol=4, loc="upper center", bbox_to_anchor=(0.5, -0.2))
        ax.set_title(f"{result['scenario']}: {result['model']} on {result['xpus']} {result['device']}, "
                     f"KV cache of replica 0", fontsize=9)
        figure.tight_layout()
        return _save(figure, path)


def plot_latencies(result: dict[str, Any], path: Path) -> Path:
    """A serving run's latency distributions: for time to first token, time per output token and end-to-end
    latency, the fraction of requests served within each time (the empirical CDF over ``per_request``), its p50
    and p99 marked, and the SLO's target where ``serving.slo`` sets one; write `path` (PNG)."""
    plt = _pyplot()
    rows = result["per_request"]
    targets = result.get("slo") or {}
    panels = (("time to first token", [r["ttft_s"] for r in rows], targets.get("ttft_s")),
              ("time per output token", [r["tpot_s"] for r in rows], targets.get("tpot_s")),
              ("end to end", [r["finish_s"] - r["arrival_s"] for r in rows], None))
    with plt.rc_context({**_STYLE, "axes.grid": True, "grid.alpha": 0.3}):
        figure, axes = plt.subplots(1, 3, figsize=(9.5, 3.2), sharey=True)
        for ax, (name, values, target) in zip(axes, panels):
            values = sorted(v for v in values if v is not None)
            scale, unit = (1e3, "ms") if values and values[-1] < 1 else (1.0, "s")
            shown = [v * scale for v in values]
            fractions = [(i + 1) / len(shown) for i in range(len(shown))]
            ax.step(shown, fractions, where="post", color="#1f4e9c", linewidth=1.2)
            for q, style in ((0.5, "--"), (0.99, ":")):  # nearest rank, as the summary's percentiles
                x = shown[max(0, math.ceil(q * len(shown)) - 1)] if shown else 0.0
                ax.axvline(x, color="#555555", linestyle=style, linewidth=0.8, label=f"p{round(q * 100)} {x:.3g} {unit}")
            if target is not None:
                ax.axvline(target * scale, color="#c0392b", linewidth=1, label=f"SLO {target * scale:.3g} {unit}")
            ax.set_xlabel(f"{name} ({unit})")
            ax.legend(fontsize=7, frameon=False, loc="lower right")
        axes[0].set_ylabel("Fraction of requests")
        axes[0].set_ylim(0, 1.02)
        figure.suptitle(f"{result['scenario']}: {result['model']} on {result['xpus']} {result['device']}, "
                        f"{len(rows):,} requests", fontsize=9)
        figure.tight_layout()
        return _save(figure, path)
