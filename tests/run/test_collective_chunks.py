"""The scenario key `collective_chunks` and the workload key `gradients.chunks` reach every all-reduce."""

import pytest

from hcsim.errors import ConfigError
from hcsim.run.prepare import prepare
from hcsim.run.scenario import load_scenario


def _all_reduce_chunks(settings):
    workload = prepare(load_scenario(None, {"xpus": 16, "fidelity": "decoder", **settings})).workload
    return {data.get("chunks") for _, data in workload.nodes(data=True) if data.get("collective") == "all_reduce"}


def test_scenario_chunks_reach_every_all_reduce():
    assert _all_reduce_chunks({}) == {None}
    assert _all_reduce_chunks({"collective_chunks": 4, "collective": "hierarchical"}) == {4}
    assert _all_reduce_chunks({"workload_overrides": {"gradients.chunks": 2}}) == {2}
    hybrid = {"collective_chunks": 3, "tp": 2, "pp": 2, "workload": "llama2-13b-shape"}
    assert _all_reduce_chunks(hybrid) - {None} == {3}  # the hybrid builder's DP gradients (TP collectives: none)


@pytest.mark.parametrize("bad", [0, 1.5, "four"])
def test_bad_chunks_are_named(bad):
    with pytest.raises(ConfigError, match=r"collective_chunks"):
        load_scenario(None, {"collective_chunks": bad})
