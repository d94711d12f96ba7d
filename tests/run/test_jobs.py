"""Several jobs on one fabric (hcsim.run.jobs, docs/jobs.md): two data-parallel jobs on paper-traditional, each
on one XPU of server 0 and one of server 1. XPUs 0-3 of a server share its first NIC and its first CPU's DRAM,
XPUs 4-7 the second: jobs on xpu0+xpu8 and xpu1+xpu9 share both, jobs on xpu0+xpu8 and xpu4+xpu12 share no link.
Each simulation runs in a fresh process (SimGrid: one engine per process)."""

import subprocess
import sys

import pytest

from hcsim.errors import ConfigError
from hcsim.run.scenario import load_scenario
from hcsim.run.simulation import simulate

BASE = {"platform": "paper-traditional", "iterations": 2, "compute_model": "peak"}


def _jobs(a, b, **more):
    return load_scenario(None, {**BASE, "jobs": [{"name": "a", "xpus": a}, {"name": "b", "xpus": b}], **more})


@pytest.fixture(scope="module")
def shared():
    return simulate(_jobs(["xpu0", "xpu8"], ["xpu1", "xpu9"], jobs_alone=True))


@pytest.fixture(scope="module")
def apart():
    return simulate(_jobs(["xpu0", "xpu8"], ["xpu4", "xpu12"], jobs_alone=True))


def test_jobs_that_share_links_each_take_longer_than_alone(shared):
    a, b = shared["jobs"]
    for job in (a, b):
        assert job["iteration_time_s"] > job["alone_iteration_time_s"]
        assert job["slowdown"] == job["iteration_time_s"] / job["alone_iteration_time_s"] > 1
    # two identical jobs on mirror-image XPUs: neither is favoured
    assert a["iteration_time_s"] == b["iteration_time_s"] and a["breakdown"] == b["breakdown"]
    assert a["xpu_names"] == "xpu0+xpu8" and b["xpu_names"] == "xpu1+xpu9"


def test_a_shared_link_carries_both_jobs_bytes(shared, apart):
    """The NIC link xpu0 and xpu1 share carries each job's all-reduce bytes: twice one job's, where apart it
    carries job a's alone (every unit runs every iteration, so link bytes are sums)."""
    link = "r0.tor -> r0s0.nic0.0"
    together = {row["link"]: row["bytes"] for row in shared["links"]["eth"]}
    alone = {row["link"]: row["bytes"] for row in apart["links"]["eth"]}
    assert together[link] == 2 * alone[link] > 0


def test_jobs_on_links_they_do_not_share_run_as_alone_bit_for_bit(apart):
    for job in apart["jobs"]:
        assert job["iteration_time_s"] == job["alone_iteration_time_s"]
        assert job["slowdown"] == 1.0
    a, b = apart["jobs"]
    assert a["iteration_times_s"] == b["iteration_times_s"]


def test_a_job_is_the_scenario_run_alone_whatever_its_vertex_names():
    """One job named zeta (its vertices zeta/...) on the first two XPUs: the plain scenario's numbers, bit for bit."""
    plain = simulate(load_scenario(None, {**BASE, "xpus": 2}))
    job = simulate(load_scenario(None, {**BASE, "jobs": [{"name": "zeta", "xpus": 2}]}))
    assert job["jobs"][0]["iteration_times_s"] == plain["iteration_times_s"]
    assert job["jobs"][0]["breakdown"] == plain["breakdown"]
    assert job["iteration_times_s"] == plain["iteration_times_s"]


@pytest.mark.parametrize("jobs, message", [
    ([{"name": "a", "xpus": ["xpu0", "xpu1"]}, {"name": "b", "xpus": ["xpu1", "xpu2"]}],
     r"jobs\[1\]\.xpus: xpu1 is jobs\[0\]'s too; jobs run on disjoint XPUs"),
    ([{"name": "a", "xpus": 2, "tpp": 2}], r"jobs\[0\]\.tpp: unknown key inside a job \(did you mean 'tp'\?\); a "
                                          r"job's keys: name, xpus"),
    ([{"name": "a", "xpus": 2, "platform": "dgx-h100"}], r"jobs\[0\]\.platform: a platform key, which stays at the "
                                                         r"top level"),
    ([{"name": "a", "xpus": 2, "collective_model": "flow"}], r"jobs\[0\]\.collective_model: a key of the whole run"),
    ([{"name": "a", "xpus": 2, "tp": 0}], r"jobs\[0\]\.tp: "),
    ([{"name": "a", "xpus": 0}], r"jobs\[0\]\.xpus: expected a count >= 1"),
    ([{"name": "a/b", "xpus": 2}], r"jobs\[0\]\.name: expected a name without '/'"),
    ([{"name": "a", "xpus": 1}, {"name": "a", "xpus": 1}], r"jobs\[1\]\.name: 'a' is the name of jobs\[0\] too"),
    ([], r"jobs: expected a list of jobs"),
])
def test_a_bad_jobs_key_is_one_clear_error(jobs, message):
    with pytest.raises(ConfigError, match=message):
        load_scenario(None, {"jobs": jobs})


def test_more_xpus_than_the_platform_has_and_unknown_xpus_are_refused_at_prepare():
    from hcsim.run.prepare import prepare

    with pytest.raises(ConfigError, match=r"jobs: 4097 XPUs asked for \(4096 \+ 1\), but platform 'paper-cxl' has "
                                          r"4096"):
        prepare(load_scenario(None, {"jobs": [{"name": "a", "xpus": 4096}, {"name": "b", "xpus": 1}]}))
    with pytest.raises(ConfigError, match=r"jobs\[1\]\.xpus: xpu99999 is not an XPU of platform 'paper-cxl'"):
        prepare(load_scenario(None, {"jobs": [{"name": "a", "xpus": 1}, {"name": "b", "xpus": ["xpu99999"]}]}))


