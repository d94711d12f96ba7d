"""A function run in a fresh process: SimGrid allows one Engine per process, ever, so each simulation
that is not the calling process's first runs in one (:mod:`hcsim.run.simulation`, :mod:`hcsim.run.serving`)."""

from __future__ import annotations

import logging
import os
import sys

from hcsim.errors import SimulationError

__all__ = ["Said", "in_fresh_process"]


def in_fresh_process(function, *args):
    """`function(*args)` in a fresh process (SimGrid: one Engine per process); its result or its error."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        with _fresh_process() as pool:
            result, said = pool.submit(_saying, function, args, dict(os.environ)).result()
    except BrokenProcessPool as err:
        raise SimulationError(f"simulation process: it died before returning a result ({err}). If this runs from "
                              "a script, put the script's top-level code under `if __name__ == \"__main__\":` "
                              "(the process imports the script again)") from None
    for name, level, message in said:  # on the caller's loggers, under the caller's logging set-up
        logging.getLogger(name).log(level, "%s", message)
    return result


class Said(logging.Handler):
    """The distinct warnings a process logs, in order, as (logger, level, message), to hand back with its
    result: a fresh process's stderr is its fork server's, which need not be the caller's now (a test capturing
    it); a sweep point's is kept only when it fails (:mod:`hcsim.study.points`)."""

    def __init__(self) -> None:
        super().__init__(logging.WARNING)
        self.said: list[tuple[str, int, str]] = []

    def emit(self, record: logging.LogRecord) -> None:
        said = (record.name, record.levelno, record.getMessage())
        if said not in self.said:
            self.said.append(said)


def _saying(function, args: tuple, environment: dict[str, str]):
    """Child side: `function(*args)` under the caller's `environment` (the fork server's is the one it started
    with: HCSIM_NO_LIMITS set since would be missed) and the warnings it logged; should it raise, they are
    written to stderr first, as a process that had no such handler would have."""
    os.environ.clear()
    os.environ.update(environment)
    said = Said()
    logging.getLogger().addHandler(said)
    try:
        return function(*args), said.said
    except BaseException:
        for _, _, message in said.said:
            print(message, file=sys.stderr)
        raise


# What every fresh process runs, imported once into the fork server its processes start from: a process then starts
# in about 0.08 s instead of importing them again (0.42 s spawned; 2-core Xeon, 2026-11-29). The server itself
# never runs a simulation, so each process forked from it still makes its process's first and only Engine.
PRELOAD = ["hcsim.run.simulation", "hcsim.run.serving"]


def _fresh_process():
    """A pool of one process for one task, forked from a fork server that has imported :data:`PRELOAD` (spawned
    where there is no fork server), never from the calling process (imported here: `hcsim simulate` runs in its
    own process and needs no multiprocessing)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_all_start_methods, get_context

    if "forkserver" not in get_all_start_methods():
        return ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"), max_tasks_per_child=1)
    context = get_context("forkserver")
    context.set_forkserver_preload(PRELOAD)
    return ProcessPoolExecutor(max_workers=1, mp_context=context, max_tasks_per_child=1)
