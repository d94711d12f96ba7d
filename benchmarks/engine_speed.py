"""Engine speed: wall time, peak memory, activities and activities/s at each scale and fidelity,
against what plain SimGrid sustains on the same kind of activities.

Cases (each point runs in a fresh process):

- ``layer``, ``decoder``: LLaMA2-13B data parallel on the paper's coherent topology, one iteration,
  through ``hcsim simulate`` (workload granularity);
- ``gpt3``: GPT-3 175B on paper-cxl A100 (BF16, tp 8 x pp 8, dp = XPUs / 64, 96 micro-batches of 1
  sequence per pipeline, 1F1B, full recomputation, flow collectives, TP collectives analytic); at 1024
  XPUs the performance page's row (global batch 1536);
- ``llama3``: Llama-3 405B on paper-cxl H100, the spec raised to the size asked (tp 8 x pp 16 with 7 + 14 x
  8 + 7 layers, sequence parallelism, dp = XPUs / 128, 16 micro-batches per pipeline, 1F1B, full
  recomputation); at 16,384 XPUs the performance page's row (global batch 2048); ``llama3-dgx``: the same
  on a DGX-H100 fat tree of the size asked (at 131,072 XPUs: 16,384 nodes, dp 1,024);
- ``vtrain``: the vTrain-size row, GPT-3 175B on DGX A100 (tp 8 x pp 32, dp = XPUs / 256, 768
  micro-batches of 1 sequence per pipeline, full recomputation, the roofline compute model, flow collectives,
  TP collectives analytic, every XPU simulated); at 512 XPUs it is the row (global batch 1536);
- ``gpt3-mb``: ``gpt3`` on 64 XPUs with `size` micro-batches per pipeline (wall time against
  micro-batches: its exponent);
- ``2d-hierarchical``: the 2-D data-parallel case (benchmarks/hierarchical_2d.py: servers of 8 on a
  switch, rings across servers, 40 layers of fixed compute and a 634 MB hierarchical all-reduce);
- ``simgrid``: plain SimGrid, no hcsim engine: every XPU of a single switch alternates an execution
  and a transfer to its ring neighbour, each a pooled ExecTask / CommTask fired with
  ``enqueue_firings`` and refired from its completion callback (SimGrid's Python API). Its activities/s is
  the ceiling of a Task-driven engine in Python; the other cases print their ratio to it at the same number
  of XPUs (column /simgrid);
- ``simgrid-cpp``: the same activity mix on SimGrid's C++ S4U API, no Task and no Python in the loop:
  ``simgrid_ceiling.cpp`` beside this file (compiled on first use into build/benchmarks/) runs the chains as
  plain s4u::Exec / s4u::Comm started from completion callbacks in maestro, as hcsim's engine core starts
  its activities, on the platform's XML. Its activities/s is the ceiling of an engine that runs every
  execution as a SimGrid activity; every case prints its ratio to it (column /C++). ``simgrid-cpp-actors``:
  the same chains, one S4U actor per XPU with blocking waits, for the choice between the two.

Per case, the fitted exponent k of wall time ~ XPUs^k (least squares on logs) is printed. Quote the
figures with the machine line (cores, memory, load average): the machine may be shared.

    .venv/bin/python benchmarks/engine_speed.py                    # every case at its default sizes
    .venv/bin/python benchmarks/engine_speed.py --xpus 64 256 --case decoder layer simgrid
    .venv/bin/python benchmarks/engine_speed.py --case gpt3 --xpus 1024      # the GPT-3 row
    .venv/bin/python benchmarks/engine_speed.py --case vtrain                # the vTrain row (512)
    .venv/bin/python benchmarks/engine_speed.py --case llama3 --xpus 16384   # the Llama-3 row
    .venv/bin/python benchmarks/engine_speed.py --case simgrid-cpp layer --xpus 4096 --firings 2000000 \
        --ceiling-platform layer --repeat 5   # the layer ratio: the median of 5 rounds' ratios
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from hcsim.allocator import environment, in_use

HERE = Path(__file__).resolve().parent

LEVELS = {  # name: scenario settings
    "layer": ["granularity=layer"],
    "decoder": ["granularity=decoder"],
}
_HYBRID = ["micro_batch=1", "schedule=1f1b", "recompute=full", "collective_model=flow",
           "local_collectives=analytic", "iterations=1"]
_GPT3 = ["workload=gpt3-175b", "workload_overrides={training.precision: bf16}", "devices=[A100]", "tp=8", "pp=8",
         *_HYBRID]
_LLAMA3 = ["workload=llama3-405b", "devices=[H100]", "tp=8", "pp=16",
           "sequence_parallel=true",
           f"layer_split=[7, {', '.join(['8'] * 14)}, 7]", *_HYBRID]
HYBRID = {  # name: (XPUs per pipeline, micro-batches per pipeline, scenario settings)
    "gpt3": (64, 96, _GPT3),
    "llama3": (128, 16, _LLAMA3),
    "llama3-dgx": (128, 16, [*_LLAMA3, "platform=dgx-h100"]),
    "vtrain": (256, 768, ["workload=gpt3-175b", "platform=dgx-a100", "tp=8", "pp=32", "micro_batch=1",
                          "recompute=full", "compute_model=roofline", "local_collectives=analytic", "iterations=1",
                          "collective_model=flow"]),
}
MICRO_BATCH_CASE = "gpt3-mb"  # gpt3 on one pipeline (64 XPUs); its size is micro-batches per pipeline
CPP_CASES = {"simgrid-cpp": "callbacks", "simgrid-cpp-actors": "actors"}  # case: simgrid_ceiling's driver
CASES = [*LEVELS, *HYBRID, MICRO_BATCH_CASE, "2d-hierarchical", "simgrid", *CPP_CASES]
CEILINGS = ("simgrid-cpp", "simgrid")  # run first, for the ratios
DEFAULT_SIZES = {"gpt3": [64, 256, 1024], "llama3": [1024, 4096, 16384], "llama3-dgx": [16384, 131072],
                 "vtrain": [512], MICRO_BATCH_CASE: [12, 24, 48, 96]}


def scenario_settings(case: str, size: int) -> list[str]:
    """The `--set` settings of one point of a simulate case; `size` is XPUs (micro-batches for gpt3-mb)."""
    if case in LEVELS:
        return [f"xpus={size}", *LEVELS[case]]
    if case == MICRO_BATCH_CASE:
        per, _, settings = HYBRID["gpt3"]
        return [f"xpus={per}", f"global_batch={size}", *settings]
    per, micro_batches, settings = HYBRID[case]
    if size % per:
        raise SystemExit(f"--xpus: case {case} needs a multiple of {per} XPUs, not {size}")
    raised = [f"platform_overrides.xpus={size}"] if case.startswith("llama3") else []  # the spec at the size
    return [f"xpus={size}", f"global_batch={micro_batches * size // per}", *raised, *settings]


def _child(command: list[str], timeout: float) -> dict:
    """Run `command` (prints one JSON object last) in a fresh process; its record plus process_s."""
    start = time.perf_counter()
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=environment())
    except subprocess.TimeoutExpired:
        return {"error": f"> {timeout:.0f} s"}
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1] if done.stderr.strip() else f"exit {done.returncode}"}
    record = json.loads(done.stdout.strip().splitlines()[-1])
    record["process_s"] = time.perf_counter() - start
    return record


def run_point(case: str, xpus: int, iterations: int, timeout: float, firings: int, on: str = "switch") -> dict:
    """One point in a fresh process: process_s, run_s (the simulation proper), activities, peak_rss_mb. `on`: the
    ceilings' platform (:func:`_ring_platform`)."""
    if case == "simgrid":
        return _child([sys.executable, __file__, "--simgrid-point", str(xpus), "--firings", str(firings),
                       "--ceiling-platform", on], timeout)
    if case in CPP_CASES:
        ceiling_program()  # compiled here, so that the point's peak memory is the program's alone
        return _child([sys.executable, __file__, "--simgrid-cpp-point", str(xpus), "--firings", str(firings),
                       "--driver", CPP_CASES[case], "--ceiling-platform", on], timeout)
    if case == "2d-hierarchical":
        r = _child([sys.executable, str(HERE / "hierarchical_2d.py"), "--point", str(xpus)], timeout)
        if "error" not in r:
            r["run_s"] = r["sim_s"]
        return r
    command = [sys.executable, "-m", "hcsim.cli", "simulate", "--json", "--set", f"iterations={iterations}"]
    for setting in scenario_settings(case, xpus):
        command += ["--set", setting]
    r = _child(command, timeout)
    if "error" not in r:
        r["run_s"] = r["wall_time_s"] - r["setup_time_s"]  # compile, load, run: what follows building the graphs
    return r


