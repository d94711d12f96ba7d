"""Llama 3 70B on a mixed cluster of one DGX H100 node and one DGX H200 node (16 GPUs, tp 4): co-located replicas
against prefill/decode disaggregation, goodput under latency targets as the arrival rate grows.

    .venv/bin/python experiments/disaggregation/run.py                # results/disaggregation.{csv,md,png}
    .venv/bin/python experiments/disaggregation/run.py --report-only  # redraw and rewrite from the CSV

Each point is `hcsim simulate` of workloads/llama3-70b-serving.yaml (prompts 2k-8k and outputs 256-1k tokens,
Poisson arrivals; vLLM V1's scheduler, 8,192 tokens and 256 sequences a step), 256 requests, on dgx-h100 with
devices [H100, H200] (node by node: XPUs 0-7 H100, 8-15 H200): four replicas of tp 4, two on each node. Systems:
co-located (every replica prefills and decodes, requests dealt in turn); 2 prefill + 2 decode with the H100s
prefilling and the H200s decoding, and the reverse; 3 prefill (two H100 replicas, one H200) + 1 decode (H200);
and, added after the sweep (serving.routing came later), co-located and 3P:1D with each arrival routed to the
least loaded replica instead of in turn (the decode replica is picked by load in every disaggregated system). A
request meets the tight-TPOT SLO with its first token within 1 s and its time per output token within 25 ms, the
tight-TTFT SLO within 0.5 s and 50 ms; goodput is the requests meeting it per second of the run (hcsim's
serving.slo), and DistServe's goodput the highest rate swept at which 90 % of the requests meet it. The
findings were written after a pilot of single points (co-located and 2P:2D at tp 8 at 2 and 4 requests/s, 128
requests; co-located, 2P:2D and 3P:1D at tp 4 at 4 and 6 requests/s, 256 requests) and before the sweep.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RATES = (2, 4, 6, 8)  # requests per second
BASE = {"workload": "llama3-70b-serving", "platform": "dgx-h100", "xpus": 16, "tp": 4}
REQUESTS = 256
SLOS = {"tight TPOT": {"ttft": "1s", "tpot": "25ms"}, "tight TTFT": {"ttft": "500ms", "tpot": "50ms"}}
ATTAINMENT = 0.9  # DistServe's goodput: the highest rate at which this share of the requests meets the SLO
SYSTEMS = {  # label -> (devices node by node, serving.disaggregation or None, serving.routing)
    "co-located": (["H100", "H200"], None, "round_robin"),
    "2P:2D, H100 prefill, H200 decode": (["H100", "H200"], {"prefill": 2, "decode": 2}, "round_robin"),
    "2P:2D, H200 prefill, H100 decode": (["H200", "H100"], {"prefill": 2, "decode": 2}, "round_robin"),
    "3P:1D, H100+H200 prefill, H200 decode": (["H100", "H200"], {"prefill": 3, "decode": 1}, "round_robin"),
    # added after the sweep (serving.routing came later; the findings compare the four above): arrivals to the
    # least loaded replica instead of in turn
    "co-located, least loaded": (["H100", "H200"], None, "least_loaded"),
    "3P:1D, least loaded prefill": (["H100", "H200"], {"prefill": 3, "decode": 1}, "least_loaded"),
}
COLOCATED, FORWARD, REVERSE, THREE, *LATER = SYSTEMS
DISAGGREGATED = (FORWARD, REVERSE, THREE)


def best_rate(t, system, slo):
    """DistServe's goodput of `system` under `slo`: the highest rate swept at which ATTAINMENT of requests meet it."""
    return max([rate for rate in RATES if t[system, rate][f"attainment {slo}"] >= ATTAINMENT], default=0)


