"""The regression catalogue of bad inputs (issue 17): every entry point, every class of mistake.

Each case gives hcsim a bad input and asserts what a user must get: exit code 2
from the CLI (HcsimError from Python), no traceback, one message that follows
the template of :mod:`hcsim.errors`, names the file, key or option at fault
and says what would be valid. Nothing here runs a simulation: the engine is
replaced by a tripwire, so a bad input that slips through fails its case
instead of running for minutes.
"""

from __future__ import annotations

import ast
import fcntl
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from hcsim.cli import main
from hcsim.config import MAX_SPEC_BYTES, REPO_ROOT
from hcsim.errors import MESSAGE_TEMPLATE, HcsimError

# --- files the cases read ------------------------------------------------------------------------------

EXPLICIT = """
name: tiny
device_catalog: []
links:
  hbm: {latency: 100ns}
topology:
  nodes:
    - {name: sw, kind: switch}
    - {name: sw2, kind: switch}
    - {name: a, kind: xpu, device: H100, extended_memory: pool}
    - {name: b, kind: xpu, device: V100}
    - {name: pool, kind: memory, capacity: 1TiB, role: cxl_type3}
  links:
    - {ends: [a, sw], bandwidth: 128GB/s, latency: 200ns, kind: cxl}
    - {ends: [b, sw], bandwidth: 128GB/s, latency: 200ns, kind: cxl}
    - {ends: [pool, sw], bandwidth: 128GB/s, latency: 200ns, kind: cxl}
    - {ends: [sw, sw2], bandwidth: 128GB/s, latency: 200ns, kind: cxl}
routes:
  - ROUTE
"""

KERNEL_HEADER = "kind,m,n,k,batch,dtype,seconds,flops,bytes\n"
GOOD_AXES = "axes: {coherent: [true, false], cxl_bandwidth: [64GB/s, 128GB/s]}\n"
EXPERIMENT = "name: exp\nbase: {xpus: 2, iterations: 1}\n" + GOOD_AXES

FILES = {
    "dup.yaml": "xpus: 8\nxpus: 16\n",
    "bin.yaml": b"\xff\xfe xpus: 8\n",
    "deep.yaml": "a: " + "[" * 3000 + "]" * 3000 + "\n",
    "bomb.yaml": "a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]\n" + "".join(
        f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 9)}]\n" for i in range(8)),
    "recursive.yaml": "a: &a [1, *a]\n",
    "list.yaml": "- xpus: 8\n",
    "syntax.yaml": "xpus: [1, 2\n",
    "noname.yaml": "name: ''\n",
    "bad-workload.yaml": "name: w\nmodel: {decoders: 2}\n",
    "route-missing-node.yaml": EXPLICIT.replace("ROUTE", "[a, ghost, pool]"),
    "route-no-link.yaml": EXPLICIT.replace("ROUTE", "[a, sw2, pool]"),
    "route-revisits.yaml": EXPLICIT.replace("ROUTE", "[a, sw, sw2, sw, pool]"),
    "route-through-xpu.yaml": EXPLICIT.replace("ROUTE", "[a, sw, b, sw2]").replace(
        "    - {ends: [sw, sw2]", "    - {ends: [b, sw2], bandwidth: 1GB/s, latency: 1ns, kind: cxl}\n    - {ends: [sw, sw2]"),
    "self-loop.yaml": EXPLICIT.replace("ROUTE", "[a, sw, pool]").replace(
        "    - {ends: [sw, sw2]", "    - {ends: [sw2, sw2], bandwidth: 1GB/s, latency: 1ns, kind: cxl}\n    - {ends: [sw, sw2]"),
    "no-xpu.yaml": EXPLICIT.replace("ROUTE", "[sw, sw2]").replace("    - {name: a, kind: xpu, device: H100, extended_memory: pool}\n", "")
                           .replace("    - {name: b, kind: xpu, device: V100}\n", "")
                           .replace("    - {ends: [a, sw], bandwidth: 128GB/s, latency: 200ns, kind: cxl}\n", "")
                           .replace("    - {ends: [b, sw], bandwidth: 128GB/s, latency: 200ns, kind: cxl}\n", ""),
    "explicit-cxl.yaml": EXPLICIT.replace("ROUTE", "[a, sw, pool]").replace("  hbm: {latency: 100ns}",
                                                                            "  hbm: {latency: 100ns}\n  cxl: {bandwidth: 1GB/s, latency: 1ns}"),
    "route-twice.yaml": EXPLICIT.replace("ROUTE", "[a, sw, pool]") + "  - [a, sw, pool]\n",
    "catalog.yaml": "name: c\nxpus: 8\ndevice_catalog: [missing.yaml]\n",
    "empty.yaml": "",
    "noaxes.yaml": "name: noaxes\nbase: {xpus: 2}\n",
    "scalar-axis.yaml": "name: x\naxes: {xpus: 8}\n",
    "bad-name.yaml": "name: ../up\n" + GOOD_AXES,
    "plot-column.yaml": EXPERIMENT + "plots: [{x: coherent, y: nope}]\n",
    "plot-series.yaml": EXPERIMENT + "plots: [{x: coherent, y: batches_per_s, series: colour}]\n",
    "plot-where.yaml": EXPERIMENT + "plots: [{x: coherent, y: batches_per_s, where: {size: 1}}]\n",
    "plot-text-y.yaml": EXPERIMENT + "plots: [{x: coherent, y: busiest_link}]\n",
    "plot-where-list.yaml": EXPERIMENT + "plots: [{x: coherent, y: batches_per_s, where: [1, 2]}]\n",
    "finding-axis.yaml": EXPERIMENT + "findings: [{check: better, axis: xpus, better: 1, worse: 2}]\n",
    "finding-tolerance.yaml": EXPERIMENT + "findings: [{check: close, axis: coherent, reference: true, other: false, tolerance: big}]\n",
    "finding-where.yaml": EXPERIMENT + "findings: [{check: better, axis: coherent, better: true, worse: false, where: {cxl_bandwidth: fast}}]\n",
    "finding-value.yaml": EXPERIMENT + "findings: [{check: better, axis: coherent, better: yes-please, worse: false}]\n",
    "finding-metric.yaml": EXPERIMENT + "findings: [{check: better, axis: coherent, better: true, worse: false, metric: speed}]\n",
    "finding-along.yaml": "name: exp\naxes: {devices: [[H100], [A100]], xpus: [2, 4]}\n"
                          "findings: [{check: saturating, along: devices}]\n",
    "finding-step.yaml": EXPERIMENT + "findings: [{check: step, along: cxl_bandwidth, from: 1GB/s, to: 128GB/s, expect: higher}]\n",
    "exp.yaml": EXPERIMENT,
    "afile": "not a folder\n",
    # issue 29: sweeps whose line plot has text along x
    "plot-zip-label.yaml": "name: zl\nbase: {xpus: 2, iterations: 1}\naxes:\n  system:\n    - {label: a, xpus: 2}\n"
                           "    - {label: b, cxl_bandwidth: 64GB/s}\nplots: [{x: system, y: batches_per_s}]\n",
    "plot-zip-default.yaml": "name: zd\nbase: {xpus: 2, iterations: 1}\naxes:\n  system:\n    - {label: a, "
                             "collective_chunks: 4}\n    - {label: b, xpus: 2}\n"
                             "plots: [{x: collective_chunks, y: batches_per_s}]\n",
    "plot-text-x.yaml": EXPERIMENT + "plots: [{x: busiest_link, y: batches_per_s}]\n",
    # issue 29: runs CSVs for `hcsim validate`
    "runs.csv": "name,gpus,measured,unit,micro_batch\nr1,8,1.5,s,1\n",
    "runs-header-only.csv": "name,gpus,measured,unit\n",
    "runs-huge.csv": "name,gpus,measured,unit,micro_batch\nr1,8,1e400,s,1\n",
    "runs-binary.csv": b"\xff\xfe\x00\x01binary",
    "runs-extra-cell.csv": "# a comment\nname,gpus,measured,unit,micro_batch\nr1,8,1.5,s,1,extra\n",
    "runs-duplicate.csv": "name,gpus,measured,unit,micro_batch\nr1,8,1.5,s,1\nr1,8,1.5,s,1\n",
    "runs-text.csv": "name,gpus,measured,unit,micro_batch\nr1,8,fast,s,1\n",
    "runs-unit.csv": "name,gpus,measured,unit,micro_batch\nr1,8,1.5,hours,1\n",
    "runs-gpus-zero.csv": "name,gpus,measured,unit,micro_batch\nr1,0,1.5,s,1\n",
    "runs-tiny.csv": "name,gpus,measured,unit,micro_batch\nr1,8,1e-12,s,1\n",
    "runs-columns.csv": "name,gpuz,measured,unit\nr1,8,1.5,s\n",
    "runs-empty.csv": "",
    "runs-bom-crlf.csv": b"\xef\xbb\xbfname,gpus,measured,unit,micro_batch\r\nr1,8,1.5,s,1\r\n",
    # issue 29: sweeps
    "zip-duplicate-label.yaml": "name: zdl\nbase: {xpus: 2, iterations: 1}\naxes:\n  system:\n    - {label: a, xpus: 2}\n"
                                "    - {label: a, xpus: 4}\n",
    "huge-grid.yaml": "name: hg\naxes:\n" + "".join(f"  {key}: [{', '.join(map(str, range(1, 21)))}]\n" for key in
                                                    ("xpus", "iterations", "step_limit", "collective_chunks", "tp")),
    "chakra-missing.yaml": "name: cm\nbase: {xpus: 2, iterations: 1, workload: 'chakra:nowhere/run'}\n"
                           "axes: {granularity: [layer, decoder]}\n",
    # issue 29: routes given by a scenario (platform_overrides.routes), blamed on it
    "routes-ghost.yaml": "name: given-routes\nxpus: 2\nplatform_overrides:\n  routes:\n    - [xpu0, ghost, xpu1]\n",
    "routes-twice.yaml": "xpus: 2\nplatform_overrides:\n  routes:\n    - [xpu0, r0s0.pcie0, xpu1]\n"
                         "    - [xpu0, r0s0.xpusw, xpu1]\n",
    # kernel CSVs for `hcsim calibrate` that the fuzz tests found a traceback in
    "k-overflow.csv": KERNEL_HEADER + "gemm,1e400,2,2,1,bf16,0.001,1,1\n",
    "k-tiny.csv": KERNEL_HEADER + "copy,0,0,0,1,u8,1e-300,0,1024\n",
    "k-huge.csv": KERNEL_HEADER + "copy,0,0,0,1,u8,1e12,0,1024\n",
    "k-no-shape.csv": KERNEL_HEADER + "gemm,0,0,0,1,bf16,0.001,1,1\n",
    "k-no-note.csv": "kind,elements,dtype,seconds,bytes,flops,note\nrmsnorm_hf_fwd,1024,bf16,0.001,1024,0,fast\n",
    "k-alike.csv": KERNEL_HEADER + "copy,0,0,0,1,u8,1e-5,0,1024\n" * 3 + "gemm,64,64,64,1,bf16,1e-5,524288,24576\n" * 3,
    # issue 29: a platform whose CXL Type 3 expanders hold 1 GB each
    "tiny-type3.yaml": (REPO_ROOT / "platforms/paper-cxl.yaml").read_text().replace(
        "type3_capacity: unbounded", "type3_capacity: 1GB"),
}


