"""Llama 3 70B serving on 8 H100 with the KV cache spilling to CXL memory: coherent or not, CXL bandwidth and
latency, against more HBM-only GPUs. At which load and CXL bandwidth does coherent KV offload match adding GPUs?
And with the offload policies serving stacks use (serving.kv_offload: blocks of preempted sequences to CXL or
host DRAM, back by prefetch beside the steps, by swap in the step, or read in place), does a KV tier pay?

    .venv/bin/python experiments/serving/run.py                 # results/serving.{csv,md,png}, ~1.5 min on 2 cores
    .venv/bin/python experiments/serving/run.py --report-only   # redraw and rewrite from the CSV

Each point is `hcsim simulate` of workloads/llama3-70b-serving.yaml (512 requests, prompts 2k-8k and outputs
256-1k tokens, Poisson arrivals; vLLM V1's scheduler) with max_num_seqs 1024, so HBM (1.45 M tokens of KV blocks
on 8 H100 after the weights and activations, at vLLM's 0.9 of the memory) can overflow. Findings were written
before the first run; the offload findings before the offload systems' first run.
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
RATES = (2, 4, 8)  # requests per second
BASE = {"workload": "llama3-70b-serving", "devices": ["H100"], "tp": 8, "workload_overrides": {"serving.max_num_seqs": 1024}}
SYSTEMS = {  # label -> scenario keys
    "8 H100, HBM only": {"platform": "paper-cxl", "xpus": 8, "spill": "error"},
    "8 H100 + CXL 32 GB/s": {"platform": "paper-cxl", "xpus": 8, "cxl_bandwidth": "32GB/s"},
    "8 H100 + CXL 128 GB/s": {"platform": "paper-cxl", "xpus": 8, "cxl_bandwidth": "128GB/s"},
    "8 H100 + CXL 128 GB/s, 2 us": {"platform": "paper-cxl", "xpus": 8, "cxl_bandwidth": "128GB/s", "cxl_latency": "2us"},
    "8 H100 + CXL 512 GB/s": {"platform": "paper-cxl", "xpus": 8, "cxl_bandwidth": "512GB/s"},
    "8 H100 + host DRAM (no coherence)": {"platform": "paper-traditional", "xpus": 8},
    "16 H100 (2 replicas), HBM only": {"platform": "paper-cxl", "xpus": 16, "spill": "error"},
}
OFFLOAD = {  # label -> scenario keys, serving.kv_offload: admission in HBM, preempted blocks to the tier
    "8 H100 + CXL 32 GB/s, offload prefetch": ({"platform": "paper-cxl", "xpus": 8, "cxl_bandwidth": "32GB/s"},
                                               {"tier": "cxl", "policy": "prefetch"}),
    "8 H100 + CXL 128 GB/s, offload prefetch": ({"platform": "paper-cxl", "xpus": 8, "cxl_bandwidth": "128GB/s"},
                                                {"tier": "cxl", "policy": "prefetch"}),
    "8 H100 + CXL 128 GB/s, offload swap": ({"platform": "paper-cxl", "xpus": 8, "cxl_bandwidth": "128GB/s"},
                                            {"tier": "cxl", "policy": "swap"}),
    "8 H100 + CXL 128 GB/s, offload in place": ({"platform": "paper-cxl", "xpus": 8, "cxl_bandwidth": "128GB/s"},
                                                {"tier": "cxl", "policy": "in_place"}),
    "8 H100 + CXL 256 GB/s, offload in place": ({"platform": "paper-cxl", "xpus": 8, "cxl_bandwidth": "256GB/s"},
                                                {"tier": "cxl", "policy": "in_place"}),
    "8 H100 + CXL 512 GB/s, offload in place": ({"platform": "paper-cxl", "xpus": 8, "cxl_bandwidth": "512GB/s"},
                                                {"tier": "cxl", "policy": "in_place"}),
    "8 H100 + host DRAM, offload prefetch": ({"platform": "paper-traditional", "xpus": 8},
                                             {"tier": "cpu", "policy": "prefetch"}),
}
SYSTEMS |= {label: keys for label, (keys, _) in OFFLOAD.items()}
FINDINGS = [  # written before the first run
    ("at 2 requests/s nothing spills: every 8-GPU system serves within 1 % of the HBM-only throughput",
     lambda t: all(abs(t[s, 2]["tokens"] / t["8 H100, HBM only", 2]["tokens"] - 1) < 0.01
                   for s in SYSTEMS if s.startswith("8 H100"))),
    ("at 8 requests/s coherent CXL at 512 GB/s beats the copy from host DRAM without coherence (throughput)",
     lambda t: t["8 H100 + CXL 512 GB/s", 8]["tokens"] > t["8 H100 + host DRAM (no coherence)", 8]["tokens"]),
    ("at 8 requests/s coherent CXL at 512 GB/s matches adding GPUs: within 10 % of 16 H100's throughput",
     lambda t: t["8 H100 + CXL 512 GB/s", 8]["tokens"] > 0.9 * t["16 H100 (2 replicas), HBM only", 8]["tokens"]),
    ("at 8 requests/s more CXL bandwidth serves more tokens per second (32 < 128 < 512 GB/s)",
     lambda t: t["8 H100 + CXL 32 GB/s", 8]["tokens"] < t["8 H100 + CXL 128 GB/s", 8]["tokens"]
     < t["8 H100 + CXL 512 GB/s", 8]["tokens"]),
]

def _tokens(t, system, rate):
    return t[system, rate]["tokens"]


OFFLOAD_FINDINGS = [  # written 2026-11-28 before the offload systems' first run (notes.md says what was seen before)
    ("at 8 requests/s a CXL tier at 128 GB/s with prefetch serves at least the HBM-only throughput: the decode "
     "batch stays in HBM, so the tier cannot lose",
     lambda t: _tokens(t, "8 H100 + CXL 128 GB/s, offload prefetch", 8) >= _tokens(t, "8 H100, HBM only", 8)),
    ("at 8 requests/s prefetch at 128 GB/s serves at least 3 % more than HBM only (no preempted request recomputed)",
     lambda t: _tokens(t, "8 H100 + CXL 128 GB/s, offload prefetch", 8) >= 1.03 * _tokens(t, "8 H100, HBM only", 8)),
    ("prefetch hardly depends on the tier's bandwidth: at 8 requests/s CXL 32 GB/s, CXL 128 GB/s and host DRAM "
     "over PCIe are within 2 % of each other",
     lambda t: max(_tokens(t, s, 8) for s in OFFLOAD if "prefetch" in s)
     <= 1.02 * min(_tokens(t, s, 8) for s in OFFLOAD if "prefetch" in s)),
    ("at 8 requests/s prefetch, overlapped with the steps, serves at least as much as swap, copied in the step",
     lambda t: _tokens(t, "8 H100 + CXL 128 GB/s, offload prefetch", 8)
     >= _tokens(t, "8 H100 + CXL 128 GB/s, offload swap", 8)),
    ("at 8 requests/s reading offloaded blocks in place at 128 GB/s serves less than prefetching them",
     lambda t: _tokens(t, "8 H100 + CXL 128 GB/s, offload in place", 8)
     < _tokens(t, "8 H100 + CXL 128 GB/s, offload prefetch", 8)),
    ("with offload the old spill's loss is gone: at 8 requests/s prefetch at 128 GB/s serves more than spill at "
     "512 GB/s",
     lambda t: _tokens(t, "8 H100 + CXL 128 GB/s, offload prefetch", 8) > _tokens(t, "8 H100 + CXL 512 GB/s", 8)),
    ("(written after the first offload run, before 256 GB/s ran) in place pays against HBM only from 256 GB/s: at 8 "
     "requests/s CXL 256 GB/s read in place serves at least the HBM-only throughput, and less than 512 GB/s",
     lambda t: _tokens(t, "8 H100, HBM only", 8) <= _tokens(t, "8 H100 + CXL 256 GB/s, offload in place", 8)
     < _tokens(t, "8 H100 + CXL 512 GB/s, offload in place", 8)),
    ("a KV tier still does not match adding GPUs: at 8 requests/s no 8-GPU system reaches 0.9 x 16 H100's throughput",
     lambda t: all(_tokens(t, s, 8) < 0.9 * _tokens(t, "16 H100 (2 replicas), HBM only", 8)
                   for s in SYSTEMS if s.startswith("8 H100"))),
]
COLUMNS = ("system", "rate", "tokens_per_s", "ttft_p50_s", "ttft_p99_s", "tpot_p50_s", "tpot_p99_s", "e2e_p99_s",
           "peak_hbm_tokens", "peak_extended_tokens", "preemptions", "spilled_to", "recomputed_tokens",
           "stored_gb", "loaded_gb", "extended_read_gb")


def main() -> int:
    out = HERE / "results"
    from hcsim.study.summary import read_rows, report_only, write_rows

    if report_only(__doc__):
        report(read_rows(out / "serving.csv", text=("system", "spilled_to")), out)
        return 0
    from hcsim.run.scenario import load_scenario
    from hcsim.run.simulation import simulate

    rows = []
    for label, keys in SYSTEMS.items():
        for rate in RATES:
            offload = {"serving.kv_offload": OFFLOAD[label][1]} if label in OFFLOAD else {}
            settings = BASE | keys | {"name": "serving", "workload_overrides": BASE["workload_overrides"]
                                      | {"serving.rate": rate} | offload}
            result = simulate(load_scenario(None, settings))
            row = {"system": label, "rate": rate, "tokens_per_s": result["throughput_tokens_per_s"],
                   "ttft_p50_s": result["ttft_s"]["p50"], "ttft_p99_s": result["ttft_s"]["p99"],
                   "tpot_p50_s": result["tpot_s"]["p50"], "tpot_p99_s": result["tpot_s"]["p99"],
                   "e2e_p99_s": result["e2e_s"]["p99"], "peak_hbm_tokens": result["kv"]["peak_hbm_tokens"],
                   "peak_extended_tokens": result["kv"]["peak_extended_tokens"],
                   "preemptions": result["preemptions"], "spilled_to": result["kv"]["spilled_to"] or "",
                   "recomputed_tokens": result["recomputed_tokens"], **_moved(result)}
            rows.append(row)
            print(f"{label:<36} {rate:>2}/s {row['tokens_per_s']:>8,.0f} tok/s  ttft p99 {row['ttft_p99_s']:7.2f} s  "
                  f"tpot p99 {row['tpot_p99_s'] * 1e3:7.1f} ms  spilled {row['peak_extended_tokens']:,}", file=sys.stderr)
    write_rows(out / "serving.csv", rows, COLUMNS)
    report(rows, out)
    return 0


def _moved(result) -> dict:
    """GB stored into the memory beyond HBM, loaded back from it and read from it by the steps (over every XPU)."""
    tier = result["kv"]["tiers"].get(result["kv"]["spilled_to"] or "", {})
    return {f"{key}_gb": tier.get(f"{key}_bytes", 0.0) / 1e9 for key in ("stored", "loaded")} | {
        "extended_read_gb": tier.get("read_bytes", 0.0) / 1e9}


def report(rows, out: Path) -> None:
    """serving.md (findings, table, the notes) and serving.png from the rows."""
    from hcsim.study.summary import discussion, results_table

    table = {(row["system"], int(row["rate"])): {"tokens": row["tokens_per_s"]} for row in rows}
    _plot(rows, out / "serving.png")
    lines = ["# Llama 3 70B serving: KV cache in HBM, CXL (coherent) or host DRAM\n", __doc__.split("\n\n")[0], "",
             "## Findings (written before the first run)\n"]
    lines += [f"- **{'holds' if check(table) else 'does not hold'}**: {claim}" for claim, check in FINDINGS]
    if all((system, rate) in table for system in OFFLOAD for rate in RATES):
        lines += ["", "## Offload findings (written before the offload systems' first run)\n"]
        lines += [f"- **{'holds' if check(table) else 'does not hold'}**: {claim}" for claim, check in OFFLOAD_FINDINGS]
    lines += results_table(rows, COLUMNS) + discussion(HERE / "notes.md")
    (out / "serving.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {out / 'serving.md'}, {out / 'serving.png'}", file=sys.stderr)


def _plot(rows, path: Path) -> None:
    """Per system a row of bars, one per arrival rate: throughput and p99 time per output token side by side
    (14 systems whose curves nearly coincide in groups: bars cannot hide one another, as lines did)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    systems = list(SYSTEMS)[::-1]  # top to bottom in the order of SYSTEMS
    value = {(row["system"], int(row["rate"])): row for row in rows}
    height = 0.8 / len(RATES)
    with plt.rc_context({"font.family": "serif", "font.size": 9, "axes.spines.top": False,
                         "axes.spines.right": False}):
        figure, (left, right) = plt.subplots(1, 2, figsize=(12, 0.42 * len(systems) + 1.6), sharey=True)
        for n, rate in enumerate(RATES):
            offsets = [y + (n - (len(RATES) - 1) / 2) * height for y in range(len(systems))]
            shown = [s for s in systems if (s, rate) in value]
            ys = [offsets[systems.index(s)] for s in shown]
            style = {"height": height, "color": f"C{n}", "label": f"{rate} requests/s"}
            left.barh(ys, [value[s, rate]["tokens_per_s"] for s in shown], **style)
            right.barh(ys, [value[s, rate]["tpot_p99_s"] * 1e3 for s in shown], **style)
        left.set_yticks(range(len(systems)), systems)
        left.set(xlabel="Output tokens per second", title="Throughput")
        right.set(xlabel="p99 time per output token (ms, log scale)", title="Latency per output token (p99)",
                  xscale="log")
        for axis in (left, right):
            axis.grid(axis="x", linewidth=0.4, alpha=0.5)
        handles, labels = right.get_legend_handles_labels()  # top to bottom as the bars of a system
        right.legend(handles[::-1], labels[::-1], loc="lower right", fontsize=8, frameon=False)
        figure.suptitle("Llama 3 70B serving on H100 (tp 8), 512 requests: the KV cache beyond HBM")
        figure.tight_layout()
        figure.savefig(path, dpi=150)
        plt.close(figure)


if __name__ == "__main__":
    sys.exit(main())
