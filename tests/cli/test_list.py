"""`hcsim list`: every built-in, one line each."""

import pytest

from hcsim.cli import main
from hcsim.config import REPO_ROOT
from hcsim.engine.collectives import algorithms
from hcsim.platform.devices import builtin_catalog
from hcsim.workload.schedules import SCHEDULES


@pytest.mark.parametrize("kind, expected", [
    ("platforms", [p.stem for p in sorted((REPO_ROOT / "platforms").glob("*.yaml"))
                   if p.stem not in ("devices", "compute-model")]),
    ("workloads", [p.stem for p in sorted((REPO_ROOT / "workloads").glob("*.yaml"))]),
    ("devices", list(builtin_catalog())),
    ("algorithms", [f"{c} {n}" for c, names in sorted(algorithms().items()) for n in names]),
    ("schedules", list(SCHEDULES)),
])
def test_list_names_every_builtin_with_a_line_of_text(kind, expected, capsys):
    assert main(["list", kind]) == 0
    lines = capsys.readouterr().out.splitlines()
    names = [" ".join(line.split()[:2]) if kind == "algorithms" else line.split()[0] for line in lines]
    assert names == expected
    assert all(len(line.split()) > (3 if kind == "algorithms" else 2) for line in lines)  # each says something


def test_list_refuses_an_unknown_kind(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["list", "gpus"])
    assert exit_.value.code == 2 and "invalid choice: 'gpus'" in capsys.readouterr().err
