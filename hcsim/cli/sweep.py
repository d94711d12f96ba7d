"""`hcsim sweep`: run an experiment's grid of scenarios, then plot and summarise it."""

from __future__ import annotations

import argparse
import sys
import threading
from pathlib import Path

from hcsim.cli import path_arg

__all__ = ["register"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "sweep", help="run an experiment: a grid of scenarios, with plots and a summary",
        description="Run every point of an experiment (a base scenario plus axes) in parallel processes, "
                    "appending one row per finished point to OUT/NAME.csv, then draw OUT/NAME.png/.svg and "
                    "write OUT/NAME.md. A killed sweep loses no finished point: run it again with --resume.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="examples:\n  hcsim sweep experiments/paper/fig8.yaml --jobs 2\n"
               "  hcsim sweep experiments/paper/fig8.yaml --jobs 2 --resume\n"
               "  hcsim sweep my-experiment.yaml --executor dask://scheduler:8786\n"
               "  hcsim sweep experiments/paper/fig10.yaml --out experiments/paper/results --report-only"
               "   # redraw a committed CSV")
    parser.add_argument("experiment", type=Path, help="experiment YAML")
    add_execution_options(parser, "points", "an error row")
    parser.add_argument("--resume", action="store_true", help="keep the rows already in the CSV, run the others")
    parser.add_argument("--retry-errors", action="store_true", help="with --resume, run failed points again")
    parser.add_argument("--overwrite", action="store_true", help="start over, replacing an existing CSV")
    parser.add_argument("--out", type=path_arg, default=Path("results"), help="folder of the outputs (default: results)")
    parser.add_argument("--report-only", action="store_true", help="run nothing: redraw the plots and summary from the CSV")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar")
    parser.set_defaults(run=run)


def add_execution_options(parser: argparse.ArgumentParser, runs: str, on_timeout: str) -> None:
    """--jobs, --executor and --timeout, which sweep and plan share; `runs` names what runs (points)."""
    parser.add_argument("-j", "--jobs", type=int, default=1, help=f"{runs} run at once (local executor; default 1)")
    parser.add_argument("--executor", default="local", metavar="local|dask://HOST:PORT",
                        help=f"where {runs} run: local processes (default) or a Dask cluster (pip install 'hcsim[dask]')")
    parser.add_argument("--timeout", type=float, metavar="SECONDS", help=f"kill one after this long ({on_timeout})")


def check_execution_options(args: argparse.Namespace) -> None:
    """ConfigError unless --jobs, --executor and --timeout are valid."""
    from hcsim.errors import ConfigError
    from hcsim.study.points import check_executor

    if args.jobs < 1:
        raise ConfigError(f"--jobs: must be >= 1, got {args.jobs}")
    if args.timeout is not None and not 0 < args.timeout < float("inf"):
        raise ConfigError(f"--timeout: must be > 0 seconds, got {args.timeout:g}; leave it out for no time limit")
    check_executor(args.executor)


def run(args) -> int:
    from hcsim.errors import ConfigError
    from hcsim.study.experiment import load_experiment
    from hcsim.study.summary import write_report
    from hcsim.study.sweep import run_sweep

    check_execution_options(args)
    experiment = load_experiment(args.experiment)
    if args.report_only:
        csv = args.out / f"{experiment.name}.csv"
        if not csv.is_file():
            raise ConfigError(f"{csv}: no such file; run the sweep first (without --report-only)")
        for path in write_report(experiment, csv, args.out):
            print(f"wrote {path}")
        return 0
    from tqdm.contrib.logging import logging_redirect_tqdm

    bar = _Progress(enabled=not args.no_progress and not args.quiet)
    try:
        with logging_redirect_tqdm():  # a warning on a line of its own, above the bar
            report = run_sweep(experiment, args.out, jobs=args.jobs, resume=args.resume, overwrite=args.overwrite,
                               retry_errors=args.retry_errors, executor=args.executor, timeout=args.timeout,
                               progress=bar.update, planned=bar.start, running=bar.running)
    finally:
        bar.close()
    print(f"{experiment.name}: {report.ran} points run, {report.skipped} already done, {report.failed} failed, "
          f"in {report.wall_time_s / 60:.1f} min -> {report.csv}")
    for path in report.outputs:
        print(f"wrote {path}")
    return 1 if report.failed else 0


class _Progress:
    """A tqdm bar weighted by each point's rough cost (Point.cost), so its estimate of the time left holds;
    it moves while points run, by the fraction of their vertex runs done."""

    def __init__(self, enabled: bool):
        self.enabled, self.bar, self.done, self.failed, self.total = enabled, None, 0, 0, 0
        self.finished = 0.0  # cost of the finished points
        self.partial: dict[int, float] = {}  # running point index -> cost done so far
        self.lock = threading.Lock()

    def start(self, points) -> None:
        self.total = len(points)
        if self.enabled and points:
            from tqdm import tqdm

            self.bar = tqdm(total=sum(p.cost for p in points), file=sys.stderr, dynamic_ncols=True,
                            bar_format="{desc} {percentage:3.0f}%|{bar}| [{elapsed}<{remaining}]")
            self._postfix()

    def update(self, point, row, cost) -> None:
        with self.lock:
            self.done += 1
            self.failed += row["status"] != "ok"
            self.finished += cost
            self.partial.pop(point.index, None)
            self._show()

    def running(self, point, fraction: float) -> None:
        with self.lock:
            self.partial[point.index] = fraction * point.cost
            self._show()

    def _show(self) -> None:
        if self.bar is not None:
            self.bar.n = self.finished + sum(self.partial.values())
            self._postfix()
            self.bar.refresh()

    def _postfix(self) -> None:
        self.bar.set_description_str(f"{self.done}/{self.total} points" + (f", {self.failed} failed" if self.failed else ""))

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
