"""Running simulations in fresh processes: one scenario (:func:`run_point`), many on an executor (:func:`run_points`).

SimGrid allows one Engine per process, ever: each point runs in ``python -m hcsim.study.points``, killed with
its parent (Linux) or after its timeout; the executor is threads here or a Dask cluster (``dask://HOST:PORT``).
Sweeps, plans and validation all run their simulations through here.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Executor, Future, ThreadPoolExecutor, as_completed
from pathlib import Path
from typing import Any

from hcsim.errors import ConfigError, HcsimError, brief, say_once
from hcsim.run.fresh import Said
from hcsim.run.scenario import Scenario

__all__ = ["POINT_FOLDER_PREFIX", "check_executor", "run_point", "run_points"]

log = logging.getLogger(__name__)


POINT_FOLDER_PREFIX = "hcsim-point-"  # + the sweep's process id: /tmp/hcsim-point-PID-XXXX, one per running point


def run_point(scenario: Scenario | tuple[Callable[..., dict[str, Any]], tuple], timeout: float | None = None,
              started: Callable[[subprocess.Popen], None] | None = None,
              progress: Callable[[float], None] | None = None) -> dict[str, Any]:
    """Run `scenario` in a fresh Python process and return its result record, or ``{"error": message}``.

    `scenario` may also be a task ``(function, args)``: the child returns ``function(*args)`` (a module-level
    function, returning a JSON mapping; ``hcsim validate``'s rows), with the same process, kill and death
    rules. A child that dies (killed, crashed) gives ``{"error": "the simulation process died (...)"}``.

    This is what a sweep's executor runs (a local thread, or a Dask worker:
    the child is started with that worker's own Python). The child is killed
    if this process dies (Linux) or `timeout` (s) passes. `progress`, if given,
    is called about once a second with the fraction (0..1) of the point's vertex
    runs done so far.
    """
    with tempfile.TemporaryDirectory(prefix=f"{POINT_FOLDER_PREFIX}{os.getpid()}-") as folder:
        source, target = Path(folder) / "scenario.pickle", Path(folder) / "result.json"
        source.write_bytes(pickle.dumps(scenario))
        command = [sys.executable, "-m", "hcsim.study.points", str(source), str(target), str(os.getpid())]
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
    warnings = Said()
    logging.getLogger().addHandler(warnings)
    scenario = pickle.loads(source.read_bytes())
    from hcsim.run.report import atomic_write
    from hcsim.run.simulation import run_here

    try:
        if isinstance(scenario, tuple):  # a task: (function, args)
            function, args = scenario
            result = function(*args)
        else:
            result = run_here(scenario, progress=_progress_file(target.with_name("progress")))
    except HcsimError as err:
        result = {"error": str(err)}
    except Exception as err:  # a bug: record it and keep the traceback on stderr for the log
        import traceback

        traceback.print_exc()
        result = {"error": f"{type(err).__name__}: {err} (a bug in hcsim; please report it)"}
    if warnings.said:  # each message once, whichever loggers said it
        result = {**result, WARNINGS: list(dict.fromkeys(message for _, _, message in warnings.said))}
    atomic_write(target, json.dumps(result))
    return 0


WARNINGS = "warnings"
"""The result key under which a point's process hands back what it warned (run_points says each once)."""


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


def run_points(scenarios: Sequence[Scenario | tuple[Callable[..., dict[str, Any]], tuple]], *, jobs: int = 1, executor: str = "local",
               timeout: float | None = None, running: Callable[[int, float], None] | None = None
               ) -> Iterator[tuple[int, dict[str, Any]]]:
    """Run each scenario in a process of its own (:func:`run_point`) on `executor`, `jobs` at a time (local:
    threads; ``dask://HOST:PORT``: a Dask cluster's workers); yield (index in `scenarios`, result record) as
    each finishes. A failure of the executor itself (a lost Dask worker...) is that point's error. Stopping
    early (an exception, or closing the iterator) cancels the points not started and kills the local ones
    running. `running` as :func:`run_sweep`'s, with the index instead of the point. What a point's process
    warns is said here, each message once."""
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
                for message in result.pop(WARNINGS, ()):  # once a run, not once a point
                    say_once(log, message)
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


if __name__ == "__main__":
    sys.exit(_point_main(sys.argv[1:]))
