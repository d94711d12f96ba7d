"""Import SimGrid's Python module without the user setting LD_LIBRARY_PATH.

The extension built by ``pip install simgrid`` has no RPATH to
``libsimgrid.so.4.1`` (installed beside it in site-packages or in the
environment's lib/), so ``import simgrid`` fails unless that library is loaded
first. We load it with RTLD_GLOBAL, then import the module.
"""

from __future__ import annotations

import ctypes
import functools
import sys
import sysconfig
from pathlib import Path

from hcsim.errors import SimulationError

__all__ = ["load"]

LIBRARY = "libsimgrid.so.4.1"


@functools.cache
def load():
    """Return the ``simgrid`` module, preloading its shared library."""
    for folder in _candidate_folders():
        library = folder / LIBRARY
        if library.exists():
            ctypes.CDLL(str(library), mode=ctypes.RTLD_GLOBAL)
            break
    try:
        import simgrid
    except ImportError as err:
        raise SimulationError(
            f"cannot import SimGrid ({err}); run `make setup` (or `pip install simgrid==4.1` "
            "with PIP_CONSTRAINT pointing at constraints.txt)") from err
    return simgrid


def _candidate_folders() -> list[Path]:
    paths = sysconfig.get_paths()
    folders = [Path(paths["purelib"]), Path(paths["platlib"]), Path(sys.prefix) / "lib",
               Path(paths["purelib"]) / "simgrid", Path(paths["purelib"]) / "lib"]
    return [folder for folder in dict.fromkeys(folders) if folder.is_dir()]