def _graph_json(nodes=None, edges=None, graph=None) -> str:
    import json

    nodes = [{"id": "a", "kind": "compute", "xpus": ["xpu0"], "flops": 1e9, "memory_bytes": 0, "start": True}] \
        if nodes is None else nodes
    attributes = {"name": "g", "precision": "fp32", "samples_per_iteration": 1, "format_version": 2, **(graph or {})}
    return json.dumps({"directed": True, "multigraph": False, "graph": attributes, "nodes": nodes,
                       "edges": edges or []})


ALL_REDUCE = {"id": "c", "kind": "comm", "collective": "all_reduce", "groups": [["xpu0", "xpu1"]], "bytes": 1e6,
              "start": True}
GRAPHS = {
    "g-empty.json": _graph_json(nodes=[]),
    "g-list-nodes.json": '{"directed": true, "multigraph": false, "graph": {}, "nodes": [[1]], "edges": []}',
    "g-edge-no-source.json": _graph_json(edges=[{"target": "a"}]),
    "g-edge-missing.json": _graph_json(edges=[{"source": "a", "target": "ghost", "wait": "xpu"}]),
    "g-not-json.json": '{"nodes": [',
    "g-a-list.json": "[1, 2]",
    "g-global-samples-text.json": _graph_json(graph={"global_samples": "x"}),
    "g-global-samples-negative.json": _graph_json(graph={"global_samples": -5}),
    "g-tokens-text.json": _graph_json(graph={"tokens_per_sample": "x"}),
    "g-model-flops-negative.json": _graph_json(graph={"model_flops": -1}),
    "g-layout-garbage.json": _graph_json(graph={"layout": "garbage"}),
    "g-pairs.json": _graph_json(nodes=[{**ALL_REDUCE, "pairs": [["xpu0", "xpu1"]]}]),
    "g-comm-xpus-mapping.json": _graph_json(nodes=[{**ALL_REDUCE, "xpus": {}}]),
    "g-no-work.json": _graph_json(nodes=[{"id": "a", "kind": "compute", "xpus": ["xpu0"], "flops": 0,
                                          "memory_bytes": 0, "start": True}]),
    "g-duplicate-id.json": _graph_json(nodes=[{"id": "a", "kind": "compute", "xpus": ["xpu0"], "flops": 1}] * 2),
    # found by the fuzz tests (tests/test_fuzz.py): each was a traceback
    "g-undirected.json": _graph_json().replace('"directed": true', '"directed": null'),
    "g-multigraph.json": _graph_json().replace('"multigraph": false', '"multigraph": true'),
    "g-layout-order-null.json": _graph_json(graph={"layout": {"sizes": {"tp": 1, "dp": 2}, "order": [None, "dp"]}}),
    "g-algorithm-not-text.json": _graph_json(nodes=[{**ALL_REDUCE, "algorithm": True}]),
    "g-algorithm-colon.json": _graph_json(nodes=[{**ALL_REDUCE, "algorithm": ":"}]),
}


