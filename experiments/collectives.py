"""Compare collective algorithms over message and group sizes on the paper's topologies.

Reads experiments/collectives.yaml; runs every (topology, group size,
algorithm, size) point in a fresh process (one SimGrid Engine per process)
with two workers; writes results/collectives.csv, results/collectives.md
(a table for the README) and results/collectives.png/.svg (time and bus
bandwidth against size, one column per topology).

Optional keys: ``compute_model`` (``peak``, the only one this script runs: transfers at line rate);
``variants``, named platform overrides (``{name: {links.cxl.bandwidth: 128GB/s}}``) that the algorithms of
``variant_algorithms`` run at, each (the others run once, on the platform as given: the overrides must not
touch their routes); the rows then carry a ``variant`` column, and the plot has one column per group size.

Usage: python experiments/collectives.py [experiments/collectives.yaml] [--out results]
"""

from __future__ import annotations

import argparse
import csv
import math
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path

from tqdm import tqdm

from hcsim.config import load_yaml
from hcsim.errors import ConfigError
from hcsim.units import parse_quantity

HERE = Path(__file__).resolve().parent


def load(path: Path) -> dict:
    """The experiment description with sizes in bytes."""
    spec = load_yaml(path)  # hcsim's bounded spec reader
    spec["sizes"] = [parse_quantity(s, "size", f"{path.name}: sizes[{i}]") for i, s in enumerate(spec["sizes"])]
    if spec.get("compute_model", "peak") != "peak":
        raise ConfigError(f"{path.name}: compute_model: {spec['compute_model']!r}: this script runs the peak model "
                          f"only (transfers at line rate); valid: peak")
    spec.setdefault("variants", {})
    unknown = sorted(set(spec.get("variant_algorithms", [])) - set(spec["algorithms"]))
    if unknown:
        raise ConfigError(f"{path.name}: variant_algorithms: {', '.join(unknown)} not in algorithms; valid: some of "
                          f"{', '.join(spec['algorithms'])}")
    return spec


def run_point(topology: str, n: int, collective: str, algorithm: str, size: float, fidelity: str,
              step_limit: int, variant: str = "", overrides: dict | None = None) -> dict:
    """One point in this (fresh) process: the collective alone on the first n XPUs of `topology` (with the
    platform `overrides` of `variant`)."""
    from hcsim.engine.api import RunOptions
    from hcsim.platform import build_platform, load_platform_spec, xpus
    from hcsim.engine.api import run
    from hcsim.workload import add_comm, new_workload

    wall = time.perf_counter()
    platform = build_platform(load_platform_spec(topology, overrides or {}), xpus=n)
    group = xpus(platform)[:n]
    graph = new_workload(f"{collective}-{algorithm}")
    add_comm(graph, "c", xpus=group, bytes=size, collective=collective, algorithm=algorithm, start=True)
    outcome = run(platform, graph, RunOptions(collective_model=fidelity, step_limit=step_limit))
    seconds = outcome.iteration_ends[0]
    algbw = size / seconds
    factor = 2 * (n - 1) / n if collective == "all_reduce" else (n - 1) / n
    return {"topology": topology, "xpus": n, "collective": collective, "algorithm": algorithm,
            **({"variant": variant} if overrides is not None else {}), "bytes": size,
            "fidelity": outcome.collective_fidelity.get("c", fidelity), "time_s": seconds, "algbw_Bps": algbw,
            "busbw_Bps": algbw * factor, "activities": outcome.activities,
            "wall_s": time.perf_counter() - wall}


def runs_on(topology: str, algorithm: str) -> bool:
    """Whether `algorithm` runs on `topology`: the coherent ring needs coherent memory (hcsim simulate
    refuses it on a non-coherent platform too)."""
    from hcsim.platform import load_platform_spec

    return algorithm != "coherent_ring" or load_platform_spec(topology, {}).coherent


def variants_of(spec: dict, algorithm: str) -> list[tuple[str, dict | None]]:
    """(variant name, platform overrides) `algorithm` runs at: each of the spec's variants for the algorithms of
    variant_algorithms, else the platform as given (("", {}) beside variants; ("", None) without any)."""
    if not spec["variants"]:
        return [("", None)]
    if algorithm in spec.get("variant_algorithms", []):
        return list(spec["variants"].items())
    return [("", {})]


