"""Fit the roofline factors named in FACTORS on the RUNS rows whose role is `calibration`.

Gauss-Newton on the signed iteration-time errors of the calibration rows (at least as many rows as
factors; least squares when there are more), with a forward-difference Jacobian; every evaluation simulates those rows with `hcsim validate`'s
machinery (each row in a fresh process). With --write, the fitted values replace the ones in the
factors file (only those keys, only that device), so a re-run of validate uses them.

    .venv/bin/python experiments/validation/calibrate.py \
        experiments/validation/korthikanti-table5.csv --platform experiments/validation/selene.yaml --write

Nothing but the calibration rows is simulated: the held-out rows never influence a factor.
"""

from __future__ import annotations

import argparse
import copy
import re
import sys
import tempfile
from pathlib import Path

import numpy as np
import yaml

from hcsim.engine.compute_model import BUILTIN_FACTORS
from hcsim.study.validate import read_runs, validate

# (device, path in the device's mapping): the factors the calibration rows set, nothing else
FACTORS = (("A100", ("gemm", "max_efficiency")),)


def errors(rows, platform, factors: dict, values, base: str, jobs: int) -> np.ndarray:
    data = copy.deepcopy(factors)
    for (device, path), value in zip(FACTORS, values):
        data["devices"][device][path[0]][path[1]] = float(value)
    with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as handle:
        yaml.safe_dump(data, handle)
    records = validate(rows, platform, {"compute_factors": handle.name}, jobs=jobs, base=base)
    Path(handle.name).unlink()
    failed = [r for r in records if r["error"] is None]
    if failed:
        sys.exit(f"calibration row not simulated: {failed[0]['name']}: {failed[0]['reason']}")
    result = np.array([r["error"] for r in records])
    print("  " + ", ".join(f"{v:.4g}" for v in values) + " -> errors " + ", ".join(f"{e:+.3%}" for e in result),
          file=sys.stderr)
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", type=Path)
    parser.add_argument("--platform", required=True)
    parser.add_argument("--factors", type=Path, default=BUILTIN_FACTORS)
    parser.add_argument("--write", action="store_true", help="write the fitted values into the factors file")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--tolerance", type=float, default=1e-3, help="stop when a step changes no factor by more "
                        "than this fraction")
    args = parser.parse_args()
    rows = [r for r in read_runs(args.runs) if r.value("role") == "calibration"]
    if len(rows) < len(FACTORS):
        sys.exit(f"{args.runs}: {len(rows)} calibration rows for {len(FACTORS)} factors; need at least as many rows")
    platform = str(Path(args.platform).resolve())
    base = str(args.runs.resolve().parent)
    factors = yaml.safe_load(args.factors.read_text())
    x = np.array([factors["devices"][d][p[0]][p[1]] for d, p in FACTORS], dtype=float)
    f = errors(rows, platform, factors, x, base, args.jobs)
    for _ in range(6):
        jacobian = np.empty((len(f), len(x)))
        for j in range(len(x)):
            step = np.zeros_like(x)
            step[j] = 0.03 * x[j]
            jacobian[:, j] = (errors(rows, platform, factors, x + step, base, args.jobs) - f) / step[j]
        step = np.linalg.lstsq(jacobian, -f, rcond=None)[0]
        x = x + step
        f = errors(rows, platform, factors, x, base, args.jobs)
        if np.max(np.abs(step / x)) < args.tolerance:  # the least-squares optimum: errors need not vanish
            break
    print("fitted: " + ", ".join(f"{d} {'.'.join(p)} = {v:.4g}" for (d, p), v in zip(FACTORS, x)))
    if args.write:
        text = args.factors.read_text()
        for (device, path), value in zip(FACTORS, x):
            text = _replace(text, device, path[1], f"{value:.3g}" if path[1] == "max_efficiency" else f"{value:.0f}")
        args.factors.write_text(text)
        print(f"wrote {args.factors}")
    return 0


def _replace(text: str, device: str, key: str, value: str) -> str:
    """Replace `key: number` inside the block of `device` in the factors YAML (comments kept)."""
    start = re.search(rf"^  {re.escape(device)}:\s*$", text, re.M).end()
    following = re.search(r"^  \S", text[start:], re.M)
    end = start + following.start() if following else len(text)
    block, count = re.subn(rf"^(\s+{re.escape(key)}: )[0-9.eE+-]+", rf"\g<1>{value}", text[start:end], count=1,
                           flags=re.M)
    if count != 1:
        sys.exit(f"factors file: no {key} under {device}")
    return text[:start] + block + text[end:]


if __name__ == "__main__":
    sys.exit(main())
