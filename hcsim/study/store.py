"""A sweep's results CSV: its columns, a point's rows, appending them whole, reading them back (``--resume``,
``--report-only``), and the folder lock a sweep and a journal (:mod:`hcsim.study.journal`) hold while they write.

Every row records the point's whole scenario, resolved (defaults replaced by the platform's and workload's
values) and in SI units named in the column: :func:`hcsim.run.results.scenario_columns`, one per Scenario
field. A point has one row per device type (:data:`hcsim.run.results.DEVICE_COLUMNS`: the device, its XPU
count and where its XPUs' iteration goes, mean over them), each with the point's results
(:data:`RESULT_COLUMNS`); a failed point has one row.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import logging
import math
import os
import threading
from collections import defaultdict
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hcsim.errors import ConfigError, brief
from hcsim.run.results import (DEVICE_COLUMNS, MEMORY_COLUMNS, SPLIT_PARTS, TIME_PARTS, csv_cell, scenario_column,
                               scenario_columns)
from hcsim.run.scenario import RETIRED_KEYS, Scenario

if TYPE_CHECKING:
    from hcsim.study.experiment import Experiment, Point

__all__ = ["ADDED_RESULT_COLUMNS", "FolderLock", "RESULT_COLUMNS", "TEXT_COLUMNS", "append_whole", "check_resume",
           "columns", "read_results", "result_rows", "upgrade_records"]

log = logging.getLogger(__name__)


# Every row records the point's whole scenario, resolved (defaults replaced by the platform's and
# workload's values) and in SI units named in the column: hcsim.run.results.scenario_columns(), one per
# Scenario field. A point has one row per device type (hcsim.run.results.DEVICE_COLUMNS: the device, its XPU
# count and where its XPUs' iteration goes, mean over them), each with the point's results below; a failed
# point has one row.
# What a row records of a point's result; every row has all of them (blank for a failed point).
RESULT_COLUMNS = (
    "iteration_time_s",        # s, mean over the steady-state iterations (all but the first)
    "batches_per_s",           # the paper's throughput: XPUs x batches per XPU / iteration time
    "samples_per_s",
    "batches_per_s_per_xpu",   # batches_per_s / xpus: where a slower device type enters, it drops
    "busiest_link",            # "kind u -> v": the link direction with the highest mean utilization
    "busiest_link_utilization",  # its bytes / (bandwidth x simulated time)
    "iteration_times_s",       # s, each iteration's, joined with + (text)
    "measured_iterations",     # "2..N": the iterations the device columns and iteration_time_s average
    "device_counts",           # "128 H100 + 128 A100"
    "activities",
    "wall_time_s",             # s of the simulation process (setup included)
    "peak_rss_mb",
    "inputs_hash",
    "hcsim_version",
    "simgrid_version",
    # added later: blank in the rows of a CSV written before they existed (see _upgrade)
    "tokens_per_s",            # blank for a workload without tokens per sample
    "model_flops_per_s_per_xpu",  # FLOP/s: the model's FLOPs (as Megatron-LM counts them) per XPU
    "mfu",                     # model FLOP/s over the XPUs' peak at the workload's precision (0..1)
)


ADDED_RESULT_COLUMNS = ("tokens_per_s", "model_flops_per_s_per_xpu", "mfu", *SPLIT_PARTS, *MEMORY_COLUMNS)


# whole mappings written as JSON before each of their keys had a column: read from the CSVs of then
LEGACY_MAPPINGS = ("platform_overrides", "workload_overrides")


STATUS_COLUMNS = ("status", "error")  # status: ok | error


MAX_CSV_BYTES = 2**30  # a results CSV read back (--resume, --report-only) is at most 1 GiB


# Columns read back as text whatever they look like (a point key such as 36725e2733359637 is no number).
TEXT_COLUMNS = ("point", "inputs_hash", "hcsim_version", "simgrid_version", "status", "error", "busiest_link",
                "iteration_times_s", "measured_iterations", "device_counts", "device", "least_idle_xpu", "breakdown",
                "devices", "collective", "granularity", "collective_model", "ring_order", "layer_split",
                "batch_split", "offload_state", "trace_xpus", "trace_iterations", "platform_overrides",
                "workload_overrides")


def columns(experiment: Experiment, points: list[Point] | None = None) -> list[str]:
    """The CSV header of `experiment`: point key, axes, every scenario column, a column per key of
    platform_overrides and workload_overrides any point sets, device columns, results, status."""
    axes = experiment.axis_columns()
    scenario = scenario_columns()
    overrides = sorted({c for p in (experiment.points() if points is None else points) for c in p.inputs
                        if c.startswith(LEGACY_MAPPINGS) and "." in c})
    return ["point", *axes, *(c for c in [*scenario, *overrides] if c not in axes), *DEVICE_COLUMNS,
            *RESULT_COLUMNS, *STATUS_COLUMNS]


def result_rows(point: Point, result: dict[str, Any], header: Sequence[str]) -> list[dict[str, Any]]:
    """The CSV rows (column -> value) of one point: one per device type, or one for its error."""
    row: dict[str, Any] = dict.fromkeys(header, "")
    row["point"] = point.key
    row.update(point.inputs)
    row.update(point.labels)
    if "error" in result:
        row.update(status="error", error=result["error"])
        return [row]
    xpus = result["xpus"]
    kind, busiest = max(((k, rows[0]) for k, rows in result["links"].items()), key=lambda kr: kr[1]["utilization"])
    row.update(
        busiest_link=f"{kind} {busiest['link']}", busiest_link_utilization=busiest["utilization"],
        iteration_time_s=result["iteration_time_s"], batches_per_s=result["batches_per_s"],
        samples_per_s=result["samples_per_s"], batches_per_s_per_xpu=result["batches_per_s"] / xpus,
        iteration_times_s=csv_cell(result["iteration_times_s"]),
        tokens_per_s=result.get("tokens_per_s"), model_flops_per_s_per_xpu=result.get("model_flops_per_s_per_xpu"),
        mfu=result.get("mfu"),
        measured_iterations=result["measured_iterations"],
        device_counts=" + ".join(f"{n} {d}" for d, n in result["devices"].items()),
        activities=result["activities"], wall_time_s=round(result["wall_time_s"], 3),
        peak_rss_mb=round(result["peak_rss_mb"], 1), inputs_hash=result["inputs_hash"],
        hcsim_version=result["versions"]["hcsim"], simgrid_version=result["versions"]["simgrid"],
        status="ok")
    rows = []
    for device, parts in result["breakdown"].items():
        pace = result["pace"][device]
        memory = result.get("memory", {}).get(device, {})
        rows.append({**row, "device": device, "device_xpus": parts["xpus"],
                     **{part: parts[part] for part in TIME_PARTS},
                     "least_idle_xpu": pace["xpu"], "least_idle_s": pace["idle_s"],
                     **{part: parts.get(part) for part in SPLIT_PARTS},
                     "state_per_xpu_bytes": memory.get("state_bytes"), "spilled_per_xpu_bytes": memory.get("spilled_bytes"),
                     "offloaded_per_xpu_bytes": memory.get("offloaded_bytes")})
    return rows


def _csv_line(values: Iterable[Any]) -> str:
    buffer = io.StringIO()
    csv.writer(buffer, lineterminator="\n").writerow(["" if v is None else v for v in values])
    return buffer.getvalue()


class _ResultsFile:
    """results/NAME.csv: a header written once, then whole rows appended one write each."""

    def __init__(self, path: Path, header: list[str]):
        self.path = path
        self.header = header
        self.lock = threading.Lock()
        if not path.exists() or path.stat().st_size == 0:
            from hcsim.run.report import atomic_write

            atomic_write(path, _csv_line(header))
        self.fd = os.open(path, os.O_WRONLY | os.O_APPEND)

    def append(self, rows: list[dict[str, Any]]) -> None:
        """Append a point's rows (one per device type) in one write."""
        data = "".join(_csv_line(row[c] for c in self.header) for row in rows).encode()
        with self.lock:
            append_whole(self.fd, data, self.path)

    def close(self) -> None:
        os.close(self.fd)


