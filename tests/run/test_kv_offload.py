"""KV offload tiers (serving.kv_offload, hcsim.run.serving): a preempted sequence's blocks and an evicted cached
prefix's go to host DRAM or CXL memory and come back by prefetch, swap or a read in place. Invariants (no request
lost or served twice, bytes moved = blocks x block bytes, per row as in total, HBM never over its blocks, no
recomputation while the tier has room), a prefetch's cost on the engine in closed form (none on an idle link, its
transfer on a saturated one), the same bytes from the same inputs, and bad keys refused by name."""

import csv
import json
import re
import subprocess
import sys

import pytest

from hcsim.errors import ConfigError
from hcsim.run.scenario import Scenario
from hcsim.run.serving import OCCUPANCY_COLUMNS, _platform, simulate_serving, write_serving_outputs
from hcsim.workload.model import ModelShape
from hcsim.workload.serving import KvOffload, ServingSpec, kv_bytes_per_token, make_requests

MODEL = ModelShape(name="llama", decoders=4, hidden=4096, heads=32, kv_heads=8, ffn=14336, mlp="swiglu",
                   norm="rmsnorm", dropout=False, sequence=8192, vocabulary=32000, positions="rope")
BLOCK = kv_bytes_per_token(MODEL) * 16  # one block of 16 tokens over the replica's XPUs
POLICIES = {  # label -> serving.kv_offload
    "recompute": None,
    "prefetch": KvOffload(tier="cxl", policy="prefetch"),
    "swap": KvOffload(tier="cxl", policy="swap"),
    "in_place": KvOffload(tier="cxl", policy="in_place"),
    "cpu, 200 MB": KvOffload(tier="cpu", policy="prefetch", size=2e8),
}


def mix(offload, **keys):
    """A mix that preempts: 12,000 tokens of KV blocks in HBM (4 % of an H100) for 30 requests of up to 2.5k tokens
    arriving at once, their prompts starting with one of 6 prefixes of 128 tokens."""
    return ServingSpec(name="s", **({"model": MODEL, "requests": 30, "prompt": (256, 2048), "output": (64, 512),
                                     "rate": 100.0, "seed": 3, "shared_prefix": 128, "prefix_groups": 6,
                                     "gpu_memory_utilization": 0.04, "kv_offload": offload} | keys))


SCENARIO = Scenario(platform="paper-cxl", xpus=2, tp=1, devices=("H100",), spill="error")


@pytest.fixture(scope="module")
def runs():
    return {label: simulate_serving(SCENARIO, mix(offload)) for label, offload in POLICIES.items()}


def test_every_request_is_served_once_whatever_the_policy(runs):
    requests = make_requests(mix(None))
    for label, result in runs.items():
        rows = result["per_request"]
        assert [row["request"] for row in rows] == list(range(len(requests))), label
        assert result["output_tokens"] == sum(q.output for q in requests), label
        assert all(row["arrival_s"] <= row["first_token_s"] <= row["finish_s"] for row in rows), label
        assert result["preemptions"] > 0, label  # (the mix does preempt: the tiers are used)


def test_bytes_moved_are_blocks_times_the_block_bytes_in_total_and_row_by_row(runs):
    for label, result in runs.items():
        if POLICIES[label] is None:
            continue
        name = "cxl_type3" if POLICIES[label].tier == "cxl" else "dram"
        tier = result["kv"]["tiers"][name]
        assert tier["stored_blocks"] > 0, label
        assert tier["stored_bytes"] == tier["stored_blocks"] * BLOCK, label
        assert tier["loaded_bytes"] == tier["loaded_blocks"] * BLOCK, label
        for column, total in (("stored_bytes", tier["stored_bytes"]), ("loaded_bytes", tier["loaded_bytes"]),
                              ("extended_read_bytes", tier["read_bytes"]),
                              ("hbm_read_bytes", result["kv"]["tiers"]["hbm"]["read_bytes"])):
            rows = sum(row[OCCUPANCY_COLUMNS.index(column)] for row in result["occupancy"])
            assert rows == pytest.approx(total, rel=1e-12, abs=0), (label, column)
        if POLICIES[label].policy == "in_place":  # read where they are, never copied back
            assert tier["loaded_blocks"] == 0 and tier["read_bytes"] > 0, label
        else:  # copied back, at most what went there; the steps read nothing beyond HBM
            assert 0 < tier["loaded_blocks"] <= tier["stored_blocks"] and tier["read_bytes"] == 0, label


def test_admission_stays_in_hbm_and_the_tier_within_its_size(runs):
    for label, result in runs.items():
        kv = result["kv"]
        assert 0 < kv["peak_hbm_tokens"] <= kv["hbm_tokens_per_replica"], label
    limited = runs["cpu, 200 MB"]
    blocks = limited["kv"]["tiers"]["dram"]["blocks_per_replica"]
    assert blocks == int(2e8 / BLOCK)  # size is per XPU, and at tp 1 x pp 1 an XPU holds whole blocks
    assert 0 < limited["kv"]["peak_extended_tokens"] <= blocks * 16