FINDINGS = [  # written before the sweep (after the pilot the docstring names)
    ("every disaggregated system's p99 time between tokens is below the co-located one's at every rate (no decode "
     "step waits for a prefill chunk)",
     lambda t: all(t[s, r]["itl_p99_s"] < t[COLOCATED, r]["itl_p99_s"] for s in DISAGGREGATED for r in RATES)),
    ("under the tight-TPOT SLO (1 s, 25 ms), 3P:1D serves more goodput than co-located at 4 and 6 requests/s",
     lambda t: all(t[THREE, r]["goodput tight TPOT"] > t[COLOCATED, r]["goodput tight TPOT"] for r in (4, 6))),
    ("under the tight-TTFT SLO (0.5 s, 50 ms), co-located serves at least the goodput of every disaggregated "
     "system at every rate (all four of its replicas prefill)",
     lambda t: all(t[COLOCATED, r]["goodput tight TTFT"] >= t[s, r]["goodput tight TTFT"] for s in DISAGGREGATED
                   for r in RATES)),
    ("decoding on the H200s gives a lower median time per output token than decoding on the H100s (2P:2D both "
     "ways) at every rate: decode reads weights and KV at 4.8 against 3.35 TB/s",
     lambda t: all(t[FORWARD, r]["tpot_p50_s"] < t[REVERSE, r]["tpot_p50_s"] for r in RATES)),
    ("DistServe's goodput (the highest rate with 90 % meeting the SLO): under tight TPOT 3P:1D's is above "
     "co-located's; under tight TTFT co-located's is at least every disaggregated system's",
     lambda t: best_rate(t, THREE, "tight TPOT") > best_rate(t, COLOCATED, "tight TPOT")
     and all(best_rate(t, COLOCATED, "tight TTFT") >= best_rate(t, s, "tight TTFT") for s in DISAGGREGATED)),
]
COLUMNS = ("system", "rate", "requests_per_s", "tokens_per_s", "ttft_p50_s", "ttft_p90_s", "ttft_p99_s",
           "tpot_p50_s", "tpot_p90_s", "tpot_p99_s", "itl_mean_s", "itl_p99_s", "itl_max_p50_s", "e2e_p99_s", "handoff_p99_s",
           "attainment tight TPOT", "goodput tight TPOT", "attainment tight TTFT", "goodput tight TTFT",
           "preemptions")


def main() -> int:
    out = HERE / "results"
    from hcsim.study.summary import read_rows, report_only, write_rows

    if report_only(__doc__):
        report(read_rows(out / "disaggregation.csv", text=("system",)), out)
        return 0
    rows = [point(label, rate) for label in SYSTEMS for rate in RATES]
    write_rows(out / "disaggregation.csv", rows, COLUMNS)
    report(rows, out)
    return 0


def point(label: str, rate: int) -> dict:
    """One system at one rate: its latencies and, under each SLO, the share of requests meeting it and goodput."""
    from hcsim.errors import SimulationError
    from hcsim.run.scenario import load_scenario
    from hcsim.run.serving import percentiles
    from hcsim.run.simulation import simulate
    from hcsim.units import parse_quantity
    from hcsim.workload.serving import Slo

    devices, split, routing = SYSTEMS[label]
    first, *_ = SLOS
    overrides = {"serving.requests": REQUESTS, "serving.rate": rate, "serving.slo": SLOS[first],
                 "serving.routing": routing}
    if split:
        overrides["serving.disaggregation"] = split
    result = simulate(load_scenario(None, BASE | {"name": "disaggregation", "devices": devices,
                                                  "workload_overrides": overrides}))
    rows, makespan = result["per_request"], result["makespan_s"]
    row = {"system": label, "rate": rate, "requests_per_s": result["requests_per_s"],
           "tokens_per_s": result["throughput_tokens_per_s"], "itl_mean_s": result["itl_s"]["mean"],
           "itl_p99_s": result["itl_s"]["p99"], "e2e_p99_s": result["e2e_s"]["p99"],
           "itl_max_p50_s": percentiles([r["itl_max_s"] for r in rows])["p50"],  # a request's longest gap: median
           "handoff_p99_s": result["handoff_s"]["p99"] if split else 0.0, "preemptions": result["preemptions"]}
    for key in ("ttft", "tpot"):
        row |= {f"{key}_{p}_s": result[f"{key}_s"][p] for p in ("p50", "p90", "p99")}
    for name, targets in SLOS.items():  # each request's times against the targets, as serving.slo counts them
        slo = Slo(**{key: parse_quantity(value, "time", f"SLOS[{name!r}].{key}") for key, value in targets.items()})
        met = sum(slo.met(r["ttft_s"], r["tpot_s"]) for r in rows)
        row[f"attainment {name}"], row[f"goodput {name}"] = met / len(rows), met / makespan
    if row[f"goodput {first}"] != result["goodput"]["requests_per_s"]:  # (the same rule as hcsim's own)
        raise SimulationError(f"{label} at {rate}/s: goodput {row[f'goodput {first}']} is not hcsim's "
                              f"{result['goodput']['requests_per_s']}")
    print(f"{label:<40} {rate:>2}/s  ttft p90 {row['ttft_p90_s']:6.3f} s  tpot p50 {row['tpot_p50_s'] * 1e3:5.1f} ms  "
          f"itl p99 {row['itl_p99_s'] * 1e3:6.1f} ms  goodput {row['goodput tight TPOT']:5.2f} / "
          f"{row['goodput tight TTFT']:5.2f} per s", file=sys.stderr)
    return row


