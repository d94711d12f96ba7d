"""layer_split: proportional: decoders per pipeline stage in proportion to the stage's speed (the peak FLOP/s
of its slowest XPU), by the largest remainders, so that the stages of a mixed pipeline compute about as long:
each stage's decoders x (time of one decoder on it) is within one decoder's time of the pipeline's mean.
Prepared (graphs and memory), no SimGrid."""

import pytest

from hcsim.errors import ConfigError
from hcsim.platform.devices import builtin_catalog
from hcsim.run.prepare import prepare
from hcsim.run.scenario import Scenario
from hcsim.workload.split import largest_remainder

PEAK = {d: builtin_catalog()[d].peaks["fp32"] for d in ("H100", "A100", "V100")}
MIXED = dict(workload="llama2-7b", precision="fp32", xpus=16, tp=8, pp=2, global_batch=4,
             platform_overrides={"rack.servers": 1})  # FP32: the V100 has no BF16 peak


def decoders_per_stage(prepared, stages: int) -> list[int]:
    """Decoders of each stage's first forward pass, counted from the graph's attention vertices."""
    nodes = prepared.workload.nodes(data=True)
    return [sum(1 for name, d in nodes if d.get("stage") == s and d.get("micro_batch") == 0 and d.get("step") == "F"
                and name.endswith(".attn")) for s in range(stages)]


@pytest.mark.parametrize("slow", ["A100", "V100"])
def test_a_proportional_split_follows_the_stages_peaks_and_equalises_their_compute(slow):
    prepared = prepare(Scenario(**MIXED, devices=("H100", slow), layer_split="proportional"))
    counts = decoders_per_stage(prepared, 2)
    assert tuple(counts) == largest_remainder(32, [PEAK["H100"], PEAK[slow]])
    times = [counts[0] / PEAK["H100"], counts[1] / PEAK[slow]]  # decoder-FLOPs units: the same decoder on both
    assert abs(times[0] - times[1]) <= 1 / PEAK["H100"] + 1 / PEAK[slow]
    even = decoders_per_stage(prepare(Scenario(**MIXED, devices=("H100", slow))), 2)
    assert even == [16, 16] and max(times) < 16 / PEAK[slow]


def test_virtual_stages_weigh_every_chunk_of_a_stage_alike():
    prepared = prepare(Scenario(**MIXED, devices=("H100", "A100"), layer_split="proportional", schedule="interleaved",
                                virtual_stages=2))
    nodes = prepared.workload.nodes(data=True)
    chunks = {(d["stage"], d["chunk"]): 0 for _, d in nodes if "step" in d}
    for name, d in nodes:
        if d.get("micro_batch") == 0 and d.get("step") == "F" and name.endswith(".attn"):
            chunks[d["stage"], d["chunk"]] += 1
    expected = largest_remainder(32, [PEAK["H100"], PEAK["A100"]] * 2)  # chunk c of stage s at c * pp + s
    assert [chunks[s, c] for c in range(2) for s in range(2)] == list(expected)


def test_a_stage_left_without_decoders_and_a_misspelling_are_refused():
    with pytest.raises(ConfigError, match=r"layer_split: proportional gives pipeline stage 1 none of the 2 decoders"):
        prepare(Scenario(**{**MIXED, "workload_overrides": {"model.decoders": 2}}, devices=("H100", "V100"),
                         layer_split="proportional"))
    with pytest.raises(ConfigError, match=r"layer_split.*proportional"):
        Scenario(**MIXED, layer_split="proportionnal")