def test_an_unbounded_tier_recomputes_nothing_and_recompute_does(runs):
    assert runs["recompute"]["recomputed_tokens"] > 0
    for label in ("prefetch", "swap", "in_place"):
        assert runs[label]["recomputed_tokens"] == 0, label


def test_evicted_prefixes_offloaded_are_hit_again():
    """Prefixes of 40 groups that HBM cannot all keep: dropped, most are computed again; offloaded to CXL, every
    request after its group's first hits them."""
    keys = {"requests": 120, "prompt": (2100, 3000), "output": (8, 32), "rate": 20.0, "shared_prefix": 2048,
            "prefix_groups": 40, "gpu_memory_utilization": 0.042}
    dropped = simulate_serving(SCENARIO, mix(None, **keys))
    offloaded = simulate_serving(SCENARIO, mix(KvOffload(tier="cxl", policy="prefetch"), **keys))
    assert offloaded["prefix_cache"]["hit_rate"] > 1.5 * dropped["prefix_cache"]["hit_rate"]
    assert offloaded["kv"]["tiers"]["cxl_type3"]["loaded_blocks"] > 0


def test_offload_beside_disaggregation_serves_every_request_once():
    """Prefetches and KV handoffs share the core's flows (tags apart): two prefill and two decode replicas on a DGX,
    offloading to host DRAM, serve every request once, loading back no more than they stored."""
    spec = mix(KvOffload(tier="cpu", policy="prefetch"), disaggregation=(2, 2))
    result = simulate_serving(Scenario(platform="dgx-h100", xpus=4, tp=1, devices=None), spec)
    assert [row["request"] for row in result["per_request"]] == list(range(spec.requests))
    assert all(row["first_token_s"] <= row["kv_landed_s"] <= row["finish_s"] for row in result["per_request"])
    tier = result["kv"]["tiers"]["dram"]
    assert result["preemptions"] > 0 and 0 < tier["loaded_blocks"] <= tier["stored_blocks"]


def test_the_same_inputs_give_the_same_bytes(runs):
    again = simulate_serving(SCENARIO, mix(POLICIES["prefetch"]))
    first = {k: v for k, v in runs["prefetch"].items() if k != "wall_time_s"}
    assert json.dumps(first) == json.dumps({k: v for k, v in again.items() if k != "wall_time_s"})


def test_one_requests_decodes_read_its_cache_token_by_token_from_hbm():
    """One request of prompt P and output O alone: O - 1 decodes, the j-th reading P + j tokens of KV from HBM (its
    cache and the token it adds), (O - 1) P + O (O - 1) / 2 tokens in all, whether its steps ran one by one or as
    one run of decodes."""
    prompt, output = 1000, 300
    result = simulate_serving(Scenario(platform="paper-cxl", xpus=1, devices=("H100",)),
                              mix(None, requests=1, prompt=(prompt, prompt), output=(output, output), rate=None,
                                  shared_prefix=0, prefix_groups=1, gpu_memory_utilization=0.9))
    tokens = (output - 1) * prompt + output * (output - 1) // 2
    assert result["kv"]["tiers"]["hbm"]["read_bytes"] == tokens * kv_bytes_per_token(MODEL)
    assert result["steps_by_kind"]["decode"] == output - 1


def test_kv_csv_holds_the_bytes_moved_per_row(runs, tmp_path):
    write_serving_outputs(tmp_path, runs["swap"])
    with open(tmp_path / "kv.csv", newline="") as handle:
        rows = list(csv.DictReader(handle))
    assert tuple(rows[0]) == OCCUPANCY_COLUMNS
    stored = sum(float(row["stored_bytes"]) for row in rows)
    assert stored == pytest.approx(runs["swap"]["kv"]["tiers"]["cxl_type3"]["stored_bytes"], rel=1e-12)
    assert (tmp_path / "kv.png").stat().st_size > 0