def _ring_platform(xpus: int, on: str = "switch"):
    """`xpus` XPUs whose routes to their ring neighbour are compiled: (the compiled platform, XPU names, FLOPs of
    100 us on an H100, bytes: 1 MB, about 1 us on an H100's NVLink). `on`: "switch", H100 on one switch (two
    links per transfer); "layer", the ``layer`` case's platform (the paper's coherent topology, its ring in the
    case's rank order: up to six links per transfer)."""
    from hcsim.platform import compile_platform
    from hcsim.platform.builders import single_switch
    from hcsim.platform.devices import builtin_catalog

    h100 = builtin_catalog()["H100"]
    names = [f"xpu{i}" for i in range(xpus)]
    if on == "switch":
        graph = single_switch(xpus, h100)
    else:
        from hcsim.run.prepare import rank_order, scenario_platform
        from hcsim.run.scenario import load_scenario

        scenario = load_scenario(None, scenario_settings("layer", xpus))
        _, graph, xpu_names = scenario_platform(scenario, "xpus")
        if rank_order(graph, xpu_names, scenario) != names:  # simgrid_ceiling rings xpu0, xpu1, ... in order
            raise SystemExit(f"--ceiling-platform layer: the layer case's ring is not xpu0, xpu1, ... at {xpus} XPUs")
    compiled = compile_platform(graph, {(names[i], names[(i + 1) % xpus]) for i in range(xpus)})
    return compiled, names, h100.fp32_flops * 1e-4, 1e6


