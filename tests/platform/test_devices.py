"""The precision-aware device catalog: dense peaks per precision, one lookup, errors that name what exists."""

import pytest

from hcsim.errors import ConfigError
from hcsim.platform import PRECISIONS, build_platform, load_catalog, load_platform_spec, peak_flops, single_switch
from hcsim.platform.compile import compile_platform
from hcsim.platform.devices import REQUIRED_PRECISIONS, Device


def test_paper_figures_are_unchanged(catalog):
    """REFERENCE.md's table: what every paper experiment computes with."""
    h100, a100, v100 = catalog["H100"], catalog["A100"], catalog["V100"]
    assert (peak_flops(h100, "fp32"), peak_flops(h100, "fp16")) == (67e12, 989e12)
    assert (peak_flops(a100, "fp32"), peak_flops(a100, "fp16")) == (19.5e12, 312e12)
    assert (peak_flops(v100, "fp32"), peak_flops(v100, "fp16")) == (15.7e12, 125e12)


def test_every_device_has_the_required_precisions_and_positive_figures(catalog):
    for device in catalog.values():
        assert set(REQUIRED_PRECISIONS) <= set(device.precisions) <= set(PRECISIONS)
        assert device.memory > 0 and device.memory_bandwidth > 0


def test_peaks_rise_as_precision_narrows(catalog):
    """Tensor cores: tf32 below bf16 = fp16 below fp8, on every device that has them (datasheets)."""
    for device in catalog.values():
        peaks = device.peaks
        if "bf16" in peaks:
            assert peaks["bf16"] == peaks["fp16"]
        if "tf32" in peaks:
            assert peaks["fp32"] < peaks["tf32"] < peaks["fp16"]
        if "fp8" in peaks:
            # twice the fp16 rate; H100 / H200 keep the paper's 989 (datasheet 989.5), hence rel 1e-3
            assert peaks["fp8"] == pytest.approx(2 * peaks["fp16"], rel=1e-3)


def test_datasheet_figures_of_the_new_devices(catalog):
    h200, b200, mi300x, a100_40 = catalog["H200"], catalog["B200"], catalog["MI300X"], catalog["A100-40GB"]
    assert (h200.memory, h200.memory_bandwidth) == (141 * 2**30, 4.8e12)
    assert peak_flops(b200, "fp8") == 4.5e15 and b200.memory_bandwidth == 7.7e12
    assert peak_flops(mi300x, "bf16") == pytest.approx(1307.4e12) and mi300x.memory == 192 * 2**30
    assert peak_flops(a100_40, "tf32") == 156e12 and a100_40.memory_bandwidth == 1555e9


def test_a_missing_precision_names_the_device_the_precision_and_what_it_has(catalog):
    with pytest.raises(ConfigError, match=r"device 'V100' has no bf16 peak FLOP/s; it has fp32, fp16\b"):
        peak_flops(catalog["V100"], "bf16")
    with pytest.raises(ConfigError, match=r"device 'A100' has no fp8 peak FLOP/s; it has fp32, tf32, bf16, fp16\b"):
        peak_flops(catalog["A100"], "fp8")
    with pytest.raises(ConfigError, match=r"precision 'int4' is not one of fp32, tf32, bf16, fp16, fp8"):
        peak_flops(catalog["H100"], "int4")


def test_graph_nodes_carry_every_peak_and_the_older_keys(catalog):
    graph = single_switch(1, catalog["A100"])
    node = graph.nodes["xpu0"]
    assert node["peak_flops"] == dict(catalog["A100"].peaks)
    assert (node["fp32_flops"], node["fp16_flops"]) == (19.5e12, 312e12)
    assert peak_flops(node, "tf32") == 156e12
    with pytest.raises(ConfigError, match=r"device 'A100' has no fp8"):
        peak_flops(node, "fp8")


def test_a_node_with_only_the_older_keys_still_works():
    node = {"kind": "xpu", "device": "Mine", "fp32_flops": 1e12, "fp16_flops": 4e12}
    assert [peak_flops(node, p) for p in ("fp32", "fp16", "bf16")] == [1e12, 4e12, 4e12]
    with pytest.raises(ConfigError, match=r"device 'Mine' has no fp8"):
        peak_flops(node, "fp8")


def test_compiled_host_speed_is_the_peak_at_the_run_precision(catalog):
    graph = build_platform(load_platform_spec("paper-traditional", {"xpus": 8}), 8)
    for precision, expected in [("fp32", 67e12), ("tf32", 494.5e12), ("bf16", 989e12), ("fp8", 1979e12)]:
        xml = compile_platform(graph, [("xpu0", "xpu1")], precision).xml
        assert f'id="xpu0" speed="{expected!r}f"' in xml


def test_catalog_errors_name_the_file_and_key(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text("devices:\n  X:\n    fp32: 1TFLOPS\n    fp8: 8\n    int4: 9TFLOPS\n    memory: 1GiB\n"
                    "    memory_bandwidth: 1TB/s\n")
    with pytest.raises(ConfigError) as info:
        load_catalog(path)
    message = str(info.value)
    for expected in ("devices.X.fp16: is required", "devices.X.fp8:", "devices.X.int4: unknown key"):
        assert expected in message
    with pytest.raises(ConfigError, match=r"device 'Y': fp8 peak must be > 0"):
        Device(name="Y", fp32_flops=1.0, fp16_flops=1.0, peaks={"fp8": 0.0}, memory=1.0, memory_bandwidth=1.0)
    with pytest.raises(ConfigError, match=r"device 'Y': peaks\['fp16'\] = 2.0 differs from fp16_flops = 1.0"):
        Device(name="Y", fp32_flops=1.0, fp16_flops=1.0, peaks={"fp16": 2.0}, memory=1.0, memory_bandwidth=1.0)