def _chakra_traces(folder: Path) -> None:
    """Chakra traces, one bad thing each: folder/NAME.<rank>.et."""
    from hcsim.workload.chakra import NODE_TYPES, Node, attribute, write_trace

    compute = NODE_TYPES["COMP_NODE"]

    def node(i, **fields):
        return Node(id=i, name=f"n{i}", type=compute, **fields)

    (folder / "ch").mkdir()
    write_trace(folder / "ch/ok.0.et", [node(1, duration_micros=10), node(2, duration_micros=10, data_deps=[1])])
    ok = (folder / "ch/ok.0.et").read_bytes()
    (folder / "ch/truncated.0.et").write_bytes(ok[:-3])
    (folder / "ch/garbage.0.et").write_bytes(bytes(range(7, 250, 3)) * 3)
    write_trace(folder / "ch/no-time.0.et", [node(1)])
    write_trace(folder / "ch/no-nodes.0.et", [])
    write_trace(folder / "ch/self.0.et", [node(1, duration_micros=10, ctrl_deps=[1])])
    write_trace(folder / "ch/forever.0.et", [node(1, duration_micros=2**64 - 1)])
    write_trace(folder / "ch/cycle.0.et", [node(1, duration_micros=10, data_deps=[2]),
                                           node(2, duration_micros=10, data_deps=[1])])
    write_trace(folder / "ch/negative.0.et", [node(1, duration_micros=10, attr=[attribute("num_ops", int64_val=-5)])])
    write_trace(folder / "ch/missing-dep.0.et", [node(1, duration_micros=10, data_deps=[7])])
    for rank in (0, 1, 3):
        write_trace(folder / f"ch/gap.{rank}.et", [node(1, duration_micros=10)])


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("bad")
    for name, text in FILES.items():
        (folder / name).write_bytes(text if isinstance(text, bytes) else text.encode())
    (folder / "big.yaml").write_bytes(b"# padding\n" * (MAX_SPEC_BYTES // 10 + 1))
    (folder / "a-folder").mkdir()
    (folder / "results").mkdir()
    for name, text in GRAPHS.items():
        (folder / name).write_text(text)
    _chakra_traces(folder)
    return folder


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch, workspace):
    """A tripwire instead of the engine and the sweep's point processes; the cases run in the workspace."""
    def tripwire(*args, **kwargs):
        raise AssertionError("a bad input reached the engine")

    monkeypatch.setattr("hcsim.engine.api.run", tripwire)
    monkeypatch.setattr("hcsim.study.points.run_point", tripwire)
    monkeypatch.delenv("HCSIM_NO_LIMITS", raising=False)
    monkeypatch.chdir(workspace)


def check_message(message: str) -> None:
    """The template of hcsim.errors: every line "WHERE: PROBLEM" (or indented under one); bounded; no glitch."""
    assert message and "Traceback" not in message, message
    assert "Ellipsis" not in message and ": :" not in message, message
    assert len(message) < 4000, f"an unbounded message ({len(message)} characters)"
    for line in message.splitlines():
        assert line.startswith("  ") or MESSAGE_TEMPLATE.match(line), f"not 'WHERE: PROBLEM': {line!r}"


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.err


# --- the CLI cases: (argv, where the message points, what it says is valid) ------------------------------

SIM = ["simulate"]
HUGE_DECODER = ["--set", "costs=shape", "--set", "model.hidden=40960", "--set", "model.heads=320"]  # 162 GB a decoder
CLI_CASES = {
    # 1. spec files that are not text, too deep, too big, endless, or bombs
    "scenario-duplicate-key": (SIM + ["dup.yaml"], r"dup\.yaml:2", r"given twice .* keep one"),
    "scenario-not-utf8": (SIM + ["bin.yaml"], r"bin\.yaml:1", r"not UTF-8 .* saved as UTF-8"),
    "scenario-too-deep": (SIM + ["deep.yaml"], r"deep\.yaml:1", r"more than 64 levels"),
    "scenario-alias-bomb": (SIM + ["bomb.yaml"], r"bomb\.yaml:\d+", r"more than 2,000,000 values"),
    "scenario-recursive-alias": (SIM + ["recursive.yaml"], r"recursive\.yaml:1", r"recursive alias"),
    "scenario-dev-zero": (SIM + ["/dev/zero"], r"/dev/zero", r"not a regular file.*expected a spec file"),
    "scenario-too-big": (SIM + ["big.yaml"], r"big\.yaml", r"larger than 8 MiB"),
    "scenario-a-folder": (SIM + ["a-folder"], r"a-folder", r"is a folder; expected a spec file"),
    "scenario-missing": (SIM + ["nowhere.yaml"], r"nowhere\.yaml", r"cannot read: No such file"),
    "scenario-a-list": (SIM + ["list.yaml"], r"list\.yaml", r"a scenario is a mapping"),
    "scenario-syntax": (SIM + ["syntax.yaml"], r"syntax\.yaml:\d+", r"not valid YAML"),
    "scenario-empty-name": (SIM + ["noname.yaml"], r"noname\.yaml.*name", r"a non-empty string"),
    "set-deep-value": (SIM + ["--set", "x=" + "[" * 100 + "]" * 100], r"--set x", r"more than 64 levels"),
    "set-bad-yaml": (SIM + ["--set", "xpus=[1"], r"--set xpus", r"not valid YAML"),
    "set-no-equals": (SIM + ["--set", "xpus"], r"--set 'xpus'", r"KEY=VALUE, e\.g\. xpus=256"),
    "set-empty-key": (SIM + ["--set", "=8"], r"--set '=8'", r"KEY=VALUE"),
    # scenario keys
    "xpus-zero": (SIM + ["--set", "xpus=0"], r"xpus", r">= 1"),
    "xpus-text": (SIM + ["--set", "xpus=abc"], r"xpus", r"expected an integer"),
    "xpus-float": (SIM + ["--set", "xpus=8.5"], r"xpus", r"expected an integer"),
    "unknown-key": (SIM + ["--set", "xpux=8"], r"xpux", r"did you mean 'xpus'"),
    "collective-model": (SIM + ["--set", "collective_model=flwo"], r"collective_model", r"step, flow, auto"),
    "xpu-sampling-retired": (SIM + ["--set", "xpu_sampling=representative"], r"xpu_sampling",
                             r"no longer available: every XPU is simulated.*remove the xpu_sampling key"),
    "granularity": (SIM + ["--set", "granularity=op"], r"granularity", r"layer, decoder"),
    "local-access": (SIM + ["--set", "local_access=x"], r"local_access", r"analytic, simulated"),
    "local-collectives": (SIM + ["--set", "local_collectives=analytc"], r"local_collectives",
                          r"simulated, analytic \(did you mean 'analytic'\?\)"),
    "tp-does-not-divide": (SIM + ["--set", "xpus=6", "--set", "tp=4"], r"parallel layout", r"not a multiple of tp 4 x pp 1"),
    "global-batch-not-a-multiple": (SIM + ["--set", "xpus=8", "--set", "pp=2", "--set", "global_batch=7"],
                                    r"global_batch", r"valid: multiples of"),
    # one rule for every pp: interleaving needs stages to interleave, pp: 1 is refused as pp: 2 with v: 2 and 1f1b is
    "interleaved-one-stage": (SIM + ["--set", "schedule=interleaved", "--set", "virtual_stages=2"], r"schedule",
                              r"interleaved needs pp > 1.*valid: pp >= 2"),
    "virtual-stages-without-interleaving": (SIM + ["--set", "xpus=4", "--set", "pp=2", "--set", "virtual_stages=2"],
                                            r"virtual_stages", r"needs schedule: interleaved"),
    "compute-factors-missing": (SIM + ["--set", "compute_factors=nosuch.csv"], r"compute_factors: 'nosuch.csv'",
                                r"no such file .*roofline factors YAML"),
    "route-through-a-missing-node": (SIM + ["--set", "xpus=4",
                                            "--set", "platform_overrides={routes: [[xpu0, nosuch, xpu1]]}"],
                                     r"routes\[0\] \(xpu0 -> xpu1\)", r"no node 'nosuch' in this platform"),
    "renamed-and-new-key": (SIM + ["--set", "fidelity=layer", "--set", "granularity=decoder"], r"fidelity",
                            r"renamed granularity.*keep only granularity"),
    "cxl-bandwidth-no-unit": (SIM + ["--set", "cxl_bandwidth=128"], r"cxl_bandwidth", r"for example '128GB/s"),
    "cxl-latency-negative": (SIM + ["--set", "cxl_latency=-1ns"], r"cxl_latency", r"must be > 0"),
    "cxl-latency-words": (SIM + ["--set", "cxl_latency=fast"], r"cxl_latency", r"write it as '200ns"),
    "trace-iterations-after-the-run": (SIM + ["--set", "trace_iterations=[5]"], r"trace_iterations",
                                       r"iterations 1 to 2"),
    "trace-iterations-bool": (SIM + ["--set", "trace_iterations=[true]"], r"trace_iterations",
                              r"list of iteration numbers from 1"),
    "trace-iterations-scalar": (SIM + ["--set", "trace_iterations=3"], r"trace_iterations",
                                r"list of iteration numbers"),
    "trace-iterations-zero": (SIM + ["--set", "trace_iterations=[0]"], r"trace_iterations",
                              r"list of iteration numbers from 1"),
    "ring-order-string": (SIM + ["--set", "ring_order=xpu0"], r"ring_order", r"topology or interleaved"),
    "ring-order-partial": (SIM + ["--set", "xpus=4", "--set", "ring_order=[xpu0]"], r"ring_order",
                           r"must list each of the 4 XPUs once"),
    "devices-nested": (SIM + ["--set", "devices=[[H100]]"], r"devices", r"a device name or a list"),
    "devices-unknown": (SIM + ["--set", "devices=[H900]"], r"devices\[0\]", r"known: A100"),
    "platform-missing": (SIM + ["--set", "platform=nowhere"], r"nowhere",
                         r"built-in ones: cxl-pool, dgx-a100, dgx-h100, gb200-nvl72, gh200, paper-cxl, paper-traditional$"),
    "platform-is-the-catalog": (SIM + ["--set", "platform=devices"], r"devices",
                                r"built-in ones: cxl-pool, dgx-a100, dgx-h100, gb200-nvl72, gh200, paper-cxl, paper-traditional$"),
    "workload-missing": (SIM + ["--set", "workload=nowhere"], r"nowhere", r"built-in ones: gpt-megatron, gpt2-hf, gpt3-175b"),
    "iterations-too-many": (SIM + ["--set", "iterations=10000000"], r"scenario 'default'",
                            r"beyond the limit of 500,000,000 .*HCSIM_NO_LIMITS"),
    "xpus-beyond-platform": (SIM + ["--set", "xpus=5000"], r"xpus", r"has 4096"),
    "coherent-maybe": (SIM + ["--set", "coherent=maybe"], r"coherent", r"true or false"),
    "step-limit-zero": (SIM + ["--set", "step_limit=0"], r"step_limit", r">= 1"),
    "collective-unknown": (SIM + ["--set", "collective=foo"], r"collective", r"is not one of .*ring"),
    "coherent-ring-without-coherence": (SIM + ["--set", "xpus=2", "--set", "collective=coherent_ring", "--set",
                                               "coherent=false"], r"collective", r"fix: set coherent: true"),
    "overrides-not-a-mapping": (SIM + ["--set", "platform_overrides=3"], r"platform_overrides",
                                r"mapping of dotted keys"),
    "override-no-unit": (SIM + ["--set", "platform_overrides.links.cxl.latency=5"], r"links\.cxl\.latency",
                         r"for example '200ns"),
    "override-through-a-scalar": (SIM + ["--set", "platform_overrides.xpus.count=1"], r"override 'xpus\.count'",
                                  r"override xpus itself"),
    "override-decoders-too-many": (SIM + ["--set", "workload_overrides.model.decoders=100000000"],
                                   r"scenario 'default'", r"beyond the limit of 4,000,000"),
    # 2. output paths, checked before any work
    "batch-split-word": (SIM + ["--set", "batch_split=uneven"], r"batch_split", r"expected even or proportional"),
    "batch-split-zero": (SIM + ["--set", "batch_split=[0,64]"], r"batch_split", r"a list of positive integers"),
    "batch-split-length": (SIM + ["--set", "xpus=4", "--set", "batch_split=[1,1,2]"], r"batch_split",
                           r"gives 3 DP replicas, the run has 4; valid: a list of 4 positive integers"),
    "batch-split-sum": (SIM + ["--set", "xpus=2", "--set", "batch_split=[1,2]"], r"batch_split",
                        r"sums to 3 samples, the run has 2; valid: .* \(training\.batch_per_xpu x xpus = 1 x 2"),
    "batch-split-hybrid-sum": (SIM + ["--set", "workload=llama2-7b", "--set", "xpus=2", "--set", "global_batch=4",
                                      "--set", "batch_split=[1,2]"], r"batch_split",
                               r"sums to 3 micro-batches, the run has 4; valid: .* \(global_batch / micro_batch"),
    "batch-split-proportional-nothing": (SIM + ["--set", "xpus=16", "--set", "devices=[H100,V100]", "--set",
                                                "platform_overrides.rack.servers=1", "--set",
                                                "batch_split=proportional"], r"batch_split",
                                         r"proportional gives DP replica 8 \(slowest XPU xpu8, V100.*valid: a larger"),
    "batch-split-graph": (SIM + ["--set", "workload=g.json", "--set", "batch_split=proportional"], r"batch_split",
                          r"applies to workload specs only"),
    "precision-unknown": (SIM + ["--set", "precision=fp4"], r"precision", r"'fp4' is not one of fp32, fp16, bf16, fp8"),
    "precision-graph": (SIM + ["--set", "workload=g.json", "--set", "precision=bf16"], r"precision",
                        r"applies to workload specs only"),
    "spill-unknown": (SIM + ["--set", "spill=maybe"], r"spill", r"'maybe' is not one of error, allow$"),
    # issue 26: state beyond HBM on a DGX cluster is out of memory, as Megatron-LM or PyTorch would say
    "spill-dgx-out-of-memory": (SIM + ["--set", "platform=dgx-h100", "--set", "workload=llama3-8b", "--set", "xpus=16",
                                       "--set", "global_batch=32", "--set", "tp=2"], r"scenario 'default'",
                                r"out of memory: stage 0 needs [0-9.]+ GB per XPU, each H100 holds 85\.9 GB .*DGX "
                                r"cluster.*Fix: offload .*ZeRO .*pipeline stages .*recompute.*--set spill=allow$"),
    "spill-error-on-paper": (SIM + ["--set", "xpus=2", "--set", "spill=error"], r"scenario 'default'",
                             r"stage 0 needs [0-9.]+ GB per XPU, each H100 holds 85\.9 GB .*; spill: error\. Fix:"),
    "simulate-out-a-file": (SIM + ["--out", "afile"], r"--out afile", r"give a folder"),
    "simulate-out-under-a-file": (SIM + ["--out", "afile/sub"], r"--out afile/sub", r"give a writable folder"),
    # 4. platform specs
    "platform-dev-zero": (["platform", "show", "/dev/zero"], r"/dev/zero", r"not a regular file"),
    "platform-missing-show": (["platform", "show", "nowhere"], r"nowhere", r"built-in ones: cxl-pool, dgx-a100, dgx-h100, gb200-nvl72, gh200, paper-cxl, paper-traditional$"),
    "platform-catalog-show": (["platform", "show", "devices"], r"devices", r"paper-cxl, paper-traditional$"),
    "platform-devices-nested": (["platform", "show", "paper-cxl", "--set", "devices=[[H100]]"], r"devices\[0\]",
                                r"expected a device name.*known: A100"),
    "platform-bandwidth-zero": (["platform", "show", "paper-cxl", "--set", "links.cxl.bandwidth=0GB/s"],
                                r"links\.cxl\.bandwidth", r"must be > 0"),
    "platform-latency-words": (["platform", "show", "paper-cxl", "--set", "links.cxl.latency=fast"],
                               r"links\.cxl\.latency", r"write it as '200ns"),
    "platform-xpus-zero": (["platform", "show", "paper-cxl", "--set", "xpus=0"], r"xpus", r">= 1"),
    "platform-option-xpus-zero": (["platform", "show", "paper-cxl", "--xpus", "0"], r"--xpus", r">= 1"),
    "platform-option-xpus-beyond": (["platform", "show", "paper-cxl", "--xpus", "5000"], r"xpus",
                                    r"holds 1 to 4096"),
    "platform-spines-too-many": (["platform", "show", "paper-cxl", "--xpus", "8", "--set", "network.spines=1000000000"],
                                 r"network\.spines", r"must be <= 4,096"),
    "platform-cpus-too-many": (["platform", "show", "paper-cxl", "--xpus", "8", "--set", "server.cpus=1000000000"],
                               r"server\.cpus", r"must be <= 4,096"),
    "platform-radix": (["platform", "show", "paper-cxl", "--set", "cxl.radix=1"], r"cxl\.radix", r">= 2"),
    "platform-attach": (["platform", "show", "paper-cxl", "--set", "cxl.type3_attach=moon"], r"cxl\.type3_attach",
                        r"switch, xpu"),
    "platform-cpus-text": (["platform", "show", "paper-cxl", "--set", "server.cpus=two"], r"server\.cpus",
                           r"expected an integer"),
    "platform-unknown-top-key": (["platform", "show", "paper-cxl", "--set", "linkz.x=1"], r"linkz",
                                 r"did you mean 'links'"),
    "route-missing-node": (["platform", "show", "route-missing-node.yaml"], r"routes\[0\]", r"no node 'ghost'"),
    "route-no-link": (["platform", "show", "route-no-link.yaml"], r"routes\[0\]", r"no link 'sw2'--'pool'"),
    "route-revisits": (["platform", "show", "route-revisits.yaml"], r"routes\[0\]", r"visits 'sw' more than once"),
    "route-through-xpu": (["platform", "show", "route-through-xpu.yaml"], r"routes\[0\]",
                          r"passes through 'b' \(xpu\).*switches, NICs and CPUs"),
    "self-loop-link": (["platform", "show", "self-loop.yaml"], r"topology\.links\[3\]\.ends",
                       r"a link joins two nodes"),
    "explicit-no-xpu": (["platform", "show", "no-xpu.yaml"], r"topology\.nodes", r"needs at least one"),
    "explicit-cxl-link-class": (["platform", "show", "explicit-cxl.yaml"], r"links\.cxl",
                                r"reads only links\.hbm"),
    "route-twice": (["platform", "show", "route-twice.yaml"], r"routes\[1\]", r"one route per pair"),
    "device-catalog-missing": (["platform", "show", "catalog.yaml"], r"device_catalog\[0\]", r"no such file"),
    "compile-missing-folder": (["platform", "compile", "paper-cxl", "-o", "nodir/x.xml"], r"-o nodir/x\.xml",
                               r"does not exist; give a path in an existing folder"),
    "compile-under-a-file": (["platform", "compile", "paper-cxl", "-o", "afile/x.xml"], r"-o afile/x\.xml",
                             r"lies under a file"),
    "compile-onto-a-folder": (["platform", "compile", "paper-cxl", "-o", "a-folder"], r"-o a-folder",
                              r"is a folder; give a file name"),
    "draw-unknown-type": (["platform", "draw", "paper-cxl", "-o", "x.xyz"], r"-o x\.xyz", r"\.png, \.svg"),
    "compile-all-pairs-too-many": (["platform", "compile", "paper-cxl", "--pairs", "all-xpus", "-o", "x.xml"],
                                   r"--pairs all-xpus", r"beyond the limit of 2,000,000"),
    # workload specs
    "workload-dev-zero": (["workload", "show", "/dev/zero"], r"/dev/zero", r"not a regular file"),
    "workload-not-utf8": (["workload", "show", "bin.yaml"], r"bin\.yaml:1", r"UTF-8"),
    "workload-duplicate-key": (["workload", "show", "dup.yaml"], r"dup\.yaml:2", r"keep one"),
    "workload-algorithm": (["workload", "show", "llama2-13b", "--set", "gradients.algorithm=foo"],
                           r"gradients\.algorithm", r"not one of .*ring"),
    "workload-decoders-too-many": (["workload", "show", "llama2-13b", "--set", "model.decoders=100000000"],
                                   r"workload 'llama2-13b'", r"beyond the limit of 4,000,000"),
    "workload-xpus-too-many": (["workload", "show", "llama2-13b", "--xpus", "100000000"], r"--xpus 100000000",
                               r"beyond the limit of 500,000,000"),
    "workload-xpus-zero": (["workload", "show", "llama2-13b", "--xpus", "0"], r"--xpus", r">= 1"),
    "workload-device": (["workload", "show", "llama2-13b", "--device", "H900"], r"--device 'H900'", r"known: A100"),
    "workload-batch-zero": (["workload", "show", "llama2-13b", "--set", "training.batch_per_xpu=0"],
                            r"training\.batch_per_xpu", r">= 1"),
    "workload-granularity": (["workload", "show", "llama2-13b", "--set", "granularity=op"], r"granularity",
                             r"layer, decoder"),
    "workload-shape-incomplete": (["workload", "show", "bad-workload.yaml"], r"model\.hidden", r"is required"),
    "export-missing-folder": (["workload", "export", "llama2-13b", "--xpus", "2", "-o", "nodir/g.json"],
                              r"-o nodir/g\.json", r"existing folder"),
    # 3. sweeps
    "sweep-empty": (["sweep", "empty.yaml"], r"empty\.yaml", r"needs at least `axes:`"),
    "sweep-no-axes": (["sweep", "noaxes.yaml"], r"noaxes\.yaml: axes", r"mapping of scenario keys to lists"),
    "sweep-scalar-axis": (["sweep", "scalar-axis.yaml"], r"axes\.xpus", r"non-empty list of values"),
    "sweep-bad-name": (["sweep", "bad-name.yaml"], r"bad-name\.yaml: name", r"letters, digits"),
    "sweep-dev-zero": (["sweep", "/dev/zero"], r"/dev/zero", r"not a regular file"),
    "sweep-deep": (["sweep", "deep.yaml"], r"deep\.yaml:1", r"64 levels"),
    "plot-missing-column": (["sweep", "plot-column.yaml"], r"plots\[0\]: y", r"columns: point, coherent"),
    "plot-unknown-series": (["sweep", "plot-series.yaml"], r"plots\[0\]: series", r"columns: point"),
    "plot-where-unknown-column": (["sweep", "plot-where.yaml"], r"plots\[0\]: where\.size", r"columns: point"),
    "plot-text-metric": (["sweep", "plot-text-y.yaml"], r"plots\[0\]: y", r"numeric columns: "),
    "plot-where-a-list": (["sweep", "plot-where-list.yaml"], r"plots\[0\]: where", r"mapping of columns to values"),
    "finding-not-an-axis": (["sweep", "finding-axis.yaml"], r"findings\[0\]: axis", r"axes: coherent, cxl_bandwidth"),
    "finding-tolerance-words": (["sweep", "finding-tolerance.yaml"], r"findings\[0\]: tolerance",
                                r"a number such as 0\.01"),
    "finding-where-wrong-kind": (["sweep", "finding-where.yaml"], r"where\.cxl_bandwidth", r"write it as '128GB/s"),
    "finding-value-not-on-axis": (["sweep", "finding-value.yaml"], r"findings\[0\]: better",
                                  r"its values: True, False"),
    "finding-unknown-metric": (["sweep", "finding-metric.yaml"], r"findings\[0\]: metric", r"numeric columns: "),
    "finding-along-not-numeric": (["sweep", "finding-along.yaml"], r"findings\[0\]: along",
                                  r"give a numeric axis"),
    "finding-step-from-not-on-axis": (["sweep", "finding-step.yaml"], r"findings\[0\]: from",
                                      r"its values: 64GB/s, 128GB/s"),
    "sweep-timeout-zero": (["sweep", "exp.yaml", "--timeout", "0"], r"--timeout", r"must be > 0 seconds"),
    "sweep-timeout-negative": (["sweep", "exp.yaml", "--timeout", "-1"], r"--timeout", r"must be > 0 seconds"),
    "sweep-timeout-nan": (["sweep", "exp.yaml", "--timeout", "nan"], r"--timeout", r"must be > 0 seconds"),
    "sweep-jobs-zero": (["sweep", "exp.yaml", "--jobs", "0"], r"--jobs", r">= 1"),
    "sweep-out-a-file": (["sweep", "exp.yaml", "--out", "afile"], r"--out afile", r"give a folder"),
    "sweep-report-without-csv": (["sweep", "exp.yaml", "--report-only", "--out", "a-folder"], r"exp\.csv",
                                 r"run the sweep first"),
    "sweep-executor": (["sweep", "exp.yaml", "--executor", "lokal", "--out", "results/executor"], r"--executor 'lokal'",
                       r"expected 'local' or 'dask://HOST:PORT'"),
}

# --- issue 29: every surface, the newer ones included ---------------------------------------------------------

VALIDATE = ["validate", "--platform", "paper-cxl"]
CLI_CASES_29 = {
    # tracebacks
    "draw-racks-zero": (["platform", "draw", "paper-cxl", "--racks", "0", "-o", "x.png"], r"--racks", r"must be >= 1"),
    "draw-servers-zero": (["platform", "draw", "paper-cxl", "--servers", "0", "-o", "x.png"], r"--servers",
                          r"must be >= 1"),
    "plot-x-zip-label": (["sweep", "plot-zip-label.yaml"], r"plot-zip-label\.yaml: plots\[0\]: x",
                         r"'system' holds text.*use kind: bar"),
    "plot-x-zip-default": (["sweep", "plot-zip-default.yaml"], r"plots\[0\]: x",
                           r"'collective_chunks' holds text at point 1.*use kind: bar"),
    "plot-x-text-column": (["sweep", "plot-text-x.yaml"], r"plots\[0\]: x",
                           r"'busiest_link' is a text column.*numeric columns: .*xpus"),
    "validate-measured-inf": (VALIDATE + ["runs-huge.csv"], r"runs-huge\.csv:2: measured", r"finite number > 0"),
    "validate-measured-tiny": (VALIDATE + ["runs-tiny.csv"], r"runs-tiny\.csv:2: measured", r"outside 1e-06 to 1e\+07 s"),
    "validate-not-utf8": (VALIDATE + ["runs-binary.csv"], r"runs-binary\.csv:1", r"saved as UTF-8"),
    "validate-out-a-file": (VALIDATE + ["runs.csv", "--out", "afile"], r"--out afile", r"give a folder"),
    # accepted without a word (exit 0 with per-row notes before)
    "validate-header-only": (VALIDATE + ["runs-header-only.csv"], r"runs-header-only\.csv", r"no runs.*one measured run per line"),
    "validate-empty": (VALIDATE + ["runs-empty.csv"], r"runs-empty\.csv", r"missing columns name, gpus.*Columns: name"),
    "validate-jobs-zero": (VALIDATE + ["runs.csv", "--jobs", "0"], r"--jobs", r"integer >= 1"),
    "validate-max-runs-negative": (VALIDATE + ["runs.csv", "--max-runs", "-1"], r"--max-runs", r"integer >= 1"),
    "validate-set-unknown": (VALIDATE + ["runs.csv", "--set", "bogus=1"], r"bogus",
                             r"unknown key; valid keys: .*global_batch.*xpus"),
    "validate-platform-missing": (["validate", "runs.csv", "--platform", "nosuch"], r"nosuch",
                                  r"built-in ones: cxl-pool, dgx-a100"),
    "validate-extra-cell": (VALIDATE + ["runs-extra-cell.csv"], r"runs-extra-cell\.csv:3",
                            r"6 cells, the header has 5.*remove the extra"),
    "validate-duplicate-name": (VALIDATE + ["runs-duplicate.csv"], r"runs-duplicate\.csv:3: name",
                                r"also the name of line 2.*its own name"),
    "validate-text-in-number": (VALIDATE + ["runs-text.csv"], r"runs-text\.csv:2: measured", r"expected a number"),
    "validate-unknown-unit": (VALIDATE + ["runs-unit.csv"], r"runs-unit\.csv:2: unit", r"not one of s, ms"),
    "validate-gpus-zero": (VALIDATE + ["runs-gpus-zero.csv"], r"runs-gpus-zero\.csv:2: gpus", r"integer >= 1"),
    "validate-unknown-column": (VALIDATE + ["runs-columns.csv"], r"runs-columns\.csv", r"unknown columns gpuz.*Columns:"),
    # physical ranges (hcsim.limits.PHYSICAL_RANGES)
    "range-cxl-bandwidth": (SIM + ["--set", "cxl_bandwidth=1e-30B/s"], r"cxl_bandwidth",
                            r"outside the physical range of a bandwidth, 1 kB/s to 100 TB/s.*HCSIM_NO_LIMITS"),
    "range-cxl-latency": (SIM + ["--set", "cxl_latency=1e9s"], r"cxl_latency", r"0 s to 1 s"),
    "range-sequence": (["workload", "show", "llama2-7b", "--set", "model.sequence=1000000000000"], r"model\.sequence",
                       r"1 tokens to 10,000,000 tokens"),
    "range-platform-bandwidth": (["platform", "show", "paper-cxl", "--set", "links.cxl.bandwidth=1e20B/s"],
                                 r"links\.cxl\.bandwidth", r"1 kB/s to 100 TB/s"),
    "range-type3-capacity": (["platform", "show", "paper-cxl", "--set", "cxl.type3_capacity=1e30B"],
                             r"cxl\.type3_capacity", r"physical range of a size, 1 B to 100 PB"),
    # scenario values blamed on the key the user wrote, not on the built-in file
    "blame-cxl-on-dgx": (SIM + ["--set", "platform=dgx-h100", "--set", "cxl_bandwidth=64GB/s"],
                         r"scenario 'default': cxl_bandwidth", r"'dgx-h100' has no CXL links.*paper-cxl"),
    "blame-platform-override": (SIM + ["--set", "platform=dgx-h100", "--set", "platform_overrides.bogus=1"],
                                r"scenario 'default': platform_overrides\.bogus", r"unknown key; valid keys: .*node.* \(in dgx-h100\.yaml\)"),
    "blame-workload-override": (SIM + ["--set", "workload_overrides.bogus=1"],
                                r"scenario 'default': workload_overrides\.bogus", r"unknown key; valid keys: .*model.* \(in llama2-13b\.yaml\)"),
    "blame-devices": (SIM + ["--set", "devices=[H100,H900]"], r"scenario 'default': devices",
                      r"in paper-cxl\.yaml, devices\[1\]: unknown device 'H900'.*known: A100"),
    "algorithm-unknown": (SIM + ["--set", "workload_overrides.gradients.algorithm=ringg"],
                          r"workload_overrides\.gradients\.algorithm", r"did you mean 'ring'.*known: .*hierarchical"),
}
GRAPH = SIM + ["--set", "xpus=2", "--set"]
CALIBRATE = ["calibrate", "--device", "H100", "-o", "factors.yaml"]
CHAKRA = SIM + ["--set", "xpus=4", "--set"]
CLI_CASES_29.update({
    # workload graph JSON: tracebacks, raw Python text, the graph-level section
    "graph-no-vertices": (GRAPH + ["workload=g-empty.json"], r"g-empty\.json", r"no vertices: a workload runs at least one"),
    "graph-nodes-not-objects": (GRAPH + ["workload=g-list-nodes.json"], r"g-list-nodes\.json: nodes\[0\]",
                                r"an object with an \"id\""),
    "graph-edge-no-source": (GRAPH + ["workload=g-edge-no-source.json"], r"g-edge-no-source\.json: edges\[0\]",
                             r"\"source\" and \"target\""),
    "graph-edge-to-missing-vertex": (GRAPH + ["workload=g-edge-missing.json"], r"edges\[0\]: target",
                                     r"no vertex 'ghost' in nodes"),
    "graph-not-json": (GRAPH + ["workload=g-not-json.json"], r"g-not-json\.json", r"not JSON.*hcsim workload export"),
    "graph-a-list": (GRAPH + ["workload=g-a-list.json"], r"g-a-list\.json", r"expected a JSON object, got a list"),
    "graph-duplicate-id": (GRAPH + ["workload=g-duplicate-id.json"], r"nodes\[1\]", r"its own id"),
    "graph-global-samples-text": (GRAPH + ["workload=g-global-samples-text.json"], r"g-global-samples-text\.json",
                                  r"^  graph: global_samples: expected an integer >= 1, got 'x'"),
    "graph-global-samples-negative": (GRAPH + ["workload=g-global-samples-negative.json"], r"global_samples",
                                      r"an integer >= 1, got -5"),
    "graph-tokens-text": (GRAPH + ["workload=g-tokens-text.json"], r"tokens_per_sample", r"an integer >= 1"),
    "graph-model-flops-negative": (GRAPH + ["workload=g-model-flops-negative.json"], r"model_flops",
                                   r"a finite number > 0, got -1"),
    "graph-layout-garbage": (GRAPH + ["workload=g-layout-garbage.json"], r"graph: layout", r"\"sizes\".*\"order\""),
    "graph-pairs-on-all-reduce": (GRAPH + ["workload=g-pairs.json"], r"vertex 'c'", r"pairs is not a vertex attribute"),
    "graph-comm-xpus-mapping": (GRAPH + ["workload=g-comm-xpus-mapping.json"], r"vertex 'c': xpus",
                                r"derived.*a list of XPU names"),
    # found by the fuzz tests (tests/test_fuzz.py): each was a traceback
    "graph-undirected": (GRAPH + ["workload=g-undirected.json"], r"g-undirected\.json: directed",
                         r"must be true or left out \(a workload graph is a directed graph\), got None"),
    "graph-multigraph": (GRAPH + ["workload=g-multigraph.json"], r"g-multigraph\.json: multigraph",
                         r"must be false or left out"),
    "graph-layout-order-null": (GRAPH + ["workload=g-layout-order-null.json"], r"graph: layout",
                                r"order naming each once"),
    "graph-algorithm-not-text": (GRAPH + ["workload=g-algorithm-not-text.json"], r"vertex 'c': algorithm",
                                 r"the name of a collective algorithm \(ring, coherent_ring, \.\.\., or module:Class\)"),
    "graph-algorithm-colon": (GRAPH + ["workload=g-algorithm-colon.json"], r"algorithm ':'",
                              r"give 'package\.module:ClassName' of an importable Algorithm subclass"),
    "calibrate-dimension-overflow": (CALIBRATE + ["k-overflow.csv"], r"k-overflow\.csv:2: column m",
                                     r"expected a finite number >= 0, got '1e400'"),
    "calibrate-seconds-tiny": (CALIBRATE + ["k-tiny.csv"], r"k-tiny\.csv:2: column seconds",
                               r"give seconds >= 1e-09"),
    "calibrate-seconds-huge": (CALIBRATE + ["k-huge.csv"], r"k-huge\.csv:2: column seconds",
                               r"outside the physical range of a duration"),
    "calibrate-gemm-without-shape": (CALIBRATE + ["k-no-shape.csv"], r"k-no-shape\.csv:2",
                                     r"a gemm row needs m, n, k \(>= 1\): give columns m, n, k >= 1, or a note"),
    "calibrate-norm-without-note": (CALIBRATE + ["k-no-note.csv"], r"k-no-note\.csv:2",
                                    r"a rmsnorm_hf_fwd row needs tokens, hidden \(>= 1\): give a note "
                                    r"'tokens=4096 hidden=4096'"),
    "calibrate-rows-alike": (CALIBRATE + ["k-alike.csv"], r"calibrate H100",
                             r"rows of different sizes and times"),
    # Chakra traces
    "chakra-empty-prefix": (SIM + ["--set", "workload=chakra:"], r"workload", r"'chakra:' names no trace.*PATH_PREFIX"),
    "chakra-no-files": (CHAKRA + ["workload=chakra:ch/nowhere"], r"chakra:ch/nowhere", r"no trace files.*\.0\.et"),
    "chakra-rank-missing": (CHAKRA + ["workload=chakra:ch/gap"], r"chakra:ch/gap", r"ranks 2 have no trace file"),
    "chakra-truncated": (CHAKRA + ["workload=chakra:ch/truncated"], r"truncated\.0\.et", r"truncated file"),
    "chakra-garbage": (CHAKRA + ["workload=chakra:ch/garbage"], r"garbage\.0\.et", r"at byte \d+ (does not parse|claims)"),
    "chakra-no-time": (CHAKRA + ["workload=chakra:ch/no-time"], r"no-time\.0\.et: node 1: duration_micros",
                       r"duration_micros > 0 .* or attribute num_ops > 0"),
    "chakra-no-nodes": (CHAKRA + ["workload=chakra:ch/no-nodes"], r"no-nodes\.0\.et", r"no nodes after the GlobalMetadata"),
    "chakra-self-dependency": (CHAKRA + ["workload=chakra:ch/self"], r"self\.0\.et: node 1: ctrl_deps",
                               r"names the node itself"),
    "chakra-duration-forever": (CHAKRA + ["workload=chakra:ch/forever"], r"forever\.0\.et: node 1: duration_micros",
                                r"physical range of a duration, 0 s to 1,000,000 s"),
    "chakra-cycle": (CHAKRA + ["workload=chakra:ch/cycle"], r"chakra:ch/cycle", r"cycle with no skip_first_iteration"),
    "chakra-negative-size": (CHAKRA + ["workload=chakra:ch/negative"], r"negative\.0\.et: node 1: num_ops",
                             r"an integer >= 0, got -5"),
    "chakra-dependency-missing": (CHAKRA + ["workload=chakra:ch/missing-dep"], r"node 1: data_deps", r"no node 7"),
    "import-missing-folder": (["workload", "import", "ch/ok", "-o", "nodir/x.json"], r"-o nodir/x\.json",
                              r"existing folder"),
    "import-onto-a-folder": (["workload", "import", "ch/ok", "-o", "a-folder"], r"-o a-folder", r"give a file name"),
    # sweeps
    "sweep-duplicate-zip-label": (["sweep", "zip-duplicate-label.yaml"], r"axes\.system\[1\]\.label",
                                  r"'a' is also the label of entry 0"),
    "sweep-grid-too-large": (["sweep", "huge-grid.yaml"], r"huge-grid\.yaml: axes",
                             r"20 x 20 x 20 x 20 x 20 axis values.*3,200,000, beyond the limit of 100,000"),
    "sweep-chakra-missing": (["sweep", "chakra-missing.yaml"], r"workload chakra:nowhere/run", r"no trace files"),
    "sweep-resume-and-overwrite": (["sweep", "exp.yaml", "--resume", "--overwrite", "--out", "results/ro"],
                                   r"--resume, --overwrite", r"contradict.*give one"),
    # plan
    "plan-global-batch-zero": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "0"], r"--global-batch",
                               r"integer >= 1"),
    "plan-global-batch-negative": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "-8"], r"--global-batch",
                                   r"integer >= 1"),
    "plan-global-batch-huge": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "1000000000000"],
                               r"--global-batch", r"beyond the limit of 10,000,000"),
    "plan-global-batch-too-many-micro-batches": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "1000000"],
                                                 r"--global-batch 1000000", r"a smaller global batch"),
    "plan-xpus-zero": (["plan", "llama2-7b", "--xpus", "0", "--global-batch", "8"], r"xpus", r">= 1"),
    "plan-xpus-negative": (["plan", "llama2-7b", "--xpus", "-1", "--global-batch", "8"], r"xpus", r">= 1"),
    "plan-xpus-huge": (["plan", "llama2-7b", "--xpus", "1000000000", "--global-batch", "8"], r"--xpus", r"has 4096"),
    "plan-model-unknown": (["plan", "nosuch", "--xpus", "8", "--global-batch", "8"], r"nosuch",
                           r"built-in ones: gpt-megatron"),
    "plan-device-unknown": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "8", "--devices", "H900"],
                            r"devices", r"unknown device 'H900'.*known: A100"),
    "plan-top-zero": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "8", "--top", "0"], r"--top", r">= 1"),
    "plan-time-zero": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "8", "--time", "0"], r"--time",
                       r"must be > 0 seconds"),
    "plan-time-negative": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "8", "--time", "-5"], r"--time",
                           r"must be > 0 seconds"),
    "plan-time-nan": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "8", "--time", "nan"], r"--time",
                      r"must be > 0 seconds"),
    "plan-out-a-file": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "8", "--out", "afile"], r"--out afile",
                        r"give a folder"),
    "plan-platform-unknown": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "8", "--platform", "nosuch"],
                              r"nosuch", r"built-in ones: cxl-pool, dgx-a100"),
    "plan-jobs-zero": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "8", "--jobs", "0"], r"--jobs", r">= 1"),
    "plan-set-unknown": (["plan", "llama2-7b", "--xpus", "8", "--global-batch", "8", "--set", "bogus=1"], r"bogus",
                         r"unknown key; valid keys: .*global_batch.*xpus"),
    "plan-training-without-global-batch": (["plan", "llama2-7b", "--xpus", "8"], r"--global-batch",
                                           r"required to plan training workload 'llama2-7b'"),
    "plan-serving-without-slo": (["plan", "llama3-70b-serving", "--xpus", "8"], r"^plan llama3-70b-serving",
                                 r"gives no serving\.slo.*Fix: give the latency targets"),
    "plan-serving-slo-out-of-reach": (["plan", "llama3-70b-serving", "--xpus", "8", "--platform", "dgx-h100", "--set",
                                       "workload_overrides={serving.slo: {ttft: 1ms}}"],
                                      r"^plan llama3-70b-serving on at most 8 XPUs",
                                      r"no layout can meet serving\.slo \(first token <= 1 ms\).*Fix: looser targets"),
    "plan-serving-nothing-fits": (["plan", "llama3-70b-serving", "--xpus", "1", "--platform", "dgx-h100", "--set",
                                   "workload_overrides={serving.slo: {ttft: 1s}}"],
                                  r"^plan llama3-70b-serving on at most 1 XPU:", r"no layout fits in memory.*valid: "
                                  r"more XPUs"),
    "plan-serving-xpus-beyond-the-platform": (["plan", "llama3-70b-serving", "--xpus", "100000", "--platform",
                                               "dgx-h100", "--set", "workload_overrides={serving.slo: {ttft: 1s}}"],
                                              r"--xpus", r"platform 'dgx-h100' has 16384"),
    "plan-nothing-fits": (["plan", "llama3-405b", "--xpus", "2", "--global-batch", "2"], r"plan llama3-405b on 2 XPUs",
                          r"no configuration fits in local memory.*valid: more XPUs"),
    # one line saying which kind of spec it is, not 15-30 lines of "is required" / "unknown key"
    "workload-given-as-platform": (["platform", "show", str(REPO_ROOT / "workloads/llama2-7b.yaml")], r"llama2-7b\.yaml",
                                   r"a workload spec \(it has model:\), not a platform spec"),
    "platform-given-as-workload": (["workload", "show", str(REPO_ROOT / "platforms/dgx-h100.yaml")], r"dgx-h100\.yaml",
                                   r"a platform spec \(it has links:\), not a workload spec"),
    "moe-in-the-data-parallel-graph": (SIM + ["--set", "workload=mixtral-8x7b"], r"model 'Mixtral 8x7B'",
                                       r"Fix: .*set ep \(expert parallelism, e\.g\. --set ep=8\)"),
    # a route error in routes a scenario gave names the scenario (its file) and platform_overrides.routes[i]
    "scenario-route-missing-node": (SIM + ["routes-ghost.yaml"], r"^routes-ghost\.yaml: platform_overrides\.routes\[0\] "
                                    r"\(xpu0 -> xpu1\)", r"no node 'ghost' in this platform \(routes given to "
                                    r"platform paper-cxl\.yaml\)$"),
    "scenario-route-twice": (SIM + ["routes-twice.yaml"], r"^routes-twice\.yaml: invalid platform_overrides\.routes:\n"
                             r"  platform_overrides\.routes\[1\] \(xpu0 -> xpu1\): platform_overrides\.routes\[0\] "
                             r"has the same ends", r"give one route per pair"),
    "set-route-missing-node": (SIM + ["--set", "xpus=2", "--set", "platform_overrides.routes=[[xpu0, ghost, xpu1]]"],
                               r"^scenario 'default': platform_overrides\.routes\[0\] \(xpu0 -> xpu1\)",
                               r"no node 'ghost' in this platform"),
    "scenario-file-with-set-blamed": (SIM + ["routes-ghost.yaml", "--set", "platform_overrides.bogus=1"],
                                      r"^routes-ghost\.yaml \(with --set\): platform_overrides\.bogus",
                                      r"unknown key; valid keys: .*server.* \(in paper-cxl\.yaml\)"),
    # workload show of a model that fits nowhere: simulate's memory rule on the platform's XPUs
    "show-fits-nowhere": (["workload", "show", "llama2-13b", *HUGE_DECODER, "--platform", "tiny-type3.yaml"],
                          r"^--platform tiny-type3\.yaml: workload 'llama2-13b' does not fit even with spilling on "
                          r"XPU 'xpu0'", r"holds 0 of 40 decoders.*extended memory holds 1 GB\. Fix: more extended "
                          r"memory \(.*pool\.capacity_per_host on cxl-pool\), a smaller batch, or recomputation"),
    "show-out-of-memory-no-spill": (["workload", "show", "llama2-13b", "--platform", "dgx-h100"],
                                    r"^--platform dgx-h100: .*out of memory: stage 0 needs \d+\.\d GB per XPU, each H100 "
                                    r"holds 85\.9 GB", r"Fix: offload .*ZeRO.*here --zero, --pp, --recompute and "
                                    r"--micro-batch"),
    "show-device-and-platform": (["workload", "show", "llama2-13b", "--device", "A100", "--platform", "dgx-h100"],
                                 r"--device A100, --platform dgx-h100", r"own devices; give one of them"),
    "show-platform-missing": (["workload", "show", "llama2-13b", "--platform", "nosuch"], r"nosuch",
                              r"built-in ones: .*paper-cxl"),
})
CLI_CASES.update(CLI_CASES_29)


