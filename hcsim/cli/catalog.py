"""`hcsim list`: what is built in, one line each.

    hcsim list platforms | workloads | devices | algorithms | schedules | kernels
"""

from __future__ import annotations

import re

__all__ = ["register"]

KINDS = ("platforms", "workloads", "devices", "algorithms", "schedules", "kernels")
SCHEDULE_LINES = {
    "gpipe": "every forward, then every backward (GPipe); bubble (p-1)/(m+p-1)",
    "1f1b": "one forward, one backward in turn after a warm-up (PipeDream-Flush, Megatron-LM's default)",
    "interleaved": "1F1B over virtual_stages chunks per stage (Megatron-LM); bubble (p-1)/(v·m)",
    "zb-h1": "zero-bubble H1: weight gradients deferred into the bubble (Qi et al. 2023)",
}


def register(subparsers) -> None:
    parser = subparsers.add_parser("list", help="list the built-in platforms, workloads, devices, ...",
                                   description="List what hcsim has built in, one line each: " + ", ".join(KINDS))
    parser.add_argument("kind", choices=KINDS, metavar="KIND", help=" | ".join(KINDS))
    parser.set_defaults(run=run)


def run(args) -> int:
    rows = {"platforms": _platforms, "workloads": _workloads, "devices": _devices, "algorithms": _algorithms,
            "schedules": lambda: list(SCHEDULE_LINES.items()), "kernels": _kernel_lines}
    entries = rows[args.kind]()
    width = max(len(name) for name, _ in entries)
    for name, line in entries:
        print(f"{name:<{width}}  {line}")
    return 0


def _first_comment(path) -> str:
    """The first sentence of the comment a YAML file starts with."""
    lines = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.startswith("#"):
            break
        lines.append(line.lstrip("# ").rstrip())
    text = re.split(r"(?<!Fig)\. |: ", " ".join(lines))[0]
    return text.rstrip(".")


def _platforms():
    from hcsim.config import REPO_ROOT

    skip = {"devices", "compute-model"}  # catalog and factors, not platforms
    return [(p.stem, _first_comment(p)) for p in sorted((REPO_ROOT / "platforms").glob("*.yaml")) if p.stem not in skip]


def _workloads():
    from hcsim.config import REPO_ROOT, load_yaml

    rows = []
    for path in sorted((REPO_ROOT / "workloads").glob("*.yaml")):
        data = load_yaml(path)
        rows.append((path.stem, str(data.get("description", "")) if isinstance(data, dict) else ""))
    return rows


def _devices():
    from hcsim.platform.devices import builtin_catalog
    from hcsim.units import format_quantity

    rows = []
    for name, device in builtin_catalog().items():
        peaks = ", ".join(f"{p} {format_quantity(v, 'FLOP/s')}" for p, v in device.peaks.items())
        rows.append((name, f"{format_quantity(device.memory, 'B')} at {format_quantity(device.memory_bandwidth, 'B/s')}; "
                           f"{peaks}"))
    return rows


def _algorithms():
    from hcsim.engine.collectives import algorithm_summaries

    return [(f"{collective} {name}", line) for (collective, name), line in algorithm_summaries().items()]


def _kernel_lines():
    from hcsim.workload.ops import INVENTORIES

    return [(name, inventory.summary) for name, inventory in INVENTORIES.items()]
