"""The fast modes against the exact level, on every built-in platform (README "Fidelity levels").

- no run reports a link above 100 %, on every platform, fitting and spilling, data parallel and hybrid: a run
  that would is an internal error naming the link;
- ``local_collectives: analytic`` equals ``simulated`` where the server's links carry nothing else, and is
  never slower (it ignores contention) and within 0.1 % where they do;
- ``granularity: decoder`` is never slower than ``layer`` and at least half its time where each XPU's memory
  paths are its own (the paper's topologies).

Small cases (16 XPUs, 2 decoders of Llama 3 8B, or LLaMA2-13B's table), each in a fresh process (one SimGrid
Engine per process), two at a time.
"""

import itertools
from concurrent.futures import ThreadPoolExecutor

import networkx as nx
import pytest

from hcsim.engine.rules import check_link_loads
from hcsim.run.scenario import Scenario
from hcsim.run.simulation import simulate

PLATFORMS = ["dgx-a100", "dgx-h100", "paper-cxl", "paper-traditional"]  # every built-in platform
SMALL = {"model.decoders": 2, "training.attention": "standard"}  # the s x s scores make batch 12 spill
ALLOW_SPILL = {"spill": "allow"} if "spill" in Scenario.__dataclass_fields__ else {}  # DGX: out of memory by default


def _scenario(platform: str, memory: str, layout: str, **settings) -> dict:
    """16 XPUs of `platform` training 2 decoders of Llama 3 8B, data parallel (the paper's graph) or hybrid
    (tp 2, 1F1B), with a batch that fits in HBM or one that spills (about 95 GB per GPU, allowed to spill)."""
    batch = 12 if memory == "spills" else 1
    if layout == "dp":
        case = {"workload_overrides": SMALL | {"training.batch_per_xpu": batch}}
    else:
        case = {"workload_overrides": dict(SMALL), "tp": 2, "micro_batch": batch, "global_batch": 16 * batch}
    return {"platform": platform, "workload": "llama3-8b", "xpus": 16, **ALLOW_SPILL, **case, **settings}


def _run_all(cases: dict) -> dict:
    """Each case's result record; two simulations at a time, each in its own process."""
    keys = list(cases)
    with ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda key: simulate(Scenario(**cases[key])), keys))
    return dict(zip(keys, results))


MATRIX = list(itertools.product(PLATFORMS, ["fits", "spills"], ["dp", "hybrid"]))


@pytest.fixture(scope="module")
def every_platform():
    return _run_all({case: _scenario(*case) for case in MATRIX})


@pytest.mark.slow
@pytest.mark.parametrize("platform, memory, layout", MATRIX)
def test_no_link_is_busier_than_its_bandwidth(every_platform, platform, memory, layout):
    """Every XPU's memory traffic simulated and counted: no link above 100 % (issue 26: on a DGX two GPUs
    spilling over one PCIe uplink, one GPU's traffic dropped, reported the uplink 187 % busy), and the
    spilling cases spill."""
    result = every_platform[platform, memory, layout]
    spilled = max(row["spilled_bytes"] for row in result["memory"].values())
    assert spilled > 0 if memory == "spills" else spilled == 0
    assert all(0 <= row["utilization"] <= 1.0 for rows in result["links"].values() for row in rows)
    if (platform, memory) == ("dgx-h100", "spills"):  # issue 26's case, small: the shared PCIe uplink carries both
        assert result["links"]["pcie"][0]["utilization"] > 0


def test_a_link_above_its_bandwidth_is_an_internal_error():
    platform = nx.Graph()
    platform.add_edge("cpu0", "up0", bandwidth=64e9, latency=2.5e-7, kind="pcie")
    check_link_loads(platform, {("cpu0", "up0"): 64e9}, 1.0)  # 100 %: fine
    with pytest.raises(RuntimeError, match=r"internal error: link cpu0 -> up0 \(pcie.* 187\.5%"):
        check_link_loads(platform, {("cpu0", "up0"): 120e9}, 1.0)


@pytest.fixture(scope="module")
def local_collectives():
    # the peak model, whose collectives the closed forms are exact for (the kernel model's NCCL rings and call
    # latencies leave the analytic form 1.6e-10 slower on dgx-a100)
    return _run_all({(platform, memory, mode): _scenario(platform, memory, "hybrid", local_collectives=mode,
                                                         compute_model="peak")
                     for platform in PLATFORMS for memory in ("fits", "spills") for mode in ("simulated", "analytic")})


@pytest.mark.slow
@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("memory", ["fits", "spills"])
def test_analytic_local_collectives_are_never_slower_and_within_a_tenth_of_a_percent(local_collectives, platform,
                                                                                      memory):
    """TP 2 collectives inside a server as their closed form: exact where nothing else crosses the server's
    links meanwhile (the DGX NVSwitch: 1e-12); the data-parallel ring crosses the XPU switch of the paper's
    topologies too, which the closed form ignores (0.015 % faster on paper-traditional)."""
    simulated = local_collectives[platform, memory, "simulated"]["iteration_time_s"]
    analytic = local_collectives[platform, memory, "analytic"]["iteration_time_s"]
    assert simulated * (1 - 1e-3) <= analytic <= simulated * (1 + 1e-12)
    if platform.startswith("dgx"):
        assert analytic == pytest.approx(simulated, rel=1e-12)


@pytest.fixture(scope="module")
def granularities():
    return _run_all({(platform, decoders, level): {"platform": platform, "xpus": 16, "granularity": level,
                                                    "workload_overrides": {"model.decoders": decoders}}
                     for platform in ("paper-cxl", "paper-traditional") for decoders in (4, 40)
                     for level in ("layer", "decoder")})


@pytest.mark.slow
@pytest.mark.parametrize("platform", ["paper-cxl", "paper-traditional"])
@pytest.mark.parametrize("decoders", [4, 40])  # LLaMA2-13B FP32 (paper Table 4): 4 decoders fit, 40 spill
def test_fused_decoders_are_never_slower_and_at_most_twice_as_fast(granularities, platform, decoders):
    """A fused pass takes max(sum F / FLOP/s, sum B / B/s) where its layers take the sum of max(F / FLOP/s,
    B / B/s): between half and all of it, when each XPU's memory paths are its own."""
    layer = granularities[platform, decoders, "layer"]["iteration_time_s"]
    decoder = granularities[platform, decoders, "decoder"]["iteration_time_s"]
    assert layer / 2 <= decoder <= layer * (1 + 1e-12)
