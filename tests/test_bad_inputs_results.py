"""Bad input on the surfaces of the last wave outside serving: compute factors files, calibrate, sweep names, long
paths, validate's runs CSV. Each ends in one message naming the file, the key or column and what would be valid
(hcsim.errors' template), exit 2 from the CLI, no traceback.

Nothing here runs a simulation but the cases that say so."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from hcsim.cli import main
from hcsim.config import REPO_ROOT, check_output_file, resolve_spec
from hcsim.engine.compute_model import load_compute_model
from hcsim.errors import MESSAGE_TEMPLATE, ConfigError

MEASURED = sorted((REPO_ROOT / "experiments" / "calibration" / "measurements").glob("h100-sxm-80gb-kernels*.csv"))
LONG = "x" * 300  # beyond the 255 bytes a file name may have


def check_message(message: str) -> None:
    """One message of hcsim.errors' template: every line "WHERE: PROBLEM" (or indented under one)."""
    assert message and "Traceback" not in message, message
    for line in message.splitlines():
        assert line.startswith("  ") or MESSAGE_TEMPLATE.match(line), f"not 'WHERE: PROBLEM': {line!r}"


def refused(argv: list[str], capsys) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.startswith("hcsim: error: "), err
    message = err.removeprefix("hcsim: error: ").rstrip("\n")
    check_message(message)
    return message


# --- compute factors files -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, where, valid", [
    ("", r"mine\.yaml: gives no factors", r"expected devices: .*and/or links: .*platforms/compute-model\.yaml"),
    ("devices: {}\nlinks: {}\n", r"mine\.yaml: gives no factors", r"hcsim calibrate writes one"),
    ("links: [1, 2]\n", r"mine\.yaml: links: expected a mapping", r"bandwidth_factor, call_latency\}, got \[1, 2\]"),
    ("devices:\n  H100:\n    attention:\n      table: [[128, 4096, 0.6, 0.5], [128, fast, 0.6, 0.5]]\n",
     r"mine\.yaml: devices\.H100\.attention\.table\[1\]", r"expected 4 numbers \[head_dim, sequence"),
])
def test_a_factors_file_that_gives_nothing_or_a_wrong_shape_is_refused(tmp_path, text, where, valid):
    path = tmp_path / "mine.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_compute_model(path)
    check_message(str(info.value))
    assert re.search(where, str(info.value)) and re.search(valid, str(info.value)), str(info.value)


@pytest.mark.parametrize("name, suggestion", [("h100", "did you mean 'H100'"), ("H10O", "did you mean 'H100'"),
                                              ("Quantum", "the devices of this run's catalog and platform: A100, .*H100")])
def test_a_factors_entry_for_a_device_the_run_cannot_have_is_refused(tmp_path, name, suggestion):
    """Before, a lower-case 'h100' entry went unused and the built-in H100 factors timed the run without a word."""
    text = (REPO_ROOT / "platforms" / "compute-model.yaml").read_text()
    path = tmp_path / "mine.yaml"
    path.write_text(text.replace("\n  H100:\n", f"\n  {name}:\n", 1))
    from hcsim.platform.devices import builtin_catalog

    with pytest.raises(ConfigError) as info:
        load_compute_model(path, set(builtin_catalog()))
    check_message(str(info.value))
    assert re.fullmatch(rf".*mine\.yaml: devices\.{name}: no device of that name \(names are case-sensitive\); "
                        rf"{suggestion}.*", str(info.value)), str(info.value)
    assert name in load_compute_model(path).devices  # without the run's devices (calibrate's own file): read


def test_an_implausibly_low_efficiency_is_said_where_a_run_reads_it(tmp_path, caplog):
    """An efficiency of 1e-6 is a valid fraction but a million-fold slowdown (5.4e5 s an iteration): a warning."""
    path = tmp_path / "mine.yaml"
    path.write_text("devices:\n  H100:\n    gemm: {max_efficiency: 0.7, half_dimension: 100}\n"
                    "    memory_efficiency: 0.000001\n"
                    "    attention: {flash_forward_efficiency: 0.5, flash_backward_efficiency: 0.4}\n"
                    "    kernel_overhead: 2us\n")
    with caplog.at_level("WARNING"):
        load_compute_model(path)
    assert not caplog.records  # calibrate and the default's resolution read it too: said where a run does
    with caplog.at_level("WARNING"):
        load_compute_model(path, {"H100"})
    [record] = caplog.records
    assert re.search(r"mine\.yaml: devices\.H100: memory_efficiency 1e-06 of the GPU's peak: below 0\.01, its kernels "
                     r"would run 1e\+06x slower", record.getMessage()), record.getMessage()


