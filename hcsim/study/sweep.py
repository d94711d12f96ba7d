"""The sweep runner: every point of an experiment (:mod:`hcsim.study.experiment`) simulated, one CSV row each.

The runner runs every point in a fresh process of its own (SimGrid allows one
Engine per process, ever): a `concurrent.futures` executor (threads locally,
a Dask cluster with ``dask://HOST:PORT``) hands each point to
:func:`hcsim.study.points.run_point`, which starts ``python -m hcsim.study.points`` and waits for it. A
child that crashes (a C++ abort takes the whole process down) costs only its
own point, which is recorded with its error. Each finished point is appended
to the CSV (:mod:`hcsim.study.store`) as one line, with one ``os.write`` on an ``O_APPEND`` descriptor
followed by ``fsync``, so a killed sweep loses no finished point and never
leaves half a row; ``resume`` skips the points already in the file, matched
by their key (the hash of the point's full scenario), once each row is checked: a row of no point of the
experiment, or one whose axis values, inputs hash or results do not hold, is moved to NAME.dropped.csv and
its point run again. :mod:`hcsim.study.summary` writes the report.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hcsim.errors import ConfigError, OutputError, brief
from hcsim.study.experiment import Experiment, Point, describe
from hcsim.study.points import _remove_stale_point_folders, check_executor, run_points
from hcsim.study.store import FolderLock, _drop_rows, _existing, _ResultsFile, check_resume, columns, result_rows
from hcsim.study.summary import write_report

__all__ = ["SweepReport", "run_sweep"]

log = logging.getLogger(__name__)


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
    kept_errors = sum(status != "ok" for status in done.values())
    if kept_errors and not retry_errors:
        log.warning("%s: %d point%s recorded with an error kept (--retry-errors runs them again)", path, kept_errors,
                    "s" if kept_errors > 1 else "")
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
                    log.warning("point %d (%s) failed: %s", point.index, describe(point.labels), row["error"])
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