def run(spec: dict) -> list[dict]:
    """Every point of `spec`, two at a time, each in a fresh process."""
    points = [(t, n, spec["collective"], a, s, spec["collective_model"], spec["step_limit"], v, o)
              for t in spec["topologies"] for n in spec["group_sizes"] for a in spec["algorithms"]
              for v, o in variants_of(spec, a) for s in spec["sizes"] if runs_on(t, a)]
    rows = []
    with ProcessPoolExecutor(max_workers=spec.get("workers", 2), mp_context=get_context("spawn"),
                             max_tasks_per_child=1) as pool:
        futures = [pool.submit(run_point, *p) for p in points]
        for future in tqdm(as_completed(futures), total=len(futures), desc="collectives"):
            rows.append(future.result())
    return sorted(rows, key=lambda r: (r["topology"], r["xpus"], r["algorithm"], r.get("variant", ""), r["bytes"]))


def write_csv(rows: list[dict], path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def read_csv(path: Path) -> list[dict]:
    """The rows write_csv wrote, numbers as numbers."""
    with open(path, newline="") as handle:
        rows = list(csv.DictReader(handle))
    for row in rows:
        for key in ("xpus", "activities"):
            row[key] = int(row[key])
        for key in ("bytes", "time_s", "algbw_Bps", "busbw_Bps", "wall_s"):
            row[key] = float(row[key])
    return rows


def markdown(rows: list[dict], spec: dict) -> str:
    """Bus bandwidth (GB/s) per algorithm, topology, group size and message size."""
    sizes = spec["sizes"]
    lines = ["| topology | XPUs | algorithm | " + " | ".join(_size(s) for s in sizes) + " |",
             "|---|---|---|" + "---|" * len(sizes)]
    index = {(r["topology"], r["xpus"], r["algorithm"], r.get("variant", ""), r["bytes"]): r for r in rows}
    for t in spec["topologies"]:
        for n in spec["group_sizes"]:
            for a in spec["algorithms"]:
                if not runs_on(t, a):
                    continue
                for v, _ in variants_of(spec, a):
                    cells = []
                    for s in sizes:
                        r = index.get((t, n, a, v, s))
                        cells.append(f"{r['time_s'] * 1e3:.3g} ms / {r['busbw_Bps'] / 1e9:.3g}" if r else "–")
                    lines.append(f"| {t} | {n} | {a}{f' ({v})' if v else ''} | " + " | ".join(cells) + " |")
    return ("Time and bus bandwidth (GB/s) of one all-reduce, "
            f"collective model {spec['collective_model']} (step up to {spec['step_limit']} XPUs):\n\n" + "\n".join(lines) + "\n")


def _size(size: float) -> str:
    return f"{size / 1e9:g} GB" if size >= 1e9 else f"{size / 1e6:g} MB"


def plot(rows: list[dict], spec: dict, stem: Path) -> None:
    """Time and bus bandwidth against size; one column per topology, one line per (algorithm, XPUs)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    topologies = spec["topologies"]
    fig, axes = plt.subplots(2, len(topologies), figsize=(6 * len(topologies), 10), squeeze=False, sharey="row")
    styles = ["-", "--", ":", "-."]
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for col, t in enumerate(topologies):
        for i, a in enumerate(spec["algorithms"]):
            for j, n in enumerate(spec["group_sizes"]):
                pts = sorted((r["bytes"], r["time_s"], r["busbw_Bps"]) for r in rows
                             if r["topology"] == t and r["algorithm"] == a and r["xpus"] == n)
                if not pts:
                    continue
                x = [p[0] for p in pts]
                kw = dict(color=colors[i % len(colors)], linestyle=styles[j % len(styles)], marker=".")
                axes[0][col].plot(x, [p[1] for p in pts], label=f"{a}, {n} XPUs", **kw)
                axes[1][col].plot(x, [p[2] / 1e9 for p in pts], **kw)
        axes[0][col].set(title=t, xscale="log", yscale="log", ylabel="time (s)")
        axes[1][col].set(xscale="log", yscale="log", xlabel="message size per rank", ylabel="bus bandwidth (GB/s)")
        for ax in axes[:, col]:
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xticks(spec["sizes"], [_size(s) for s in spec["sizes"]])
            ax.minorticks_off()
    found = {}  # one legend for the figure, below the plots, so it covers no data: a column per algorithm
    for ax in axes[0]:
        for handle, label in zip(*ax.get_legend_handles_labels()):
            found.setdefault(label, handle)
    labels = [f"{a}, {n} XPUs" for a in spec["algorithms"] for n in spec["group_sizes"] if f"{a}, {n} XPUs" in found]
    fig.legend([found[label] for label in labels], labels, loc="lower center", fontsize=8,
               ncol=len(spec["algorithms"]), frameon=False)
    fig.tight_layout(rect=(0, 0.012 * len(spec["group_sizes"]) + 0.01, 1, 1))
    for ext in ("png", "svg"):
        fig.savefig(stem.with_suffix(f".{ext}"), dpi=120)
    plt.close(fig)


def plot_variants(rows: list[dict], spec: dict, stem: Path) -> None:
    """Time and bus bandwidth against size; one column per group size (the first topology's), one line per
    algorithm and variant: dashed where an algorithm runs at the variants."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    topology, sizes = spec["topologies"][0], spec["group_sizes"]
    lines = [(a, v) for a in spec["algorithms"] for v, _ in variants_of(spec, a)]
    fig, axes = plt.subplots(2, len(sizes), figsize=(5.5 * len(sizes), 10), squeeze=False, sharey="row")
    colors = plt.get_cmap("tab10").colors
    for col, n in enumerate(sizes):
        for i, (a, v) in enumerate(lines):
            pts = sorted((r["bytes"], r["time_s"], r["busbw_Bps"]) for r in rows if r["topology"] == topology
                         and r["xpus"] == n and r["algorithm"] == a and r.get("variant", "") == v)
            kw = dict(color=colors[i % len(colors)], linestyle="--" if v else "-", marker="osD^vx+*"[i % 8],
                      fillstyle="none", markersize=4 + (i % 4))  # variants that coincide stay told apart
            axes[0][col].plot([p[0] for p in pts], [p[1] for p in pts], label=f"{a} {v}".strip(), **kw)
            axes[1][col].plot([p[0] for p in pts], [p[2] / 1e9 for p in pts], **kw)
        axes[0][col].set(title=f"{topology}, {n} XPUs", xscale="log", yscale="log", ylabel="time (s)")
        axes[1][col].set(xscale="log", yscale="log", xlabel="message size per rank", ylabel="bus bandwidth (GB/s)")
        for ax in axes[:, col]:
            ax.grid(True, which="both", alpha=0.3)
            ax.set_xticks(spec["sizes"], [_size(s) for s in spec["sizes"]], rotation=45)
            ax.minorticks_off()
    handles, labels = axes[0][0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="lower center", fontsize=8, ncol=3, frameon=False)
    fig.tight_layout(rect=(0, 0.02 * math.ceil(len(lines) / 3) + 0.01, 1, 1))
    for ext in ("png", "svg"):
        fig.savefig(stem.with_suffix(f".{ext}"), dpi=120)
    plt.close(fig)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default=HERE / "collectives.yaml", type=Path)
    parser.add_argument("--out", default=HERE.parent / "results", type=Path)
    parser.add_argument("--report-only", action="store_true",
                        help="redraw the table and plots from the CSV in --out, running nothing")
    args = parser.parse_args()
    spec = load(args.spec)
    if args.report_only:
        rows = read_csv(args.out / "collectives.csv")
    else:
        rows = run(spec)
        write_csv(rows, args.out / "collectives.csv")
    (args.out / "collectives.md").write_text(markdown(rows, spec))
    (plot_variants if spec["variants"] else plot)(rows, spec, args.out / "collectives")
    print(markdown(rows, spec))  # noqa: T201 (a script's report)


if __name__ == "__main__":
    main()
