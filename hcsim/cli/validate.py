"""`hcsim validate`: simulate measured training runs and report the error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

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
               f"every row runs with {defaults} unless --set says otherwise\n\n"
               "example:\n  hcsim validate experiments/validation/korthikanti-table5.csv "
               "--platform experiments/validation/selene.yaml --out experiments/validation/results")
    parser.add_argument("runs", type=Path, help="CSV of measured runs")
    parser.add_argument("--platform", required=True, help="platform spec (built-in name or path) the runs ran on")
    parser.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                        help="a scenario key for every row, e.g. compute_model=peak or compute_factors=my.yaml "
                             "(repeatable)")
    parser.add_argument("--out", type=Path, default=Path("validation"),
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
    from hcsim.study.validate import markdown, read_runs, validate, write_report

    _check_options(args)
    rows = read_runs(args.runs)
    settings = parse_settings(args.settings)
    _check_settings(settings, args.platform)
    check_output_folder(args.out, "--out")  # before any row runs: a bad folder must not cost the results

    def progress(record):
        state = f"{record['error']:+.1%}" if record["error"] is not None else record["reason"]
        print(f"  {record['name']}: {state}", file=sys.stderr)

    platform = str(Path(args.platform).resolve()) if Path(args.platform).is_file() else args.platform
    with Journal(args.out, "validation", "validation", resume=args.resume, overwrite=args.overwrite) as journal:
        records = validate(rows, platform, settings, jobs=args.jobs, max_runs=args.max_runs,
                           base=str(args.runs.resolve().parent), progress=progress, journal=journal)
        print(markdown(records, f"{args.runs.name} on {args.platform}"))
        try:
            paths = write_report(records, args.out, title=f"{args.runs.name} on {args.platform}")
        except OSError as err:
            from hcsim.errors import OutputError

            raise OutputError(f"--out {args.out}: could not write the report ({err.strerror or err}); the table "
                              f"above is the result, and {journal.path} keeps every simulation: run again with "
                              "--resume") from None
        journal.finish()
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0


def _check_options(args) -> None:
    """Options wrong for every row: refused before any row runs, not reported once per row."""
    from hcsim.errors import ConfigError
    from hcsim.study.sweep import check_resume

    if args.jobs < 1:
        raise ConfigError(f"--jobs: must be an integer >= 1 (rows simulated at once), got {args.jobs}")
    if args.max_runs is not None and args.max_runs < 1:
        raise ConfigError(f"--max-runs: must be an integer >= 1 (vertex runs per row), got {args.max_runs}")
    check_resume(args.resume, args.overwrite, "the finished simulations in validation.journal.jsonl")


def _check_settings(settings: dict, platform: str) -> None:
    """--set keys and the platform checked once, before any row: a mistake there is every row's."""
    from hcsim.config import resolve_spec
    from hcsim.platform import load_platform_spec
    from hcsim.run.scenario import load_scenario

    load_scenario(None, {**settings, "platform": platform})
    load_platform_spec(resolve_spec(platform, "platforms"))