def append_whole(fd: int, data: bytes, path: Path) -> None:
    """Append `data` to `path`, open as `fd` with ``O_APPEND``, in one write, then sync it: a process killed
    meanwhile leaves all of it or none (a power loss at most a torn last line, which readers drop)."""
    written = os.write(fd, data)
    if written != len(data):
        raise OSError(f"{path}: short write ({written} of {len(data)} bytes); the disk may be full")
    os.fsync(fd)


def check_resume(resume: bool, overwrite: bool, kept: str = "the rows already in the CSV") -> None:
    """--resume and --overwrite together are refused: `kept` are what --resume keeps."""
    if resume and overwrite:
        raise ConfigError(f"--resume, --overwrite: they contradict each other (keep {kept}, or start over "
                          "replacing them); give one")


def _existing(path: Path, header: list[str], points: Sequence[Point] = ()) -> dict[str, str]:
    """Point key -> status of the rows already in `path`; a torn last line (power loss) is dropped.

    Raises
    ------
    ConfigError
        naming the file and line of a line that is not a row of this experiment (garbage, binary, a
        wrong number of columns), or if the header is another experiment's.
    """
    if not path.exists() or path.stat().st_size == 0:
        return {}
    from hcsim.config import read_text

    text = read_text(path, MAX_CSV_BYTES, "a results CSV")
    if not text.endswith("\n"):
        from hcsim.run.report import atomic_write

        text = text[: text.rfind("\n") + 1]
        log.warning("%s: dropped an incomplete last line", path)
        atomic_write(path, text)
    rows = _parse_csv(path, text)
    found = rows[0][1] if rows else None
    whole = [(line, row) for line, row in rows[1:] if len(row) == len(found or ())]
    upgraded = upgrade_records(found or [], header, [dict(zip(found, row)) for _, row in whole], points)
    if upgraded is None:
        raise ConfigError(f"{path}: its columns are not this experiment's (were the axes changed?). "
                          "Fix: move the file away, or run with --overwrite to start over")
    new = [[record[c] for c in header] for record in upgraded]
    if found != header or any(row != old for row, (_, old) in zip(new, whole)):
        # written by an older hcsim: new columns (scenario keys at their defaults, results blank), cells as today
        from hcsim.run.report import atomic_write

        log.warning("%s: written by an older hcsim; adding the columns %s (scenario keys at their defaults, "
                    "results it did not record blank) and writing its cells as today's (no numbers change)", path,
                    ", ".join(c for c in header if c not in found) or "none")
        lines = dict(zip((line for line, _ in whole), new))
        rows = [(1, header)] + [(line, lines.get(line, row)) for line, row in rows[1:]]
        atomic_write(path, "".join(_csv_line(row) for _, row in rows))
    status_column, counts_column = header.index("status"), header.index("device_counts")
    by_key = {p.key: p for p in points}
    status, counts, expected = {}, defaultdict(int), {}
    doubtful: dict[str, str] = {}  # point key -> why its rows are not trusted
    unknown: list[tuple[int, str]] = []  # (line, why) of rows that are no point of this experiment
    for line, row in rows[1:]:
        key = row[0] if row else ""
        whole = len(row) == len(header) and row[status_column] in ("ok", "error") and key
        if not whole and not (key in by_key and points):
            raise ConfigError(f"{path}:{line}: not a row of this experiment ({len(row)} of {len(header)} columns, "
                              f"status {brief(row[status_column] if len(row) > status_column else None)}); fix or "
                              "delete that line, or run with --overwrite to start over")
        if points:
            why = (_row_problem(dict(zip(header, row)), by_key[key]) if whole and key in by_key else
                   f"{len(row)} of {len(header)} columns, status "
                   f"{brief(row[status_column] if len(row) > status_column else None)}" if key in by_key else None)
            if key not in by_key:
                unknown.append((line, f"point {brief(key)} is no point of this experiment (a damaged key, or a point "
                                      "the experiment no longer has)"))
                continue
            if why:
                doubtful.setdefault(key, f"line {line}: {why}")
                continue
        status[key] = row[status_column]
        counts[key] += 1
        if status[key] == "ok":
            expected[key] = len(row[counts_column].split(" + "))
    if doubtful or unknown:
        _set_aside(path, header, rows, {line for line, _ in unknown}, set(doubtful))
        aside = path.with_name(f"{path.stem}.dropped.csv")
        reasons = [f"line {line}: {why}" for line, why in unknown]
        reasons += [f"point {key} ({', '.join(f'{c}={v}' for c, v in by_key[key].labels.items())}), {why}"
                    for key, why in doubtful.items()]
        log.warning("%s: rows not trusted, moved to %s (%s): %s", path, aside.name,
                    f"their {len(doubtful)} point{'s' if len(doubtful) != 1 else ''} run again" if doubtful
                    else "no point of this experiment", "; ".join(reasons[:5])
                    + (f"; and {len(reasons) - 5} more" if len(reasons) > 5 else ""))
    torn = {k for k, n in expected.items() if counts[k] != n and k not in doubtful}  # cut short by a power loss
    if torn:
        log.warning("%s: dropped %d points with some of their device rows missing", path, len(torn))
        _drop_rows(path, torn)
    return {k: v for k, v in status.items() if k not in torn and k not in doubtful}


