"""Where the time goes, per parallel dimension (hcsim.run.results.SPLIT_PARTS): the parts add up exactly.

Every simulation runs in a subprocess (SimGrid allows one engine per process)."""

import csv
import json
import subprocess
import sys

import pytest

from hcsim.run.results import COMM_KINDS, TIME_PARTS

SMALL = ["--set=workload=llama3-8b", "--set=workload_overrides={model.decoders: 4}", "--set=micro_batch=1"]
CASES = {
    "tp-pp-dp recompute": ["--set=platform=dgx-h100", "--set=xpus=16", "--set=tp=2", "--set=pp=2",
                           "--set=global_batch=16", "--set=recompute=full"],
    "mixed devices, data parallel": ["--set=platform=paper-cxl", "--set=xpus=16", "--set=devices=[H100,A100]",
                                     "--set=global_batch=16", "--set=precision=fp16", "--set=compute_model=peak"],
    "zero-3 interleaved": ["--set=platform=dgx-h100", "--set=xpus=8", "--set=pp=2", "--set=dp=4", "--set=zero=3",
                           "--set=schedule=interleaved", "--set=virtual_stages=2", "--set=global_batch=16"],
}


@pytest.fixture(scope="module", params=sorted(CASES))
def run(request, tmp_path_factory):
    out = tmp_path_factory.mktemp("breakdown")
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", *SMALL, *CASES[request.param], "--json",
                           "--out", str(out / "run")], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    with open(out / "run" / "xpus.csv") as handle:
        return request.param, json.loads(done.stdout), list(csv.DictReader(handle))


def test_the_parts_add_up_to_their_whole_on_every_xpu(run):
    """comm_KIND_s sum to exposed_comm_s, idle_bubble_s + idle_peers_s to idle_s, recompute_s <= compute_s, and the
    four parts to the iteration time."""
    _, result, rows = run
    period = result["iteration_time_s"]
    for row in rows:
        value = {key: float(v) for key, v in row.items() if key.endswith("_s")}
        assert sum(value[p] for p in TIME_PARTS) == pytest.approx(period, rel=1e-9)
        assert sum(value[f"comm_{kind}_s"] for kind in COMM_KINDS) == pytest.approx(value["exposed_comm_s"],
                                                                                  rel=1e-9, abs=1e-15)
        assert value["idle_bubble_s"] + value["idle_peers_s"] == pytest.approx(value["idle_s"], rel=1e-9, abs=1e-15)
        assert 0 <= value["recompute_s"] <= value["compute_s"] * (1 + 1e-12)
    for device, parts in result["breakdown"].items():
        assert sum(parts[f"comm_{kind}_s"] for kind in COMM_KINDS) == pytest.approx(parts["exposed_comm_s"],
                                                                                    rel=1e-9, abs=1e-15)


def test_each_case_shows_the_parts_it_has(run):
    name, result, _ = run
    parts = {k: sum(p[k] for p in result["breakdown"].values()) for k in next(iter(result["breakdown"].values()))}
    if name == "tp-pp-dp recompute":
        assert parts["comm_tp_s"] > 0 and parts["comm_pp_s"] > 0 and parts["recompute_s"] > 0
        assert parts["idle_bubble_s"] > 0  # the pipeline bubble
    elif name == "mixed devices, data parallel":  # the H100s wait in the gradient all-reduces for the A100s
        assert result["breakdown"]["H100"]["idle_peers_s"] > 0 and parts["comm_dp_s"] > 0
        assert parts["comm_tp_s"] == parts["comm_pp_s"] == parts["recompute_s"] == 0
    else:
        assert parts["comm_dp_s"] > 0  # ZeRO-3's gathers and reduce-scatters
