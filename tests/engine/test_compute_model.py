"""The roofline compute model (hcsim.engine.compute_model): closed forms through the engine on SimGrid, and the peak
model untouched by op-level costs."""

import math

import pytest

from dataclasses import replace

from hcsim.engine.compute_model import ComputeModel, DeviceFactors, load_compute_model
from hcsim.errors import ConfigError
from hcsim.workload import add_comm, add_compute, add_dependency, new_workload
from hcsim.workload.ops import Op
from cases import H100, run  # tests/engine is on sys.path

MODEL = load_compute_model()


def gemm(m, n, k):
    return Op("g", "gemm", 2.0 * m * n * k, 2.0 * (m * k + k * n + m * n), m, n, k, 1)


def one_vertex(ops, flops=1e12, size=0.0):
    graph = new_workload("one", precision="fp32")  # the host runs at its FP32 peak
    add_compute(graph, "v", xpus=["xpu0"], flops=flops, memory_bytes=size, start=True)
    graph.nodes["v"]["ops"] = tuple(ops)
    return graph


def test_gemm_efficiency_is_the_product_of_the_dimension_factors():
    f = MODEL.device("V100")  # the formula form
    m, n, k = 2048, 1536, 6144
    h = f.gemm_half_dimension
    assert f.gemm_efficiency(m, n, k) == pytest.approx(f.gemm_max_efficiency * m / (m + h) * n / (n + h) * k / (k + h))
    assert f.gemm_efficiency(10**9, 10**9, 10**9) == pytest.approx(f.gemm_max_efficiency, rel=1e-6)


def test_an_instance_takes_the_sum_of_its_kernels_rooflines_plus_their_overheads():
    """With no host launch cost (the formula form, V100's factors on an H100 XPU)."""
    f = replace(MODEL.device("V100"), name="H100")
    model = ComputeModel(devices={"H100": f}, links=MODEL.links)
    peak, bandwidth = H100.fp32_flops, H100.memory_bandwidth
    big, small = gemm(4096, 4096, 4096), Op("norm", "memory", 0.0, 3e8)
    flash = Op("flash_attention", "attention", 1e12, 1e8)
    expected = (big.flops / (peak * f.gemm_efficiency(4096, 4096, 4096)) + small.bytes / (bandwidth * f.memory_efficiency)
                + flash.flops / (peak * f.flash_forward_efficiency) + 3 * f.kernel_overhead)
    ends, spans, _ = run(one_vertex([big, small, flash]), 1, compute_model=model)
    start, end = spans[1, "xpu0", "v"]
    assert end - start == pytest.approx(expected, rel=1e-12)
    assert math.isclose(model.time([big, small, flash], "H100", peak, bandwidth), expected, rel_tol=1e-12)


def test_the_host_paces_small_kernels_and_hides_behind_large_ones():
    """Kernels issued every `launch` s run in order, each no earlier than its issue: n tiny kernels take n
    launches; a long kernel first lets the host run ahead, so the tiny ones after it cost only their own time."""
    f = MODEL.device("H100")
    assert f.launch > 0 and f.backward_launch > 0
    peak, bandwidth = H100.fp16_flops, H100.memory_bandwidth
    tiny = Op("add", "memory", 0.0, 1e3)
    t_tiny = MODEL.op_time(f, tiny, peak, bandwidth)
    assert MODEL.time([tiny] * 10, "H100", peak, bandwidth) == pytest.approx(10 * f.launch + t_tiny, rel=1e-12)
    back = Op("add.bwd", "memory", 0.0, 1e3)
    assert MODEL.time([back] * 10, "H100", peak, bandwidth) == pytest.approx(10 * f.backward_launch + t_tiny)
    big = gemm(16384, 16384, 16384)
    t_big = MODEL.op_time(f, big, peak, bandwidth)
    assert t_big > 100 * f.launch
    unlimited = ComputeModel(devices={"H100": replace(f, power_gemm=0.0)}, links={})  # GEMMs at their own clock
    assert unlimited.time([big] + [tiny] * 10, "H100", peak, bandwidth) == pytest.approx(f.launch + t_big
                                                                                         + 10 * t_tiny)


