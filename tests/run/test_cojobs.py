"""A serving job beside a training job on one fabric (hcsim.run.cojobs, docs/jobs.md): one SimGrid run, each job
reported on its own. On paper-traditional, XPUs 0-3 of a server share its first NIC, XPUs 4-7 the second. The
training job (LLaMA2-13B data parallel, one iteration: its iteration time is its end, measured from 0) runs on
xpu0 + xpu8; the serving job (OPT-13B, tp 2 over the two servers: two ring all-reduces per layer over the NICs) on
xpu1 + xpu9 shares the first NICs with it, on xpu4 + xpu12 shares no link. Each simulation runs in a fresh
process (SimGrid: one engine per process)."""

import json

import pytest

from hcsim.errors import ConfigError
from hcsim.run.scenario import load_scenario
from hcsim.run.simulation import simulate

SERVE = {"name": "serve", "workload": "opt-13b-serving", "tp": 2,
         "workload_overrides": {"serving.requests": 24, "serving.rate": 3}}
BASE = {"name": "train-serve", "platform": "paper-traditional", "iterations": 1}
# what a serving record holds that says how its requests went (not how long the simulation took)
SERVED = ("ttft_s", "tpot_s", "itl_s", "e2e_s", "makespan_s", "throughput_tokens_per_s", "steps", "output_tokens",
          "preemptions", "kv")


def _scenario(serve_xpus, **more):
    return load_scenario(None, {**BASE, "jobs": [{"name": "train", "xpus": ["xpu0", "xpu8"]},
                                                 {**SERVE, "xpus": serve_xpus}], **more})


@pytest.fixture(scope="module")
def shared():
    return simulate(_scenario(["xpu1", "xpu9"], jobs_alone=True))


@pytest.fixture(scope="module")
def apart():
    return simulate(_scenario(["xpu4", "xpu12"], jobs_alone=True))


def test_a_serving_job_on_links_of_its_own_runs_as_alone_bit_for_bit(apart):
    train, serve = apart["jobs"]
    assert train["iteration_times_s"] == [train["alone_iteration_time_s"]] and train["slowdown"] == 1.0
    assert serve["kind"] == "serving" and serve["xpu_names"] == "xpu4+xpu12"
    assert set(serve["slowdown"].values()) == {1.0}
    alone = simulate(load_scenario(None, {**BASE, "jobs": [{**SERVE, "xpus": ["xpu4", "xpu12"]}]}))
    assert alone["kind"] == "serving"
    assert {k: serve[k] for k in SERVED} == {k: alone[k] for k in SERVED}


def test_a_serving_job_and_a_training_job_on_one_nic_each_lose_and_neither_gains(shared):
    """The training job's all-reduce and the serving job's TP all-reduces cross the same NIC links: the training
    iteration ends later than alone, and every latency mean of the serving job is longer and its throughput lower."""
    train, serve = shared["jobs"]
    assert train["iteration_time_s"] > train["alone_iteration_time_s"] and train["slowdown"] > 1
    for key in ("ttft_s", "tpot_s", "itl_s", "e2e_s"):
        assert serve[key]["mean"] > serve["alone"][key]
        assert serve["slowdown"][key] == serve[key]["mean"] / serve["alone"][key] > 1
    assert serve["throughput_tokens_per_s"] < serve["alone"]["throughput_tokens_per_s"]
    assert serve["xpu_names"] == "xpu1+xpu9" and shared["xpus"] == 4


def test_serving_phases_that_cross_the_training_jobs_links_are_simulated_in_full(shared, apart):
    """Alone on its links a serving step's phases are each one delay of their closed-form time; beside a training
    job whose routes cross the NICs, the all-reduce phases are simulated flow by flow (more activities), never
    timed as if alone."""
    assert shared["jobs"][1]["activities"] > 2 * apart["jobs"][1]["activities"]


def test_a_run_with_a_serving_job_is_deterministic(shared):
    again = simulate(_scenario(["xpu1", "xpu9"], jobs_alone=True))

    def served(result):
        return json.dumps([{k: job[k] for k in job if "wall" not in k} for job in result["jobs"]], sort_keys=True)

    assert served(again) == served(shared)