@pytest.mark.parametrize("given, problem", [("/dev/null", "not a regular file"), (".", "not a regular file"),
                                            (LONG, "no such file"), ("nowhere.yaml", "no such file")])
def test_compute_factors_that_is_no_file_says_what_it_is(given, problem):
    from hcsim.run.scenario import load_scenario

    with pytest.raises(ConfigError) as info:
        load_scenario(None, {"compute_factors": given})
    check_message(str(info.value))
    assert "compute_factors: " in str(info.value) and problem in str(info.value), str(info.value)
    assert "give a roofline factors YAML" in str(info.value)


# --- calibrate --------------------------------------------------------------------------------------------------

def test_calibrate_to_a_path_it_cannot_write_keeps_the_fit(tmp_path):
    """The fit takes its time: when -o cannot be written after it, the factors are printed, not lost."""
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "calibrate", *map(str, MEASURED), "--device", "H100",
                           "-o", "/proc/hcsim-factors.yaml"], capture_output=True, text=True, timeout=600)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert re.match(r"hcsim: error: -o /proc/hcsim-factors\.yaml: could not write the factors \(.*\); they are "
                    r"printed above", done.stderr), done.stderr
    assert "devices:\n  H100:\n" in done.stdout


def test_calibrate_says_which_rows_it_does_not_model(tmp_path):
    """A row of a kind hcsim does not model is neither fitted nor checked: the command says so, with the count."""
    mystery = tmp_path / "mystery.csv"
    mystery.write_text("kind,m,n,k,batch,dtype,seconds,flops,bytes\nmystery_kernel,0,0,0,1,bf16,1e-5,0,1024\n"
                       "mystery_kernel,0,0,0,1,bf16,2e-5,0,2048\n")
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "calibrate", *map(str, MEASURED), str(mystery),
                           "--device", "H100", "-o", str(tmp_path / "f.yaml")], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert "  not modelled, so not used: mystery_kernel (2 rows)\n" in done.stdout


@pytest.mark.parametrize("output, problem", [(f"{LONG}.yaml", r"cannot be a file here \(File name too long\)"),
                                             ("a\0b.yaml", "holds a NUL character")])
def test_calibrate_output_that_cannot_be_a_file_is_refused_before_the_fit(output, problem):
    with pytest.raises(ConfigError, match=rf"^-o .*{problem}"):
        check_output_file(output, "-o", suffixes=(".yaml",))


def test_a_kernel_csv_saved_by_a_spreadsheet_is_read_as_it_is(tmp_path):
    from hcsim.study.calibrate import read_kernels

    text = MEASURED[0].read_text()
    path = tmp_path / "bom.csv"
    path.write_bytes(b"\xef\xbb\xbf" + text.replace("\n", "\r\n").encode())
    assert [r.seconds for r in read_kernels([path])] == [r.seconds for r in read_kernels([MEASURED[0]])]


@pytest.mark.parametrize("content, where, problem", [
    ("kind,m,n,k,batch,dtype,seconds,flops,bytes\ngemm,1,1,1,1,bf16,1e-5,1,1\ngemm," + "9" * 200_000 + "\n",
     r"long\.csv:3", r"field larger than field limit"),
])
def test_a_kernel_csv_cell_beyond_the_csv_limit_names_the_line(tmp_path, capsys, content, where, problem):
    (tmp_path / "long.csv").write_text(content)
    message = refused(["calibrate", str(tmp_path / "long.csv"), "--device", "H100", "-o", str(tmp_path / "f.yaml")],
                      capsys)
    assert re.search(where, message) and re.search(problem, message), message


