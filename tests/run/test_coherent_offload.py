"""offload: coherent: training state in the XPU's coherent extended memory, read and updated in place beside the
computation, on a CXL Type 3 expander (what offload: cxl does) or a superchip's CPU memory over NVLink-C2C."""

import pytest

from hcsim.errors import ConfigError
from hcsim.run.prepare import prepare
from hcsim.run.scenario import load_scenario
from hcsim.run.simulation import simulate

GH200 = ["platform=gh200", "workload=llama3-8b", "xpus=8", "tp=4", "global_batch=8", "iterations=2", "zero=1",
         "compute_model=peak"]


def test_on_a_superchip_the_state_lives_in_the_grace_memory_and_is_read_over_c2c():
    prepared = prepare(load_scenario(None, GH200 + ["offload=coherent"]))
    optimizer = [d for _, d in prepared.workload.nodes(data=True) if d.get("phase") == "optimizer"]
    assert optimizer and all(d.get("offload") == "coherent" and d["spilled_xpus"] == frozenset(d["xpus"])
                             for d in optimizer)
    nodes = prepared.platform.nodes
    for x in prepared.xpus:
        memory = nodes[x]["extended_memory"]
        assert nodes[memory]["role"] == "dram"
        assert prepared.platform.edges[x, nodes[memory]["owner"]]["kind"] == "c2c"
    # read in place: the reads travel memory -> CPU -> XPU over C2C, nothing is copied into HBM first
    assert all((nodes[x]["extended_memory"], x) in prepared.pairs for x in prepared.xpus)


def test_in_place_reads_stall_the_step_where_none_keeps_the_state_in_hbm():
    coherent, none = (simulate(load_scenario(None, GH200 + [f"offload={o}"])) for o in ("coherent", "none"))
    assert coherent["memory"]["GH200"]["offloaded_bytes"] > 0 == none["memory"]["GH200"]["offloaded_bytes"]
    assert coherent["breakdown"]["GH200"]["memory_stall_s"] > none["breakdown"]["GH200"]["memory_stall_s"]


def test_on_paper_cxl_coherent_is_cxl():
    base = ["workload=llama2-13b-shape", "xpus=8", "tp=2", "global_batch=8", "zero=1", "iterations=1",
            "compute_model=peak"]
    cxl, coherent = (simulate(load_scenario(None, base + [f"offload={o}"])) for o in ("cxl", "coherent"))
    assert coherent["iteration_times_s"] == cxl["iteration_times_s"]
    assert coherent["breakdown"] == cxl["breakdown"]


def test_offload_cxl_on_a_superchip_names_coherent():
    with pytest.raises(ConfigError, match=r"offload: cxl: .*gives XPU 'xpu0' dram memory \(offload: coherent reads"):
        prepare(load_scenario(None, GH200 + ["offload=cxl"]))
    with pytest.raises(ConfigError, match=r"offload: coherent: .*dgx-h100.*coherent: False"):
        prepare(load_scenario(None, ["platform=dgx-h100", "workload=llama3-8b", "xpus=8", "tp=4",
                                     "global_batch=8", "zero=1", "offload=coherent"]))


def test_a_cpu_step_runs_at_the_cpu_s_speed_beside_its_dram_reads_under_the_kernel_model(tmp_path):
    """offload: cpu's optimizer step on the Grace CPU: the kernel model times GPU kernels, not this step, which
    takes max(FLOPs / the CPU's FLOP/s, latency + bytes / its DRAM bandwidth) under either compute model (it was
    priced as the GPU's kernels and then run at the CPU's speed: 139x too slow)."""
    import csv

    settings = ["platform=gh200", "workload=llama3-8b", "xpus=8", "tp=4", "global_batch=8", "iterations=1",
                "zero=1", "offload=cpu", "trace_xpus=[xpu0]", "compute_model=roofline"]
    simulate(load_scenario(None, settings), out=tmp_path)
    (row,) = [r for r in csv.DictReader(open(tmp_path / "trace.csv")) if r["vertex"] == "s0.optimizer"]
    prepared = prepare(load_scenario(None, settings))
    step, nodes = prepared.workload.nodes["s0.optimizer"], prepared.platform.nodes
    memory = nodes["xpu0"]["host_memory"]
    cpu = nodes[memory]["owner"]
    dram = prepared.platform.edges[cpu, memory]
    closed = max(step["flops"] / nodes[cpu]["flops"], dram["latency"] + step["memory_bytes"] / dram["bandwidth"])
    assert float(row["end_s"]) - float(row["start_s"]) == pytest.approx(closed, rel=1e-9)


def test_a_serving_replica_on_a_superchip_reads_its_spilled_kv_in_place_over_c2c():
    """Spilled KV blocks live in the Grace CPU's memory and are read in place beside the HBM reads (the coherent
    form), as on a CXL Type 3 expander; on a DGX the host DRAM is copied first."""
    from hcsim.run.serving import _platform, serving_workload

    def platform_of(settings):
        scenario = load_scenario(None, ["workload=llama3-70b-serving", "tp=4", "spill=allow", *settings])
        return _platform(scenario, serving_workload(scenario))[0]

    gh200 = platform_of(["platform=gh200", "xpus=4"])
    assert gh200.coherent and gh200.spilled_to == "dram"
    dgx = platform_of(["platform=dgx-h100", "xpus=8"])
    assert not dgx.coherent and dgx.spilled_to == "dram"