# the result cells an "ok" row must hold as finite numbers > 0 (a row with them blank or damaged is run again)
TRUSTED_NUMBERS = ("iteration_time_s", "batches_per_s", "samples_per_s")


def _row_problem(row: dict[str, str], point: Point) -> str | None:
    """Why a whole row of `point` read back from its results CSV cannot be trusted, or None."""
    for column, value in point.labels.items():
        if column in row and row[column] != _today(column, "" if value is None else str(value)):
            return f"{column} is {brief(row[column])}, the point's is {brief(value)}"
    if row["status"] == "error":
        return None if row["error"].strip() else "status error without its error"
    if row["inputs_hash"].partition("+")[0] != point.key:
        return f"inputs_hash {brief(row['inputs_hash'])} is not the point's {point.key}"
    for column in TRUSTED_NUMBERS:
        number = _number(row[column])
        if number is None or number <= 0:
            return f"{column} is {brief(row[column])}, not a number > 0"
    if not row["device"] or not all(part.strip().partition(" ")[0].isdigit() and part.strip().partition(" ")[2]
                                    for part in row["device_counts"].split(" + ")):
        return f"device {brief(row['device'])}, device_counts {brief(row['device_counts'])}: not a device's row"
    return None


def _set_aside(path: Path, header: list[str], rows: list[tuple[int, list[str]]], lines: set[int],
               keys: set[str]) -> None:
    """Move the rows on `lines`, and every row of the points `keys`, from `path` to NAME.dropped.csv beside it
    (appended; with the header when it starts it), so nothing read back is lost."""
    from hcsim.run.report import atomic_write

    moved = [row for line, row in rows[1:] if line in lines or (row and row[0] in keys)]
    kept = [rows[0][1]] + [row for line, row in rows[1:] if not (line in lines or (row and row[0] in keys))]
    aside = path.with_name(f"{path.stem}.dropped.csv")
    text = aside.read_text() if aside.is_file() else _csv_line(header)
    atomic_write(aside, text + "".join(_csv_line(row) for row in moved))
    atomic_write(path, "".join(_csv_line(row) for row in kept))