def test_an_attention_row_with_next_to_no_flops_is_refused_not_fitted(tmp_path):
    """Found by tests/test_fuzz.py: flops 1.2e-38 fitted an efficiency of 1e-49 of peak, and timing it divided by
    zero; a row below MIN_EFFICIENCY of peak names its line instead."""
    from hcsim.platform.devices import builtin_catalog
    from hcsim.study.calibrate import MIN_EFFICIENCY, SMS, fit_device, read_kernels

    lines = MEASURED[0].read_text().splitlines()
    columns = lines[0].split(",")
    number = next(i for i, line in enumerate(lines) if line.startswith("attn_fwd,"))
    cells = lines[number].split(",")
    cells[columns.index("flops")] = "1.175494351e-38"
    lines[number] = ",".join(cells)
    path = tmp_path / "k.csv"
    path.write_text("\n".join(lines) + "\n")
    h100 = builtin_catalog()["H100"]
    with pytest.raises(ConfigError, match=rf"k\.csv:{number + 1}: attention row gives an efficiency of .* outside "
                                          rf"\[{MIN_EFFICIENCY:g}, 1\]: check its seconds and flops"):
        fit_device(read_kernels([path, *MEASURED[1:]]), name="H100", peak=h100.peaks["bf16"],
                   memory_bandwidth=h100.memory_bandwidth, sms=SMS["H100"])


@pytest.mark.parametrize("given, problem", [("/dev/null", "not a regular file"), (".", "is a folder")])
def test_a_kernel_csv_that_is_no_file_says_what_it_is(tmp_path, capsys, given, problem):
    message = refused(["calibrate", given, "--device", "H100", "-o", str(tmp_path / "f.yaml")], capsys)
    assert problem in message and "a kernel CSV" in message, message


# --- sweep names and long paths -------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ['"a\\0b"', "n" * 300])
def test_a_sweep_name_that_cannot_name_files_is_refused(tmp_path, capsys, name):
    path = tmp_path / "exp.yaml"
    path.write_text(f"name: {name}\nbase: {{xpus: 2, iterations: 1}}\naxes: {{cxl_latency: [200ns, 1us]}}\n")
    message = refused(["sweep", str(path), "--out", str(tmp_path / "out")], capsys)
    assert re.search(r"exp\.yaml: name: .* cannot name the result files; use letters, digits, '-' and '_', at most "
                     r"200 bytes", message), message


@pytest.mark.parametrize("folder", ["workloads", "platforms"])
def test_a_spec_path_too_long_for_the_file_system_is_one_message(folder):
    with pytest.raises(ConfigError, match=rf"cannot be a file here \(File name too long\); give a YAML file or a "
                                          rf"built-in {folder} spec name"):
        resolve_spec(LONG, folder, Path("."))


# --- validate's runs CSV: its cells and keys, each row checked before the first simulation ----------------------

HEADER = "name,layers,hidden,heads,vocabulary,sequence,gpus,tp,pp,micro_batch,global_batch,recompute,measured,unit"
ROW = "r1,2,256,4,1024,128,2,2,1,1,2,full,1.0,s"
SELENE = str(REPO_ROOT / "experiments" / "validation" / "selene.yaml")


@pytest.mark.parametrize("columns, cells, options, where, problem", [
    (",schedule", ",sideways", [], r"runs\.csv:2: schedule", r"'sideways' is not one of gpipe, 1f1b"),
    (",zero", ",5", [], r"runs\.csv:2: zero", r"expected a ZeRO stage 0, 1, 2 or 3, got '5'"),
    (",precision", ",fp4", [], r"runs\.csv:2: precision", r"'fp4' is not one of fp32, fp16, bf16, fp8"),
    (",kernels", ",cudnn", [], r"runs\.csv:2: kernels", r"is not one of megatron, pytorch-eager, torch-compile"),
    (",set", ",offload=cpu;colour=red", [], r"runs\.csv:2: set: colour: unknown key", r"valid keys: .*offload"),
    (",set", ",offload", [], r"runs\.csv:2: set: 'offload'", r"expected KEY=VALUE .*separate several with ';'"),
    (",set", ",tp=4", [], r"runs\.csv:2: set: tp", r"given in its own column too; keep one"),
    (",set", ",zero=9", [], r"runs\.csv:2: set: zero", r"9 is not one of 0, 1, 2, 3"),
    (",set", ",platform_overrides.links.xpu_link.bandwidth=5", [], r"runs\.csv:2: selene\.yaml: "
     r"links\.xpu_link\.bandwidth", r"has no unit; write it with one"),
    (",workload", ",llama3-70b-serving", [], r"runs\.csv:2: workload llama3-70b-serving: a serving workload",
     r"run a serving workload with hcsim simulate"),
    ("", "", ["--set", "workload=llama3-70b-serving"], r"--set workload: workload llama3-70b-serving: a serving "
     r"workload", r"run a serving workload with hcsim simulate"),
    (",source", "," + "s" * 200_000, [], r"runs\.csv:2", r"field larger than field limit"),
])
def test_a_bad_runs_csv_cell_names_the_row_and_the_column(tmp_path, capsys, columns, cells, options, where, problem):
    (tmp_path / "runs.csv").write_text(f"{HEADER}{columns}\n{ROW}{cells}\n")
    message = refused(["validate", str(tmp_path / "runs.csv"), "--platform", SELENE, *options,
                       "--out", str(tmp_path / "out")], capsys)
    assert re.search(where, message) and re.search(problem, message), message
    assert not (tmp_path / "out").exists()  # refused before the first simulation