def report(rows, out: Path) -> None:
    """disaggregation.md (findings, DistServe's goodput, the table, the notes) and disaggregation.png."""
    from hcsim.study.summary import discussion, results_table

    table = {(row["system"], int(row["rate"])): row for row in rows}
    _plot(rows, out / "disaggregation.png")
    lines = ["# Co-located against disaggregated serving on a mixed H100 + H200 cluster\n", __doc__.split("\n\n")[0],
             "", "## Findings (written before the sweep)\n"]
    lines += [f"- **{'holds' if check(table) else 'does not hold'}**: {claim}" for claim, check in FINDINGS]
    lines += ["", f"## DistServe's goodput: the highest rate swept with {ATTAINMENT:.0%} of requests meeting the SLO\n",
              "| system | " + " | ".join(SLOS) + " |", "|---|" + "---|" * len(SLOS)]
    lines += [f"| {s} | " + " | ".join(f"{best_rate(table, s, slo)}/s" for slo in SLOS) + " |" for s in SYSTEMS]
    lines += results_table(rows, COLUMNS) + discussion(HERE / "notes.md")
    (out / "disaggregation.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'disaggregation.md'}, {out / 'disaggregation.png'}", file=sys.stderr)


def _plot(rows, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with plt.rc_context({"font.family": "serif", "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False}):
        figure, panels = plt.subplots(1, 3, figsize=(14, 4))
        for n, label in enumerate(SYSTEMS):
            mine = [row for row in rows if row["system"] == label]
            rates = [row["rate"] for row in mine]
            style = {"marker": "osD^vP"[n], "label": label, "linestyle": ":" if label in LATER else "-" if n == 0
                     else "--", "fillstyle": "none" if label in LATER else "full"}
            for panel, slo in zip(panels, SLOS):
                panel.plot(rates, [row[f"goodput {slo}"] for row in mine], **style)
            panels[2].plot(rates, [row["itl_p99_s"] * 1e3 for row in mine], **style)
        for panel, (slo, targets) in zip(panels, SLOS.items()):
            panel.set(xlabel="Arrival rate (requests/s)", ylabel="Goodput (requests/s meeting the SLO)",
                      title=f"{slo}: TTFT <= {targets['ttft']}, TPOT <= {targets['tpot']}")
        panels[2].set(xlabel="Arrival rate (requests/s)", ylabel="p99 time between tokens (ms)", yscale="log",
                      title="Inter-token latency (p99)")
        panels[0].legend(fontsize=7, frameon=False)
        figure.suptitle(f"Llama 3 70B on 8 H100 + 8 H200 (tp 4, four replicas), {REQUESTS} requests: "
                        "co-located against prefill/decode disaggregation")
        figure.tight_layout()
        figure.savefig(path, dpi=150)
        plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
