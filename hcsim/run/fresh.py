"""A function run in a fresh, spawned process: SimGrid allows one Engine per process, ever, so each simulation
that is not the calling process's first runs in one (:mod:`hcsim.run.simulation`, :mod:`hcsim.run.serving`)."""

from __future__ import annotations

from hcsim.errors import SimulationError

__all__ = ["in_fresh_process"]


def in_fresh_process(function, *args):
    """`function(*args)` in a spawned process (SimGrid: one Engine per process); its result or its error."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        with _fresh_process() as pool:
            return pool.submit(function, *args).result()
    except BrokenProcessPool as err:
        raise SimulationError(f"simulation process: it died before returning a result ({err}). If this runs from "
                              "a script, put the script's top-level code under `if __name__ == \"__main__\":` "
                              "(the process is spawned and imports the script again)") from None


def _fresh_process():
    """A pool of one spawned (never forked) process for one task (imported here: `hcsim simulate` runs in
    its own process and needs no multiprocessing)."""
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    return ProcessPoolExecutor(max_workers=1, mp_context=get_context("spawn"), max_tasks_per_child=1)
