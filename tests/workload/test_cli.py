"""`hcsim workload show` and `hcsim workload export`."""

from hcsim.cli import main
from hcsim.workload import build_training_graph, load_workload, load_workload_spec, place_memory


def test_show_prints_state_placement_and_flops(capsys):
    assert main(["workload", "show", "llama2-13b", "--device", "V100", "--set", "training.batch_per_xpu=2"]) == 0
    out = capsys.readouterr().out
    spec = load_workload_spec("llama2-13b", {"training.batch_per_xpu": 2})
    graph = build_training_graph(spec, ["xpu0"])
    entry = place_memory(graph, {"xpu0": 32 * 2**30}, spec).by_capacity[0]
    assert "training state per XPU" in out and "activations" in out
    assert f"local: decoders 1-{entry.local_decoders}," in out
    assert f"spilled to extended memory: decoders {entry.local_decoders + 1}-40" in out
    assert "FLOPs per XPU per iteration" in out and "batch per XPU 2" in out


def test_show_reports_errors_in_one_line(capsys):
    assert main(["workload", "show", "llama2-13b", "--device", "H900"]) == 2
    assert "--device 'H900': not in the device catalog" in capsys.readouterr().err
    assert main(["workload", "show", "llama2-13b", "--set", "fidelity"]) == 2
    assert "expected KEY=VALUE" in capsys.readouterr().err


HUGE_DECODER = ["--set", "costs=shape", "--set", "model.hidden=40960", "--set", "model.heads=320"]  # 162 GB a decoder


def test_show_on_a_platform_places_the_state_in_its_memories(tmp_path, capsys):
    """--platform: the state goes where a simulation puts it; a decoder larger than HBM spills whole when the
    platform's Type 3 expanders hold it (6.5 TB in 7 TB), and is refused when they do not (in 6 TB)."""
    from hcsim.config import REPO_ROOT

    paper = (REPO_ROOT / "platforms/paper-cxl.yaml").read_text()
    for capacity in ("7TB", "6TB"):
        (tmp_path / f"t3-{capacity}.yaml").write_text(paper.replace("type3_capacity: unbounded",
                                                                    f"type3_capacity: {capacity}"))
    assert main(["workload", "show", "llama2-13b", *HUGE_DECODER, "--platform", str(tmp_path / "t3-7TB.yaml")]) == 0
    out = capsys.readouterr().out
    assert "memory on H100 (85.9 GB local)" in out and "local: nothing" in out
    assert "spilled to extended memory: decoders 1-40, 6.483 TB" in out
    assert main(["workload", "show", "llama2-13b", *HUGE_DECODER, "--platform", str(tmp_path / "t3-6TB.yaml")]) == 2
    assert "6.483 TB spill but its extended memory holds 6 TB" in capsys.readouterr().err
    assert main(["workload", "show", "llama2-13b", "--platform", "dgx-h100", "--set", "training.batch_per_xpu=1",
                 "--set", "model.decoders=4"]) == 0  # fits in HBM: a DGX runs it
    assert "spilled: nothing" in capsys.readouterr().out


def test_export_writes_a_graph_that_loads_back(tmp_path, capsys):
    path = tmp_path / "graph.json"
    assert main(["workload", "export", "llama2-13b", "--xpus", "3", "-o", str(path), "--device", "H100",
                 "--set", "granularity=decoder"]) == 0
    graph = load_workload(path, ["xpu0", "xpu1", "xpu2"])
    assert graph.nodes["d40.bwd"]["spilled_xpus"] == frozenset({"xpu0", "xpu1", "xpu2"})
    assert graph.nodes["d01.fwd"]["start"] and graph.edges["optimizer", "d01.fwd"]["skip_first_iteration"]


def test_import_writes_a_chakra_trace_as_a_graph_and_names_the_units(tmp_path, capsys):
    from hcsim.workload.chakra import NODE_TYPES, Node, attribute, import_chakra, write_trace

    all_reduce = [attribute("comm_type", int64_val=0), attribute("comm_size", int64_val=1000)]
    for rank in range(3):
        write_trace(tmp_path / f"dp.{rank}.et", [Node(id=1, type=NODE_TYPES["COMP_NODE"], duration_micros=10),
                                                 Node(id=2, type=NODE_TYPES["COMM_COLL_NODE"], data_deps=[1],
                                                      attr=all_reduce)])
    path = tmp_path / "dp.json"
    assert main(["workload", "import", f"chakra:{tmp_path / 'dp'}", "-o", str(path)]) == 0
    out = capsys.readouterr().out
    assert "3 compute and 1 communication vertices" in out and "over 3 ranks" in out
    assert "2^30 B/s" in out and "GiB/s" in out  # ASTRA-sim's GB/s is not hcsim's
    loaded, imported = load_workload(path), import_chakra(tmp_path / "dp")
    assert sorted(loaded.nodes(data="xpus")) == sorted(imported.nodes(data="xpus"))
    assert main(["workload", "import", str(tmp_path / "none"), "-o", str(path)]) == 2
    assert "no trace files" in capsys.readouterr().err


def test_export_without_a_device_warns_that_nothing_spills(tmp_path, capsys):
    assert main(["workload", "export", "llama2-13b", "--xpus", "2", "-o", str(tmp_path / "g.json")]) == 0
    assert "no --device: no memory is placed" in capsys.readouterr().err
