"""`hcsim validate` with the runs users measure today: a Llama-style FP8 row with context parallelism, ZeRO, GQA,
SwiGLU/RMSNorm and its own platform and scenario keys runs from a CSV; a file no row of which can be simulated
ends with exit 2 after its report is written.

The simulations run in a subprocess (SimGrid allows one engine per process)."""

import csv
import subprocess
import sys

import pytest

from hcsim.config import REPO_ROOT

MODERN = ("name,workload,platform,layers,gpus,tp,cp,pp,micro_batch,global_batch,precision,zero,kv_heads,mlp,norm,"
          "kernels,set,measured,unit\n"
          "fp8-cp,llama3-8b,dgx-h100,4,8,2,2,1,1,8,fp8,1,8,swiglu,rmsnorm,megatron,schedule=1f1b;cp_algorithm=ring,"
          "0.5,s\n")


def validate(tmp_path, text, *options):
    (tmp_path / "runs.csv").write_text(text)
    return subprocess.run([sys.executable, "-m", "hcsim.cli", "validate", str(tmp_path / "runs.csv"), *options,
                           "--out", str(tmp_path / "out")], capture_output=True, text=True, timeout=600)


def test_a_modern_fp8_context_parallel_row_runs_from_a_csv(tmp_path):
    done = validate(tmp_path, MODERN)  # no --platform: the row names its own
    assert done.returncode == 0, done.stderr
    [row] = list(csv.DictReader((tmp_path / "out" / "validation.csv").open()))
    assert row["reason"] == "" and float(row["simulated_s"]) > 0
    assert float(row["error"]) == pytest.approx(float(row["simulated_s"]) / 0.5 - 1, rel=1e-5)


def test_a_file_no_row_of_which_can_be_simulated_exits_2_after_its_report(tmp_path):
    """tp 3 divides neither row's 4 attention heads: each row keeps its reason, the report is written, exit 2."""
    header = "name,layers,hidden,heads,vocabulary,sequence,gpus,tp,pp,micro_batch,global_batch,recompute,measured,unit\n"
    done = validate(tmp_path, header + "a,2,256,4,1024,128,3,3,1,1,1,full,1.0,s\nb,2,256,4,1024,128,3,3,1,1,2,full,1.0,s\n",
                    "--platform", str(REPO_ROOT / "experiments" / "validation" / "selene.yaml"))
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[-1].startswith(f"hcsim: error: {tmp_path / 'runs.csv'}: no row could be simulated")
    assert "Traceback" not in done.stderr
    table = list(csv.DictReader((tmp_path / "out" / "validation.csv").open()))
    assert [r["name"] for r in table] == ["a", "b"] and all(r["reason"] for r in table)
    assert (tmp_path / "out" / "validation.md").exists()


def test_the_report_title_names_a_platform_file_by_its_spec_name():
    from hcsim.cli.validate import _platform_name

    assert _platform_name(str(REPO_ROOT / "experiments" / "validation" / "selene.yaml")) == "selene-a100"
    assert _platform_name("dgx-h100") == "dgx-h100"