PREFETCH = """
import math, sys
from array import array
from pathlib import Path
from hcsim.config import resolve_spec
from hcsim.engine import core
from hcsim.platform import build_platform, compile_platform, load_platform_spec
from hcsim.platform.routes import route_bandwidth, route_latency, shortest_routes
graph = build_platform(load_platform_spec(resolve_spec("paper-cxl", "platforms", Path(".")), {}), 1)
route = shortest_routes(graph, "xpu0.cxl", ["xpu0"])["xpu0"]
bandwidth, latency = route_bandwidth(graph, route), route_latency(graph, route)
platform = compile_platform(graph, [("xpu0.cxl", "xpu0")], "bf16")
layout = {"r_tp": array("i", [1]), "r_xpus": array("q", [0, 1]), "x_host": array("i", [0]),
          "x_ext": array("i", [1]), "x_dram": array("i", [-1]), "h_src": array("i", [1]), "h_dst": array("i", [0])}
compute = 10e-3
read, prefetch = float(sys.argv[1]) * compute * bandwidth, float(sys.argv[2]) * compute * bandwidth
step = (1.0, math.inf, 0.0, 0.0, 0.0, compute, 0.0, 0.0, 0.0, read, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0)
ends = []
def next_step(replica, now, done):
    if now == 0:
        return [step, (1.0, 0.0, prefetch, 0.0, 0.0, 5.0)] if prefetch else step
    ends.append(now)
    return None
core.load().run_steps(platform.tables, ["xpu0", "xpu0.cxl"], layout, next_step, True, lambda tag, now: None)
print(repr(ends[0]), repr(latency), repr(bandwidth))
"""


def step_end(read, prefetch):
    """One step of 10 ms of compute on xpu0 of paper-cxl reading `read` x (10 ms at the CXL link's bandwidth) in
    place from its CXL memory, beside a prefetch of `prefetch` x that over the same link (the flow serving's
    prefetches are, started with the step); the step's end, the route's latency and bandwidth."""
    done = subprocess.run([sys.executable, "-c", PREFETCH, str(read), str(prefetch)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return [float(value) for value in done.stdout.split()]


def test_a_prefetch_overlapped_costs_nothing_on_an_idle_link_and_its_transfer_on_a_saturated_one():
    compute = 10e-3
    alone, latency, bandwidth = step_end(0, 0)
    assert alone == pytest.approx(compute, rel=1e-12)
    assert step_end(0, 0.5)[0] == pytest.approx(compute, rel=1e-12)  # the link idle beside the compute: hidden
    saturated = step_end(2, 0)[0]  # the step's own read takes the link for twice its compute
    assert saturated == pytest.approx(latency + 2 * compute, rel=1e-12)
    prefetch = 0.5 * compute * bandwidth
    assert step_end(2, 0.5)[0] == pytest.approx(saturated + prefetch / bandwidth, rel=1e-12)  # it pays the copy


def test_in_place_is_for_coherent_memory_only():
    """CXL Type 3 on paper-cxl and a GH200's Grace memory (NVLink-C2C) are read in place; host DRAM over PCIe is
    not, and in_place there is refused by its key."""
    spec = mix(KvOffload(tier="cpu", policy="in_place"))
    assert _platform(Scenario(platform="gh200", xpus=1, devices=None), spec)[0].coherent
    assert _platform(SCENARIO, mix(KvOffload(tier="cxl", policy="in_place")))[0].coherent
    with pytest.raises(ConfigError, match=r"serving.kv_offload.policy: in_place .* needs coherent memory"):
        _platform(SCENARIO, spec)


SERVE = ["--set=workload=llama3-70b-serving", "--set=tp=8", "--set=xpus=8", "--set=devices=[H100]"]


@pytest.mark.parametrize("settings, expected", [
    (["--set=workload_overrides={serving.kv_offload: {tier: disk}}"],
     r"serving.kv_offload.tier: 'disk' is not one of cpu, cxl"),
    (["--set=workload_overrides={serving.kv_offload: {tier: cxl, policy: lazy}}"],
     r"serving.kv_offload.policy: 'lazy' is not one of prefetch, swap, in_place"),
    (["--set=workload_overrides={serving.kv_offload: {policy: swap}}"], r"serving.kv_offload.tier: is required"),
    (["--set=workload_overrides={serving.kv_offload: {tier: cxl, ratio: 2}}"], r"serving.kv_offload.ratio: unknown"),
    (["--set=workload_overrides={serving.kv_offload: {tier: cxl, size: 0GB}}"],
     r"serving.kv_offload.size: must be > 0"),
    (["--set=workload_overrides={serving.kv_offload: {tier: cxl}, serving.preemption: swap}"],
     r"serving.preemption: swap beside serving.kv_offload"),
    (["--set=platform=dgx-h100", "--set=workload_overrides={serving.kv_offload: {tier: cxl}}"],
     r"serving.kv_offload.tier: cxl: platform 'dgx-h100' has no CXL Type 3 memory"),
    (["--set=platform=paper-traditional", "--set=workload_overrides={serving.kv_offload: {tier: cpu, "
      "policy: in_place}}"], r"serving.kv_offload.policy: in_place .* needs coherent memory"),
])
def test_a_bad_kv_offload_ends_in_one_message_naming_the_key(settings, expected):
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", "--set=platform=paper-cxl", *SERVE,
                           *settings], capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert re.search(expected, done.stderr), done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
