"""Set hcsim's kernel inventory of a Hugging Face training step beside a profile of the real one.

Reads what `benchmarks/gpu_step_kernels.py` wrote on a GPU (PROFILE.csv: one row per kernel launch of one step;
PROFILE.json: its summary) and prints, per phase (forward, backward, optimizer), the kernels hcsim's
`pytorch-eager` inventory launches (hcsim.workload.ops) against those the profile saw, and per kernel class (GEMM,
attention, memory-bound, optimizer) the device time hcsim's roofline model gives each kernel against the
profile's; then the peak memory hcsim's eager memory model gives against torch.cuda.max_memory_allocated.
Kernel-level: no step time is compared or fitted here.

    .venv/bin/python benchmarks/step_kernels.py PROFILE.csv --workload gpt2-hf --device H200
    .venv/bin/python benchmarks/step_kernels.py llama.csv --workload llama3.2-1b-hf --device H200 --set batch_per_xpu=4
"""

from __future__ import annotations

import argparse
import csv
import gzip
import json
import re
import sys
from dataclasses import replace
from pathlib import Path

from hcsim.engine.compute_model import load_compute_model
from hcsim.platform.devices import builtin_catalog
from hcsim.workload.hybrid import Parallelism, build_hybrid_graph
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.memory import CUDA_CONTEXT, eager_memory
from hcsim.workload.ops import GEMM_KINDS
from hcsim.workload.spec import load_workload_spec

CLASSES = (("gemm", re.compile(r"gemm|nvjet|cutlass|cublas", re.I)),
           ("attention", re.compile(r"sdpa|flash|fmha", re.I)),
           ("optimizer", re.compile(r"multi_tensor_apply|AdamW", re.I)))


def kernel_class(name: str, kind: str = "") -> str:
    """gemm | attention | optimizer | memory for a profiled kernel's name (or an hcsim op's kind)."""
    if kind:
        return "gemm" if kind in GEMM_KINDS else "attention" if kind == "attention" else "memory"
    return next((cls for cls, pattern in CLASSES if pattern.search(name)), "memory")


def inventory(spec) -> dict[str, list]:
    """hcsim's kernels of one step on one GPU, by phase: the ops of the workload graph hcsim simulates."""
    batch = spec.batch_per_xpu
    graph = build_hybrid_graph(spec, Parallelism(micro_batch=batch, global_batch=batch, recompute=spec.recomputation),
                               ParallelLayout(["x0"], {}))
    phases = {"fwd": "forward", "bwd": "backward", "recompute": "backward", "optimizer": "optimizer"}
    out: dict[str, list] = {"forward": [], "backward": [], "optimizer": []}
    for _, data in graph.nodes(data=True):
        if data["kind"] == "compute":
            out[phases[data["phase"]]] += data.get("ops") or ()
    return out


def compare(profile: Path, workload: str, device: str, overrides: dict | None = None) -> dict:
    """{phase: {class: (kernels hcsim, kernels measured, seconds hcsim, seconds measured)}}, and under "memory"
    hcsim's and the profile's peak bytes, for a profile of benchmarks/gpu_step_kernels.py; `overrides` over the
    workload spec: {"training": {batch_per_xpu, recomputation, ...}, "model": {hidden, ...}}."""
    summary = json.loads(Path(str(profile).removesuffix(".gz").removesuffix(".csv") + ".json").read_text())
    overrides = overrides or {}
    spec = load_workload_spec(workload)
    spec = replace(spec, model=replace(spec.model, **overrides.get("model", {})), **overrides.get("training", {}))
    catalog, model = builtin_catalog()[device], load_compute_model()
    factors, peak, bandwidth = model.device(device), catalog.flops("bf16"), catalog.memory_bandwidth
    with (gzip.open(profile, "rt") if profile.suffix == ".gz" else profile.open()) as f:
        rows = [r for r in csv.DictReader(f) if not r["name"].startswith("Optimizer.step")]  # a range, no kernel
    out = {}
    for phase, ops in inventory(spec).items():
        table = {}
        for op in ops:
            cls = kernel_class(op.name, op.kind)
            n, seen, t, measured = table.get(cls, (0, 0, 0.0, 0.0))
            table[cls] = (n + 1, seen, t + model.op_time(factors, op, peak, bandwidth), measured)
        for r in rows:
            if r["phase"] == phase:
                cls = kernel_class(r["name"])
                n, seen, t, measured = table.get(cls, (0, 0, 0.0, 0.0))
                table[cls] = (n, seen + 1, t, measured + float(r["device_us"]) / 1e6)
        out[phase] = table
    memory = eager_memory(spec.model, layers=spec.model.decoders, micro_batch=spec.batch_per_xpu,
                          recompute=spec.recomputation)
    out["memory"] = (memory.total, summary["peak_allocated_GiB"] * 2**30 + CUDA_CONTEXT)
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("profile", type=Path, help="a CSV (or .csv.gz) of benchmarks/gpu_step_kernels.py, its .json "
                                                   "beside it")
    parser.add_argument("--workload", required=True, help="an hcsim workload with training.kernels: pytorch-eager")
    parser.add_argument("--device", required=True, help="the device the profile ran on (hcsim's name: H100, H200)")
    parser.add_argument("--set", action="append", default=[], metavar="SECTION.KEY=VALUE",
                        help="a key over the workload's (training.batch_per_xpu=4, model.hidden=2560)")
    args = parser.parse_args(argv)
    import yaml
    overrides: dict = {}
    for item in args.set:
        key, value = item.split("=", 1)
        section, _, field = key.partition(".")
        overrides.setdefault(section, {})[field] = yaml.safe_load(value)
    result = compare(args.profile, args.workload, args.device, overrides)
    print(f"{args.workload} on {args.device}, {args.profile.name}")
    print(f"{'phase':10} {'class':10} {'kernels hcsim':>13} {'measured':>9} {'ms hcsim':>9} {'measured':>9}")
    for phase in ("forward", "backward", "optimizer"):
        table = result[phase]
        for cls, (n, seen, t, measured) in sorted(table.items()):
            print(f"{phase:10} {cls:10} {n:13d} {seen:9d} {t * 1e3:9.2f} {measured * 1e3:9.2f}")
        total = [sum(v[i] for v in table.values()) for i in range(4)]
        print(f"{phase:10} {'all':10} {total[0]:13d} {total[1]:9d} {total[2] * 1e3:9.2f} {total[3] * 1e3:9.2f}")
    hcsim, measured = result["memory"]
    print(f"peak memory: hcsim {hcsim / 2**30:.2f} GiB, measured {measured / 2**30:.2f} GiB (allocated + the CUDA "
          f"context)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