def _parse_csv(path: Path, text: str) -> list[tuple[int, list[str]]]:
    """(line number, fields) of each non-empty record of CSV `text`; a line csv cannot read is a ConfigError."""
    reader = csv.reader(io.StringIO(text))
    rows = []
    while True:
        line = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return rows
        except csv.Error as err:
            raise ConfigError(f"{path}:{line}: not a CSV row ({err}); fix or delete that line, or run with "
                              "--overwrite to start over") from None
        if row:
            rows.append((line, row))


def _drop_rows(path: Path, keys: set[str]) -> None:
    from hcsim.run.report import atomic_write

    lines = path.read_text().splitlines(keepends=True)
    keep = [lines[0]] + [line for line in lines[1:] if next(csv.reader([line]))[0] not in keys]
    atomic_write(path, "".join(keep))


def read_results(path: str | Path, header: Sequence[str] | None = None, points: Sequence[Point] = ()
                 ) -> list[dict[str, Any]]:
    """The rows of a sweep's CSV, with numbers, booleans and blanks (None) typed back; with `header` (today's
    columns of its experiment, :func:`columns`), an older CSV's rows as today's (:func:`upgrade_records`).

    A column is typed as a whole, as pandas does: numbers when every value in it is a finite number,
    booleans when every value is True or False; otherwise, and always for TEXT_COLUMNS (point keys
    such as ``36725e2733359637``, which Python and pandas would read as infinity), its values stay
    text. (``pandas.read_csv(path, dtype={"point": str, "inputs_hash": str})`` reads the same file.)
    """
    from hcsim.config import read_text

    wanted = header
    rows = _parse_csv(Path(path), read_text(path, MAX_CSV_BYTES, "a results CSV"))
    if not rows:
        return []
    found = rows[0][1]
    bad = next((line for line, row in rows[1:] if len(row) != len(found)), None)
    if bad is not None:
        raise ConfigError(f"{path}:{bad}: not a row of this file ({len(found)} columns in its header); fix or "
                          "delete that line")
    records = [dict(zip(found, row)) for _, row in rows[1:]]
    if wanted is not None:  # an older CSV of this experiment, as hcsim writes it today
        records = upgrade_records(found, list(wanted), records, points)
        if records is None:
            raise ConfigError(f"{path}: its columns are not this experiment's (were the axes changed?). Fix: run "
                              "the sweep again with --overwrite")
        header = list(wanted)
    else:
        header = found
    kinds = {column: _column_kind(column, [record[column] for record in records]) for column in header}
    return [{k: _typed(v, kinds[k]) for k, v in record.items()} for record in records]


