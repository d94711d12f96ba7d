"""hcsim's engine core on SimGrid's S4U C++ API: the C++ extension ``_core`` that runs workload graphs
(:mod:`.workload`, executor.cpp) and serving steps (hcsim/run/serving.py, steps.cpp) on the compiled platform
(platform.cpp builds it from the compiled route tables).

The extension (sources beside this file, built by ``make`` through ``scripts/build_core.py``) takes flat
arrays and runs them on plain SimGrid activities started from completion callbacks in SimGrid's maestro
(driver.hpp); docs/engine-core.md says how. Every run needs it: where it is not built or does not load,
:func:`available` is False and :func:`unavailable_reason` says why, with the fix. SimGrid allows one Engine
per process, ever: each run of the core makes it, so callers run it in a fresh process (hcsim/run/fresh.py).
"""

from __future__ import annotations

import functools

from hcsim.errors import SimulationError

__all__ = ["available", "unavailable_reason", "load"]

SIMGRID_VERSION = (4, 1, 0)


@functools.cache
def _load_or_reason():
    from hcsim.engine.simgrid_loader import load_library

    if load_library() is None:
        return None, "libsimgrid.so.4.1 is not installed (run `make setup`)"
    try:
        from hcsim.engine.core import _core
    except ImportError as err:
        return None, f"the extension is not built or does not load ({err}); build it with `make core`"
    if tuple(_core.simgrid_version()) != tuple(_core.header_version) or tuple(_core.header_version) != SIMGRID_VERSION:
        return None, (f"the extension was built with SimGrid {_core.header_version} headers but runs on libsimgrid "
                      f"{_core.simgrid_version()}; rebuild it with `make core`")
    return _core, None


def available() -> bool:
    """True when the C++ core is built and loads against SimGrid 4.1."""
    return _load_or_reason()[0] is not None


def unavailable_reason() -> str | None:
    """Why the core cannot be used, with the fix; None when it can."""
    return _load_or_reason()[1]


def load():
    """The extension module.

    Raises
    ------
    SimulationError
        when it is not built or does not match the installed SimGrid (the message says how to build it).
    """
    module, reason = _load_or_reason()
    if module is None:
        raise SimulationError(f"engine core: {reason}")
    return module
