"""Serving on the engine core, fuzzed (hypothesis): a small serving workload file whose ``serving:`` keys are
drawn at random (valid and not), run to the end on the built-in platforms, the new ones included (gh200,
gb200-nvl72, cxl-pool), with or without prefill/decode disaggregation. Each run either serves every request
once with all its tokens, in order of time, within its budgets (tokens and sequences per step, the KV blocks
in HBM), or is refused before it starts with hcsim's own error in the template; the core never aborts and
nothing else is raised. tests/test_fuzz.py fuzzes the same workload up to its first step, without the core.
"""

import os

import pytest
import yaml
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from hcsim.errors import MESSAGE_TEMPLATE, HcsimError
from hcsim.run.scenario import load_scenario
from hcsim.run.serving import serving_workload, simulate_serving

# Llama-3 8B's shape with 2 decoders: steps of a few ms, a run of a few requests in well under a second
BASE = {"kind": "serving", "name": "fuzz",
        "model": {"name": "tiny-llama", "decoders": 2, "hidden": 4096, "heads": 32, "kv_heads": 8, "ffn": 14336,
                  "mlp": "swiglu", "norm": "rmsnorm", "dropout": False, "sequence": 4096, "vocabulary": 128256,
                  "positions": "rope"},
        "serving": {"requests": 4, "prompt": [16, 300], "output": [2, 40], "rate": 50, "seed": 1}}

SERVING_VALUES = {
    "requests": [1, 3, 6, 0, -1, 2.5, "many", None],
    "prompt": [[16, 300], 64, [300, 16], [1, 4096], [1, 5000], 0, ".nan", [8, 8, 8]],
    "output": [[2, 40], 1, 2, [3, 3], [2, 4095], -4, "x"],
    "rate": [None, 0.5, 1000, 0, -2, float("nan"), float("inf"), "fast"],
    "scheduler": ["vllm-v1", "vllm-v0", "sglang", "vllm-v9", 1],
    "max_num_seqs": [1, 2, 64, 0, 1.5],
    "max_num_batched_tokens": [16, 64, 512, 8192, 0, -5, float("nan")],
    "block_size": [8, 16, 128, 3, 0],
    "preemption": ["recompute", "swap", "drop"],
    "swap_space": ["1GB", "0GB", "4", 4, "-1GB"],
    "gpu_memory_utilization": [0.9, 0.05, 0.001, 0, 1.5, float("nan")],
    "prefix_caching": [True, False, "yes"],
    "chunked_prefill": [True, False, 3],
    "shared_prefix": [0, 8, 15, 100000, -1],
    "prefix_groups": [1, 3, 0],
    "step_overhead": ["0s", "20us", "-1us", 5],
    "disaggregation": [{"prefill": 1, "decode": 1}, {"prefill": 1, "decode": 3}, {"prefill": 0, "decode": 2},
                       {"prefill": 1}, [1, 1], {"prefill": 1, "decode": 1, "extra": 2}],
    "seed": [0, 7, -1, 1.5],
    "nope": [1],
}
WHERE = {"dgx-h100": ["H100"], "paper-cxl": ["H100"], "cxl-pool": ["H100"], "gh200": ["GH200"],
         "gb200-nvl72": ["GB200"]}
changes = st.dictionaries(st.sampled_from(sorted(SERVING_VALUES)), st.none(), max_size=4).flatmap(
    lambda keys: st.fixed_dictionaries({k: st.sampled_from(SERVING_VALUES[k]) for k in keys}))
removed = st.lists(st.sampled_from(["requests", "prompt", "output", "rate", "seed"]), max_size=2, unique=True)
layouts = st.sampled_from([{"xpus": 1, "tp": 1}, {"xpus": 2, "tp": 1}, {"xpus": 2, "tp": 2}, {"xpus": 4, "tp": 1},
                           {"xpus": 4, "tp": 2}, {"xpus": 4, "tp": 2, "pp": 2}, {"xpus": 2, "tp": 1, "spill": "allow"}])


def check_served(result, serving: dict) -> None:
    """Every request served once with all its tokens, in order of time, within the step and KV budgets."""
    rows = result["per_request"]
    assert [r["request"] for r in rows] == list(range(len(rows)))
    if isinstance(serving.get("requests"), int):
        assert len(rows) == serving["requests"]
    assert result["output_tokens"] == sum(r["output"] for r in rows)
    for r in rows:
        assert 0 <= r["arrival_s"] <= r["first_token_s"] <= r["finish_s"] <= result["makespan_s"], r
        assert r["ttft_s"] == pytest.approx(r["first_token_s"] - r["arrival_s"], abs=1e-12)
    scheduler = result["scheduler"]
    assert result["max_step_tokens"] <= scheduler["max_num_batched_tokens"]
    assert max(row[4] for row in result["occupancy"]) <= scheduler["max_num_seqs"]
    assert result["kv"]["peak_hbm_tokens"] <= result["kv"]["hbm_tokens_per_replica"]


@settings(max_examples=int(os.environ.get("HCSIM_FUZZ_EXAMPLES", 25)), derandomize=True, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])
@given(changes, removed, st.sampled_from(sorted(WHERE)), layouts)
def test_a_random_serving_run_serves_every_request_once_or_is_refused_before_it_starts(tmp_path, change, gone,
                                                                                       platform, layout):
    serving = {k: v for k, v in {**BASE["serving"], **change}.items() if k not in gone}
    note(f"serving {serving}; platform {platform}; {layout}")
    path = tmp_path / "fuzz.yaml"
    path.write_text(yaml.safe_dump({**BASE, "serving": serving}))
    try:
        scenario = load_scenario(None, {"workload": str(path), "platform": platform, "devices": WHERE[platform],
                                        **layout})
        result = simulate_serving(scenario, serving_workload(scenario))
    except HcsimError as err:
        event("refused")
        first = str(err).split("\n")[0]
        assert MESSAGE_TEMPLATE.match(first), f"not 'WHERE: PROBLEM': {first!r}"
        return
    event("served")
    check_served(result, serving)
