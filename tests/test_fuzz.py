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
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from hcsim.config import REPO_ROOT, parse_yaml
from hcsim.errors import MESSAGE_TEMPLATE, HcsimError
from hcsim.run.scenario import SCENARIO_KEYS
from hcsim.workload import validate_workload

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

    monkeypatch.setattr("hcsim.engine.api.run", tripwire)


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
            prepared = prepare(scenario)
            # prepare trusts the graphs hcsim builds: each keeps the graph contract (every vertex in order)
            assert len(validate_workload(prepared.workload, prepared.xpus)) == len(prepared.workload)

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


COHERENT = {name: yaml.safe_load((REPO_ROOT / "platforms" / f"{name}.yaml").read_text())
            for name in ("gh200", "gb200-nvl72", "cxl-pool")}


@FUZZ
@given(st.sampled_from(sorted(COHERENT)).flatmap(lambda name: st.tuples(st.just(name), _mutations(COHERENT[name]))),
       st.integers(1, 80))
def test_a_random_coherent_platform_builds_or_raises_hcsims_error(tmp_path, case, xpus):
    """The superchip (gh200, gb200-nvl72) and pooled-CXL (cxl-pool) specs, mutated: built or refused."""
    from hcsim.platform import build_platform, load_platform_spec

    name, mutations = case
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(_apply(COHERENT[name], mutations)))

    def action():
        spec = load_platform_spec(path)
        build_platform(spec, min(xpus, spec.xpus))

    own_error_or_nothing(action)


SERVING = yaml.safe_load((REPO_ROOT / "workloads" / "llama3-70b-serving.yaml").read_text())


class _Scheduled(Exception):
    """Raised where a serving run would start scheduling: everything before it (checks, platform, requests) ran."""


@FUZZ
@given(_mutations(SERVING), st.sampled_from(["paper-cxl", "dgx-h100", "cxl-pool", "gh200"]),
       st.sampled_from([{}, {"tp": 8}, {"tp": 4, "pp": 2}, {"spill": "allow"}, {"precision": "fp16"}]))
def test_a_random_serving_spec_is_ready_to_run_or_raises_hcsims_error(tmp_path, monkeypatch, mutations, platform,
                                                                     keys):
    """The serving workload (kind: serving), mutated, on each kind of platform: its checks, its platform side and
    its requests made up to the first scheduling step, or hcsim's own error."""
    from hcsim.run.scenario import load_scenario
    from hcsim.run.serving import serving_workload, simulate_serving

    def scheduled(*args, **kwargs):
        raise _Scheduled

    monkeypatch.setattr("hcsim.run.serving._Scheduler.run", scheduled)
    path = tmp_path / "serving.yaml"
    data = _apply(SERVING, mutations)
    if isinstance(data, dict) and isinstance(data.get("serving"), dict):  # small runs: making 10^6 requests is
        requests = data["serving"].get("requests")                         # seconds, not a property
        if isinstance(requests, int) and not isinstance(requests, bool) and requests > 2000:
            data["serving"]["requests"] = 2000
    path.write_text(yaml.safe_dump(data))

    def action():
        scenario = load_scenario(None, {"workload": str(path), "platform": platform, "xpus": 8, **keys})
        spec = serving_workload(scenario)
        if spec is None:  # no longer a serving workload (kind or serving: mutated): the training path's to judge
            return
        try:
            simulate_serving(scenario, spec)
        except _Scheduled:
            pass

    own_error_or_nothing(action)


JOBS = [{"name": "a", "xpus": 2, "workload": "llama2-7b", "tp": 2},
        {"name": "b", "xpus": ["xpu4", "xpu5"], "iterations": 1}]
job_values = st.one_of(values, st.sampled_from(["llama2-7b", "llama3-8b", "llama3-70b-serving", "fp8", "bf16", "a", "b",
                                                "xpu0", "xpu3", "xpu8", "xpu99", 1, 2, 3, 4, 8, ["xpu6", "xpu7"]]))
# a valid jobs list, mutated: values changed, removed or added at its paths and at each job's other keys
JOB_PATHS = [*_paths(JOBS), *((i, key) for i in (0, 1, 2) for key in ("workload", "pp", "dp", "precision", "zero",
                                                                       "global_batch", "offload", "spill", "platform",
                                                                       "stragglers", "nope", "granularity", "xpus"))]
job_mutations = st.lists(st.tuples(st.sampled_from(JOB_PATHS), job_values, st.booleans()), max_size=3)


