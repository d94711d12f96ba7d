"""One-GPU training steps of a Hugging Face model in PyTorch eager mode (training.kernels: pytorch-eager), end to end.

Every simulation runs in a subprocess (SimGrid allows one engine per process)."""

import json
import math
import subprocess
import sys

import pytest

from hcsim.engine.compute_model import load_compute_model
from hcsim.platform.devices import builtin_catalog, peak_flops
from hcsim.run.prepare import prepare
from hcsim.run.scenario import load_scenario

WORKLOAD = """
name: tiny-llama
model: {name: tiny Llama, decoders: 4, hidden: 1024, heads: 16, kv_heads: 4, ffn: 2816, mlp: swiglu, norm: rmsnorm,
        dropout: false, sequence: 1024, vocabulary: 32000, positions: rope}
costs: shape
training: {batch_per_xpu: 4, kernels: pytorch-eager}
granularity: layer
"""


def hcsim(*args):
    return subprocess.run([sys.executable, "-m", "hcsim.cli", *args], capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def workload(tmp_path_factory):
    path = tmp_path_factory.mktemp("hf") / "tiny-llama.yaml"
    path.write_text(WORKLOAD)
    return path


def settings(workload, device):
    return {"platform": "dgx-h100", "xpus": 1, "devices": [device], "workload": str(workload)}


@pytest.mark.parametrize("device", ["H100", "H200"])
def test_a_one_gpu_step_is_the_sum_of_its_vertices_kernel_times(workload, device):
    """One GPU runs its vertices one after another: the iteration is the sum over them of the kernel model's
    time (host issue and GPU in order), the PyTorch workload being timed by its kernels by default."""
    done = hcsim("simulate", *(f"--set={k}={json.dumps(v) if isinstance(v, list) else v}"
                               for k, v in settings(workload, device).items()), "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    prepared = prepare(load_scenario(None, settings(workload, device)))
    model = load_compute_model()
    spec = builtin_catalog()[device]
    peak = peak_flops(spec, "bf16")
    expected = math.fsum(model.time(data["ops"], device, peak, spec.memory_bandwidth)
                         for _, data in prepared.workload.nodes(data=True) if data["kind"] == "compute")
    assert result["iteration_time_s"] == pytest.approx(expected, rel=1e-9)


def test_an_h200_step_is_faster_than_an_h100_step_by_less_than_its_bandwidth(workload):
    times = {}
    for device in ("H100", "H200"):
        done = hcsim("simulate", "--set=platform=dgx-h100", "--set=xpus=1", f"--set=devices=[{device}]",
                     f"--set=workload={workload}", "--json")
        assert done.returncode == 0, done.stderr
        times[device] = json.loads(done.stdout)["iteration_time_s"]
    assert 3.35 / 4.8 < times["H200"] / times["H100"] < 0.97