def test_every_bad_row_is_listed_before_any_row_runs(tmp_path, capsys):
    (tmp_path / "runs.csv").write_text(f"{HEADER},set,platform\n{ROW},colour=red,{SELENE}\n"
                                       f"{ROW.replace('r1', 'r2')},,\n")
    message = refused(["validate", str(tmp_path / "runs.csv"), "--out", str(tmp_path / "out")], capsys)
    assert re.match(r".*runs\.csv: invalid \(2 problems\):", message), message
    assert re.search(r"runs\.csv:2: set: colour: unknown key", message)
    assert re.search(r"runs\.csv:3: platform: empty, and no --platform given", message)


# --- sweep: every point's specs read before the first point runs ------------------------------------------------

@pytest.mark.parametrize("axes, where, problem", [
    ("platform_overrides.links.pcie.bandwidth: [128GB/s, 64]",
     r"exp\.yaml: point 1 \(platform_overrides\.links\.pcie\.bandwidth=64\): paper-cxl\.yaml: links\.pcie\.bandwidth",
     r"64 has no unit"),
    ("workload: [llama2-13b, llama3-70b-serving]", r"exp\.yaml: point 1 \(workload=llama3-70b-serving\): workload "
     r"llama3-70b-serving: a serving workload", r"hcsim sweep runs training workloads.*hcsim simulate"),
])
def test_a_sweep_point_whose_spec_fails_is_refused_before_any_point_runs(tmp_path, capsys, monkeypatch, axes, where,
                                                                          problem):
    def tripwire(*args, **kwargs):
        raise AssertionError("a bad point reached the engine")

    monkeypatch.setattr("hcsim.study.points.run_point", tripwire)
    (tmp_path / "exp.yaml").write_text(f"name: exp\nbase: {{xpus: 8, iterations: 1}}\naxes:\n  {axes}\n")
    message = refused(["sweep", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "out")], capsys)
    assert re.search(where, message) and re.search(problem, message), message


# --- output paths, help and lists -------------------------------------------------------------------------------

@pytest.mark.parametrize("argv", [["simulate", "--out", ""], ["sweep", "exp.yaml", "--out", ""],
                                  ["validate", "runs.csv", "--out", ""], ["plan", "llama3-8b", "--out", " "],
                                  ["platform", "draw", "paper-cxl", "-o", ""], ["calibrate", "k.csv", "--device",
                                                                                 "H100", "-o", ""]])
def test_an_empty_output_path_is_refused_not_read_as_the_current_folder(tmp_path, monkeypatch, capsys, argv):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    assert re.search(r"error: argument (--out|-o/--output): an empty path; give a folder or file name",
                     capsys.readouterr().err)
    assert list(tmp_path.iterdir()) == []


def test_simulate_help_lists_every_precision(capsys):
    from hcsim.workload.graph import PRECISIONS

    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    entry = capsys.readouterr().out.split("\n  precision (default", 1)[1].split("\n  xpus", 1)[0]
    assert " | ".join(PRECISIONS) in " ".join(entry.split())
    assert " | ".join(PRECISIONS) in (REPO_ROOT / "docs" / "workloads.md").read_text()