@pytest.mark.parametrize("argv, where, valid", CLI_CASES.values(), ids=CLI_CASES.keys())
def test_a_bad_cli_input_is_one_line_naming_the_place_and_what_is_valid(argv, where, valid, capsys):
    code, err = run_cli(argv, capsys)
    assert code == 2, err
    assert err.startswith("hcsim: error: "), err
    message = err.removeprefix("hcsim: error: ").rstrip("\n")
    check_message(message)
    assert re.search(where, message), f"does not name {where!r}: {message}"
    assert re.search(valid, message, re.MULTILINE), f"does not say {valid!r}: {message}"


def test_a_runs_csv_saved_by_a_spreadsheet_is_read_as_it_is(workspace):
    from hcsim.study.validate import read_runs

    rows = read_runs(workspace / "runs-bom-crlf.csv")
    assert [row.cells for row in rows] == [{"name": "r1", "gpus": "8", "measured": "1.5", "unit": "s", "micro_batch": "1"}]


def test_the_physical_ranges_give_way_to_hcsim_no_limits(monkeypatch):
    from hcsim.run.scenario import load_scenario

    with pytest.raises(HcsimError, match=r"cxl_latency: '2s' is outside the physical range"):
        load_scenario(None, {"cxl_latency": "2s"})
    monkeypatch.setenv("HCSIM_NO_LIMITS", "1")
    assert load_scenario(None, {"cxl_latency": "2s"}).cxl_latency == 2.0