def upgrade_records(found: list[str], header: list[str], records: list[dict[str, str]],
                    points: Sequence[Point] = ()) -> list[dict[str, str]] | None:
    """The rows (column -> CSV text) of a results CSV whose header is `found`, as rows of `header`, the header
    of today's hcsim for its experiment; None when `found` is another experiment's.

    A CSV written by an older hcsim lacks columns that came later: a scenario key's gets its default (every
    run of the file had it; a key whose default the specs resolve, such as precision, gets what it resolves
    to for the row's point among `points`: the same key, so the same scenario), a result's (:data:`ADDED_RESULT_COLUMNS`) stays blank (not recorded), a key of
    platform_overrides or workload_overrides gets its value from the mapping the file wrote as JSON. Cells
    written as they were then become today's (:func:`_today`): "none" and prose blank, JSON lists joined
    with +, a mapping its keys. No number changes."""
    found = [c for c in found if c not in RETIRED_COLUMNS]  # keys that went: every row now runs what they named
    if any(c not in header for c in found) or [c for c in header if c in found] != list(found):
        return None
    defaults = {scenario_column(f.name): csv_cell(f.default) for f in dataclasses.fields(Scenario)
                if f.default is not dataclasses.MISSING and f.default is not None}
    missing = [c for c in header if c not in found]
    mapped = [c for c in missing if c.startswith(LEGACY_MAPPINGS) and "." in c]
    scenario = set(scenario_columns())
    if any(c not in scenario and c not in ADDED_RESULT_COLUMNS and c not in mapped for c in missing):
        return None
    inputs = {p.key: p.inputs for p in points}
    upgraded = []
    for record in records:
        row = {c: _today(c, record[c]) if c in record else "" for c in header}
        for c in missing:
            if c in scenario and c not in defaults:
                value = inputs.get(record.get("point"), {}).get(c)
                row[c] = "" if value is None else str(value)
            elif c in defaults:
                row[c] = "" if defaults[c] is None else str(defaults[c])
            elif c in mapped:
                mapping, key = c.split(".", 1)
                value = _json_mapping(record.get(mapping, "")).get(key)
                row[c] = "" if value is None else str(csv_cell(value))
        upgraded.append(row)
    return upgraded