def test_list_algorithms_gives_each_description_to_the_end_of_its_sentence(capsys):
    assert main(["list", "algorithms"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) > 10
    for line in lines:
        assert line.rstrip().endswith((".", ")")), f"cut mid-sentence: {line!r}"


# --- a factors file where the run reads it, and where it does not (these two run a small simulation) ------------

def hcsim(*args):
    return subprocess.run([sys.executable, "-m", "hcsim.cli", *args], capture_output=True, text=True, timeout=600)


def test_a_factors_file_the_peak_model_does_not_read_is_said_and_still_checked(tmp_path):
    import json

    factors = tmp_path / "mine.yaml"
    factors.write_text((REPO_ROOT / "platforms" / "compute-model.yaml").read_text())
    done = hcsim("simulate", "--set=xpus=8", "--set=iterations=1", "--set=compute_model=peak",
                 f"--set=compute_factors={factors}", "--json")
    assert done.returncode == 0, done.stderr
    assert re.search(r"compute_factors: .*mine\.yaml is not read: this run uses the peak model", done.stderr)
    assert json.loads(done.stdout)["compute_model"] == "peak" and json.loads(done.stdout)["compute_factors"] is None
    factors.write_text("devices:\n  H100: {memory_efficiency: 2}\n")  # unread, but wrong: an error all the same
    done = hcsim("simulate", "--set=xpus=8", "--set=iterations=1", "--set=compute_model=peak",
                 f"--set=compute_factors={factors}")
    assert done.returncode == 2 and "mine.yaml: devices.H100" in done.stderr and "Traceback" not in done.stderr


def test_a_lower_case_device_in_a_factors_file_stops_the_run_instead_of_going_unused(tmp_path):
    factors = tmp_path / "mine.yaml"
    factors.write_text((REPO_ROOT / "platforms" / "compute-model.yaml").read_text().replace("\n  H100:\n", "\n  h100:\n"))
    done = hcsim("simulate", "--set=platform=dgx-h100", "--set=workload=llama3-8b", "--set=xpus=8", "--set=tp=8",
                 "--set=compute_model=roofline", f"--set=compute_factors={factors}")
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert re.search(r"mine\.yaml: devices\.h100: no device of that name \(names are case-sensitive\); did you mean "
                     r"'H100'", done.stderr), done.stderr


@pytest.mark.parametrize("base, axes, where", [
    ("{iterations: 1}", "xpus: [8, 0]", r"exp\.yaml: point 1 \(xpus=0\): xpus: must be >= 1, got 0"),
    ("{iterations: 0}", "xpus: [8]", r"exp\.yaml: point 0 \(xpus=8\): base\.iterations: must be >= 1, got 0"),
])
def test_a_sweep_value_is_blamed_on_the_axis_or_the_base_that_gave_it_not_on_set(tmp_path, capsys, base, axes, where):
    (tmp_path / "exp.yaml").write_text(f"name: exp\nbase: {base}\naxes:\n  {axes}\n")
    message = refused(["sweep", str(tmp_path / "exp.yaml"), "--out", str(tmp_path / "out")], capsys)
    assert re.search(where, message) and "--set" not in message, message


@pytest.mark.parametrize("setting", [["--set", "workload_overrides.serving.rate=null"],
                                     ["--set", "workload_overrides={serving.rate: null}"]])
def test_serving_rate_null_as_an_override_sends_every_request_at_once(tmp_path, capsys, setting):
    """The workload file may leave `serving.rate` out (a batch arriving at once); `null` says the same from
    the command line, over the file's rate."""
    out = tmp_path / "run"
    assert main(["simulate", "--set", "workload=llama3-70b-serving", "--set", "platform=paper-cxl", "--set", "xpus=8",
                 "--set", "tp=8", "--set", "devices=[H100]", *setting,
                 "--set", "workload_overrides.serving.requests=8", "--out", str(out)]) == 0
    lines = (out / "requests.csv").read_text().splitlines()
    assert lines[0].split(",")[1] == "arrival_s" and len(lines) == 9
    assert {line.split(",")[1] for line in lines[1:]} == {"0.0"}  # the file's rate, 4 per second, is replaced
