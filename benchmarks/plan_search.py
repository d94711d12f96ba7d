"""Is `hcsim plan`'s pick the best? The search against every fitting plan simulated.

    .venv/bin/python benchmarks/plan_search.py llama3-8b --platform dgx-h100 --xpus 8 --global-batch 16 \
        --jobs 2 --out out/plan-search/llama3-8b-8

runs ``hcsim plan ... --all --out OUT`` (every fitting plan simulated; skipped when OUT/plan.csv holds such a run:
``--reuse``), then replays :class:`hcsim.study.plan.Search` over the simulated times in OUT/plan.csv, as
``hcsim plan`` runs it with ``--jobs`` simulations at a time, and prints the exhaustive best, the search's pick,
how many plans the search simulated and the gap between the two; and, for comparison, the pick of the
estimate's top 5 (what ``hcsim plan --top 5`` picked before the search).
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--platform", required=True)
    parser.add_argument("--xpus", required=True)
    parser.add_argument("--global-batch", required=True)
    parser.add_argument("--devices")
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--reuse", action="store_true", help="replay OUT/plan.csv without simulating again")
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    from hcsim.study.plan import Search

    if not args.reuse:
        command = [sys.executable, "-m", "hcsim.cli", "plan", args.model, "--platform", args.platform, "--xpus",
                   args.xpus, "--global-batch", args.global_batch, "--jobs", str(args.jobs), "--all", "--out",
                   str(args.out), "--overwrite"] + (["--devices", args.devices] if args.devices else [])
        wall = time.perf_counter()
        subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
        print(f"every fitting plan simulated in {time.perf_counter() - wall:.0f} s")
    with open(args.out / "plan.csv", newline="") as handle:
        rows = [r for r in csv.DictReader(handle) if r["simulated"] == "True" and r["simulated_s"]]
    shape = {r["plan"]: (r["schedule"], int(r["tp"]), int(r["pp"]), int(r["cp"])) for r in rows}
    simulated = {r["plan"]: float(r["simulated_s"]) for r in rows}
    estimates = {r["plan"]: float(r["estimated_s"]) for r in rows}
    best = min(simulated, key=simulated.get)
    search = Search(estimates, shape=shape.get)
    while not search.finished():
        for plan in search.next(args.jobs):
            search.record(plan, simulated[plan])
    pick = min((p for p, s in search.simulated.items() if s is not None), key=simulated.get)
    top5 = min(sorted(estimates, key=estimates.get)[:5], key=simulated.get)
    print(f"{len(rows)} fitting plans; exhaustive best {simulated[best]:.4f} s: {best}")
    print(f"search: {len(search.simulated)} simulated ({search.finished()}); pick {simulated[pick]:.4f} s "
          f"({simulated[pick] / simulated[best] - 1:+.2%}): {pick}")
    print(f"estimate's top 5: pick {simulated[top5]:.4f} s ({simulated[top5] / simulated[best] - 1:+.2%}): {top5}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
