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


GPT2_27B = ["--set=workload=gpt2-hf", "--set=platform=dgx-h100", "--set=xpus=1", "--set=workload_overrides.model.hidden=2560",
            "--set=workload_overrides.model.decoders=32", "--set=workload_overrides.model.heads=32",
            "--set=workload_overrides.model.ffn=10240"]


@pytest.mark.parametrize("batch, sequence, fits", [(4, 1024, True), (2, 2048, True), (6, 1024, False),
                                                   (8, 1024, False), (4, 2048, False)])
def test_gpt2_2_7b_runs_out_of_memory_on_an_h100_where_a_real_run_did(batch, sequence, fits):
    """Measured on an H100 80GB with benchmarks/gpu_step_kernels.py (2026-11-26, experiments/calibration/steps):
    4 x 1024 and 2 x 2048 ran (65.2 GiB allocated), 6 x 1024, 8 x 1024 and 4 x 2048 ran out of memory; 6 x 1024
    only by the CUDA context (hcsim.workload.memory.CUDA_CONTEXT)."""
    done = hcsim("simulate", *GPT2_27B, f"--set=workload_overrides.model.sequence={sequence}",
                 f"--set=workload_overrides.training.batch_per_xpu={batch}", "--set=iterations=1")
    assert done.returncode == (0 if fits else 2), done.stderr
    assert ("out of memory" in done.stderr) != fits


def test_a_compiled_step_holds_what_the_partitioner_keeps_and_less_than_eager(workload):
    """torch-compile's memory through the CLI is hcsim.workload.memory.eager_memory with the compiled rule (the
    partitioner's saved tensors, the head's BF16 logits and gradient), below the eager step's; the step is
    faster (fused kernels)."""
    from hcsim.workload.memory import eager_memory
    from hcsim.workload.spec import load_workload_spec

    runs = {}
    for kernels in ("pytorch-eager", "torch-compile"):
        done = hcsim("simulate", "--set=platform=dgx-h100", "--set=xpus=1", "--set=devices=[H100]",
                     f"--set=workload={workload}", f"--set=workload_overrides={{training.kernels: {kernels}}}",
                     "--json")
        assert done.returncode == 0, done.stderr
        runs[kernels] = json.loads(done.stdout)
    model = load_workload_spec(str(workload)).model
    compiled = eager_memory(model, layers=model.decoders, micro_batch=4, compiled=True).total
    assert runs["torch-compile"]["memory"]["H100"]["state_bytes"] == pytest.approx(compiled, rel=1e-12)
    assert compiled < runs["pytorch-eager"]["memory"]["H100"]["state_bytes"]
    assert runs["torch-compile"]["iteration_time_s"] < runs["pytorch-eager"]["iteration_time_s"]