@FUZZ
@given(st.one_of(job_mutations.map(lambda m: _apply(JOBS, m)), values), st.sampled_from(["paper-traditional", "paper-cxl", "gh200", "gb200-nvl72", "cxl-pool"]),
       st.dictionaries(st.sampled_from(["xpus", "jobs_alone", "compute_model", "iterations", "granularity"]),
                       st.one_of(values, st.sampled_from([True, False, "peak", "roofline", 1, 2, "layer"])),
                       max_size=1))
def test_a_random_jobs_scenario_prepares_or_raises_hcsims_error(jobs_value, platform, more):
    """The multi-job scenario (``jobs:``, docs/jobs.md), its list and each job's keys drawn at random, on the
    paper's platforms and the new ones: loaded and prepared (each job's graph built and placed, the graphs
    joined), or hcsim's own error."""
    from hcsim.run.prepare import prepare
    from hcsim.run.scenario import load_scenario

    mapping = {"platform": platform, "granularity": "decoder", "compute_model": "peak", **more, "jobs": jobs_value}

    def action():
        scenario = load_scenario(None, mapping)
        if scenario.jobs and all(isinstance(job["xpus"], int) and job["xpus"] <= 8 or len(job["xpus"]) <= 8
                                 for job in scenario.jobs):  # (jobs: null is a plain scenario, fuzzed above)
            prepare(scenario)
            event("prepared")

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


# --- files read by the newer surfaces: graph JSON, Chakra bytes, runs CSVs, kernel CSVs (issue 29) -----------

cells = st.one_of(st.sampled_from(["", "0", "-1", "1", "2", "8", "nan", "inf", "-inf", "1e400", "1e-400", "1e30",
                                   "9" * 30, "2.5", "0.0", "-0", "1_000", "0x10", "١"]),
                  st.sampled_from(["abc", "1,5", '"', "\x00", "gemm", "attn_fwd", "bf16", "fp8", "s", "ms", "tokens/s",
                                   "tflops/gpu", "full", "interleaved", "true", "H100", "calibration", "m=0 n=1",
                                   "tokens=8 hidden=x", "a=b=c"]),
                  st.text(max_size=8), st.integers(-(10**20), 10**20).map(str), st.floats().map(repr))
# a raw edit of a file's bytes: (where, as a fraction of its length; what: insert, overwrite or cut there; bytes)
byte_edits = st.lists(st.tuples(st.floats(0, 1), st.sampled_from(["insert", "overwrite", "cut"]),
                                st.binary(min_size=1, max_size=6)), min_size=1, max_size=3)


def _edit_bytes(data: bytes, edits) -> bytes:
    for where, how, chunk in edits:
        at = int(where * len(data))
        data = (data[:at] + chunk + data[at:] if how == "insert" else
                data[:at] + chunk + data[at + len(chunk):] if how == "overwrite" else data[:at])
    return data


def _edit_table(text: str, edits) -> str:
    """CSV `text` with cells replaced, rows dropped or doubled, a column dropped: (row, column, what, value)."""
    import csv
    import io

    rows = list(csv.reader(io.StringIO(text)))
    for row, column, how, value in edits:
        r = row % len(rows) if rows else 0
        if not rows:
            break
        if how == "cell" and rows[r]:
            rows[r][column % len(rows[r])] = value
        elif how == "drop-row":
            del rows[r]
        elif how == "double-row":
            rows.insert(r, list(rows[r]))
        elif how == "drop-column":
            for cells_of in rows:
                if cells_of:
                    del cells_of[column % len(cells_of)]
        elif how == "extra-cell":
            rows[r].append(value)
    out = io.StringIO()
    csv.writer(out, lineterminator="\n").writerows(rows)
    return out.getvalue()


table_edits = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 30),
                                 st.sampled_from(["cell", "cell", "cell", "drop-row", "double-row", "drop-column",
                                                  "extra-cell"]), cells), min_size=1, max_size=4)


def _graph_json(hybrid: bool) -> dict:
    """A small valid workload graph as node-link JSON: data parallel (compute and all-reduces), or tp x pp with
    ZeRO-1 (p2p, reduce-scatters, all-gathers, stages, groups)."""
    import json
    import tempfile
    from pathlib import Path

    from hcsim.run.prepare import prepare
    from hcsim.run.scenario import load_scenario
    from hcsim.workload import save_workload

    settings = {"workload": "llama2-13b-shape", "xpus": 4, "pp": 2, "global_batch": 4, "micro_batch": 1, "zero": 1} \
        if hybrid else {"workload": "llama2-13b", "xpus": 2, "granularity": "decoder"}
    workload = prepare(load_scenario(None, {**settings, "workload_overrides.model.decoders": 2})).workload
    with tempfile.TemporaryDirectory() as folder:
        save_workload(workload, Path(folder) / "g.json")
        return json.loads((Path(folder) / "g.json").read_text())


