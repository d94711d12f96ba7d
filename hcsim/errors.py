"""The errors hcsim raises on purpose.

Each carries one string that names the place (file and field, node, vertex),
the problem and, where there is one, the fix; one string so that errors pickle
back from sweep worker processes unchanged. The CLI prints them in one line.

Every message follows one template (:data:`MESSAGE_TEMPLATE`)::

    WHERE: PROBLEM[; what would be valid, or Fix: ...]

WHERE names the file (``paper-cxl.yaml``, ``exp.yaml:12``), the key
(``links.cxl.latency``), the option (``--out``) or the object
(``scenario 'default'``); a message listing several problems repeats the
template on each line (or indents them under a ``WHERE: ...:`` line). A
user's value is shown with :func:`brief`, never in full.
"""

import logging
import re
import reprlib
from pathlib import Path

__all__ = ["HcsimError", "ConfigError", "TopologyError", "WorkloadError", "SimulationError", "OutputError", "brief",
           "MESSAGE_TEMPLATE", "shadowed_package", "invalid", "say_once"]

# One line of a message: a place, ": ", the problem (continuation lines of a list are indented instead).
MESSAGE_TEMPLATE = re.compile(r"^(?P<where>[^\s:][^\n]*?): (?P<problem>\S[^\n]*)$")

_SAID: set[str] = set()


def say_once(log: logging.Logger, message: str) -> None:
    """Warn `message` on `log` once per process, whoever says it again: a sweep, a plan or a validation reads its
    specs once to check them and again for every point, and each point's process hands back what it warned
    (hcsim.study.points.run_points), so one note would otherwise come several times."""
    if message not in _SAID:
        _SAID.add(message)
        log.warning("%s", message)


_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlist, _REPR.maxtuple = 60, 60, 6, 6
_REPR.maxdict, _REPR.maxset, _REPR.maxlevel, _REPR.maxlong = 4, 6, 3, 40


# A number in exponent notation that YAML 1.1 (PyYAML) reads as text: it wants a dot and a signed exponent
_EXPONENT_TEXT = re.compile(r"^[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+$")


def brief(value: object) -> str:
    """`value`'s repr, cut short (at most about 100 characters): what error messages show of a user's value. Text
    that reads as a number in exponent notation says why it is text (``'1e12'``: YAML needs ``1.0e+12``)."""
    try:
        shown = _REPR.repr(value)
    except Exception:  # a user object whose repr fails
        return f"<{type(value).__name__}>"
    if isinstance(value, str) and _EXPONENT_TEXT.match(value.strip()):
        mantissa, exponent = value.strip().lower().split("e")
        number = f"{mantissa if '.' in mantissa else mantissa + '.0'}e{exponent if exponent[0] in '+-' else '+' + exponent}"
        whole = float(number) if float(number).is_integer() and abs(float(number)) < 1e16 else None
        shown += (f" (text to YAML, which reads exponent notation as a number only with a dot and a signed exponent: "
                  f"write {number}{f', or {int(whole)}' if whole is not None else ''})")
    return shown


def invalid(where: str, problems: list[str]) -> str:
    """A message listing `problems` under ``WHERE: invalid (N problems):``, one indented line each."""
    count = f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"
    return f"{where}: invalid ({count}):\n  " + "\n  ".join(problems)


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
    folders = [str(p) for p in getattr(hcsim, "__path__", []) if not (Path(p) / "run" / "simulation.py").exists()]
    return ImportError(f"'import hcsim' found the folder {', '.join(folders) or '?'} (no __init__.py) instead of the "
                       f"hcsim package in {Path(__file__).resolve().parent}: a folder named 'hcsim' in the current "
                       f"directory or next to your script (a checkout of hcsim?) shadows it. Fix: run the script "
                       f"from another folder, or rename that folder")


class OutputError(HcsimError):
    """A run finished but its outputs could not be written; `result` holds its result record (or None)."""

    def __init__(self, message: str, result: dict | None = None):
        super().__init__(message, result)
        self.result = result

    def __str__(self) -> str:
        return str(self.args[0])
