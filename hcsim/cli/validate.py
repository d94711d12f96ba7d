"""`hcsim validate`: simulate measured training runs and report the error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from hcsim.cli import path_arg

__all__ = ["register"]


def register(subparsers) -> None:
    from hcsim.study.validate import COLUMNS, DEFAULT_SETTINGS, UNITS

    columns = "\n".join(f"  {name:<18} {meaning}" for name, meaning in COLUMNS.items())
    defaults = ", ".join(f"{k}={v}" for k, v in DEFAULT_SETTINGS.items())
    parser = subparsers.add_parser(
        "validate", help="simulate measured runs (a CSV) and report the error",
        description="Simulate each measured run of RUNS.csv on the platform SPEC (each in a fresh process) and "
                    "write a table of measured and simulated iteration times with the signed error, the mean and "
                    "max absolute error (held-out rows apart from calibration rows) and a measured-vs-simulated "
                    "plot. Rows that cannot be simulated are listed with the reason. Each finished simulation is "
                    "kept in OUT/validation.journal.jsonl until the report is written: a killed validation loses "
                    "none of them, run it again with --resume.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog=f"RUNS.csv columns (name, gpus, measured and unit required; '#' lines are comments):\n{columns}\n\n"
               f"units: {', '.join(UNITS)} (tflops/gpu as Narayanan et al. 2021 count it: "
               f"96·B·s·L·h²(1 + s/6h + V/16Lh) per iteration)\n"
               f"every row runs with {defaults} unless --set says otherwise; a row's set column wins over "
               f"--set\n\n"
               "example:\n  hcsim validate experiments/validation/korthikanti-table5.csv "
               "--platform experiments/validation/selene.yaml --out experiments/validation/results")
    parser.add_argument("runs", type=Path, help="CSV of measured runs")
    parser.add_argument("--platform", default=None,
                        help="platform spec (built-in name or path) the runs ran on; required unless every row "
                             "names its own (column platform)")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a scenario key for every row, e.g. compute_model=peak or compute_factors=my.yaml "
                             "(repeatable)")
    parser.add_argument("--out", type=path_arg, default=Path("validation"),
                        help="folder for validation.csv, .md, .png, .svg (default: ./validation)")
    parser.add_argument("--jobs", type=int, default=1, help="rows simulated at once (default 1)")
    parser.add_argument("--resume", action="store_true",
                        help="after a killed run: keep its finished simulations (OUT/validation.journal.jsonl), "
                             "simulate the other rows")
    parser.add_argument("--overwrite", action="store_true",
                        help="after a killed run: discard its finished simulations and start over")
    parser.add_argument("--max-runs", type=int, default=None,
                        help="list rows whose workload graph has more vertex runs than this as not simulated")
    parser.set_defaults(run=run)


def run(args) -> int:
    from hcsim.config import check_output_folder, parse_settings
    from hcsim.study.journal import Journal
    from hcsim.study.validate import check_rows, markdown, read_runs, validate, write_report

    _check_options(args)
    rows = read_runs(args.runs)
    settings = parse_settings(args.settings)
    _check_settings(settings, args.platform)
    platform = None
    if args.platform is not None:
        platform = str(Path(args.platform).resolve()) if Path(args.platform).is_file() else args.platform
    base = str(args.runs.resolve().parent)
    check_rows(rows, platform, settings, base, str(args.runs))  # every row's keys and specs, before any runs
    check_output_folder(args.out, "--out")  # before any row runs: a bad folder must not cost the results

    def progress(record):
        state = f"{record['error']:+.1%}" if record["error"] is not None else record["reason"]
        print(f"  {record['name']}: {state}", file=sys.stderr)

    title = f"{args.runs.name} on {_platform_name(args.platform)}" if args.platform else args.runs.name
    with Journal(args.out, "validation", "validation", resume=args.resume, overwrite=args.overwrite) as journal:
        records = validate(rows, platform, settings, jobs=args.jobs, max_runs=args.max_runs, base=base,
                           progress=progress, journal=journal)
        print(markdown(records, title))
        try:
            paths = write_report(records, args.out, title=title)
        except OSError as err:
            from hcsim.errors import OutputError

            raise OutputError(f"--out {args.out}: could not write the report ({err.strerror or err}); the table "
                              f"above is the result, and {journal.path} keeps every simulation: run again with "
                              "--resume") from None
        journal.finish()
    print("wrote " + ", ".join(str(p) for p in paths))
    if not any(record["error"] is not None for record in records):
        from hcsim.errors import SimulationError

        raise SimulationError(f"{args.runs}: no row could be simulated (each row's reason is in the table above and "
                              f"in {args.out / 'validation.md'}); fix those rows, or check --platform and --set")
    return 0


def _platform_name(platform: str) -> str:
    """A platform as a title names it: a spec file by its spec's name, a built-in by its own."""
    path = Path(platform)
    if path.suffix in (".yaml", ".yml") and path.is_file():
        try:
            from hcsim.config import load_yaml

            data = load_yaml(path)
            return str(data.get("name") or path.stem) if isinstance(data, dict) else path.stem
        except Exception:  # noqa: BLE001 -- a title only; the spec's problems are reported where it is read
            return path.stem
    return platform


def _check_options(args) -> None:
    """Options wrong for every row: refused before any row runs, not reported once per row."""
    from hcsim.errors import ConfigError
    from hcsim.study.store import check_resume

    if args.jobs < 1:
        raise ConfigError(f"--jobs: must be an integer >= 1 (rows simulated at once), got {args.jobs}")
    if args.max_runs is not None and args.max_runs < 1:
        raise ConfigError(f"--max-runs: must be an integer >= 1 (vertex runs per row), got {args.max_runs}")
    check_resume(args.resume, args.overwrite, "the finished simulations in validation.journal.jsonl")


def _check_settings(settings: dict, platform: str | None) -> None:
    """--set keys, a serving workload and the platform checked once, before any row: a mistake there is every
    row's."""
    from hcsim.config import resolve_spec
    from hcsim.errors import ConfigError
    from hcsim.platform import load_platform_spec
    from hcsim.run.scenario import load_scenario
    from hcsim.study.experiment import check_specs

    scenario = load_scenario(None, {**settings, **({"platform": platform} if platform else {})}, "--set ")
    if platform is not None:
        load_platform_spec(resolve_spec(platform, "platforms"))
    if "workload" in settings:
        problems = check_specs([("--set workload", scenario)], "validate")
        if problems:
            raise ConfigError(problems[0])
