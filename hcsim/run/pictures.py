"""One run's pictures: where each XPU's iteration goes (xpus.png) and a serving run's KV cache over time (kv.png).

Matplotlib is imported inside each function, so a run that draws nothing never loads it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["plot_xpu_times", "plot_kv_occupancy"]

_PARTS = (("compute_s", "compute", "#1f4e9c"), ("memory_stall_s", "memory stall", "#e08e0b"),
          ("exposed_comm_s", "exposed communication", "#c0392b"), ("idle_s", "idle (waiting)", "#bbbbbb"))


def plot_xpu_times(rows: list[dict[str, Any]], path: Path, title: str = "", most: int = 64) -> Path:
    """Stacked bars of where each XPU's iteration goes (rows of ``xpus.csv``); write `path` (PNG).

    Up to `most` XPUs get a bar each; beyond, one bar per class of XPUs that follow the same
    representative (labelled "xpu0 +7": the representative and how many follow it), and if still more,
    per device type its XPU with the least idle time, the mean over its XPUs and its XPU with the most.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    bars = _xpu_bars(rows, most)
    with plt.rc_context({"font.family": "serif", "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False}):
        figure, ax = plt.subplots(figsize=(7.5, 1.2 + 0.22 * len(bars)))
        positions = list(range(len(bars)))[::-1]
        left = [0.0] * len(bars)
        for key, name, colour in _PARTS:
            widths = [bar[key] for _, bar in bars]
            ax.barh(positions, widths, left=left, color=colour, label=name, height=0.75)
            left = [a + b for a, b in zip(left, widths)]
        ax.set_ylim(-0.6, len(bars) - 0.4)  # no empty band above the first bar and below the last
        ax.set_yticks(positions)
        ax.set_yticklabels([label for label, _ in bars], fontsize=7 if len(bars) > 24 else 8)
        ax.set_xlabel("Seconds per iteration")
        ax.legend(fontsize=7, frameon=False, ncol=4, loc="lower left", bbox_to_anchor=(0.0, 1.0))
        if title:
            ax.set_title(title, fontsize=9, pad=18)
        figure.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=150)
        plt.close(figure)
    return path


def _xpu_bars(rows: list[dict[str, Any]], most: int) -> list[tuple[str, dict[str, Any]]]:
    """(label, row) per bar: every XPU, or per class, or per device type its least idle, mean and most idle."""
    if len(rows) <= most:
        return [(f"{r['xpu']} ({r['device']}" + (f", follows {r['representative']})" if r["representative"] != r["xpu"]
                                                 else ")"), r) for r in rows]
    classes: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        classes.setdefault(row["representative"], []).append(row)
    if len(classes) <= most:
        return [(f"{rep} +{len(members) - 1} ({members[0]['device']})", next(r for r in members if r["xpu"] == rep)
                 if any(r["xpu"] == rep for r in members) else members[0]) for rep, members in classes.items()]
    bars = []
    by_device: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        by_device.setdefault(row["device"], []).append(row)
    for device, members in by_device.items():
        least = min(members, key=lambda r: r["idle_s"])
        mean = {key: sum(r[key] for r in members) / len(members) for key, _, _ in _PARTS}
        bars += [(f"{least['xpu']} ({device}, least idle)", least), (f"mean of {len(members)} {device}", mean),
                 (f"{max(members, key=lambda r: r['idle_s'])['xpu']} ({device}, most idle)",
                  max(members, key=lambda r: r["idle_s"]))]
    return bars


def plot_kv_occupancy(result: dict[str, Any], path: Path) -> Path:
    """The KV cache of a serving run over time: tokens in HBM and in extended memory (replica 0), and the
    sequences running; write `path` (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = [row for row in result["occupancy"] if row[0] == 0]
    times = [row[1] for row in rows]
    with plt.rc_context({"font.family": "serif", "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False}):
        figure, ax = plt.subplots(figsize=(7.5, 3.2))
        ax.stackplot(times, [row[2] for row in rows], [row[3] for row in rows], step="post",
                     labels=["KV tokens in HBM", f"KV tokens in {result['kv']['spilled_to'] or 'extended memory'}"],
                     colors=["#1f4e9c", "#e08e0b"])
        ax.axhline(result["kv"]["hbm_tokens_per_replica"], color="#1f4e9c", linestyle=":", linewidth=1,
                   label="HBM capacity")
        running = ax.twinx()
        running.step(times, [row[4] for row in rows], where="post", color="#c0392b", linewidth=1)
        running.set_ylabel("Sequences running", color="#c0392b")
        ax.set_xlabel("Time (s)")
        ax.set_ylabel("KV cache (tokens)")
        ax.legend(fontsize=7, frameon=False, loc="upper left")
        ax.set_title(f"{result['scenario']}: {result['model']} on {result['xpus']} {result['device']}, "
                     f"KV cache of replica 0", fontsize=9)
        figure.tight_layout()
        path.parent.mkdir(parents=True, exist_ok=True)
        figure.savefig(path, dpi=150)
        plt.close(figure)
    return path