def test_every_built_in_spec_is_inside_the_physical_ranges():
    from hcsim.platform import load_platform_spec
    from hcsim.workload import load_workload_spec

    def loads(load, path) -> None:
        try:
            load(path)
        except HcsimError as err:  # a spec of another kind in the folder (serving) may not load as a training one
            assert "physical range" not in str(err), str(err)

    for path in sorted((REPO_ROOT / "platforms").glob("*.yaml")):
        if path.stem not in ("devices", "compute-model"):
            loads(load_platform_spec, path)
    for path in sorted((REPO_ROOT / "workloads").glob("*.yaml")):
        loads(load_workload_spec, path)


@pytest.mark.parametrize("platform, key", [("dgx-h100", "node.cpu_flops"), ("paper-cxl", "server.cpu_flops")])
def test_the_fix_that_offload_cpu_suggests_works(platform, key):
    from hcsim.run.prepare import prepare
    from hcsim.run.scenario import load_scenario

    settings = {"platform": platform, "workload": "llama2-7b", "xpus": 8, "tp": 8, "global_batch": 8,
                "offload": "cpu"}
    with pytest.raises(HcsimError) as info:
        prepare(load_scenario(None, settings))
    fix = re.search(r"--set (platform_overrides\.(\S+))=(\S+)\)", str(info.value))
    assert fix and fix[2] == key, str(info.value)
    prepare(load_scenario(None, {**settings, fix[1]: fix[3]}))  # the suggested setting runs


