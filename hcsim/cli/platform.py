"""`hcsim platform show|compile|draw SPEC`: inspect, compile and draw platform specs."""

from __future__ import annotations

import logging
import math
import time

from hcsim.cli import path_arg
from hcsim.platform.devices import PRECISIONS
from hcsim.errors import ConfigError, OutputError
from hcsim.units import format_quantity

__all__ = ["register"]

log = logging.getLogger(__name__)


def register(subparsers) -> None:
    """Add the `platform` subcommand and its show / compile / draw actions."""
    parser = subparsers.add_parser("platform", help="inspect, compile and draw platform specs",
                                   description="Inspect, compile and draw platform specs (platforms/*.yaml).")
    actions = parser.add_subparsers(dest="action", metavar="ACTION")
    parser.set_defaults(run=lambda args: parser.print_help() or 1)

    def common(sub):
        sub.add_argument("spec", metavar="SPEC", help="a built-in name (paper-cxl, paper-traditional) or a YAML path")
        sub.add_argument("--xpus", type=int, default=None, metavar="N", help="build the first N XPUs (default: the spec's)")
        sub.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", dest="overrides",
                         help="override a spec field, e.g. --set links.cxl.bandwidth=256GB/s --set coherent=false")

    show = actions.add_parser("show", help="counts of nodes and links by kind, devices, FLOP/s, memory")
    common(show)
    show.set_defaults(run=_show)
    compile_ = actions.add_parser("compile", help="write the SimGrid platform XML")
    common(compile_)
    compile_.add_argument("-o", "--output", type=path_arg, required=True, metavar="FILE.xml",
                          help="the SimGrid 4.1 platform XML to write (hosts, links, zones and routes)")
    compile_.add_argument("--pairs", choices=("data-parallel", "all-xpus"), default="data-parallel",
                          help="host pairs to emit routes for (default: data-parallel, each XPU with its memories "
                               "plus a ring)")
    compile_.add_argument("--precision", choices=PRECISIONS, default="fp32",
                          help="which FLOP/s of each device the XPU hosts get as speed, its dense peak (default: fp32)")
    compile_.set_defaults(run=_compile)
    draw = actions.add_parser("draw", help="draw the platform (a representative part of large ones), names and, "
                              "given a run's links.csv, link loads")
    common(draw)
    draw.add_argument("-o", "--output", type=path_arg, required=True, metavar="FILE.png",
                      help="the drawing; its format follows the suffix (.png, .svg or .pdf), one file")
    draw.add_argument("--loads", metavar="LINKS.csv",
                      help="links.csv of a run (hcsim simulate --out DIR): links drawn by their mean utilization. "
                           "Build the same platform as the run (--xpus, --set) so the names match")
    draw.add_argument("--racks", type=int, default=2, help="racks drawn at most (default 2)")
    draw.add_argument("--servers", type=int, default=2, help="servers drawn per rack at most (default 2)")
    draw.set_defaults(run=_draw)


def _overrides(items: list[str]) -> dict[str, object]:
    from hcsim.config import parse_settings  # values are YAML: true, 4096, [H100, A100], 256GB/s

    return parse_settings(items, "links.cxl.latency=1us")


DRAW_SUFFIXES = (".png", ".svg", ".pdf", ".jpg", ".jpeg")  # what matplotlib writes


def _graph(args):
    from hcsim.config import check_output_file
    from hcsim.platform import build_platform, load_platform_spec

    if getattr(args, "output", None) is not None:  # before any work: a bad path costs nothing
        check_output_file(args.output, "-o", DRAW_SUFFIXES if args.action == "draw" else None)
    if args.xpus is not None and args.xpus < 1:
        raise ConfigError(f"--xpus: must be >= 1, got {args.xpus}")
    for option in ("racks", "servers"):
        if getattr(args, option, 1) < 1:
            raise ConfigError(f"--{option}: must be >= 1 ({option} drawn at most), got {getattr(args, option)}")
    spec = load_platform_spec(args.spec, _overrides(args.overrides))
    return spec, build_platform(spec, args.xpus)


def _show(args) -> int:
    from hcsim.platform.summary import summarize_platform

    spec, graph = _graph(args)
    summary = summarize_platform(graph)
    print(f"{summary.name}: {'coherent (CXL fabric)' if summary.coherent else 'not coherent'}, "
          f"{graph.number_of_nodes()} nodes, {graph.number_of_edges()} links"
          + (f"; routes never use {', '.join(summary.avoided_links)} links" if summary.avoided_links else ""))
    print("nodes:")
    for kind, count in summary.nodes.items():
        print(f"  {kind:<20} {count:>8}")
    levels = graph.graph.get("ib_switches")
    if levels:  # a fat-tree group node stands for several switches
        print("InfiniBand switches per level (1 = leaves): "
              + ", ".join(f"{level}: {count}" for level, count in levels.items()))
    print("links:")
    for kind, count in summary.links.items():
        print(f"  {kind:<20} {count:>8}")
    print("devices:")
    for device, count in summary.devices.items():
        print(f"  {device:<20} {count:>8}")
    print(f"total FLOP/s: fp32 {format_quantity(summary.fp32_flops, 'FLOPS')}, "
          f"fp16 {format_quantity(summary.fp16_flops, 'FLOPS')}")
    print("memory:")
    for role, capacity in summary.memory.items():
        print(f"  {role:<20} {'unbounded' if math.isinf(capacity) else format_quantity(capacity, 'B'):>12}")
    return 0


def _compile(args) -> int:
    from hcsim.platform import write_platform
    from hcsim.platform.pairs import data_parallel_pairs
    from hcsim.platform.topology import xpus

    from hcsim.limits import MAX_ROUTE_PAIRS, check_limit

    spec, graph = _graph(args)
    if args.pairs == "all-xpus":
        members = xpus(graph)
        check_limit(len(members) * (len(members) - 1), MAX_ROUTE_PAIRS, f"the host pairs of {len(members)} XPUs",
                    "--pairs all-xpus", "use --pairs data-parallel or fewer --xpus")
        pairs = [(a, b) for a in members for b in members if a != b]
    else:
        pairs = data_parallel_pairs(graph)
    start = time.perf_counter()
    try:
        compiled = write_platform(graph, pairs, args.output, args.precision)
    except OSError as err:
        raise OutputError(f"-o {args.output}: could not write it ({err.strerror or err})") from None
    print(f"{args.output}: {len(compiled.routes)} routes, {len(set(compiled.pods.values()))} zones, "
          f"{len(compiled.xml) / 1e6:.1f} MB, compiled in {time.perf_counter() - start:.1f} s")
    return 0


def _draw(args) -> int:
    from hcsim.platform.draw import draw_platform

    from hcsim.platform.draw import read_link_loads

    spec, graph = _graph(args)
    loads = read_link_loads(args.loads) if args.loads else None
    if loads is not None:
        unknown = [pair for pair in loads if not graph.has_edge(*pair)]
        if unknown:
            log.warning("%s: %d of its links are not in this platform (e.g. %s -> %s): build it as the run did "
                        "(--xpus, --set)", args.loads, len(unknown), *unknown[0])
    try:
        note = draw_platform(graph, args.output, max_racks=args.racks, max_servers=args.servers, loads=loads)
    except OSError as err:
        raise OutputError(f"-o {args.output}: could not write it ({err.strerror or err})") from None
    print(f"{args.output}: {note}" if note else f"{args.output}: whole platform")
    return 0