def test_the_top_level_xpus_and_jobs_alone_without_jobs_are_refused():
    with pytest.raises(ConfigError, match=r"xpus: with jobs, each job names its XPUs"):
        load_scenario(None, {"xpus": 8, "jobs": [{"name": "a", "xpus": 2}]})
    with pytest.raises(ConfigError, match=r"jobs_alone: applies to a scenario with jobs"):
        load_scenario(None, {"jobs_alone": True})


def test_a_scenario_without_jobs_keeps_its_digest_and_record():
    scenario = load_scenario(None, {"xpus": 8})
    assert "jobs" not in scenario.to_dict() or scenario.to_dict()["jobs"] is None
    assert scenario.digest() == load_scenario(None, {"xpus": 8, "jobs_alone": False}).digest()


def test_the_cli_says_what_is_wrong_without_a_traceback(tmp_path):
    path = tmp_path / "two.yaml"
    path.write_text("jobs:\n  - {name: a, xpus: 2, platform: dgx-h100}\n")
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "simulate", str(path)], capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "jobs[0].platform: a platform key" in done.stderr and "Traceback" not in done.stderr


def test_a_job_that_is_done_stops_and_frees_its_links(shared, apart):
    """Job b runs 2 iterations, job a 4: a's first two are as long as when both share the links throughout, its
    last two as long as alone (each job's iteration ends recorded on their own, the run's iteration k ending
    when every job that runs it has)."""
    run = simulate(load_scenario(None, {**BASE, "jobs": [{"name": "a", "xpus": ["xpu0", "xpu8"], "iterations": 4},
                                                         {"name": "b", "xpus": ["xpu1", "xpu9"]}]}))
    a, b = run["jobs"]
    assert len(a["iteration_times_s"]) == 4 and len(b["iteration_times_s"]) == 2
    assert b["iteration_times_s"] == shared["jobs"][1]["iteration_times_s"]
    assert a["iteration_times_s"][:2] == shared["jobs"][0]["iteration_times_s"]
    alone = apart["jobs"][0]["alone_iteration_time_s"]
    assert a["iteration_times_s"][2:] == pytest.approx([alone, alone], rel=1e-9)
    assert run["iteration_times_s"] == a["iteration_times_s"]
    assert a["iteration_time_s"] == pytest.approx(sum(a["iteration_times_s"][1:]) / 3, rel=1e-12)


def test_a_memory_two_jobs_spill_to_holds_what_both_put_there():
    """Each job spills 281 GB per XPU to its CPU's DRAM: one job fits a 400 GB DRAM, two jobs on one CPU's do not;
    on two CPUs' they fit."""
    from hcsim.errors import WorkloadError
    from hcsim.run.prepare import prepare

    def scenario(b):
        return load_scenario(None, {**BASE, "platform_overrides": {"server.dram_capacity": "400GB"},
                                    "jobs": [{"name": "a", "xpus": ["xpu0", "xpu8"]}, {"name": "b", "xpus": b}]})

    with pytest.raises(WorkloadError, match=r"jobs: together, memory 'r0s0\.dram0' is shared by 2 XPUs \(xpu0, "
                                            r"xpu1\) and holds 400 GB"):
        prepare(scenario(["xpu1", "xpu9"]))
    assert prepare(scenario(["xpu4", "xpu12"])).jobs[1].xpus == ["xpu4", "xpu12"]


def test_a_sweep_refuses_a_scenario_with_jobs_before_any_point_runs(tmp_path):
    path = tmp_path / "exp.yaml"
    path.write_text("name: two\ndescription: two jobs\nbase:\n  platform: paper-traditional\n  jobs:\n"
                    "    - {name: a, xpus: 2}\n    - {name: b, xpus: 2}\naxes:\n  iterations: [1, 2]\n")
    done = subprocess.run([sys.executable, "-m", "hcsim.cli", "sweep", str(path), "--out", str(tmp_path / "out")],
                          capture_output=True, text=True)
    assert done.returncode == 2, done.stderr
    assert "jobs: hcsim sweep compares one job's iterations per point" in done.stderr
    assert "Traceback" not in done.stderr


def test_each_job_reports_the_clock_its_own_gemms_keep_under_the_power_limit():
    """Two eager jobs on one DGX H100, one XPU each: GPT-2's GEMMs are a tenth of its kernel time (under the
    limit: nothing to report), Llama 3.2 1B's about half (below its clock); each job's record says its own clock,
    the one it has alone, not the lowest of the run's."""
    base = {"platform": "dgx-h100", "iterations": 1}
    gpt2 = {"name": "gpt2", "xpus": ["xpu0"], "workload": "gpt2-hf"}
    llama = {"name": "llama", "xpus": ["xpu1"], "workload": "llama3.2-1b-hf", "workload_overrides": {"model.decoders": 4}}
    together = simulate(load_scenario(None, {**base, "jobs": [gpt2, llama]}))["jobs"]
    alone = [simulate(load_scenario(None, {**base, "jobs": [job]}))["jobs"][0] for job in (gpt2, llama)]
    assert [job["gemm_clocks"] for job in together] == [job["gemm_clocks"] for job in alone]
    assert together[0]["gemm_clocks"] == {} and 0.9 < together[1]["gemm_clocks"]["H100"] < 1
