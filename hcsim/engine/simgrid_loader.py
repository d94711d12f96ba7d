"""Import SimGrid's Python module without the user setting LD_LIBRARY_PATH.

The extension built by ``pip install simgrid`` has no RPATH to
``libsimgrid.so.4.1`` (installed beside it in site-packages or in the
environment's lib/), so ``import simgrid`` fails unless that library is loaded
first. We load it with RTLD_GLOBAL, then import the module.

Importing it prints ``[xbt_cfg/INFO] Configuration change: Set
'contexts/factory' to 'thread'`` on standard error, before any option can
lower the log level; the import runs with file descriptor 2 on /dev/null.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import os
import sys
import sysconfig
from pathlib import Path

from hcsim.errors import SimulationError

__all__ = ["load", "load_library", "library_path"]

LIBRARY = "libsimgrid.so.4.1"


def library_path() -> Path | None:
    """Where ``libsimgrid.so.4.1`` is installed (site-packages or the environment's lib/), or None."""
    for folder in _candidate_folders():
        library = folder / LIBRARY
        if library.exists():
            return library
    return None


@functools.cache
def load_library() -> Path | None:
    """Load ``libsimgrid.so.4.1`` with RTLD_GLOBAL, without importing SimGrid's Python module; its path.

    The C++ engine core (:mod:`hcsim.engine.core`) needs only the library: importing the Python module
    would also switch SimGrid's context factory to OS threads for the whole process.
    """
    library = library_path()
    if library is not None:
        ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
    return library


@functools.cache
def load():
    """Return the ``simgrid`` module, preloading its shared library."""
    load_library()
    try:
        with _quiet_stderr():
            import simgrid
    except ImportError as err:
        raise SimulationError(
            f"simgrid: cannot import SimGrid ({err}); run `make setup` (or `pip install simgrid==4.1` "
            "with PIP_CONSTRAINT pointing at constraints.txt)") from err
    return simgrid


@contextlib.contextmanager
def _quiet_stderr():
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _candidate_folders() -> list[Path]:
    paths = sysconfig.get_paths()
    folders = [Path(paths["purelib"]), Path(paths["platlib"]), Path(sys.prefix) / "lib",
               Path(paths["purelib"]) / "simgrid", Path(paths["purelib"]) / "lib"]
    return [folder for folder in dict.fromkeys(folders) if folder.is_dir()]
