"""`hcsim workload`: show a workload spec's state, memory placement and FLOPs; export its graph as JSON.

    hcsim workload show llama2-13b --device H100 --set training.batch_per_xpu=2
    hcsim workload export llama2-13b --xpus 8 -o graph.json
"""

from __future__ import annotations

import argparse

from hcsim.errors import ConfigError
from hcsim.units import format_quantity

__all__ = ["register"]


def register(subparsers) -> None:
    """Add the ``workload`` subcommand and its ``show`` and ``export`` actions."""
    parser = subparsers.add_parser("workload", help="inspect and export workload specs",
                                   description="Inspect a workload spec (workloads/*.yaml) and export its graph.")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    parser.set_defaults(run=lambda args: (parser.print_help(), 1)[1])

    show = actions.add_parser("show", help="training state, what is local and what spills, FLOPs per iteration")
    show.add_argument("spec", metavar="SPEC", help="a workload YAML file or a built-in name (llama2-13b)")
    show.add_argument("--device", default="H100", help="device whose local memory holds the state (default H100)")
    show.add_argument("--xpus", type=int, default=1, help="data-parallel XPUs (default 1)")
    _add_set(show)
    show.set_defaults(run=run_show)

    export = actions.add_parser("export", help="write the training graph as networkx node-link JSON")
    export.add_argument("spec", metavar="SPEC", help="a workload YAML file or a built-in name (llama2-13b)")
    export.add_argument("--xpus", type=int, required=True, help="data-parallel XPUs, named xpu0 .. xpu{N-1}")
    export.add_argument("-o", "--output", required=True, help="JSON file to write")
    export.add_argument("--device", default=None, help="also place memory for this device (sets spilled_xpus)")
    _add_set(export)
    export.set_defaults(run=run_export)


def _add_set(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                        help="override a spec value by its dotted key, e.g. training.batch_per_xpu=4 (repeatable)")


def _load(args):
    from hcsim.config import parse_settings
    from hcsim.workload import build_training_graph, load_workload_spec

    overrides = parse_settings(args.overrides, "training.batch_per_xpu=4")
    if args.xpus < 1:
        raise ConfigError(f"--xpus must be >= 1, got {args.xpus}")
    spec = load_workload_spec(args.spec, overrides)
    xpus = [f"xpu{i}" for i in range(args.xpus)]
    return spec, xpus, build_training_graph(spec, xpus)


def _device(name: str):
    from hcsim.platform.devices import builtin_catalog

    catalog = builtin_catalog()
    if name not in catalog:
        raise ConfigError(f"--device {name!r}: not in the device catalog; known: {', '.join(sorted(catalog))}")
    return catalog[name]


def run_show(args) -> int:
    from hcsim.workload import place_memory

    device = _device(args.device)
    spec, xpus, graph = _load(args)
    placement = place_memory(graph, {x: device.memory for x in xpus}, spec)
    print(describe(spec, graph, placement, device.name))
    return 0


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
        f"(fidelity {spec.fidelity}, gradient bucket {spec.bucket}, algorithm {spec.algorithm})",
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


def run_export(args) -> int:
    from hcsim.workload import place_memory, save_workload

    spec, xpus, graph = _load(args)
    if args.device:
        device = _device(args.device)
        place_memory(graph, {x: device.memory for x in xpus}, spec)
    save_workload(graph, args.output)
    print(f"wrote {args.output}: {graph.number_of_nodes()} vertices, {graph.number_of_edges()} edges over {len(xpus)} XPUs")
    return 0