def simgrid_point(xpus: int, firings: int, on: str = "switch") -> dict:
    """Plain SimGrid: `xpus` chains (execution, transfer to the ring neighbour, ...), `firings` Task firings, on
    the platform `on` names (:func:`_ring_platform`)."""
    from hcsim.engine.simgrid_loader import load

    compiled, names, flops, size = _ring_platform(xpus, on)
    xml = Path(f"/tmp/hcsim-simgrid-bench-{os.getpid()}.xml")
    xml.write_text(compiled.xml)
    sg = load()
    engine = sg.Engine(["bench", "--log=root.thres:warning", "--log=xbt_cfg.thres:warning"])
    for setting in ("network/model:CM02", "network/TCP-gamma:0", "network/crosstraffic:0"):  # the core's
        engine.set_config(setting)
    engine.load_platform(str(xml))
    xml.unlink()
    set_amount = sg.Task.amount.fset
    per_chain = max(2, firings // xpus)
    left = [per_chain] * xpus
    tasks = []
    for i in range(xpus):
        host, peer = sg.Host.by_name(names[i]), sg.Host.by_name(names[(i + 1) % xpus])
        execution = sg.ExecTask.init(f"e{i}", 0.0, host)
        transfer = sg.CommTask.init(f"c{i}", 0.0, host, peer)
        tasks += [execution, transfer]

        def fire(task, amount, chain=i):
            if left[chain] > 0:
                left[chain] -= 1
                set_amount(task, amount, "instance_0")
                task.enqueue_firings(1)

        execution.on_this_completion_cb(lambda _t, transfer=transfer, fire=fire: fire(transfer, size))
        transfer.on_this_completion_cb(lambda _t, execution=execution, fire=fire: fire(execution, flops))
        fire(execution, flops)
    start = time.perf_counter()
    engine.run()
    run_s = time.perf_counter() - start
    return {"xpus": xpus, "activities": per_chain * xpus, "run_s": run_s, "wall_s": run_s,
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}


def simgrid_cpp_point(xpus: int, firings: int, driver: str, on: str = "switch") -> dict:
    """The same chains as :func:`simgrid_point` (`firings` activities in all) on SimGrid's C++ API: the program
    simgrid_ceiling.cpp beside this file, with `driver` (callbacks or actors), on the platform `on` names."""
    compiled, names, flops, size = _ring_platform(xpus, on)
    xml = Path(f"/tmp/hcsim-simgrid-bench-{os.getpid()}.xml")
    xml.write_text(compiled.xml)
    per_chain = max(2, firings // xpus)
    try:
        done = subprocess.run([str(ceiling_program()), str(xml), str(xpus), str(per_chain), repr(flops), repr(size),
                               driver], capture_output=True, text=True, env=environment())
    finally:
        xml.unlink()
    if done.returncode:
        raise SystemExit(f"simgrid_ceiling failed: {done.stderr.strip()[-2000:]}")
    result = json.loads(done.stdout)
    return {"xpus": xpus, "activities": result["activities"], "run_s": result["run_s"], "wall_s": result["run_s"],
            "run_cpu_s": result["run_cpu_s"],
            "peak_rss_mb": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def ceiling_program() -> Path:
    """build/benchmarks/simgrid_ceiling, compiled from simgrid_ceiling.cpp when missing or older than it, against
    the SimGrid 4.1 the engine core builds against (scripts/build_core.py's headers and library)."""
    sys.path.insert(0, str(HERE.parent / "scripts"))
    import build_core

    source = HERE / "simgrid_ceiling.cpp"
    program = build_core.ROOT / "build" / "benchmarks" / "simgrid_ceiling"
    if program.exists() and program.stat().st_mtime >= source.stat().st_mtime:
        return program
    library = build_core.simgrid_library()
    cxx, _ = build_core.compiler()
    build_core.fetch_headers()
    program.parent.mkdir(parents=True, exist_ok=True)
    done = subprocess.run([cxx, "-std=c++17", "-O2", "-DNDEBUG", f"-I{build_core.HEADERS}", str(source),
                           f"-L{library.parent}", f"-l:{library.name}", f"-Wl,-rpath,{library.parent}", "-o",
                           str(program)], capture_output=True, text=True)
    if done.returncode:
        raise SystemExit(f"compiling {source.name} failed:\n{done.stdout}{done.stderr}")
    return program


def fitted_exponent(points: list[tuple[int, float]]) -> float | None:
    """k of wall ~ xpus^k, least squares on (log xpus, log wall); None below two distinct sizes."""
    if len({x for x, _ in points}) < 2:
        return None
    xs, ys = [math.log(x) for x, _ in points], [math.log(w) for _, w in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def machine() -> str:
    memory = "?"
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
    allocator = "mimalloc (preloaded in every point)" if in_use(environment()) else "glibc's malloc"
    return f"machine: {os.cpu_count()} cores, {memory} memory, load average {load}; allocator: {allocator}"


def fastest(records) -> dict:
    """The record of the fastest run (the least process time) of a point's runs; an error if one failed."""
    records = list(records)
    failed = [r for r in records if "error" in r]
    return failed[0] if failed else min(records, key=lambda r: r["process_s"])


def _rate(record: dict) -> float | None:
    return None if "error" in record else record["activities"] / record["run_s"]


def _ratio(case: str, xpus: int, ceiling: str, runs: dict) -> str:
    """`case`'s activities/s over `ceiling`'s at `xpus`: the median of each round's ratio; "-" where not compared."""
    if case in (ceiling, MICRO_BATCH_CASE) or (ceiling, xpus) not in runs or (ceiling == "simgrid" and case in CPP_CASES):
        return "-"
    ratios = sorted(mine / theirs for mine, theirs in zip(map(_rate, runs[(case, xpus)]), map(_rate, runs[(ceiling, xpus)]))
                    if mine is not None and theirs)
    return f"{statistics.median(ratios):.2f}" if ratios else "-"


def _print_row(case: str, xpus: int, runs: dict, walls: dict) -> None:
    r = fastest(runs[(case, xpus)])
    if "error" in r:
        print(f"{case:<18} {xpus:>5}  failed: {r['error']}", flush=True)
        return
    walls[case].append((xpus, r["process_s"]))
    iteration = f"{r['iteration_time_s']:.6g} s" if "iteration_time_s" in r else "-"
    print(f"{case:<18} {xpus:>5} {r['process_s']:>8.1f} {r['run_s']:>8.1f} {r['activities']:>11,} "
          f"{_rate(r):>9,.0f} {_ratio(case, xpus, 'simgrid', runs):>8} {_ratio(case, xpus, 'simgrid-cpp', runs):>6} "
          f"{r['peak_rss_mb']:>8.0f}  {iteration}", flush=True)


def _print_exponent(case: str, walls: list[tuple[int, float]]) -> None:
    k = fitted_exponent(walls)
    if k is not None:
        axis = "micro-batches" if case == MICRO_BATCH_CASE else "XPUs"
        print(f"{case:<18} wall time ~ {axis}^{k:.2f} over {', '.join(str(x) for x, _ in walls)}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--xpus", type=int, nargs="+",
                        help="sizes of every XPU case (default: 64 256 1024 4096, or the case's own)")
    parser.add_argument("--micro-batches", type=int, nargs="+", default=DEFAULT_SIZES[MICRO_BATCH_CASE],
                        help=f"micro-batches per pipeline of {MICRO_BATCH_CASE}")
    parser.add_argument("--case", nargs="+", default=CASES, choices=CASES, help="what to measure (see above)")
    parser.add_argument("--iterations", type=int, default=1)
    parser.add_argument("--timeout", type=float, default=900, help="seconds per point")
    parser.add_argument("--repeat", type=int, default=1,
                        help="run every point this many times (rounds: each point once a round, the ceilings "
                             "first), each in a fresh process; report each point's fastest run (timeit's rule: "
                             "the others measured the machine's noise) and the median of the rounds' ratios")
    parser.add_argument("--firings", type=int, default=200_000, help="Task firings of each simgrid point")
    parser.add_argument("--ceiling-platform", choices=("switch", "layer"), default="switch",
                        help="where the simgrid ceilings run their chains: H100 on one switch (two links per "
                             "transfer), or the layer case's platform and ring (up to six)")
    parser.add_argument("--simgrid-point", type=int, help=argparse.SUPPRESS)  # run one simgrid point here
    parser.add_argument("--simgrid-cpp-point", type=int, help=argparse.SUPPRESS)  # one simgrid-cpp point here
    parser.add_argument("--driver", default="callbacks", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.simgrid_point:
        print(json.dumps(simgrid_point(args.simgrid_point, args.firings, args.ceiling_platform)))
        return
    if args.simgrid_cpp_point:
        print(json.dumps(simgrid_cpp_point(args.simgrid_cpp_point, args.firings, args.driver, args.ceiling_platform)))
        return
    print(machine())
    repeat = max(1, args.repeat)
    print(f"{args.iterations} iteration(s) (hybrid cases: 1); run = compile + load + simulate"
          + (f"; the fastest of {repeat} runs per point; ratios: the median of each round's (every point runs "
             f"once a round, the ceilings first)" if repeat > 1 else ""))
    # the ceilings first, for the ratios
    cases = sorted(args.case, key=lambda c: CEILINGS.index(c) if c in CEILINGS else len(CEILINGS))
    points = [(case, size) for case in cases for size in
              (args.micro_batches if case == MICRO_BATCH_CASE else args.xpus or DEFAULT_SIZES.get(case, [64, 256, 1024, 4096]))]
    runs: dict[tuple[str, int], list[dict]] = {point: [] for point in points}
    print(f"{'case':<18} {'size':>5} {'wall s':>8} {'run s':>8} {'activities':>11} {'act/s':>9} {'/simgrid':>8} "
          f"{'/C++':>6} {'peak MB':>8}  iteration time")
    walls: dict[str, list[tuple[int, float]]] = {case: [] for case in cases}
    last = {point[0]: point for point in points}  # each case's last point
    # rounds outermost: a ratio pairs a case's run with its ceiling's of the same round (minutes apart, where the
    # machine's speed drifts over the rounds); the last round prints each point's row as it ends
    for round_ in range(repeat):
        for case, xpus in points:
            runs[(case, xpus)].append(run_point(case, xpus, args.iterations, args.timeout, args.firings,
                                                args.ceiling_platform))
            if round_ == repeat - 1:
                _print_row(case, xpus, runs, walls)
                if last[case] == (case, xpus):
                    _print_exponent(case, walls[case])
    print(machine().replace("machine:", "after:"))


if __name__ == "__main__":
    main()