@pytest.mark.parametrize("platform, tp, expected", [
    ("dgx-h100", 16, {"tp_across_servers": {"tp": 16, "groups": 1, "servers": 2}}),
    ("dgx-h100", 8, {}),
])
def test_a_tp_group_across_servers_is_simulated_as_it_is_and_said(platform, tp, expected):
    from hcsim.cli import simulate
    from hcsim.run.prepare import prepare
    from hcsim.run.report import _tp_across_servers
    from hcsim.run.scenario import load_scenario

    prepared = prepare(load_scenario(None, {"platform": platform, "workload": "llama2-7b", "xpus": 16, "tp": tp,
                                            "global_batch": 16}))
    assert _tp_across_servers(prepared) == expected
    if expected:
        import inspect

        assert "TP groups        span servers" in inspect.getsource(simulate)  # the summary's line for it


def test_simulate_help_does_not_claim_a_tp_group_sits_inside_a_server(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = capsys.readouterr().out
    assert "tp (default 1)" in text and "sits inside a server" not in text and "may span servers" in text


# --- sweep results read back (--resume) -------------------------------------------------------------------


def _sweep_csv(workspace: Path, folder: str, capsys) -> Path:
    """The CSV a first (tripwired: every point an error row) run of exp.yaml writes into results/FOLDER."""
    out = workspace / "results" / folder
    code, err = run_cli(["sweep", "exp.yaml", "--out", str(out), "--no-progress"], capsys)
    assert code == 1 and "reached the engine" in (out / "exp.csv").read_text()
    return out / "exp.csv"


@pytest.mark.parametrize("folder, garbage, where", [
    ("garbage", b"this is, not a row\n", r"exp\.csv:3: not a row of this experiment"),
    ("nul", b"abc,\x00def\n", r"exp\.csv:3: not a (CSV row|row of this experiment)"),
    ("binary", b"\x89PNG\r\n\x1a\n", r"exp\.csv:\d+: not UTF-8"),
])
def test_resume_names_the_file_and_line_of_a_garbage_row(workspace, capsys, folder, garbage, where):
    csv = _sweep_csv(workspace, folder, capsys)
    lines = csv.read_bytes().splitlines(keepends=True)
    csv.write_bytes(b"".join(lines[:2]) + garbage + b"".join(lines[2:]))
    code, err = run_cli(["sweep", "exp.yaml", "--out", str(csv.parent), "--resume"], capsys)
    message = err.removeprefix("hcsim: error: ")
    assert code == 2 and re.search(where, message), err
    check_message(message.rstrip("\n"))
    assert re.search(r"(fix or delete that line|saved as UTF-8)", message)


def test_a_second_sweep_into_the_same_folder_is_refused_while_the_first_runs(workspace, capsys):
    out = workspace / "results" / "locked"
    out.mkdir()
    with open(out / ".exp.lock", "w") as held:
        fcntl.flock(held, fcntl.LOCK_EX | fcntl.LOCK_NB)
        code, err = run_cli(["sweep", "exp.yaml", "--out", str(out)], capsys)
    assert code == 2 and "exp.csv: another sweep is writing it" in err and "give another --out" in err
    assert not (out / "exp.csv").exists()


def test_the_lock_is_released_and_removed_after_a_sweep(workspace, capsys):
    csv = _sweep_csv(workspace, "released", capsys)
    assert not (csv.parent / ".exp.lock").exists()
    code, err = run_cli(["sweep", "exp.yaml", "--out", str(csv.parent), "--resume", "--no-progress"], capsys)
    assert code == 0 and "another sweep" not in err


def test_point_folders_of_a_killed_sweep_are_removed_and_live_ones_kept(tmp_path, monkeypatch):
    import tempfile

    from hcsim.study.points import POINT_FOLDER_PREFIX, _remove_stale_point_folders

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    stale = tmp_path / f"{POINT_FOLDER_PREFIX}{int(dead.stdout)}-abc"
    live = tmp_path / f"{POINT_FOLDER_PREFIX}{os.getpid()}-abc"
    for folder in (stale, live):
        folder.mkdir()
        (folder / "scenario.pickle").write_bytes(b"x")
    _remove_stale_point_folders()
    assert not stale.exists() and live.exists()


# --- the Python API -------------------------------------------------------------------------------------


def _api_cases():
    from hcsim.engine.api import RunOptions
    from hcsim.platform import build_platform, load_platform_spec
    from hcsim.run.prepare import prepare
    from hcsim.run.scenario import Scenario, load_scenario
    from hcsim.run.simulation import simulate, simulate_graphs
    from hcsim.study.experiment import load_experiment
    from hcsim.study.sweep import run_sweep
    from hcsim.study.validate import RunRow, measured_seconds
    from hcsim.workload import load_workload, load_workload_spec

    tflops_row = RunRow(line=3, cells={"name": "r", "layers": "2", "hidden": "256", "vocabulary": "1024",
                                       "sequence": "128", "global_batch": "8", "gpus": "", "measured": "50",
                                       "unit": "tflops/gpu"})
    return {
        # found by the fuzz tests: a throughput per GPU without the GPUs was a TypeError
        "validate-tflops-without-gpus": (lambda: measured_seconds(tflops_row), r"line 3: unit tflops/gpu",
                                         r"needs layers, hidden, vocabulary and gpus"),
        "simulate-none": (lambda: simulate(None), r"scenario", r"expected a hcsim\.run\.scenario\.Scenario"),
        "prepare-a-dict": (lambda: prepare({"xpus": 8}), r"scenario", r"expected a hcsim\.run\.scenario\.Scenario"),
        "settings-a-string": (lambda: load_scenario(None, "xpus=8"), r"settings", r"a list of KEY=VALUE strings"),
        "settings-tuples": (lambda: load_scenario(None, [("xpus", 8)]), r"settings", r"KEY=VALUE strings"),
        "scenario-path-a-number": (lambda: load_scenario(5), r"scenario", r"a YAML file path or None"),
        "scenario-xpus-text": (lambda: Scenario(xpus="8"), r"xpus", r"an integer >= 1"),
        "scenario-xpus-bool": (lambda: Scenario(xpus=True), r"xpus", r"an integer >= 1"),
        "scenario-compute-factors-missing": (lambda: Scenario(compute_factors="nosuch.yaml"), r"compute_factors",
                                             r"no such file .*platforms/compute-model.yaml or the output of hcsim "
                                             r"calibrate"),
        "scenario-ring-order-string": (lambda: Scenario(ring_order="xpu0"), r"ring_order", r"topology, interleaved"),
        "scenario-collective-model": (lambda: Scenario(collective_model="flwo"), r"collective_model",
                                      r"step, flow, auto"),
        "scenario-devices-string": (lambda: Scenario(devices="H100"), r"devices", r"tuple of device names"),
        "scenario-trace-iterations-zero": (lambda: Scenario(trace_iterations=(0,)), r"trace_iterations",
                                           r"integers >= 1"),
        "scenario-overrides-a-list": (lambda: Scenario(platform_overrides=[1]), r"platform_overrides",
                                      r"mapping of dotted keys"),
        "scenario-cxl-nan": (lambda: Scenario(cxl_bandwidth=float("nan")), r"cxl_bandwidth", r"finite number > 0"),
        "run-options-collective-model": (lambda: RunOptions(collective_model="flwo"), r"collective_model",
                                         r"step, flow, auto"),
        "run-options-iterations": (lambda: RunOptions(iterations=0), r"iterations", r">= 1"),
        "run-options-local-collectives": (lambda: RunOptions(local_collectives="fast"), r"local_collectives",
                                          r"simulated, analytic"),
        "scenario-layer-split-zero": (lambda: Scenario(layer_split=(0, 4)), r"layer_split", r"integers >= 1"),
        "scenario-batch-split-zero": (lambda: Scenario(batch_split=(0, 4)), r"batch_split",
                                      r"one of even, proportional or a non-empty tuple of integers >= 1"),
        "platform-overrides-a-string": (lambda: load_platform_spec("paper-cxl", "xpus=4"), r"overrides",
                                        r"mapping of dotted keys"),
        "platform-spec-none": (lambda: load_platform_spec(None), r"platform spec", r"a file path or a built-in name"),
        "build-platform-xpus-text": (lambda: build_platform(load_platform_spec("paper-cxl"), "8"), r"xpus",
                                     r"holds 1 to 4096"),
        "workload-decoders-float": (lambda: load_workload_spec("llama2-13b", {"model.decoders": 1e8}),
                                    r"model\.decoders", r"expected an integer"),
        "workload-graph-dev-zero": (lambda: load_workload("/dev/zero"), r"/dev/zero", r"not a regular file"),
        "workload-graph-deep": (lambda: load_workload("deep.json"), r"deep\.json", r"nested too deeply"),
        "workload-graph-xpus-nested": (lambda: load_workload("nested-xpus.json"), r"vertex 'v'",
                                       r"a list of XPU names"),
        "experiment-path-a-number": (lambda: load_experiment(5), r"experiment", r"path of an experiment YAML"),
        "sweep-timeout-zero": (lambda: run_sweep(load_experiment("exp.yaml"), "results/api", timeout=0), r"timeout",
                               r"seconds > 0"),
        "sweep-jobs-float": (lambda: run_sweep(load_experiment("exp.yaml"), "results/api", jobs=1.5), r"jobs",
                             r"integer >= 1"),
        "simulate-out-a-file": (lambda: simulate(Scenario(), out="afile"), r"out afile", r"give a folder"),
        "simulate-graphs-without-guard": (lambda: _without_guard(simulate_graphs), r"unguarded\.py",
                                          r'if __name__ == "__main__"'),
    }


def _without_guard(function):
    """Call `function` as if from a script whose top level has no ``if __name__ == "__main__":`` guard."""
    script = Path("unguarded.py")
    script.write_text("from hcsim.run.simulation import simulate\nsimulate(None)\n")
    main = sys.modules["__main__"]
    saved = (getattr(main, "__file__", None), getattr(main, "__spec__", None))
    main.__file__, main.__spec__ = str(script.resolve()), None
    try:
        return function(None, None)
    finally:
        main.__file__, main.__spec__ = saved


API_CASES = list(_api_cases())


@pytest.mark.parametrize("case", API_CASES)
def test_a_bad_python_call_raises_hcsims_own_error_naming_the_key(case, workspace):
    (workspace / "deep.json").write_text("[" * 100_000 + "]" * 100_000)
    (workspace / "nested-xpus.json").write_text('{"directed": true, "multigraph": false, "graph": {}, '
                                                 '"nodes": [{"id": "v", "kind": "compute", "xpus": [["x"]]}], "edges": []}')
    call, where, valid = _api_cases()[case]
    with pytest.raises(HcsimError) as info:
        call()
    message = str(info.value)
    check_message(message)
    assert re.search(where, message), f"does not name {where!r}: {message}"
    assert re.search(valid, message), f"does not say {valid!r}: {message}"


def test_the_catalogue_holds_at_least_80_bad_inputs():
    assert len(CLI_CASES) + len(API_CASES) + 3 >= 80


# --- outside the process: the real command, a closed pipe, a script without the guard ----------------------


def _hcsim(*args, cwd, **kwargs):
    return subprocess.run([sys.executable, "-m", "hcsim.cli", *args], capture_output=True, text=True, cwd=cwd,
                          timeout=120, **kwargs)


@pytest.mark.parametrize("argv", [["simulate", "bomb.yaml"], ["platform", "show", "/dev/zero"],
                                  ["sweep", "finding-where.yaml"], ["workload", "show", "bin.yaml"]])
def test_the_command_exits_2_without_a_traceback(workspace, argv):
    done = _hcsim(*argv, cwd=workspace)
    assert done.returncode == 2 and "Traceback" not in done.stderr
    assert done.stderr.startswith("hcsim: error: ") and done.stdout == ""


def test_output_piped_to_a_reader_that_closes_ends_quietly(workspace):
    process = subprocess.Popen([sys.executable, "-m", "hcsim.cli", "workload", "show", "llama2-13b"],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=workspace)
    process.stdout.close()  # like `| head` exiting before hcsim writes
    _, err = process.communicate(timeout=120)
    assert b"Traceback" not in err and b"BrokenPipeError" not in err
    assert process.returncode in (0, 141)


def test_a_readme_style_script_without_the_guard_is_told_what_to_do(workspace):
    script = workspace / "example.py"
    script.write_text("from hcsim.run.scenario import load_scenario\nfrom hcsim.run.simulation import simulate\n\n"
                      "result = simulate(load_scenario(None, {'xpus': 8}))\n")
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, cwd=workspace, timeout=120)
    assert done.returncode != 0 and "BrokenProcessPool" not in done.stderr
    assert 'outside `if __name__ == "__main__":`' in done.stderr and "ConfigError" in done.stderr


