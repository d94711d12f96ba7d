"""The errors hcsim raises on purpose.

Each carries one string that names the place (file and field, node, vertex),
the problem and, where there is one, the fix; one string so that errors pickle
back from sweep worker processes unchanged. The CLI prints them in one line.
"""

__all__ = ["HcsimError", "ConfigError", "TopologyError", "WorkloadError", "SimulationError"]


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
