"""The Python API in a user's script: what simulate_graphs returns, and the errors a script can run into.

Scripts run in subprocesses: SimGrid allows one engine per process, and the errors are about how a script is
started.
"""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

SCRIPT = textwrap.dedent("""
    from hcsim.platform.builders import single_switch
    from hcsim.platform.devices import builtin_catalog
    from hcsim.run.simulation import simulate_graphs
    from hcsim.workload import add_compute, new_workload

    def run():
        graph = new_workload("one")
        add_compute(graph, "c", xpus=["xpu0"], flops=0.0, duration=1e-3, start=True)
        result = simulate_graphs(single_switch(1, builtin_catalog()["H100"]), graph)
        print(result["iteration_ends"][0], result["wall_time_s"], result["peak_rss_mb"])
""")


def _run(folder: Path, body: str) -> subprocess.CompletedProcess:
    (folder / "script.py").write_text(SCRIPT + body)
    return subprocess.run([sys.executable, "script.py"], cwd=folder, capture_output=True, text=True, timeout=300)


def test_simulate_graphs_reports_wall_time_and_peak_memory(tmp_path):
    done = _run(tmp_path, 'if __name__ == "__main__":\n    run()\n')
    assert done.returncode == 0, done.stderr
    end, wall, peak = map(float, done.stdout.split())
    assert abs(end - 1e-3) < 1e-12
    assert 0 < wall < 300 and 10 < peak < 10_000  # a SimGrid worker holds at least its libraries


def test_a_script_without_a_main_guard_is_told_what_to_do(tmp_path):
    done = _run(tmp_path, "run()\n")
    assert done.returncode != 0
    assert "ConfigError" in done.stderr and 'if __name__ == "__main__":' in done.stderr
    assert "script.py" in done.stderr


def test_a_folder_named_hcsim_shadowing_the_package_is_named(tmp_path):
    (tmp_path / "hcsim").mkdir()  # a checkout next to the script: no __init__.py in it
    done = _run(tmp_path, 'if __name__ == "__main__":\n    run()\n')
    if done.returncode == 0:
        pytest.skip("hcsim is installed on sys.path itself (not editable): a regular package wins, nothing shadows it")
    assert f"found the folder {tmp_path / 'hcsim'}" in done.stderr and "shadows it" in done.stderr


def test_a_script_s_run_warns_on_the_script_s_stderr_once():
    """The run's process is forked from a fork server whose stderr need not be the script's: it hands its
    warnings back, and the script (no logging set up) writes each once on its own stderr."""
    code = textwrap.dedent("""
        from hcsim.run.scenario import load_scenario
        from hcsim.run.simulation import simulate
        simulate(load_scenario(None, ["workload=llama3-8b", "platform=dgx-h100", "xpus=8", "tp=4", "pp=2",
                                      "global_batch=8", "workload_overrides={training.tp_comm_overlap: true}"]))
        """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    said = [line for line in done.stderr.splitlines() if "tp_comm_overlap" in line]
    assert len(said) == 1 and said[0].startswith("scenario 'default': training.tp_comm_overlap:"), done.stderr


def test_a_run_sees_the_environment_its_caller_has_now(monkeypatch):
    """The fork server keeps the environment it started with; a run gets its caller's as it is at the call:
    HCSIM_NO_LIMITS set after an earlier run still lifts the limit on the next."""
    from hcsim.run.fresh import in_fresh_process

    in_fresh_process(abs, -1)  # the fork server is running
    monkeypatch.setenv("HCSIM_FRESH_CHECK", "set since")
    assert in_fresh_process(os.getenv, "HCSIM_FRESH_CHECK") == "set since"