# --- one template for every message the code base can raise -------------------------------------------------


def _raised_messages():
    """(file:line, first literal text) of every ``raise XxxError(f"...")`` in hcsim."""
    for path in sorted((REPO_ROOT / "hcsim").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.Raise) and isinstance(node.exc, ast.Call) and node.exc.args):
                continue
            name = getattr(node.exc.func, "id", getattr(node.exc.func, "attr", ""))
            # argparse puts the WHERE ("argument --out: ") before an ArgumentTypeError's text itself
            if not name.endswith("Error") or name in ("AssertionError", "OSError", "NotImplementedError",
                                                      "ArgumentTypeError"):
                continue
            text = node.exc.args[0]
            if isinstance(text, (ast.JoinedStr, ast.Constant)):
                yield f"{path.relative_to(REPO_ROOT)}:{node.lineno}", text


def _shape(text) -> str:
    """The message with every placeholder as X: its shape."""
    if isinstance(text, ast.Constant):
        return str(text.value)
    return "".join(part.value if isinstance(part, ast.Constant) else "X" for part in text.values)


def test_every_message_in_the_code_follows_the_template():
    shapes = {where: _shape(text) for where, text in _raised_messages()}
    assert len(shapes) > 50
    bad = {where: shape for where, shape in shapes.items()
           if shape != "X" and not MESSAGE_TEMPLATE.match(shape.split("\n")[0])}
    assert not bad, "messages not 'WHERE: PROBLEM':\n" + "\n".join(f"{w}: {s!r}" for w, s in bad.items())


