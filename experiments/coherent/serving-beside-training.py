"""A serving job beside a training job on one rack CXL pool: what each loses.

    .venv/bin/python experiments/coherent/serving-beside-training.py                # results/serving-beside-training.{csv,md}
    .venv/bin/python experiments/coherent/serving-beside-training.py --report-only  # rewrite the report from the CSV

On the cxl-pool platform (DGX-style hosts of 8 H100, every 8 hosts sharing one CXL Type 3 device behind one CXL
2.0 switch: 2 x8 ports a host CPU, 8 device heads), a training job and a serving job run together in one
simulation (a scenario's jobs, docs/jobs.md), and each again alone on the same XPUs (jobs_alone). The training
job: Llama-3 8B data parallel on 16 H100 (hosts 0-1), BF16, micro-batch 4, full recomputation, its optimizer
state in the pool, read and updated in place by the GPUs (offload coherent), one iteration. The serving job:
OPT-13B (FP16) on 2 H100, one replica each (tp 1), vLLM V1's scheduler, 96 requests (prompts 128-1k tokens,
outputs 64-512) at 4 or 8 requests per second, given 40 % of each GPU's memory (serving.gpu_memory_utilization
0.4: about 8,700 tokens of KV blocks a replica after the weights), so its KV cache spills to the memory beyond
HBM, the pool, read in place by each step (spill: allow). The serving XPUs are on host 2 (xpu16, xpu17: the
same pool as the training) or on host 8 (xpu64, xpu65: the next pool, no link in common with the training), at
the pool's port bandwidth of 32 GB/s (CXL 2.0 x8) and, for one point, 128 GB/s. Both jobs are timed by the
kernel model (compute_model: roofline). Scaled down: one training iteration, collectives inside a node analytic,
the rest at flow fidelity, 96 requests. The findings were written before the points ran, after one pilot run
(same pool, 8 requests/s, 32 GB/s), which is named in them.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
NAME = "serving-beside-training"
TRAIN = {"name": "train", "xpus": 16, "workload": "llama3-8b", "micro_batch": 4, "recompute": "full", "zero": 0,
         "offload": "coherent"}
SERVE = {"name": "serve", "workload": "opt-13b-serving", "spill": "allow",
         "workload_overrides": {"serving.requests": 96, "serving.gpu_memory_utilization": 0.4}}
BASE = {"name": NAME, "platform": "cxl-pool", "compute_model": "roofline", "iterations": 1,
        "local_collectives": "analytic", "collective_model": "flow", "jobs_alone": True}
PLACES = {"same pool": ["xpu16", "xpu17"], "own pool": ["xpu64", "xpu65"]}  # the serving job's XPUs
POINTS = [(place, rate, "32GB/s") for place in PLACES for rate in (4, 8)] + [("same pool", 8, "128GB/s")]
COLUMNS = ("place", "rate", "cxl_bandwidth", "compute_model", "train_iteration_s", "train_alone_s", "train_slowdown",
           "tokens_per_s", "alone_tokens_per_s", "ttft_mean_s", "alone_ttft_mean_s", "tpot_mean_s",
           "alone_tpot_mean_s", "e2e_mean_s", "alone_e2e_mean_s", "ttft_slowdown", "tpot_slowdown",
           "throughput_slowdown", "peak_extended_tokens", "serving_makespan_s")


def _row(t, place, rate, bandwidth="32GB/s"):
    return t[place, rate, bandwidth]


FINDINGS = [  # written 2026-11-28 before the points ran (after the one pilot the docstring names)
    ("on its own pool the serving job shares no link with the training: both jobs equal their runs alone bit for "
     "bit at 4 and 8 requests/s (every slowdown exactly 1)",
     lambda t: all(_row(t, "own pool", r)[k] == 1.0 for r in (4, 8)
                   for k in ("train_slowdown", "ttft_slowdown", "tpot_slowdown", "throughput_slowdown"))),
    ("on the training's pool both lose at 4 and 8 requests/s: the training iteration is longer than alone and the "
     "serving job's mean time per output token too (the pilot, 8 requests/s: x1.095 and x1.16)",
     lambda t: all(_row(t, "same pool", r)["train_slowdown"] > 1 and _row(t, "same pool", r)["tpot_slowdown"] > 1
                   for r in (4, 8))),
    ("on the training's pool each loses more at 8 requests/s than at 4 (more KV spilled, more pool traffic): the "
     "training's slowdown and the serving job's per-output-token slowdown are both larger",
     lambda t: _row(t, "same pool", 8)["train_slowdown"] > _row(t, "same pool", 4)["train_slowdown"]
     and _row(t, "same pool", 8)["tpot_slowdown"] > _row(t, "same pool", 4)["tpot_slowdown"]),
    ("the serving job's time to first token loses more than its time per output token (a prefill waits behind "
     "the spilled decodes that the pool slows) at every shared point",
     lambda t: all(row["ttft_slowdown"] > row["tpot_slowdown"] for key, row in t.items() if key[0] == "same pool")),
    ("ports of 128 GB/s cut both losses at 8 requests/s: the training's and the serving job's per-output-token "
     "slowdowns are both smaller than at 32 GB/s",
     lambda t: _row(t, "same pool", 8, "128GB/s")["train_slowdown"] < _row(t, "same pool", 8)["train_slowdown"]
     and _row(t, "same pool", 8, "128GB/s")["tpot_slowdown"] < _row(t, "same pool", 8)["tpot_slowdown"]),
    ("the training never loses more than 15 % of its iteration time at any point",
     lambda t: all(row["train_slowdown"] < 1.15 for row in t.values())),
]


def run_point(place: str, rate: int, bandwidth: str) -> dict:
    from hcsim.run.scenario import load_scenario
    from hcsim.run.simulation import simulate

    serve = {**SERVE, "xpus": PLACES[place],
             "workload_overrides": {**SERVE["workload_overrides"], "serving.rate": rate}}
    result = simulate(load_scenario(None, {**BASE, "cxl_bandwidth": bandwidth, "jobs": [TRAIN, serve]}))
    train, served = result["jobs"]
    alone = served["alone"]
    return {"place": place, "rate": rate, "cxl_bandwidth": bandwidth, "compute_model": train["compute_model"],
            "train_iteration_s": train["iteration_time_s"], "train_alone_s": train["alone_iteration_time_s"],
            "train_slowdown": train["slowdown"], "tokens_per_s": served["throughput_tokens_per_s"],
            "alone_tokens_per_s": alone["throughput_tokens_per_s"], "ttft_mean_s": served["ttft_s"]["mean"],
            "alone_ttft_mean_s": alone["ttft_s"], "tpot_mean_s": served["tpot_s"]["mean"],
            "alone_tpot_mean_s": alone["tpot_s"], "e2e_mean_s": served["e2e_s"]["mean"],
            "alone_e2e_mean_s": alone["e2e_s"], "ttft_slowdown": served["slowdown"]["ttft_s"],
            "tpot_slowdown": served["slowdown"]["tpot_s"], "throughput_slowdown": served["slowdown"]["throughput"],
            "peak_extended_tokens": served["kv"]["peak_extended_tokens"], "serving_makespan_s": served["makespan_s"]}


def main() -> int:
    out = HERE / "results"
    table = out / f"{NAME}.csv"
    from hcsim.study.summary import read_rows, report_only, write_rows

    if report_only(__doc__):
        report(read_rows(table, text=("place", "cxl_bandwidth", "compute_model")), out)
        return 0
    rows = []
    for place, rate, bandwidth in POINTS:
        rows.append(run_point(place, rate, bandwidth))
        row = rows[-1]
        print(f"{place:<9} {rate}/s {bandwidth:>7}: training x{row['train_slowdown']:.4f}, serving ttft "
              f"x{row['ttft_slowdown']:.4f} tpot x{row['tpot_slowdown']:.4f}", file=sys.stderr)
    write_rows(table, rows, COLUMNS)
    report(rows, out)
    return 0


def report(rows: list[dict], out: Path) -> None:
    """NAME.md: the question, the findings and whether each holds, the results table."""
    from hcsim.study.summary import results_table

    table = {(row["place"], int(row["rate"]), row["cxl_bandwidth"]): row for row in rows}
    lines = [f"# {__doc__.splitlines()[0]}\n", __doc__.split("\n\n", 2)[2].strip(), "",
             "## Findings (written before the points ran)\n"]
    lines += [f"- **{'holds' if check(table) else 'does not hold'}**: {claim}" for claim, check in FINDINGS]
    lines += results_table(rows, list(COLUMNS))
    lines += ["", "The discussion is in [../README.md](../README.md#a-serving-job-beside-a-training-job-results-"
                  "against-the-expectations)."]
    (out / f"{NAME}.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / f'{NAME}.csv'}, {out / f'{NAME}.md'}", file=sys.stderr)


if __name__ == "__main__":
    sys.exit(main())
