"""Property tests (hypothesis): random scenarios, platform specs, workload specs and YAML text either
load, build and prepare, or raise hcsim's own error with a message in the template; never anything else.

Cheap by design: nothing here runs SimGrid (scenarios are prepared, platforms built with at most a few
dozen XPUs, workload graphs over two XPUs).
"""

from __future__ import annotations

import copy
import os

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hcsim.config import REPO_ROOT, parse_yaml
from hcsim.errors import MESSAGE_TEMPLATE, HcsimError
from hcsim.run.scenario import SCENARIO_KEYS

# HCSIM_FUZZ_EXAMPLES=1000 for a longer hunt than the suite's
FUZZ = settings(max_examples=int(os.environ.get("HCSIM_FUZZ_EXAMPLES", 60)), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                        HealthCheck.too_slow])

UNITS = ["GB/s", "Gbit/s", "ns", "us", "s", "GiB", "GB", "TFLOPS", "GFLOP", "", "furlongs", "B/s"]
quantities = st.builds(lambda n, u: f"{n}{u}", st.one_of(st.integers(-10, 10**4), st.floats(allow_nan=True)),
                       st.sampled_from(UNITS))
scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 300), st.sampled_from([10**9, 2**63, -(10**12)]),
                    st.floats(allow_nan=True, allow_infinity=True), st.text(max_size=12), quantities,
                    st.sampled_from(["H100", "A100", "ring", "layer", "decoder", "step", "flow", "auto", "all",
                                     "representative", "topology", "interleaved", "xpu0", "paper-cxl",
                                     "paper-traditional", "llama2-7b", "true", "unbounded"]))
values = st.recursive(scalars, lambda inner: st.one_of(st.lists(inner, max_size=4),
                                                       st.dictionaries(st.text(max_size=8), inner, max_size=3)),
                      max_leaves=8)


def own_error_or_nothing(action) -> None:
    """Run `action`; an HcsimError is fine (its message follows the template), anything else fails."""
    try:
        action()
    except HcsimError as err:
        first = str(err).split("\n")[0]
        assert MESSAGE_TEMPLATE.match(first), f"not 'WHERE: PROBLEM': {first!r}"


@pytest.fixture(autouse=True)
def no_engine(monkeypatch):
    def tripwire(*args, **kwargs):
        raise AssertionError("the fuzz tests never run the engine")

    monkeypatch.setattr("hcsim.run.simulation.execute", tripwire)


@FUZZ
@given(st.dictionaries(st.sampled_from([*SCENARIO_KEYS, "fidelity", "xpu_fidelity", "collective_fidelity", "nope",
                                        "platform_overrides.links.cxl.latency", "workload_overrides.model.decoders"]),
                       values, max_size=5),
       st.integers(1, 16))
def test_a_random_scenario_prepares_or_raises_hcsims_error(mapping, xpus):
    from hcsim.run.prepare import prepare
    from hcsim.run.scenario import load_scenario

    mapping.setdefault("xpus", xpus)  # small by default: preparing 4096 XPUs is seconds, not a property

    def action():
        scenario = load_scenario(None, mapping)
        if scenario.xpus <= 64 and (scenario.global_batch or 1) <= 16:  # a small graph: preparing stays cheap
            prepare(scenario)

    own_error_or_nothing(action)


def _paths(data, prefix=()):
    """Every dotted path of a nested mapping (lists entered by index)."""
    if isinstance(data, dict):
        for key, value in data.items():
            yield (*prefix, key)
            yield from _paths(value, (*prefix, key))
    elif isinstance(data, list):
        for index, value in enumerate(data):
            yield (*prefix, index)
            yield from _paths(value, (*prefix, index))


def _mutate(data, path, value, delete):
    data = copy.deepcopy(data)
    node = data
    for part in path[:-1]:
        node = node[part]
    if delete:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return data


def _mutations(base):
    paths = list(_paths(base))
    return st.lists(st.tuples(st.sampled_from(paths), values, st.booleans()), min_size=1, max_size=3)


def _apply(base, mutations):
    data = base
    for path, value, delete in mutations:
        try:
            data = _mutate(data, path, value, delete)
        except (KeyError, IndexError, TypeError):  # an earlier mutation removed or replaced the path
            continue
    return data


PAPER = yaml.safe_load((REPO_ROOT / "platforms" / "paper-cxl.yaml").read_text())
LLAMA = yaml.safe_load((REPO_ROOT / "workloads" / "llama2-13b.yaml").read_text())


@FUZZ
@given(_mutations(PAPER), st.integers(1, 40))
def test_a_random_structured_platform_builds_or_raises_hcsims_error(tmp_path, mutations, xpus):
    from hcsim.platform import build_platform, load_platform_spec

    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(_apply(PAPER, mutations)))

    def action():
        spec = load_platform_spec(path)
        build_platform(spec, min(xpus, spec.xpus))

    own_error_or_nothing(action)


NAMES = ["a", "b", "sw", "sw2", "pool", "cpu", "a.hbm", 3, None]
nodes = st.fixed_dictionaries({"name": st.sampled_from(NAMES),
                               "kind": st.sampled_from(["xpu", "switch", "memory", "cpu", "nic", "rack", 1])},
                              optional={"device": st.sampled_from(["H100", "V100", "H200", 3]),
                                        "capacity": st.sampled_from(["1TiB", "0GB", "unbounded", 5]),
                                        "role": st.sampled_from(["dram", "cxl_type3", "hbm", "x"]),
                                        "owner": st.sampled_from(NAMES),
                                        "extended_memory": st.sampled_from(NAMES),
                                        "transit": st.booleans()})
links = st.fixed_dictionaries({"ends": st.one_of(st.lists(st.sampled_from(NAMES), min_size=0, max_size=3), scalars),
                               "kind": st.sampled_from(["cxl", "eth", "pcie", "hbm", "warp"])},
                              optional={"bandwidth": st.one_of(quantities, scalars),
                                        "latency": st.one_of(quantities, scalars)})


@FUZZ
@given(st.lists(nodes, max_size=6), st.lists(links, max_size=6),
       st.lists(st.lists(st.sampled_from(NAMES), max_size=5), max_size=3))
def test_a_random_explicit_platform_builds_or_raises_hcsims_error(tmp_path, node_list, link_list, routes):
    from hcsim.platform import build_platform, load_platform_spec

    path = tmp_path / "t.yaml"
    path.write_text(yaml.safe_dump({"name": "t", "links": {"hbm": {"latency": "100ns"}},
                                    "topology": {"nodes": node_list, "links": link_list}, "routes": routes}))
    own_error_or_nothing(lambda: build_platform(load_platform_spec(path)))


@FUZZ
@given(_mutations(LLAMA))
def test_a_random_workload_spec_builds_or_raises_hcsims_error(tmp_path, mutations):
    from hcsim.limits import check_run_cost
    from hcsim.workload import build_training_graph, load_workload_spec, place_memory

    path = tmp_path / "w.yaml"
    path.write_text(yaml.safe_dump(_apply(LLAMA, mutations)))

    def action():
        spec = load_workload_spec(path)
        check_run_cost(spec, 2, 1, "fuzz")
        graph = build_training_graph(spec, ["xpu0", "xpu1"])
        place_memory(graph, {"xpu0": 80e9, "xpu1": 1e9}, spec)

    own_error_or_nothing(action)


@FUZZ
@given(st.one_of(st.text(max_size=200), st.builds(yaml.safe_dump, values)))
def test_random_yaml_text_parses_or_raises_hcsims_error(text):
    own_error_or_nothing(lambda: parse_yaml(text, "fuzz.yaml"))
