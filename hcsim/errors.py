"""The errors hcsim raises on purpose.

Each carries one string that names the place (file and field, node, vertex),
the problem and, where there is one, the fix; one string so that errors pickle
back from sweep worker processes unchanged. The CLI prints them in one line.
"""

from pathlib import Path

__all__ = ["HcsimError", "ConfigError", "TopologyError", "WorkloadError", "SimulationError", "shadowed_package"]


class HcsimError(Exception):
    """Base of every error hcsim raises on purpose."""


class ConfigError(HcsimError, ValueError):
    """A spec, scenario or command-line value is invalid."""


class TopologyError(HcsimError):
    """A platform graph is inconsistent: unknown device, bad link, unreachable XPU."""


class WorkloadError(HcsimError):
    """A workload graph is invalid: misplaced vertex, negative size, unbroken cycle."""


class SimulationError(HcsimError):
    """A simulation could not run or did not finish."""


def shadowed_package(error: ImportError) -> ImportError:
    """The ImportError to raise when ``from hcsim import __version__`` failed with `error`: it says whether a
    folder named ``hcsim`` (a namespace package: no ``__init__.py``) shadows the installed package."""
    import hcsim

    if getattr(hcsim, "__file__", None) is not None:
        return error
    folders = [str(p) for p in getattr(hcsim, "__path__", []) if not (Path(p) / "simulation.py").exists()]
    return ImportError(f"'import hcsim' found the folder {', '.join(folders) or '?'} (no __init__.py) instead of the "
                       f"hcsim package in {Path(__file__).resolve().parent}: a folder named 'hcsim' in the current "
                       f"directory or next to your script (a checkout of hcsim?) shadows it. Fix: run the script "
                       f"from another folder, or rename that folder")
