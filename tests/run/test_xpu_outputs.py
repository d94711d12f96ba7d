"""What a run writes about each XPU and how it timed its compute: xpus.csv holds what the README says (every
XPU with its stage and ranks), xpus.png reads at 1,024 XPUs, the summary and result.json name the compute model,
kernels and precision recipe.

Simulations run in a subprocess (SimGrid allows one engine per process)."""

import csv
import json
import re
import subprocess
import sys
from pathlib import Path

import networkx as nx
import pytest

from hcsim.run.pictures import plot_xpu_times, xpu_classes
from hcsim.run.results import RANK_COLUMNS, SPLIT_PARTS, TIME_PARTS, XPU_COLUMNS, XpuTimes, xpu_rows

ROOT = Path(__file__).resolve().parents[2]
# 16 H100 of two DGX nodes: tp 2 x pp 2 x dp 4, interleaved over 2 chunks per stage (4 decoders: 1 per chunk)
PIPELINE = ["--set=platform=dgx-h100", "--set=workload=llama3-8b", "--set=workload_overrides={model.decoders: 4}",
            "--set=xpus=16", "--set=tp=2", "--set=pp=2", "--set=micro_batch=1", "--set=global_batch=16",
            "--set=schedule=interleaved", "--set=virtual_stages=2", "--set=name=pipeline"]


def hcsim(*args):
    return subprocess.run([sys.executable, "-m", "hcsim.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def pipeline_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("pipeline")
    done = hcsim("simulate", *PIPELINE, "--out", str(out))
    assert done.returncode == 0, done.stderr
    with open(out / "xpus.csv") as handle:
        rows = list(csv.DictReader(handle))
    return done.stdout, json.loads((out / "result.json").read_text()), rows


def test_xpus_csv_holds_what_the_readme_says_every_xpu_with_its_stage_and_ranks(pipeline_run):
    claim = re.search(r"`[^`]*xpus\.csv` has\s+every\s+XPU\s+with\s+its\s+stage\s+and\s+ranks",
                      (ROOT / "README.md").read_text())
    assert claim, "the README no longer says what xpus.csv holds: update this test with it"
    _, result, rows = pipeline_run
    assert [r["xpu"] for r in rows] == [f"xpu{i}" for i in range(16)]  # every XPU, by number (xpu2 before xpu10)
    for i, row in enumerate(rows):
        # Megatron-LM's rank order, tp innermost, then cp, ep, dp, pp outermost (hcsim.workload.layout)
        tp, dp, pp = i % 2, i // 2 % 4, i // 8
        assert (row["tp_rank"], row["cp_rank"], row["ep_rank"], row["dp_rank"], row["pp_rank"]) == \
            (str(tp), "0", "0", str(dp), str(pp))
        assert row["stage"] == str(pp) and row["chunks"] == f"{pp}+{pp + 2}"  # stage s holds chunks s and pp + s
        assert row["job"] == "pipeline" and row["device"] == "H100"
        assert row["server"] == rows[i - i % 8]["server"] != rows[(i + 8) % 16]["server"]  # 8 GPUs per DGX node
        parts = sum(float(row[p]) for p in TIME_PARTS)
        assert parts == pytest.approx(result["iteration_time_s"], rel=1e-9)
    assert list(rows[0]) == list(XPU_COLUMNS)


def test_every_xpus_csv_column_is_documented_with_its_unit():
    text = (ROOT / "docs" / "concepts.md").read_text()
    section = text.split("### `xpus.csv`", 1)[1].split("\n#", 1)[0]
    for column in XPU_COLUMNS:
        assert f"`{column}`" in section, f"docs/concepts.md: xpus.csv's column {column} is not described"
    assert "seconds per measured iteration" in section  # the unit of every *_s column


def test_per_xpu_rows_are_sorted_by_number_and_a_graph_workload_leaves_ranks_blank():
    platform = nx.Graph()
    names = [f"xpu{i}" for i in (10, 2, 1, 0, 11)]
    for name in names:
        platform.add_node(name, kind="xpu", device="H100", server="n0", rack=0)
    times = {name: XpuTimes(compute_s=1.0, memory_stall_s=0.0, exposed_comm_s=0.0, idle_s=0.0) for name in names}
    rows = xpu_rows(platform, times, 1.0, job="graph")
    assert [r["xpu"] for r in rows] == ["xpu0", "xpu1", "xpu2", "xpu10", "xpu11"]
    assert all("stage" not in r and all(c not in r for c in RANK_COLUMNS) for r in rows)  # blank cells


def _rows(n: int, stages: int, odd: set[int]) -> list[dict]:
    """n XPUs alike but the `odd` ones (memory-stalled), half H100 and half A100 per stage, 1 s per iteration."""
    rows = []
    for i in range(n):
        row = dict.fromkeys((*TIME_PARTS, *SPLIT_PARTS), 0.0)
        row.update(xpu=f"xpu{i}", stage=i * stages // n, device="H100" if i % 2 else "A100", iteration_time_s=1.0,
                   compute_s=0.6, idle_s=0.4, idle_bubble_s=0.4)
        if i in odd:
            row.update(compute_s=0.5, memory_stall_s=0.1)
        rows.append(row)
    return rows


def test_classes_are_stage_and_device_and_the_xpus_that_differ_are_found():
    classes, differing = xpu_classes(_rows(1024, 8, {5, 700}))
    assert list(classes) == [(s, d) for s in range(8) for d in ("A100", "H100")]
    assert all(len(members) == 64 for members in classes.values())
    assert {r["xpu"] for rows in differing.values() for r in rows} == {"xpu5", "xpu700"}
    assert [r["xpu"] for r in differing[(0, "H100")]] == ["xpu5"]


def test_xpus_png_stays_readable_at_1024_xpus(tmp_path):
    """One bar per (stage, device) class: the picture of 1,024 XPUs is as tall as that of 64 in the same
    classes, plus one bar per XPU that differs."""
    from matplotlib.image import imread

    heights = {}
    for n, odd in ((64, set()), (1024, set()), (1024, {5})):
        path = plot_xpu_times(_rows(n, 4, odd), tmp_path / f"{n}-{len(odd)}.png", title=f"{n} XPUs")
        heights[n, len(odd)] = imread(path).shape[0]
    assert heights[64, 0] == heights[1024, 0]
    assert heights[1024, 0] < heights[1024, 1] < 2 * heights[1024, 0]


def test_the_summary_and_result_name_the_compute_model_kernels_and_precision_recipe(pipeline_run):
    stdout, result, _ = pipeline_run
    assert result["kernels"] == "megatron" and result["engine"] == "core"
    assert result["compute_model"] in ("peak", "roofline")
    assert (result["compute_factors"] is None) == (result["compute_model"] == "peak")
    assert result["precision_recipe"].startswith(result["precision"])
    line = next(line for line in stdout.splitlines() if line.startswith("  compute   "))
    assert f"kernels {result['kernels']}" in line and result["precision_recipe"] in line
    assert ("peak model" if result["compute_model"] == "peak" else "roofline model") in line