RETIRED_COLUMNS = frozenset(RETIRED_KEYS)  # scenario keys retired (engine, xpu_sampling): dropped when read


_NOTHING = {"cxl_bandwidth_Bps": "none", "cxl_latency_s": "none", "collective_chunks": "the algorithm's default",
            "devices": "per node (explicit topology)"}  # what older CSVs wrote where nothing exists


def _today(column: str, text: str) -> str:
    """A cell of an older CSV as hcsim writes it today."""
    if _NOTHING.get(column) == text:
        return ""
    if column in LEGACY_MAPPINGS and text.startswith("{"):
        return str(csv_cell(sorted(_json_mapping(text))) or "")
    if text.startswith("[") and column in TEXT_COLUMNS:
        try:
            value = json.loads(text)
        except ValueError:
            return text
        return str(csv_cell(value)) if isinstance(value, list) else text
    return text


def _json_mapping(text: str) -> dict:
    try:
        value = json.loads(text) if text.startswith("{") else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _column_kind(column: str, values: list[str]) -> str:
    present = [v for v in values if v != ""]
    if column in TEXT_COLUMNS or not present:
        return "text"
    if all(v in ("True", "False") for v in present):
        return "bool"
    if all(_number(v) is not None for v in present):
        return "number"
    return "text"


def _number(text: str) -> int | float | None:
    """`text` as an int or a finite float, or None."""
    for kind in (int, float):
        try:
            value = kind(text)
        except ValueError:
            continue
        return value if kind is int or math.isfinite(value) else None
    return None


def _typed(text: str, kind: str) -> Any:
    if text == "":
        return None
    if kind == "bool":
        return text == "True"
    if kind == "number":
        return _number(text)
    return text


class FolderLock:
    """An exclusive lock on OUT/.NAME.lock while a `what` (sweep, plan, validation) writes OUT/NAME.EXT
    (`guarded`): a second one into the same folder is refused instead of doubling its rows. The lock (flock)
    ends with the process, even a killed one; the file is removed on a normal exit."""

    def __init__(self, guarded: Path, what: str):
        self.guarded = guarded
        self.what = what
        self.path = guarded.parent / f".{guarded.stem}.lock"
        self.fd: int | None = None

    def __enter__(self) -> "FolderLock":
        import fcntl

        for _ in range(10):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                os.close(fd)
                raise ConfigError(f"{self.guarded}: another {self.what} is writing it (lock {self.path} held); "
                                  "wait for it to end, or give another --out") from None
            try:
                same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
            except FileNotFoundError:
                same = False
            if same:  # not a lock file its previous owner removed meanwhile
                previous = os.read(fd, 64).decode(errors="replace").strip()
                if previous:  # its sweep was killed (SIGKILL, power loss) before it could remove the file
                    log.warning("%s: taking over the lock of %s process %s, which is no longer running (killed?); "
                                "what it finished is kept in %s", self.path, self.what, previous, self.guarded.name)
                os.lseek(fd, 0, os.SEEK_SET)
                os.ftruncate(fd, 0)
                os.write(fd, f"{os.getpid()}\n".encode())
                self.fd = fd
                return self
            os.close(fd)
        raise ConfigError(f"{self.path}: could not take the {self.what} lock; try again")

    def __exit__(self, *exc) -> None:
        if self.fd is not None:
            self.path.unlink(missing_ok=True)
            os.close(self.fd)
            self.fd = None