GRAPHS = {hybrid: _graph_json(hybrid) for hybrid in (False, True)}


@FUZZ
@given(st.booleans().flatmap(lambda hybrid: st.tuples(st.just(hybrid), _mutations(GRAPHS[hybrid]))),
       st.none() | byte_edits)
def test_a_mutated_graph_json_runs_or_raises_hcsims_error(tmp_path, mutated, edits):
    """A valid node-link graph with values replaced or deleted anywhere (vertices, edges, the graph section),
    its bytes edited: prepared for a run (loaded, checked, placed) or refused with hcsim's own error."""
    import json

    from hcsim.run.prepare import prepare
    from hcsim.run.scenario import load_scenario

    hybrid, mutations = mutated
    path = tmp_path / "g.json"
    data = json.dumps(_apply(GRAPHS[hybrid], mutations)).encode()
    path.write_bytes(_edit_bytes(data, edits) if edits else data)
    own_error_or_nothing(lambda: prepare(load_scenario(None, {"workload": str(path), "xpus": 4 if hybrid else 2})))


def _chakra_ranks() -> list[bytes]:
    """Two ranks of a valid Chakra trace: compute timed by duration and by num_ops, an all-reduce, a send and
    its receive, a control dependency."""
    import tempfile
    from pathlib import Path

    from hcsim.workload.chakra import NODE_TYPES, Node, attribute, write_trace

    comp, coll = NODE_TYPES["COMP_NODE"], NODE_TYPES["COMM_COLL_NODE"]
    send, recv = NODE_TYPES["COMM_SEND_NODE"], NODE_TYPES["COMM_RECV_NODE"]
    ranks = []
    with tempfile.TemporaryDirectory() as folder:
        for rank in range(2):
            peer = 1 - rank
            p2p = [attribute("comm_dst" if rank == 0 else "comm_src", int32_val=peer),
                   attribute("comm_size", int64_val=4096), attribute("comm_tag", int32_val=7)]
            nodes = [Node(id=0, name="fwd", type=comp, duration_micros=100),
                     Node(id=1, name="ops", type=comp, data_deps=[0],
                          attr=[attribute("num_ops", int64_val=10**9), attribute("tensor_size", uint64_val=10**6)]),
                     Node(id=2, name="ar", type=coll, data_deps=[1],
                          attr=[attribute("comm_type", int64_val=0), attribute("comm_size", int64_val=10**6)]),
                     Node(id=3, name="p2p", type=send if rank == 0 else recv, data_deps=[2], attr=p2p),
                     Node(id=4, name="bwd", type=comp, duration_micros=50, ctrl_deps=[3])]
            path = Path(folder) / f"t.{rank}.et"
            write_trace(path, nodes)
            ranks.append(path.read_bytes())
    return ranks


CHAKRA = _chakra_ranks()


@FUZZ
@given(st.integers(0, 1), byte_edits, st.booleans())
def test_mutated_chakra_bytes_run_or_raise_hcsims_error(tmp_path, rank, edits, import_only):
    """A valid two-rank Chakra trace with one rank file's bytes edited (protobuf varints, lengths, tags and
    payloads cut or overwritten): imported and prepared for a run, or refused with hcsim's own error."""
    from hcsim.run.prepare import prepare
    from hcsim.run.scenario import load_scenario
    from hcsim.workload.chakra import import_chakra

    for r, data in enumerate(CHAKRA):
        (tmp_path / f"t.{r}.et").write_bytes(_edit_bytes(data, edits) if r == rank else data)
    prefix = str(tmp_path / "t")
    if import_only:
        own_error_or_nothing(lambda: import_chakra(prefix))
    else:
        own_error_or_nothing(lambda: prepare(load_scenario(None, {"workload": f"chakra:{prefix}", "xpus": 2,
                                                                  "platform": "paper-traditional"})))


RUNS = ("name,role,layers,hidden,heads,vocabulary,sequence,gpus,tp,pp,micro_batch,global_batch,recompute,schedule,"
        "virtual_stages,sequence_parallel,measured,unit\n"
        "a,calibration,2,256,4,1024,128,2,2,1,1,2,full,1f1b,1,true,1.0,s\n"
        "b,,4,256,4,1024,128,4,1,2,1,4,selective,interleaved,2,false,300,ms\n"
        "c,,2,512,8,2048,256,8,2,2,1,8,none,zb-h1,1,false,50,tflops/gpu\n"
        "d,,2,256,4,1024,128,4,2,1,2,8,full,1f1b,1,false,2000,tokens/s\n")
SELENE = str(REPO_ROOT / "experiments" / "validation" / "selene.yaml")


