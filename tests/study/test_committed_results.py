"""Every committed experiment's results CSV is the experiment's own: one row set per point of the experiment file
as it is now (its point keys are the digests of today's scenarios), readable by today's hcsim (retired columns
dropped, later ones filled), so ``hcsim sweep FILE --report-only`` and ``--resume`` work on each."""

from pathlib import Path

import pytest
import yaml

from hcsim.study.experiment import load_experiment
from hcsim.study.store import columns, read_results
from hcsim.study.summary import check_current

EXPERIMENTS = Path(__file__).resolve().parents[2] / "experiments"


def _committed() -> list[tuple[Path, Path]]:
    """(experiment file, its committed CSV): the CSV named after the experiment in its folder's results/ (or
    experiments/results/ for the files at the top)."""
    found = []
    for path in sorted(EXPERIMENTS.rglob("*.yaml")):
        if "results" in path.parts or "platforms" in path.parts:
            continue
        data = yaml.safe_load(path.read_text())
        if not (isinstance(data, dict) and "axes" in data):  # a scenario a sweep includes, not an experiment
            continue
        csv = path.parent / "results" / f"{data['name']}.csv"
        if csv.exists():
            found.append((path, csv))
    return found


COMMITTED = _committed()


def test_the_committed_experiments_are_found():
    """Every results CSV under experiments/ but those their own scripts make (astra-sim/run.py, serving/run.py,
    disaggregation/run.py, coherent/serving-beside-training.py)."""
    made_by_scripts = {"astra-sim.csv", "serving.csv", "disaggregation.csv", "serving-beside-training.csv"}
    every = {c for c in EXPERIMENTS.rglob("results/*.csv") if c.name not in made_by_scripts}
    assert {csv for _, csv in COMMITTED} == every


@pytest.mark.parametrize("path, csv", COMMITTED, ids=[str(p.relative_to(EXPERIMENTS)) for p, _ in COMMITTED])
def test_a_committed_csv_holds_the_experiment_s_points(path, csv):
    experiment = load_experiment(path)
    points = experiment.points()
    rows = read_results(csv, columns(experiment, points), points)
    check_current(experiment, csv, rows, points, csv.parent)
    assert {row["point"] for row in rows} == {point.key for point in points}