def test_a_list_of_problems_heads_them_with_their_count():
    from hcsim.errors import invalid

    assert invalid("platform 'x'", ["node 'a': no kind"]) == "platform 'x': invalid (1 problem):\n  node 'a': no kind"
    assert invalid("platform 'x'", ["a: b", "c: d"]).splitlines()[0] == "platform 'x': invalid (2 problems):"


# --- outputs that fail at the end: the result is kept -------------------------------------------------------


def test_run_here_keeps_the_result_when_writing_fails_at_the_end(monkeypatch, tmp_path):
    import hcsim.run.simulation as simulation
    from hcsim.errors import OutputError
    from hcsim.run.prepare import Prepared
    from hcsim.run.scenario import Scenario

    def disk_full(out, result, outcome, platform, workload=None, xpus=None):
        raise OSError(28, "No space left on device", str(out / "result.json"))

    monkeypatch.setattr(simulation, "prepare", lambda scenario: Prepared(
        scenario, None, None, None, [], set(), True))
    monkeypatch.setattr(simulation.api, "run", lambda *args: "outcome")
    monkeypatch.setattr(simulation, "compute_model", lambda *args: None)  # the stub run has no workload graph
    monkeypatch.setattr(simulation, "traced_xpus", lambda *args: None)
    monkeypatch.setattr(simulation, "summarize", lambda *args: {"iteration_time_s": 1.0})
    monkeypatch.setattr(simulation, "write_outputs", disk_full)
    monkeypatch.setattr(simulation, "total_runs", lambda *args: 0)
    with pytest.raises(OutputError, match=r"result\.json: could not write the outputs \(No space left") as info:
        simulation.run_here(Scenario(), tmp_path / "out")
    assert info.value.result == {"iteration_time_s": 1.0}
    check_message(str(info.value))


def test_simulate_prints_the_result_before_saying_what_was_not_written(monkeypatch, capsys):
    import hcsim.cli.simulate as command
    import hcsim.run.simulation as simulation
    from hcsim.errors import OutputError

    def finished_but_unwritten(scenario, out, progress, **keys):
        raise OutputError(f"{out}/trace.json: could not write the outputs (No space left on device)", {"r": 1})

    monkeypatch.setattr(simulation, "run_here", finished_but_unwritten)
    monkeypatch.setattr(command, "summary", lambda result: f"the result {result}")
    code = main(["simulate", "--out", "runs/full"])
    captured = capsys.readouterr()
    assert code == 2 and "the result {'r': 1}" in captured.out
    assert "runs/full/trace.json: could not write the outputs" in captured.err
