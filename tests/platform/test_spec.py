"""Platform specs: units at the boundary, overrides, the device catalog, errors that name the field."""

import math

import pytest

from hcsim.config import REPO_ROOT
from hcsim.errors import ConfigError
from hcsim.platform import builtin_catalog, load_platform_spec
from hcsim.units import parse_quantity


@pytest.mark.parametrize("text, dimension, value", [
    ("128GB/s", "bandwidth", 128e9), ("12.5GB/s", "bandwidth", 12.5e9), ("200Gbit/s", "bandwidth", 25e9),
    ("200ns", "time", 200e-9), ("5us", "time", 5e-6), ("80GiB", "size", 80 * 2**30), ("1.5GB", "size", 1.5e9),
    ("67TFLOPS", "flops", 67e12), ("989TFLOPS", "flops", 989e12),
])
def test_unit_parsing(text, dimension, value):
    assert parse_quantity(text, dimension) == value


@pytest.mark.parametrize("text", [128e9, "128", "128GB", "fast"])
def test_bandwidth_without_a_bandwidth_unit_is_an_error(text):
    with pytest.raises(ConfigError, match="links.x"):
        parse_quantity(text, "bandwidth", "links.x")


def test_catalog_has_the_paper_devices():
    catalog = builtin_catalog()
    h100, a100, v100 = catalog["H100"], catalog["A100"], catalog["V100"]
    assert (h100.fp32_flops, h100.fp16_flops, h100.memory, h100.memory_bandwidth) == (67e12, 989e12, 80 * 2**30, 3.35e12)
    assert (a100.fp32_flops, a100.fp16_flops, a100.memory) == (19.5e12, 312e12, 80 * 2**30)
    assert (v100.fp32_flops, v100.fp16_flops, v100.memory, v100.memory_bandwidth) == (15.7e12, 125e12, 32 * 2**30, 0.9e12)


def test_overrides_apply_before_checking(cxl_spec):
    spec = load_platform_spec("paper-cxl", {"coherent": False, "devices": ["H100", "A100"],
                                            "links.cxl.bandwidth": "256GB/s", "links.cxl.latency": "1us"})
    assert spec.coherent is False and spec.devices == ("H100", "A100")
    assert (spec.links["cxl"].bandwidth, spec.links["cxl"].latency) == (256e9, 1e-6)
    assert spec.links["upi"] == cxl_spec.links["upi"]
    assert math.isinf(spec.cxl.type3_capacity)
    assert dict(spec.overrides)["coherent"] is False


def test_every_problem_is_reported_at_once_with_its_key():
    with pytest.raises(ConfigError) as info:
        load_platform_spec("paper-cxl", {"links.cxl.latncy": "1us", "links.upi.bandwidth": "0GB/s",
                                         "links.pcie.latency": "-5ns", "devices": ["H100", "H10"],
                                         "server.cpus": 0, "cxl.type3_attach": "swich", "xpus": "many",
                                         "colour": "blue"})
    message = str(info.value)
    for expected in [r"links.cxl.latncy: unknown key (did you mean 'latency'?)", "links.upi.bandwidth: must be > 0",
                     "links.pcie.latency: must be > 0", "devices[1]: unknown device 'H10' (did you mean 'H100'?)",
                     "server.cpus: must be >= 1", "cxl.type3_attach: 'swich' is not one of switch, xpu",
                     "xpus: expected an integer", "colour: unknown key"]:
        assert f"paper-cxl.yaml: {expected}" in message


def test_override_through_a_scalar_names_the_key():
    with pytest.raises(ConfigError, match=r"override 'xpus.count': xpus is 4096 in paper-cxl.yaml, not a mapping"):
        load_platform_spec("paper-cxl", {"xpus.count": 3})


def test_custom_device_catalog(tmp_path):
    (tmp_path / "mine.yaml").write_text(
        "devices:\n  MyASIC:\n    fp32: 50TFLOPS\n    fp16: 400TFLOPS\n    memory: 48GiB\n    memory_bandwidth: 2TB/s\n")
    spec_file = tmp_path / "pod.yaml"
    paper = (REPO_ROOT / "platforms" / "paper-cxl.yaml").read_text()
    spec_file.write_text(paper.replace("device_catalog: []", "device_catalog: [mine.yaml]"))
    spec = load_platform_spec(spec_file, {"devices": ["MyASIC", "H100"], "xpus": 256})
    assert spec.catalog["MyASIC"].fp16_flops == 400e12
    assert spec.device_of_rack(0).name == "MyASIC" and spec.device_of_rack(1).name == "H100"
    (tmp_path / "bad.yaml").write_text("devices:\n  H100:\n    fp32: 1TFLOPS\n    fp16: 2TFLOPS\n    memory: 1GiB\n"
                                       "    memory_bandwidth: 1TB/s\n")
    with pytest.raises(ConfigError, match=r"device_catalog\[0\]: device 'H100' is already defined"):
        load_platform_spec(spec_file, {"device_catalog": ["bad.yaml"]})


def test_a_relative_device_catalog_is_found_beside_the_spec_then_in_the_current_directory(tmp_path, monkeypatch):
    (tmp_path / "mine.yaml").write_text(
        "devices:\n  MyASIC:\n    fp32: 50TFLOPS\n    fp16: 400TFLOPS\n    memory: 48GiB\n    memory_bandwidth: 2TB/s\n")
    monkeypatch.chdir(tmp_path)
    spec = load_platform_spec("paper-cxl", {"device_catalog": ["mine.yaml"], "devices": ["MyASIC"]})
    assert spec.device_of_rack(0).name == "MyASIC"
    with pytest.raises(ConfigError, match=r"device_catalog\[0\]: nowhere.yaml: no such file"):
        load_platform_spec("paper-cxl", {"device_catalog": ["nowhere.yaml"]})


def test_unknown_spec_name_lists_the_builtins():
    with pytest.raises(ConfigError, match="paper-cxl, paper-traditional"):
        load_platform_spec("paper-cxll")