@pytest.mark.parametrize("serve, more, message", [
    ({"zero": 1}, {}, r"jobs\[1\]\.zero: 1 does not apply to serving workload 'opt-13b-serving'"),
    ({"iterations": 3}, {}, r"jobs\[1\]\.iterations: 3 does not apply to serving workload"),
    ({}, {"compute_model": "peak"}, r"compute_model: 'peak', but jobs\[1\] serves \('opt-13b-serving'\), which the "
                                    r"kernel model times. Fix: compute_model: roofline"),
    ({"xpus": ["xpu0", "xpu9"]}, {}, r"jobs\[1\]\.xpus: xpu0 is jobs\[0\]'s too; jobs run on disjoint XPUs"),
    ({"xpus": ["xpu1", "xpu9", "xpu10"]}, {}, r"jobs\[1\]: xpus 3 is not a multiple of tp x pp = 2 x 1"),
])
def test_a_serving_job_with_what_it_cannot_take_is_one_clear_error(serve, more, message):
    from hcsim.run.cojobs import serving_job_run
    from hcsim.run.prepare import prepare

    with pytest.raises(ConfigError, match=message):
        scenario = load_scenario(None, {**BASE, **more, "jobs": [{"name": "train", "xpus": ["xpu0", "xpu8"]},
                                                                 {**SERVE, "xpus": ["xpu1", "xpu9"], **serve}]})
        serving_job_run(prepare(scenario))


def test_a_run_with_a_serving_job_writes_its_requests_in_a_folder_named_after_it(tmp_path):
    """--out: the run's outputs, and in OUT/serve/ the serving job's as a serving run writes them: one
    requests.csv row per request, each with its first token before its finish, and its result.json the record's
    numbers."""
    import csv

    out = tmp_path / "out"
    result = simulate(_scenario(["xpu4", "xpu12"]), out)
    folder = out / "serve"
    rows = list(csv.DictReader((folder / "requests.csv").open()))
    assert [int(row["request"]) for row in rows] == list(range(24))
    assert all(float(row["first_token_s"]) <= float(row["finish_s"]) for row in rows)
    assert {"kv.csv", "kv.png", "latency.png", "result.json"} <= {p.name for p in folder.iterdir()}
    record = next(job for job in result["jobs"] if job.get("kind") == "serving")
    written = json.loads((folder / "result.json").read_text())
    assert written["ttft_s"] == record["ttft_s"] and written["output_tokens"] == record["output_tokens"]
    assert (out / "result.json").exists()


def test_a_memory_the_training_jobs_offload_to_holds_only_the_rest_for_the_serving_job():
    """cxl-pool: the training job's optimizer state in the pool (offload coherent) and the serving job's KV cache
    spilling to the same pool: the pool is one capacity, so the serving job's blocks there are its share of what
    the training leaves, (capacity - taken) / 2 a replica XPU against capacity / 2 alone."""
    from hcsim.run.prepare import prepare

    train = {"name": "train", "xpus": 16, "workload": "llama3-8b", "micro_batch": 4, "recompute": "full", "zero": 0,
             "offload": "coherent"}
    serve = {"name": "serve", "xpus": ["xpu16", "xpu17"], "workload": "opt-13b-serving", "spill": "allow", "tp": 2,
             "workload_overrides": {"serving.requests": 4, "serving.gpu_memory_utilization": 0.4}}
    base = {"name": "pool", "platform": "cxl-pool", "compute_model": "roofline", "iterations": 1,
            "local_collectives": "analytic", "collective_model": "flow"}
    scenario = load_scenario(None, {**base, "jobs": [train, serve]})
    prepared = prepare(scenario)
    pool = prepared.platform.nodes["xpu16"]["extended_memory"]
    taken, capacity = prepared.taken[pool], prepared.platform.nodes[pool]["capacity"]
    assert 0 < taken < capacity and pool == prepared.platform.nodes["xpu0"]["extended_memory"]
    together = simulate(scenario)["jobs"][1]["kv"]["extended_tokens_per_replica"]
    alone = simulate(load_scenario(None, {**base, "jobs": [serve]}))["kv"]["extended_tokens_per_replica"]
    assert together < alone
    assert together == pytest.approx(alone * (capacity - taken) / capacity, rel=1e-5)
