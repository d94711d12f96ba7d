"""`hcsim validate`: simulate measured training runs and report the error."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

__all__ = ["register"]


def register(subparsers) -> None:
    from hcsim.validate import COLUMNS, DEFAULT_SETTINGS, UNITS

    columns = "\n".join(f"  {name:<18} {meaning}" for name, meaning in COLUMNS.items())
    defaults = ", ".join(f"{k}={v}" for k, v in DEFAULT_SETTINGS.items())
    parser = subparsers.add_parser(
        "validate", help="simulate measured runs (a CSV) and report the error",
        description="Simulate each measured run of RUNS.csv on the platform SPEC (each in a fresh process) and "
                    "write a table of measured and simulated iteration times with the signed error, the mean and "
                    "max absolute error (held-out rows apart from calibration rows) and a measured-vs-simulated "
                    "plot. Rows that cannot be simulated are listed with the reason.",
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
    parser.add_argument("--max-runs", type=int, default=None,
                        help="list rows whose workload graph has more vertex runs than this as not simulated")
    parser.set_defaults(run=run)


def run(args) -> int:
    from hcsim.config import parse_settings
    from hcsim.validate import markdown, read_runs, validate, write_report

    rows = read_runs(args.runs)
    settings = parse_settings(args.settings)

    def progress(record):
        state = f"{record['error']:+.1%}" if record["error"] is not None else record["reason"]
        print(f"  {record['name']}: {state}", file=sys.stderr)

    platform = str(Path(args.platform).resolve()) if Path(args.platform).is_file() else args.platform
    records = validate(rows, platform, settings, jobs=args.jobs, max_runs=args.max_runs,
                       base=str(args.runs.resolve().parent), progress=progress)
    paths = write_report(records, args.out, title=f"{args.runs.name} on {args.platform}")
    print(markdown(records, f"{args.runs.name} on {args.platform}"))
    print("wrote " + ", ".join(str(p) for p in paths))
    return 0