def test_under_the_power_limit_gemms_keep_the_clock_their_share_leaves_them():
    """sustained_clock: GEMMs alone run at 1 / power_gemm of their clock (the H200's measured duty rows: 0.885),
    under the limit at full clock; time(clock=c) slows the compute-bound GEMMs alone, by c; gemm_share adds up
    what the share is of."""
    f = replace(MODEL.device("H100"), launch=0.0, backward_launch=0.0)
    model = ComputeModel(devices={"H100": f}, links={})
    peak, bandwidth = H100.fp16_flops, H100.memory_bandwidth
    big, copy, skinny = gemm(8192, 8192, 8192), Op("copy", "memory", 0.0, 1e9), gemm(1, 8192, 8192)
    t_big, t_copy, t_skinny = (model.op_time(f, op, peak, bandwidth) for op in (big, copy, skinny))
    assert f.sustained_clock(1.0) == pytest.approx(1 / f.power_gemm) and f.sustained_clock(1.0) < 0.9
    assert f.sustained_clock(0.2) == 1.0 and f.sustained_clock(0.5) < f.sustained_clock(0.3)
    assert model.gemm_share([big, copy, skinny], "H100", peak, bandwidth) == pytest.approx(
        (t_big, t_big + t_copy + t_skinny))  # the memory-bound GEMM is not counted
    clock = f.sustained_clock(0.8)
    assert model.time([big, copy, skinny], "H100", peak, bandwidth, clock=clock) == pytest.approx(
        t_big / clock + t_copy + t_skinny)


def test_a_jobs_gemms_run_at_the_clock_of_their_share_of_its_compute():
    """The engine takes the share over all of a job's compute vertices on a device, each once per XPU it runs
    on: a vertex of GEMMs alone beside one of copies three times as long keeps the clock (share 1/4), alone it
    runs at sustained_clock(1)."""
    f = MODEL.device("H100")
    peak, bandwidth = H100.fp32_flops, H100.memory_bandwidth  # the graph's precision: FP32
    big = gemm(8192, 8192, 8192)
    gemms, span = MODEL.gemm_share([big], "H100", peak, bandwidth)  # the span: the host's launch and the kernel
    _, spans, result = run(one_vertex([big]), 1, compute_model=MODEL)
    start, end = spans[1, "xpu0", "v"]
    alone = MODEL.time([big], "H100", peak, bandwidth, clock=f.sustained_clock(gemms / span))
    assert f.sustained_clock(gemms / span) < 0.9 and end - start == pytest.approx(alone, rel=1e-9)
    assert result["gemm_clocks"] == {"H100": f.sustained_clock(gemms / span)}  # what the run reports
    copies = Op("copy", "memory", 0.0, 3 * span * bandwidth * f.memory_efficiency)
    graph = one_vertex([big])
    add_compute(graph, "w", xpus=["xpu0"], flops=1e12)
    graph.nodes["w"]["ops"] = (copies,)
    add_dependency(graph, "v", "w")
    _, spans, result = run(graph, 1, compute_model=MODEL)
    start, end = spans[1, "xpu0", "v"]
    share = gemms / (span + MODEL.gemm_share([copies], "H100", peak, bandwidth)[1])
    assert share < 0.3 and f.sustained_clock(share) == 1.0 and end - start == pytest.approx(span, rel=1e-9)
    assert result["gemm_clocks"] == {}  # under the limit: nothing to report


def test_decode_attention_reads_its_cache_at_its_own_measured_rate():
    """Serving's decode attention (kind decode) at the H200's measured decode_efficiency (4.4 TB/s); the H100,
    with no decode rows measured, streams it at memory_efficiency."""
    from hcsim.workload.model import ModelShape
    from hcsim.workload.serving import attention_kernels

    model = ModelShape(name="gqa", hidden=4096, heads=32, kv_heads=8, decoders=1, ffn=14336, sequence=8192,
                       vocabulary=1000)
    (decode,) = attention_kernels(model, decode=64, context=64 * 4096)
    h200, h100 = MODEL.device("H200"), MODEL.device("H100")
    assert decode.kind == "decode" and h200.decode_efficiency > h200.memory_efficiency and not h100.decode_efficiency
    for f in (h200, h100):
        expected = decode.bytes / (4.8e12 * (f.decode_efficiency or f.memory_efficiency)) + f.kernel_overhead
        assert MODEL.op_time(f, decode, 989e12, 4.8e12) == pytest.approx(expected, rel=1e-12)


