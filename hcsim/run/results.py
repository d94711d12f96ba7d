"""What a run reports per XPU and per device type, and the resolved inputs it records.

Pure functions over plain data (no SimGrid, no matplotlib): the simulation
(`hcsim.run.report`), the sweep's CSV (`hcsim.study.store`) and ``xpus.csv`` are
built on them, so every output says the same thing.

Where an iteration goes, per XPU (:func:`per_xpu_times`), in seconds per
iteration, averaged over the measured iterations (every iteration but the
first, which fills the pipeline; the only one when a run has one):

``compute_s``
    the XPU's FLOPs at its speed;
``memory_stall_s``
    time a compute vertex ran beyond its FLOPs: waiting for memory reads and
    copies (spilled state, HBM when it is the slower of the two);
``exposed_comm_s``
    communication that delays this XPU: in a collective whose members have
    all arrived, computing nothing;
``idle_s``
    the rest: waiting for a dependency, for slower peers, in a pipeline bubble.

The four add up to the reported iteration time (the engine's clocks cover
the measured window). Their parts (:data:`SPLIT_PARTS`):

``comm_tp_s``, ``comm_cp_s``, ``comm_pp_s``, ``comm_dp_s``, ``comm_ep_s``, ``comm_offload_s``, ``comm_other_s``
    exposed communication by what it serves: tensor, context, pipeline (p2p), data parallelism (gradients,
    ZeRO gathers), experts (all-to-all), offload, other (a graph's own collectives); a span in which
    several are open goes to the one that opened first; they add up to exposed_comm_s;
``idle_bubble_s``, ``idle_peers_s``
    idle waiting for a dependency (the pipeline bubble, a peer's data) and idle in a collective waiting for
    its peers to arrive; they add up to idle_s;
``recompute_s``
    the part of compute_s that recomputes activations.

Where each XPU sits (:func:`xpu_rows`, the first columns of ``xpus.csv``, :data:`XPU_PLACE_COLUMNS`):
``job`` the job the XPU trains (one per run: the scenario's name); ``device``, ``server``, ``rack`` from the
platform; ``stage`` its pipeline stage (0-based), ``chunks`` the model chunks (virtual stages, numbered
0 .. pp x virtual_stages - 1 from the first layers) it holds, joined with ``+`` (stage s holds s, pp + s, ...);
``tp_rank``, ``cp_rank``, ``pp_rank``, ``dp_rank``, ``ep_rank`` its coordinate on each parallel axis
(hcsim.workload.layout).
A graph workload (a .json graph, a Chakra trace) has no layout: its stage, chunks and ranks are blank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hcsim.engine.api import COMM_KINDS
from hcsim.errors import HcsimError
from hcsim.run.scenario import Scenario

__all__ = ["XpuTimes", "DEVICE_COLUMNS", "MEMORY_COLUMNS", "TIME_PARTS", "SPLIT_PARTS", "COMM_KINDS", "rows_for", "spec_columns", "per_xpu_times", "pace_setters",
           "scenario_columns", "scenario_column", "column_unit", "resolve_scenario", "csv_cell", "xpu_rows", "XPU_COLUMNS",
           "XPU_PLACE_COLUMNS", "RANK_COLUMNS"]

TIME_PARTS = ("compute_s", "memory_stall_s", "exposed_comm_s", "idle_s")
SPLIT_PARTS = (*(f"comm_{kind}_s" for kind in COMM_KINDS), "idle_bubble_s", "idle_peers_s", "recompute_s")
# The columns of a sweep row that belong to one device type of the point (one row per device type);
# least_idle_xpu / least_idle_s: that type's XPU with the least idle time, the one its peers wait for.
# state_per_xpu_bytes, spilled_per_xpu_bytes, offloaded_per_xpu_bytes: the most training state an XPU of that type
# holds, the most of it that spills beyond its local memory and that offload keeps away (B; blank for a graph
# workload, which says where data lives but not how much state there is).
MEMORY_COLUMNS = ("state_per_xpu_bytes", "spilled_per_xpu_bytes", "offloaded_per_xpu_bytes")
DEVICE_COLUMNS = ("device", "device_xpus", *TIME_PARTS, "least_idle_xpu", "least_idle_s", *SPLIT_PARTS,
                  *MEMORY_COLUMNS)
RANK_COLUMNS = ("tp_rank", "cp_rank", "pp_rank", "dp_rank", "ep_rank")
XPU_PLACE_COLUMNS = ("xpu", "job", "device", "slowdown", "server", "rack", "stage", "chunks", *RANK_COLUMNS)
XPU_COLUMNS = (*XPU_PLACE_COLUMNS, *TIME_PARTS, *SPLIT_PARTS, "iteration_time_s")


@dataclass(frozen=True, slots=True, kw_only=True)
class XpuTimes:
    """Seconds per measured iteration of one XPU; the four parts sum to the iteration time, and the split parts
    (module docstring) to theirs."""

    compute_s: float
    memory_stall_s: float
    exposed_comm_s: float
    idle_s: float
    comm_tp_s: float = 0.0
    comm_cp_s: float = 0.0
    comm_pp_s: float = 0.0
    comm_dp_s: float = 0.0
    comm_ep_s: float = 0.0
    comm_offload_s: float = 0.0
    comm_other_s: float = 0.0
    idle_bubble_s: float = 0.0
    idle_peers_s: float = 0.0
    recompute_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return dataclasses.asdict(self)


def per_xpu_times(engine_times: Mapping[str, Mapping[str, float]]) -> dict[str, XpuTimes]:
    """Per XPU, seconds per measured iteration of compute, memory stall, exposed communication and idle time.

    Parameters
    ----------
    engine_times : the executor's per-XPU clocks (``RunResult.xpu_times``): xpu -> compute_s,
        memory_stall_s, comm_s (communication that delayed the XPU), idle_s, each in s per measured
        iteration.

    >>> times = per_xpu_times({"xpu0": {"compute_s": 2.0, "memory_stall_s": 1.0, "comm_s": 0.5, "idle_s": 0.25}})
    >>> times["xpu0"].exposed_comm_s
    0.5
    """
    return {xpu: XpuTimes(compute_s=t["compute_s"], memory_stall_s=t["memory_stall_s"], exposed_comm_s=t["comm_s"],
                          idle_s=t["idle_s"], **{part: t.get(part, 0.0) for part in SPLIT_PARTS})
            for xpu, t in engine_times.items()}


def rows_for(rows: list[dict[str, Any]], column: str) -> list[dict[str, Any]]:
    """The sweep rows that carry `column` once per value: all of them for a device column, else the first
    row of each point (its other rows repeat the point's results)."""
    if column in DEVICE_COLUMNS:
        return rows
    seen: set = set()
    kept = []
    for row in rows:
        key = row.get("point")
        if key is None or key not in seen:
            seen.add(key)
            kept.append(row)
    return kept


def pace_setters(times: Mapping[str, XpuTimes], device_of: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Per device type, its XPU with the least idle time (the one the others wait for) and that time (s)."""
    best: dict[str, tuple[float, str]] = {}
    for xpu, row in times.items():
        device = device_of[xpu]
        if device not in best or row.idle_s < best[device][0]:
            best[device] = (row.idle_s, xpu)
    return {device: {"xpu": xpu, "idle_s": idle} for device, (idle, xpu) in sorted(best.items())}


def xpu_rows(platform, times: Mapping[str, XpuTimes], period: float, layout=None, virtual_stages: int = 1,
             job: str | None = None) -> list[dict[str, Any]]:
    """The rows of ``xpus.csv`` (columns XPU_COLUMNS), sorted by XPU number (xpu2 before xpu10).

    `period` is the iteration time (s); `layout` (a :class:`~hcsim.workload.layout.ParallelLayout`
    over the run's XPUs, None for a graph workload) gives each XPU its stage and ranks, with
    `virtual_stages` model chunks per stage; `job` names the job (module docstring)."""
    from hcsim.platform.topology import natural_key

    rows = []
    for xpu in sorted(times, key=natural_key):
        node = platform.nodes[xpu]
        place: dict[str, Any] = {"xpu": xpu, "job": job, "device": node.get("device"),
                                 "slowdown": node.get("slowdown", 1.0), "server": node.get("server"),
                                 "rack": node.get("rack")}
        if layout is not None:
            ranks = layout.coordinates(xpu)
            stages = layout.sizes["pp"]
            place.update(stage=ranks["pp"], chunks=csv_cell([ranks["pp"] + c * stages for c in range(virtual_stages)]),
                         **{f"{axis}_rank": ranks[axis] for axis in ("tp", "cp", "pp", "dp", "ep")})
        rows.append({**place, **times[xpu].as_dict(),
                     "iteration_time_s": period})
    return rows


# --- the scenario as recorded -------------------------------------------------------------------

_UNIT_SUFFIX = {"B/s": "Bps", "s": "s", "B": "B"}


def scenario_columns() -> list[str]:
    """The columns that record a scenario: one per Scenario field (but ``base``, a folder of this machine),
    named ``FIELD_UNIT`` when the field has a unit (``cxl_bandwidth_Bps``, ``cxl_latency_s``)."""
    return [scenario_column(f.name) for f in dataclasses.fields(Scenario) if f.name != "base"]


def scenario_column(key: str) -> str:
    """The CSV column of a scenario key (``cxl_latency`` -> ``cxl_latency_s``); other names unchanged."""
    for f in dataclasses.fields(Scenario):
        if f.name == key:
            unit = f.metadata.get("unit")
            return f"{key}_{_UNIT_SUFFIX[unit]}" if unit else key
    return key


def spec_columns(spec: Mapping[str, Any], keys: Sequence[str]) -> dict[str, Any]:
    """A plot or finding spec with the columns it names (the values of `keys`, and the keys of its
    ``where`` and ``labels`` mappings) turned into CSV columns: ``cxl_bandwidth`` -> ``cxl_bandwidth_Bps``."""
    spec = dict(spec)
    for key in keys:
        value = spec.get(key)
        if isinstance(value, str):
            spec[key] = scenario_column(value)
        elif isinstance(value, list):
            spec[key] = [scenario_column(v) if isinstance(v, str) else v for v in value]
    for key in ("where", "labels"):
        if isinstance(spec.get(key), Mapping):
            spec[key] = {scenario_column(str(k)): v for k, v in spec[key].items()}
    return spec


def column_unit(column: str) -> str | None:
    """The unit ("B/s", "s") of a scenario column with a unit, else None."""
    for f in dataclasses.fields(Scenario):
        unit = f.metadata.get("unit")
        if unit and column == f"{f.name}_{_UNIT_SUFFIX[unit]}":
            return unit
    return None


def resolve_scenario(scenario: Scenario) -> dict[str, Any]:
    """Column -> value of every scenario field, defaults replaced by what they resolve to, as CSV cells.

    A field left to the platform or workload spec (None: devices, coherent, CXL bandwidth and latency, spill,
    collective, graph fidelity, precision) takes the spec's value, compute_model the one the run uses
    (:func:`hcsim.run.prepare.resolve_compute_model`); if the specs cannot be read (a point that
    fails), fields keep their own values. A cell holds a number, a word, or nothing (None, a blank cell: a
    value that does not exist, such as the CXL latency of a platform without CXL, or the algorithm's own
    default chunk count): never "none", prose or JSON. Lists are joined with ``+`` (``H100+A100``,
    ``31+9``); a mapping (platform_overrides, workload_overrides) has a column per key it sets
    (``workload_overrides.model.sequence``), after the fields' columns.
    """
    from_specs = _spec_values(scenario)
    values: dict[str, Any] = {}
    overrides: dict[str, Any] = {}
    for f in dataclasses.fields(Scenario):
        if f.name == "base":
            continue
        value = getattr(scenario, f.name)
        if value is None:
            value = from_specs.get(f.name)
        if f.name == "jobs" and value:  # several jobs: their names (result.json's inputs hold the rest)
            value = [job["name"] for job in value]
        if isinstance(value, Mapping):
            values[scenario_column(f.name)] = csv_cell(sorted(value)) or None  # the keys; each has a column below
            overrides.update({f"{f.name}.{key}": csv_cell(v) for key, v in sorted(value.items())})
        else:
            values[scenario_column(f.name)] = csv_cell(value)
    return {**values, **overrides}


def csv_cell(value: Any) -> Any:
    """`value` as a CSV cell: a list joined with ``+``, a mapping as ``key=value`` pairs joined with ``;``,
    anything else as it is (None: blank).

    >>> csv_cell([31, 9]), csv_cell(("H100", "A100")), csv_cell(None), csv_cell(2.5e-7)
    ('31+9', 'H100+A100', None, 2.5e-07)
    """
    if isinstance(value, (list, tuple)):
        return "+".join(str(v) for v in value)
    if isinstance(value, Mapping):
        return "; ".join(f"{k}={csv_cell(v)}" for k, v in sorted(value.items()))
    return value


def _spec_values(scenario: Scenario) -> dict[str, Any]:
    """The values the specs give the scenario's None fields, each spec's when it can be read (a graph workload
    has no spec: the workload's fields stay blank, the graph holds them)."""
    from hcsim.config import resolve_spec
    from hcsim.platform import load_platform_spec
    from hcsim.workload import load_workload_spec

    base = Path(scenario.base)
    from hcsim.run.prepare import resolve_compute_model

    values: dict[str, Any] = {"trace_iterations": list(range(1, scenario.iterations + 1)),
                              "compute_factors": "platforms/compute-model.yaml",  # the built-in roofline factors
                              "compute_model": resolve_compute_model(scenario)}  # None: roofline where it can time
    try:
        platform = load_platform_spec(resolve_spec(scenario.platform, "platforms", base), scenario.platform_settings())
    except HcsimError:
        platform = None
    if platform is not None:
        cxl = platform.links.get("cxl")
        values.update(devices=platform.devices or None, coherent=platform.coherent,  # None: per node (explicit)
                      cxl_bandwidth=cxl.bandwidth if cxl else None, cxl_latency=cxl.latency if cxl else None,
                      spill=platform.spill)
    try:
        workload = load_workload_spec(resolve_spec(scenario.workload, "workloads", base), scenario.workload_settings())
    except HcsimError:  # a graph (.json, chakra:) or a spec that fails: its values are the graph's own
        return values
    dp = scenario.dp or max(1, scenario.xpus // (scenario.tp * scenario.cp * scenario.ep * scenario.pp))
    micro_batch = scenario.micro_batch or workload.batch_per_xpu
    # Keyed by Scenario field: what a None there means (see Scenario's field comments).
    values.update(collective=workload.algorithm, granularity=workload.granularity, precision=workload.precision,
                  collective_chunks=workload.chunks,  # None: the algorithm's default
                  dp=dp, micro_batch=micro_batch, global_batch=dp * micro_batch, recompute=workload.recomputation,
                  layer_split="even")
    return values
