"""`hcsim platform show|compile|draw`."""

import ast
import subprocess
import sys

from hcsim.cli import main
from hcsim.config import REPO_ROOT


def test_show_counts_and_totals(capsys):
    assert main(["platform", "show", "paper-cxl", "--xpus", "256", "--set", "devices=[H100, A100]"]) == 0
    out = capsys.readouterr().out
    assert "coherent (CXL fabric)" in out
    lines = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("  ")}
    assert lines["xpu"] == ["256"] and lines["memory/cxl_type3"] == ["256"] and lines["switch/tor"] == ["2"]
    assert lines["H100"] == ["128"] and lines["A100"] == ["128"]
    assert lines["cxl_type3"] == ["unbounded"]
    assert "fp32 11.07 PFLOPS" in out  # 128 x 67 + 128 x 19.5 TFLOPS
    assert "routes never use" not in out


def test_show_names_the_links_routes_avoid(capsys):
    assert main(["platform", "show", "paper-cxl", "--xpus", "16", "--set", "cxl.xpu_traffic=fabric"]) == 0
    assert "; routes never use eth links" in capsys.readouterr().out.splitlines()[0]


def test_compile_writes_xml(tmp_path, capsys):
    output = tmp_path / "p.xml"
    assert main(["platform", "compile", "paper-traditional", "--xpus", "16", "-o", str(output)]) == 0
    assert output.read_text().startswith("<?xml") and 'version="4.1"' in output.read_text()
    assert "96 routes" in capsys.readouterr().out  # 16 XPUs x 2 memories x 2 directions + 16 ring links x 2


def test_draw_says_when_it_draws_a_part(tmp_path, capsys):
    output = tmp_path / "p.png"
    assert main(["platform", "draw", "paper-cxl", "--xpus", "512", "-o", str(output)]) == 0
    assert output.read_bytes()[:4] == b"\x89PNG"
    assert "representative part: 2 of 4 racks, 2 of 16 servers per rack" in capsys.readouterr().out


def test_errors_exit_2_in_one_line(capsys):
    assert main(["platform", "show", "paper-cxl", "--xpus", "9999"]) == 2
    assert main(["platform", "show", "paper-cxl", "--set", "links.cxl.latency=0ns"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err[0].startswith("hcsim: error: paper-cxl.yaml: xpus: cannot build 9999")
    assert err[1] == "hcsim: error: paper-cxl.yaml: links.cxl.latency: must be > 0, got '0ns'"


def test_platform_layer_imports_neither_simgrid_nor_matplotlib_at_module_level():
    for path in (REPO_ROOT / "hcsim" / "platform").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in tree.body:  # module level only: drawing imports matplotlib inside its function
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            assert not any(n.split(".")[0] in ("simgrid", "matplotlib") for n in names), path.name
    done = subprocess.run([sys.executable, "-c", "import sys, hcsim.platform; "
                           "print('matplotlib' in sys.modules, 'simgrid' in sys.modules)"],
                          capture_output=True, text=True, cwd=REPO_ROOT)
    assert done.stdout.split() == ["False", "False"]


def test_draw_shows_link_loads_from_a_runs_links_csv(tmp_path, caplog):
    loads = tmp_path / "links.csv"
    loads.write_text("source,target,kind,bandwidth_Bps,bytes,utilization\n"
                     "r0.cxl1.0,xpu0,cxl,1.28e11,1e12,0.62\nxpu0.hbm,xpu0,hbm,3.35e12,1e9,0.003\n"
                     "nowhere,xpu0,cxl,1e9,1,0.5\n")
    output = tmp_path / "p.svg"
    assert main(["platform", "draw", "paper-cxl", "--xpus", "16", "-o", str(output), "--loads", str(loads)]) == 0
    assert output.read_text().startswith("<?xml")  # the format follows the suffix
    assert "1 of its links are not in this platform (e.g. nowhere -> xpu0)" in caplog.text


def test_draw_rejects_a_file_that_is_no_links_csv(tmp_path, capsys):
    loads = tmp_path / "links.csv"
    loads.write_text("a,b\n1,2\n")
    assert main(["platform", "draw", "paper-cxl", "--xpus", "16", "-o", str(tmp_path / "p.png"),
                 "--loads", str(loads)]) == 2
    assert "not a links.csv of hcsim simulate --out" in capsys.readouterr().err


def test_draw_loads_labels_overlap_no_name_node_or_other_label(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    kept = []
    monkeypatch.setattr(plt, "close", lambda figure=None: kept.append(figure))
    rows = [f"r0.cxl1.0,xpu{i},cxl,1.28e11,1e12,{0.62 if i in (0, 8) else 0.49}" for i in range(16)]
    loads = tmp_path / "links.csv"
    loads.write_text("source,target,kind,bandwidth_Bps,bytes,utilization\n" + "\n".join(rows) + "\n")
    assert main(["platform", "draw", "paper-cxl", "--xpus", "64", "-o", str(tmp_path / "p.png"),
                 "--loads", str(loads)]) == 0
    figure = kept[0]
    axes = figure.axes[0]
    renderer = figure.canvas.get_renderer()
    texts = [(t.get_text(), t.get_window_extent(renderer)) for t in axes.texts]
    labels = [(text, box) for text, box in texts if text.endswith("%")]
    assert labels  # the busiest links are labelled
    for text, box in labels:
        clash = [other for other, b in texts if b is not box and box.overlaps(b)]
        assert not clash, f"{text} overlaps {clash}"
    figure.clf()