@FUZZ
@given(table_edits, st.none() | byte_edits)
def test_a_mutated_runs_csv_validates_or_raises_hcsims_error(tmp_path, edits, raw):
    """`hcsim validate`'s reading of a runs CSV with cells, rows and columns edited (and its bytes): the file is
    refused with hcsim's error, or each row becomes a scenario that prepares, or a reason of hcsim's own (what
    validate lists as not simulated); nothing is simulated."""
    from hcsim.run.prepare import prepare
    from hcsim.study.validate import measured_seconds, read_runs, row_scenario

    path = tmp_path / "runs.csv"
    data = _edit_table(RUNS, edits).encode()
    path.write_bytes(_edit_bytes(data, raw) if raw else data)
    rows = []
    own_error_or_nothing(lambda: rows.extend(read_runs(path)))
    for row in rows:
        def action(row=row):
            measured_seconds(row)
            scenario = row_scenario(row, SELENE, None, str(tmp_path))
            if scenario.xpus <= 16:  # a small run: preparing stays cheap
                prepare(scenario)

        own_error_or_nothing(action)


def _kernels() -> tuple[str, str]:
    """Two small kernel CSVs of both layouts, cut from the H100 measurements: every kind the fit reads."""
    folder = REPO_ROOT / "experiments" / "calibration" / "measurements"
    first = (folder / "h100-sxm-80gb-kernels.csv").read_text().splitlines(keepends=True)
    second = (folder / "h100-sxm-80gb-kernels2.csv").read_text().splitlines(keepends=True)
    keep = [line for line in first[1:] if not line.startswith("gemm")] + \
        [line for line in first[1:] if line.startswith("gemm")][::9]
    return "".join(first[:1] + keep), "".join(second[:1] + second[1::3])


KERNELS = _kernels()


@FUZZ
@given(st.integers(0, 1), table_edits, st.none() | byte_edits)
def test_mutated_kernel_csvs_calibrate_or_raise_hcsims_error(tmp_path, which, edits, raw):
    """`hcsim calibrate` on kernel CSVs with cells, rows and columns edited (and bytes): factors fitted and
    their errors tabled, or hcsim's own error."""
    from hcsim.platform.devices import builtin_catalog
    from hcsim.study.calibrate import SMS, error_table, factors_yaml, fit_device, model_errors, read_kernels

    paths = []
    for i, text in enumerate(KERNELS):
        path = tmp_path / f"k{i}.csv"
        data = _edit_table(text, edits).encode() if i == which else text.encode()
        path.write_bytes(_edit_bytes(data, raw) if raw and i == which else data)
        paths.append(path)
    h100 = builtin_catalog()["H100"]
    peak = h100.peaks["bf16"]

    def action():
        rows = read_kernels(paths)
        calibration = fit_device(rows, name="H100", peak=peak, memory_bandwidth=h100.memory_bandwidth, sms=SMS["H100"])
        error_table(model_errors(rows, calibration, peak, h100.memory_bandwidth))
        factors_yaml(calibration, [p.name for p in paths])

    own_error_or_nothing(action)


def test_the_seeds_of_the_file_fuzzers_are_valid(tmp_path):
    """Unmutated, each fuzzed file runs through: so a mutation lands next to a valid input, not in a refusal."""
    import json

    from hcsim.platform.devices import builtin_catalog
    from hcsim.run.prepare import prepare
    from hcsim.run.scenario import load_scenario
    from hcsim.study.calibrate import SMS, fit_device, read_kernels
    from hcsim.study.validate import measured_seconds, read_runs, row_scenario

    for hybrid, data in GRAPHS.items():
        (tmp_path / "g.json").write_text(json.dumps(data))
        prepare(load_scenario(None, {"workload": str(tmp_path / "g.json"), "xpus": 4 if hybrid else 2}))
    for rank, data in enumerate(CHAKRA):
        (tmp_path / f"t.{rank}.et").write_bytes(data)
    prepare(load_scenario(None, {"workload": f"chakra:{tmp_path / 't'}", "xpus": 2, "platform": "paper-traditional"}))
    (tmp_path / "runs.csv").write_text(RUNS)
    rows = read_runs(tmp_path / "runs.csv")
    assert len(rows) == 4
    for row in rows:
        assert measured_seconds(row) > 0
        prepare(row_scenario(row, SELENE, None, str(tmp_path)))
    for i, text in enumerate(KERNELS):
        (tmp_path / f"k{i}.csv").write_text(text)
    h100 = builtin_catalog()["H100"]
    fit_device(read_kernels([tmp_path / "k0.csv", tmp_path / "k1.csv"]), name="H100", peak=h100.peaks["bf16"],
               memory_bandwidth=h100.memory_bandwidth, sms=SMS["H100"])
