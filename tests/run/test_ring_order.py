"""The collectives' rank order: topology order by default, interleaved servers, or the scenario's list."""

import json
import subprocess
import sys

import pytest

from hcsim.errors import ConfigError
from hcsim.platform import build_platform, load_platform_spec
from hcsim.run.prepare import rank_order
from hcsim.run.scenario import load_scenario

SMALL = ["xpus=16", "iterations=1", "coherent=false"]  # two servers joined by 12.5 GB/s Ethernet


def _iteration_time(*settings):
    args = [a for s in (*SMALL, *settings) for a in ("--set", s)]
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", "--json", *args], capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)["iteration_time_s"]


def _order(setting):
    scenario = load_scenario(None, [*SMALL, setting])
    platform = build_platform(load_platform_spec("paper-cxl", scenario.platform_settings()), 16)
    return rank_order(platform, [f"xpu{i}" for i in range(16)], scenario)


def test_interleaved_alternates_servers():
    assert _order("ring_order=interleaved") == [f"xpu{i // 2 + 8 * (i % 2)}" for i in range(16)]


def test_an_explicit_order_is_used_and_checked():
    order = [f"xpu{i}" for i in reversed(range(16))]
    assert _order(f"ring_order=[{', '.join(order)}]") == order
    with pytest.raises(ConfigError, match=r"ring_order: must list each of the 16 XPUs once; missing xpu15"):
        _order(f"ring_order=[{', '.join(order[1:])}]")
    with pytest.raises(ConfigError, match=r"ring_order: expected topology or interleaved or a list of XPU names"):
        _order("ring_order=random")


def test_the_topology_order_is_the_default_and_the_cheapest():
    """Listing the topology order changes nothing, bit for bit; interleaving servers puts every ring hop on
    Ethernet, which can only be slower."""
    default = _iteration_time()
    assert _iteration_time(f"ring_order=[{', '.join(f'xpu{i}' for i in range(16))}]") == default
    assert _iteration_time("ring_order=interleaved") > default
