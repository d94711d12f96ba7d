"""The journal of a study's finished simulations, so that a killed ``hcsim plan`` or ``hcsim validate`` resumes.

Each simulation's result is appended to ``OUT/NAME.journal.jsonl`` as soon as it finishes, one JSON line
``{"key": ..., "result": ...}`` written whole (:func:`hcsim.study.store.append_whole`, as a sweep appends its
rows), while the folder is locked (:class:`hcsim.study.store.FolderLock`). The key is the digest of the
simulated scenario (:meth:`hcsim.run.scenario.Scenario.digest`), so a resumed run matches what it finished
whatever order it ran in. Once the report is written the journal is removed; a journal left behind is an
interrupted run: ``--resume`` runs only what it lacks, ``--overwrite`` starts over, neither is refused.
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path
from typing import Any

from hcsim.errors import ConfigError, brief

__all__ = ["Journal"]

log = logging.getLogger(__name__)

MAX_JOURNAL_BYTES = 2**30  # a journal read back by --resume is at most 1 GiB


class Journal:
    """``OUT/NAME.journal.jsonl`` of the `what` (``plan``, ``validation``) writing into `out`, for a ``with``.

    Parameters
    ----------
    out : the run's --out folder.
    name : the journal's name (``plan``, ``validation``).
    what : what the command runs, for messages.
    resume : keep the journal's results (:attr:`done`), to run only the others.
    overwrite : discard a journal left by an interrupted run.

    Raises
    ------
    ConfigError
        on entering: `resume` and `overwrite` together; a journal left behind with neither; a line of it that is
        not a journal line (naming the file and line); another process writing it.
    """

    def __init__(self, out: Path, name: str, what: str, *, resume: bool = False, overwrite: bool = False):
        from hcsim.study.store import check_resume

        check_resume(resume, overwrite, f"the finished simulations in {name}.journal.jsonl")
        self.path = Path(out) / f"{name}.journal.jsonl"
        self.what = what
        self.resume = resume
        self.overwrite = overwrite
        self.done: dict[str, dict[str, Any]] = {}
        self._lock = None
        self._fd: int | None = None

    def __enter__(self) -> "Journal":
        from hcsim.study.store import FolderLock

        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = FolderLock(self.path, self.what)
        self._lock.__enter__()
        try:
            self._open()
        except BaseException:
            self._lock.__exit__(None, None, None)
            raise
        return self

    def _open(self) -> None:
        left = self.path.exists() and self.path.stat().st_size > 0
        if left and not (self.resume or self.overwrite):
            raise ConfigError(f"{self.path}: an interrupted {self.what} left its finished simulations here. Fix: "
                              "--resume to run only the missing ones, or --overwrite to start over")
        if self.overwrite:
            self.path.unlink(missing_ok=True)
        elif left:
            self.done = self._read()
            log.warning("%s: resuming: %d finished simulations kept, the others run", self.path, len(self.done))
        self._fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def _read(self) -> dict[str, dict[str, Any]]:
        from hcsim.config import read_text
        from hcsim.run.report import atomic_write

        text = read_text(self.path, MAX_JOURNAL_BYTES, f"a {self.what} journal")
        if not text.endswith("\n"):  # a power loss mid-write: that simulation runs again
            text = text[: text.rfind("\n") + 1]
            log.warning("%s: dropped an incomplete last line", self.path)
            atomic_write(self.path, text)
        done = {}
        for number, line in enumerate(text.splitlines(), 1):
            try:
                entry = json.loads(line)
            except ValueError:
                entry = None
            if not (isinstance(entry, dict) and isinstance(entry.get("key"), str)
                    and isinstance(entry.get("result"), dict)):
                raise ConfigError(f"{self.path}:{number}: not a line of a {self.what} journal ({brief(line)}); "
                                  'each line is {"key": ..., "result": {...}}: delete that line, or run with '
                                  "--overwrite to start over")
            done[entry["key"]] = entry["result"]
        return done

    def record(self, key: str, result: dict[str, Any]) -> None:
        """Append one finished simulation (its scenario's digest and its result), whole."""
        from hcsim.study.store import append_whole

        append_whole(self._fd, (json.dumps({"key": key, "result": result}, default=str) + "\n").encode(), self.path)
        self.done[key] = result

    def finish(self) -> None:
        """The report is written: the journal is no longer needed."""
        self.path.unlink(missing_ok=True)

    def __exit__(self, *exc) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
        if self._lock is not None:
            self._lock.__exit__(*exc)
            self._lock = None