def test_a_memory_bound_gemm_takes_its_bytes_time():
    f = MODEL.device("H100")
    skinny = gemm(1, 8192, 8192)  # a matrix-vector product: 2 FLOP per 2-byte weight
    time = MODEL.op_time(f, skinny, H100.fp16_flops, H100.memory_bandwidth)
    assert time == pytest.approx(skinny.bytes / (H100.memory_bandwidth * f.memory_efficiency) + f.kernel_overhead)


def test_the_peak_model_ignores_ops():
    ends, spans, _ = run(one_vertex([gemm(64, 64, 64)], flops=H100.fp32_flops), 1)
    assert spans[1, "xpu0", "v"] == (0.0, 1.0)


@pytest.mark.parametrize("local", ["simulated", "analytic"])
def test_a_transfer_runs_at_the_link_kinds_factor_and_completes_after_the_call_latency(local):
    """Simulated transfers and the closed form of a collective inside one server (local_collectives) alike."""
    size = 9e9
    graph = new_workload("p2p")
    add_compute(graph, "a", xpus=["xpu0"], flops=0.0, start=True)
    add_comm(graph, "send", pairs=[("xpu0", "xpu1")], bytes=size, collective="p2p")
    add_dependency(graph, "a", "send", wait="group")
    _, peak_spans, _ = run(graph, 2, local_collectives=local)
    _, roof_spans, _ = run(graph, 2, compute_model=MODEL, local_collectives=local)
    link = MODEL.link("xpu_link", "H100")  # NVLink 4 between H100s; one step, NCCL's Simple protocol for 9 GB
    peak_time = peak_spans[1, "xpu1", "send"][1]
    latency = 2 * 100e-9  # two XPU_link hops of single_switch
    assert peak_time == pytest.approx(latency + size / 900e9)
    assert roof_spans[1, "xpu1", "send"][1] == pytest.approx(latency + size / (900e9 * link.bandwidth_factor)
                                                            + link.call_latency + link.step_latency)


def test_a_link_entry_names_only_nccl_s_protocols(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("links:\n  xpu_link:\n    devices:\n      H100:\n        bandwidth_factor: 0.8\n"
                    "        call_latency: 8us\n        protocols:\n          LL129: {bandwidth_factor: 0.7, "
                    "call_latency: 9us}\n")
    with pytest.raises(ConfigError, match=r"links\.xpu_link\.devices\.H100\.protocols\.LL129: not one of NCCL's "
                                          r"protocols besides Simple .*: LL, LL128"):
        load_compute_model(mine)


def test_a_device_entry_overrides_its_link_kind_for_that_device_only(tmp_path):
    mine = tmp_path / "mine.yaml"
    mine.write_text("links:\n  xpu_link:\n    bandwidth_factor: 0.5\n    call_latency: 1us\n    devices:\n"
                    "      V100: {bandwidth_factor: 0.6, call_latency: 2us, step_latency: 1us}\n")
    model = load_compute_model(mine)
    assert model.link("xpu_link", "V100").simple.latency(4) == pytest.approx(6e-6)
    assert model.link("xpu_link", "A100").bandwidth_factor == 0.5  # the kind's own
    assert model.link("xpu_link", "H100").bandwidth_factor == 0.5  # a user's kind replaces the built-in's whole
    assert model.link("ib", "H100") == MODEL.link("ib", "H100")  # kinds the file does not give stay built in


def test_factors_out_of_range_are_refused():
    with pytest.raises(ConfigError, match="max_efficiency must be in"):
        DeviceFactors(name="x", gemm_max_efficiency=1.5, gemm_half_dimension=0, memory_efficiency=1,
                      flash_forward_efficiency=1, flash_backward_efficiency=1, kernel_overhead=0)
    with pytest.raises(ConfigError, match="no roofline factors for device 'TPU'"):
        MODEL.device("TPU")
