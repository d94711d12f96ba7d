"""`hcsim workload`: show a workload spec's state, memory placement and FLOPs; export its graph as JSON;
import a Chakra execution trace as a graph.

    hcsim workload show llama2-13b --device H100 --set training.batch_per_xpu=2
    hcsim workload export llama2-13b --xpus 8 -o graph.json
    hcsim workload import traces/dp -o dp.json      # traces/dp.0.et, traces/dp.1.et, ...
"""

from __future__ import annotations

import argparse
import sys

from hcsim.cli import path_arg
from hcsim.errors import ConfigError, HcsimError, OutputError
from hcsim.units import format_quantity

__all__ = ["register"]


def register(subparsers) -> None:
    """Add the ``workload`` subcommand and its ``show`` and ``export`` actions."""
    parser = subparsers.add_parser("workload", help="inspect and export workload specs",
                                   description="Inspect a workload spec (workloads/*.yaml) and export its graph.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    parser.set_defaults(run=lambda args: (parser.print_help(), 1)[1])

    builtin = _builtin_names()
    show = actions.add_parser("show", help="training state, what is local and what spills, FLOPs per iteration")
    show.add_argument("spec", metavar="SPEC", help=f"a workload YAML file or a built-in name ({builtin})")
    show.add_argument("--device", default=None, help="device whose local memory holds the state (default H100); "
                      "extended memory takes the rest, unbounded (the paper's)")
    show.add_argument("--platform", default=None, metavar="SPEC",
                      help="place the state on the first --xpus XPUs of this platform (built-in name or path) as a "
                           "simulation does: their devices, local and extended memory, and its spill rule; what "
                           "does not fit there is refused, as hcsim simulate refuses it")
    show.add_argument("--xpus", type=int, default=1, help="XPUs (default 1): dp = xpus / (tp x pp)")
    parallel = show.add_argument_group("parallelism (any of these shows the hybrid-parallel graph per stage)")
    parallel.add_argument("--tp", type=int, default=1, help="tensor-parallel size (default 1)")
    parallel.add_argument("--pp", type=int, default=1, help="pipeline stages (default 1)")
    parallel.add_argument("--micro-batch", type=int, default=None, help="samples per micro-batch (default: the "
                          "spec's batch_per_xpu)")
    parallel.add_argument("--global-batch", type=int, default=None, help="samples per iteration (default dp x "
                          "micro-batch)")
    parallel.add_argument("--schedule", default="1f1b", help="gpipe | 1f1b | interleaved | zb-h1 (default 1f1b)")
    parallel.add_argument("--virtual-stages", type=int, default=1, help="chunks per stage (interleaved)")
    parallel.add_argument("--recompute", default=None, help="none | selective | full (default: the spec's)")
    parallel.add_argument("--sequence-parallel", action="store_true", help="Megatron sequence parallelism")
    parallel.add_argument("--zero", type=int, default=0, help="ZeRO stage 0-3 over each DP group (default 0)")
    parallel.add_argument("--ep", type=int, default=1, help="expert-parallel size (mixture-of-experts models)")
    _add_set(show)
    show.set_defaults(run=run_show)

    export = actions.add_parser("export", help="write the training graph as networkx node-link JSON")
    export.add_argument("spec", metavar="SPEC", help=f"a workload YAML file or a built-in name ({builtin})")
    export.add_argument("--xpus", type=int, required=True, help="data-parallel XPUs, named xpu0 .. xpu{N-1}")
    export.add_argument("-o", "--output", type=path_arg, required=True, help="JSON file to write")
    export.add_argument("--device", default=None,
                        help="place memory for this device (sets each vertex's spilled_xpus); without it the graph "
                             "spills nothing, and a warning says so")
    _add_set(export)
    export.set_defaults(run=run_export)

    chakra = actions.add_parser(
        "import", help="read a Chakra execution trace (ASTRA-sim) into a graph JSON",
        description="Read the Chakra trace PREFIX.<rank>.et (one file per rank) into an hcsim workload graph and "
                    "write it as node-link JSON; a scenario runs it with workload: FILE.json (or runs the trace "
                    "itself with workload: chakra:PREFIX). Sizes are bytes, times microseconds; ASTRA-sim's "
                    "network 'GB/s' is 2^30 B/s (GiB/s in hcsim), hcsim's GB/s is 1e9 B/s.")
    chakra.add_argument("prefix", metavar="PREFIX", help="path prefix of the rank files (chakra:PREFIX also accepted)")
    chakra.add_argument("-o", "--output", type=path_arg, required=True, help="JSON file to write")
    chakra.add_argument("--groups", default=None,
                        help="communicator groups JSON {pg_name: [ranks]} (default: PREFIX.groups.json if present)")
    chakra.add_argument("--precision", default="fp32", choices=("fp32", "fp16", "bf16"),
                        help="FLOP/s for nodes timed by num_ops (default fp32)")
    chakra.set_defaults(run=run_import)


def _builtin_names() -> str:
    from hcsim.config import REPO_ROOT

    return ", ".join(sorted(p.stem for p in (REPO_ROOT / "workloads").glob("*.yaml")))


def _add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec value by its dotted key, e.g. training.batch_per_xpu=4 (repeatable)")


def _load_spec(args):
    from hcsim.config import parse_settings
    from hcsim.workload import load_workload_spec

    return load_workload_spec(args.spec, parse_settings(args.overrides, "training.batch_per_xpu=4"))


def _load(args):
    from hcsim.config import check_output_file, parse_settings
    from hcsim.limits import check_run_cost
    from hcsim.workload import build_training_graph, load_workload_spec

    overrides = parse_settings(args.overrides, "training.batch_per_xpu=4")
    if args.xpus < 1:
        raise ConfigError(f"--xpus: must be >= 1, got {args.xpus}")
    if getattr(args, "output", None) is not None:
        check_output_file(args.output, "-o")
    spec = load_workload_spec(args.spec, overrides)
    _check_algorithm(spec)
    check_run_cost(spec, args.xpus, 1, f"workload {spec.name!r} on --xpus {args.xpus}")
    xpus = [f"xpu{i}" for i in range(args.xpus)]
    return spec, xpus, build_training_graph(spec, xpus)


def _check_algorithm(spec) -> None:
    """The spec's all-reduce algorithm is a registered one (or "package.module:Class", checked where imported)."""
    from hcsim.config import _suggest
    from hcsim.engine.collectives import algorithms

    known = algorithms()["all_reduce"]
    if ":" not in spec.algorithm and spec.algorithm not in known:
        raise ConfigError(f"{spec.source}: gradients.algorithm: {spec.algorithm!r} is not one of {', '.join(known)}"
                          f"{_suggest(spec.algorithm, known)}")


def _device(name: str):
    from hcsim.platform.devices import builtin_catalog

    catalog = builtin_catalog()
    if name not in catalog:
        raise ConfigError(f"--device {name!r}: not in the device catalog; known: {', '.join(sorted(catalog))}")
    return catalog[name]


def run_show(args) -> int:
    from hcsim.workload import place_memory

    if args.platform is not None:
        if args.device is not None:
            raise ConfigError(f"--device {args.device}, --platform {args.platform}: the platform's XPUs have their "
                              "own devices; give one of them")
        device = _device(_check_on_platform(args))
    else:
        device = _device(args.device or "H100")
    if args.tp > 1 or args.pp > 1 or args.micro_batch or args.global_batch or args.recompute \
            or args.sequence_parallel or args.virtual_stages > 1 or args.zero or args.ep > 1 \
            or _load_spec(args).inventory.needs_hybrid_graph:
        print(describe_stages(args, device))
        return 0
    spec, xpus, graph = _load(args)
    placement = place_memory(graph, {x: device.memory for x in xpus}, spec)
    print(describe(spec, graph, placement, device.name))
    return 0


def _check_on_platform(args) -> str:
    """Prepare the run `hcsim simulate` would make of this workload on ``--platform`` (:func:`hcsim.run.prepare.
    prepare`: the same memory rule, so a model that fits nowhere there is refused with what does not fit, where
    and the remedies); return the device of its first XPU."""
    from hcsim.config import parse_settings
    from hcsim.run.prepare import prepare
    from hcsim.run.scenario import load_scenario

    settings = {"name": "workload show", "platform": args.platform, "workload": args.spec, "xpus": args.xpus,
                "tp": args.tp, "pp": args.pp, "ep": args.ep, "micro_batch": args.micro_batch,
                "global_batch": args.global_batch, "schedule": args.schedule, "virtual_stages": args.virtual_stages,
                "recompute": args.recompute, "sequence_parallel": args.sequence_parallel, "zero": args.zero}
    overrides = parse_settings(args.overrides, "training.batch_per_xpu=4")
    settings = {key: value for key, value in settings.items() if value is not None}  # None: the scenario's default
    scenario = load_scenario(None, settings | {f"workload_overrides.{k}": v for k, v in overrides.items()}, "--set ")
    try:
        prepared = prepare(scenario)
    except HcsimError as err:
        # the remedies of the memory rule are scenario keys: say where each is given
        where = (" (the Fix names scenario keys: hcsim simulate takes each as --set KEY=VALUE; here --zero, --pp, "
                 "--recompute and --micro-batch)" if "Fix: offload" in str(err) else "")
        raise type(err)(f"--platform {args.platform}: {err}{where}") from err
    return prepared.platform.nodes[prepared.xpus[0]]["device"]


def describe(spec, graph, placement, device_name: str) -> str:
    """The text `hcsim workload show` prints."""
    state = placement.state
    entry = placement.by_capacity[0]
    held = next(iter(placement.inventory.values()))  # every XPU holds the same state in data parallelism
    compute = [d for _, d in graph.nodes(data=True) if d["kind"] == "compute"]
    comm = [d for _, d in graph.nodes(data=True) if d["kind"] == "comm"]
    table = spec.decoder_table()
    flops = sum(d["flops"] for d in compute)
    model_flops = sum(d["flops"] for d in compute if d.get("phase") in ("fwd", "bwd"))
    b = format_quantity
    lines = [
        f"workload {spec.name}: {spec.model.name}, {spec.model.decoders} decoders, costs from "
        f"{'the table (' + table.name + ')' if spec.costs == 'table' else 'the model shape'}",
        f"  batch per XPU {spec.batch_per_xpu}, sequence {spec.model.sequence}, precision {spec.precision}, "
        f"optimizer {spec.optimizer}, recomputation {spec.recomputation}",
        f"  graph: {len(compute)} compute and {len(comm)} communication vertices, {graph.number_of_edges()} edges "
        f"(granularity {spec.granularity}, gradient bucket {spec.bucket}, algorithm {spec.algorithm})",
        f"parameters: {graph.graph['parameters']:,} ({table.parameters:,} per decoder)",
        f"training state per XPU: {b(held.total, 'B')} ({b(state.per_decoder, 'B')} per decoder)",
        f"  parameters {b(held.parameters, 'B')}, gradients {b(held.gradients, 'B')}, "
        f"optimizer states {b(held.optimizer, 'B')}, activations {b(held.activations, 'B')}",
        f"memory on {device_name} ({b(entry.capacity, 'B')} local):",
        f"  local: decoders 1-{entry.local_decoders}, {b(entry.local_bytes, 'B')}" if entry.local_decoders
        else "  local: nothing (one decoder block is larger than the local memory)",
    ]
    if entry.spilled_decoders:
        lines.append(f"  spilled to extended memory: decoders {entry.spilled_decoders[0]}-{entry.spilled_decoders[-1]}, "
                     f"{b(entry.spilled_bytes, 'B')}; {len(entry.spilled_vertices)} of {len(compute)} compute "
                     "vertices read spilled data")
    else:
        lines.append("  spilled: nothing")
    lines += [
        f"FLOPs per XPU per iteration: {b(flops, 'FLOP')} ({b(model_flops / spec.batch_per_xpu, 'FLOP')} per sample "
        "in forward and backward)",
        f"gradient all-reduce per iteration: {b(sum(d['bytes'] for d in comm), 'B')} in {len(comm)} collectives",
    ]
    return "\n".join(lines)


def describe_stages(args, device) -> str:
    """What `hcsim workload show` prints for a hybrid-parallel configuration: per stage FLOPs and memory."""
    from hcsim.config import parse_settings
    from hcsim.workload import load_workload_spec
    from hcsim.workload.hybrid import Parallelism, build_hybrid_graph, place_hybrid_memory
    from hcsim.workload.layout import ParallelLayout

    spec = load_workload_spec(args.spec, parse_settings(args.overrides, "training.batch_per_xpu=4"))
    xpus = [f"xpu{i}" for i in range(args.xpus)]
    layout = ParallelLayout(xpus, {"tp": args.tp, "pp": args.pp, "ep": args.ep})
    par = Parallelism.of_layout(spec, layout, micro_batch=args.micro_batch, global_batch=args.global_batch,
                                recompute=args.recompute, schedule=args.schedule, virtual_stages=args.virtual_stages,
                                sequence_parallel=args.sequence_parallel, zero=args.zero)
    graph = build_hybrid_graph(spec, par, layout)
    inf = float("inf")
    placement = place_hybrid_memory(graph, spec, par, layout, {x: device.memory for x in xpus}, dict.fromkeys(xpus, inf))
    b = format_quantity
    lines = [f"workload {spec.name}: {spec.model.name}, {spec.model.decoders} decoders, precision {spec.precision}, "
             f"kernels {spec.kernels}",
             f"  tp {par.tp} x pp {par.pp} x dp {par.dp}, micro-batch {par.micro_batch}, global batch "
             f"{par.global_batch} ({par.micro_batches} micro-batch{'es' if par.micro_batches != 1 else ''} per replica), schedule {par.schedule}"
             + (f" x {par.virtual_stages} virtual stages" if par.virtual_stages > 1 else "")
             + f", recompute {par.recompute}" + (", sequence parallel" if par.sequence_parallel else "")
             + (f", ZeRO-{par.zero}" if par.zero else "") + (f", ep {par.ep}" if par.ep > 1 else ""),
             f"  graph: {graph.number_of_nodes()} vertices, {graph.number_of_edges()} edges; model FLOPs per "
             f"iteration {b(graph.graph['model_flops'], 'FLOP')}",
             f"per stage, per XPU, on {device.name} ({b(device.memory, 'B')} local):",
             "  stage  FLOP/iteration  parameters  gradients  optimizer  activations  total      spills"]
    for stage in range(par.pp):
        flops = sum(d["flops"] for _, d in graph.nodes(data=True) if d["kind"] == "compute" and d["stage"] == stage)
        held = placement.inventory[layout.stage_xpus(stage)[0]]
        lines.append(f"  {stage:<6} {b(flops, 'FLOP'):<15} {b(held.parameters, 'B'):<11} {b(held.gradients, 'B'):<10} "
                     f"{b(held.optimizer, 'B'):<10} {b(held.activations, 'B'):<12} {b(held.total, 'B'):<10} "
                     f"{b(held.spilled, 'B') if held.spilled else 'nothing'}")
    return "\n".join(lines)


def run_export(args) -> int:
    from hcsim.workload import place_memory, save_workload

    spec, xpus, graph = _load(args)
    if args.device:
        device = _device(args.device)
        place_memory(graph, {x: device.memory for x in xpus}, spec)
    else:
        print("hcsim: warning: no --device: no memory is placed, so no vertex reads spilled data (spilled_xpus "
              "empty); simulations place memory themselves, but to export a graph with spills pass --device H100",
              file=sys.stderr)
    try:
        save_workload(graph, args.output)
    except OSError as err:
        raise OutputError(f"-o {args.output}: could not write it ({err.strerror or err})") from None
    print(f"wrote {args.output}: {graph.number_of_nodes()} vertices, {graph.number_of_edges()} edges over {len(xpus)} XPUs")
    return 0


def run_import(args) -> int:
    from hcsim.workload import save_workload
    from hcsim.workload.chakra import UNITS_NOTE, import_chakra
    from hcsim.workload.sources import graph_xpus

    from hcsim.config import check_output_file

    check_output_file(args.output, "-o")  # before reading the trace: a bad path costs nothing
    prefix = args.prefix[len("chakra:"):] if args.prefix.startswith("chakra:") else args.prefix
    graph = import_chakra(prefix, groups=args.groups, precision=args.precision)
    try:
        save_workload(graph, args.output)
    except OSError as err:
        raise OutputError(f"-o {args.output}: could not write it ({err.strerror or err})") from None
    kinds = [data["kind"] for _, data in graph.nodes(data=True)]
    print(f"wrote {args.output}: {kinds.count('compute')} compute and {kinds.count('comm')} communication vertices, "
          f"{graph.number_of_edges()} edges over {len(graph_xpus(graph))} ranks")
    print(UNITS_NOTE)
    return 0
