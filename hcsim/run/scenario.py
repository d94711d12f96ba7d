"""Scenarios: what to simulate, read from YAML and ``--set key=value``.

A scenario names a platform spec and a workload spec and the knobs the
experiments sweep. Every key is optional; the built-in default is the
paper's coherent topology with 64 H100, LLaMA2-13B data parallel, CXL at
the platform's own 128 GB/s and 200 ns.

Each key's constraint is declared once (``Scenario._constraints``) and
checked when a Scenario is built, from YAML or from Python. Renamed keys
(:data:`RENAMED_KEYS`: ``fidelity`` is now ``granularity``,
``collective_fidelity`` is ``collective_model``) are still read from YAML and
``--set``, with a warning; retired keys (:data:`RETIRED_KEYS`: ``engine``,
``xpu_sampling``) are read where they name what every run now does, with a
warning, and refused with the reason otherwise.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from hcsim.config import Fields, load_yaml, parse_settings, resolve_spec
from hcsim.engine.api import COLLECTIVE_MODELS, LOCAL_ACCESSES, LOCAL_COLLECTIVES
from hcsim.errors import ConfigError, brief, say_once
from hcsim.limits import check_range
from hcsim.params import (Choice, Constraint, Either, Flag, Integer, Integers, Number, NumberMapping, Optional,
                          StringMapping, Text, Texts, check_params)
from hcsim.engine.compute_model import COMPUTE_MODELS
from hcsim.workload.context import CP_ALGORITHMS
from hcsim.workload.graph import PRECISIONS
from hcsim.workload.model import RECOMPUTATION
from hcsim.workload.schedules import SCHEDULES, check_pipeline
from hcsim.workload.split import BATCH_SPLITS
from hcsim.workload.zero import OFFLOAD_STATES, OFFLOAD_TARGETS, ZERO_STAGES

__all__ = ["Scenario", "load_scenario", "apply_settings", "SCENARIO_KEYS", "RENAMED_KEYS", "RETIRED_KEYS",
           "COLLECTIVE_MODELS", "LOCAL_ACCESSES", "LOCAL_COLLECTIVES", "GRANULARITIES", "RING_ORDERS", "SPILLS"]

log = logging.getLogger(__name__)

GRANULARITIES = ("layer", "decoder")
RING_ORDERS = ("topology", "interleaved")
# Old key -> new key: read with a warning, so older scenario and experiment files keep working.
RENAMED_KEYS = {"fidelity": "granularity", "collective_fidelity": "collective_model"}
# Retired key -> (the values that name what every run now does: read with a warning; why the others are gone)
RETIRED_KEYS = {
    "engine": (("auto", "core"), "every run is on the C++ engine core, which holds the executor's rules once"),
    "xpu_sampling": (("all",), "every XPU is simulated; representative XPUs were retired: every XPU on the C++ "
                               "core ran 4-6x faster than representatives did, and representatives were not exact "
                               "where alike-looking XPUs play different parts (up to 1.3 % off)"),
    "xpu_fidelity": (("all",), "every XPU is simulated; representative XPUs were retired"),
}
TRACE_CHOICES = ("per-stage", "per-device")
SPILLS = ("error", "allow")  # what a stage whose state does not fit in local memory does (Scenario.spill)


class Jobs(Constraint):
    """A non-empty list of jobs, each a mapping (its keys and values: hcsim.run.jobs.check_jobs)."""

    def describe(self) -> str:
        return "a non-empty list of jobs, each a mapping of job keys (name, xpus, workload, tp, ...)"

    def accepts(self, value: Any) -> bool:
        return isinstance(value, (list, tuple)) and bool(value) and all(isinstance(job, Mapping) for job in value)


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """One simulation to run. Quantities in SI units (B/s, s). Lists given for tuple fields are made tuples."""

    name: str = "default"  # a label, recorded in the result
    platform: str = "paper-cxl"  # platform spec: built-in name or path
    workload: str = "llama2-13b"  # workload spec (built-in name or YAML path), a graph .json or chakra:PREFIX
    precision: str | None = None  # fp32 | fp16 | bf16 | fp8 (FP16/BF16: mixed precision, FP32 master weights and
    # Adam state; FP8: Transformer Engine's FP8 GEMMs, BF16 elsewhere): the training precision, overriding the
    # workload's training.precision; None: the workload's
    xpus: int = 64  # XPUs that train (the first ones of the platform, rack by rack)
    devices: tuple[str, ...] | None = None  # device per rack, cycling; None: the platform spec's
    coherent: bool | None = None  # CXL fabric and coherent memory access; None: the platform spec's
    cxl_bandwidth: float | None = field(default=None, metadata={"unit": "B/s"})  # per direction, every CXL
    # link; None: the platform spec's
    cxl_latency: float | None = field(default=None, metadata={"unit": "s"})  # None: the platform spec's
    collective: str | None = None  # all-reduce algorithm (ring, coherent_ring, ...); None: the workload's
    collective_chunks: int | None = None  # the all-reduces split into this many chunks; None: the workload's
    ring_order: str | tuple[str, ...] = "topology"  # rank order of the collectives' groups: topology
    # (neighbours in a server adjacent), interleaved (consecutive ranks on different servers) or XPU names
    collective_model: str = "auto"  # step (every transfer) | flow (phases) | auto (step up to step_limit ranks)
    step_limit: int = 64  # auto: step-exact collectives up to this many ranks, flow above
    local_access: str = "analytic"  # analytic | simulated: see hcsim.engine.api.RunOptions
    local_collectives: str = "simulated"  # simulated | analytic: see hcsim.engine.api.RunOptions
    granularity: str | None = None  # workload graph: layer | decoder vertices; None: the workload spec's
    iterations: int = 2  # the first fills the pipeline; results average the later ones
    platform_overrides: dict[str, Any] = field(default_factory=dict)  # any key of the platform spec, dotted
    # (platforms/paper-cxl.yaml lists them): {links.pcie.latency: 300ns, rack.servers: 8}
    workload_overrides: dict[str, Any] = field(default_factory=dict)  # any key of the workload spec, dotted
    # (workloads/llama2-13b.yaml lists them): {training.batch_per_xpu: 2, gradients.bucket: layer}
    # parallelism (tp x pp x dp = xpus); the paper's data-parallel graph unless tp, pp or a batch is given
    tp: int = 1  # tensor-parallel group size (Megatron-LM; a TP group may span servers: the summary says so)
    pp: int = 1  # pipeline stages
    dp: int | None = None  # data-parallel replicas; None: xpus / (tp x pp)
    micro_batch: int | None = None  # samples per micro-batch; None: the workload's batch_per_xpu
    global_batch: int | None = None  # samples per iteration; None: dp x micro_batch
    schedule: str = "1f1b"  # gpipe | 1f1b | interleaved | zb-h1 (hcsim.workload.schedules)
    virtual_stages: int = 1  # model chunks per pipeline stage (interleaved 1F1B)
    recompute: str | None = None  # none | selective | full; None: the workload's recomputation
    sequence_parallel: bool = False  # Megatron-LM sequence parallelism inside TP groups
    layer_split: tuple[int, ...] | str | None = None  # decoders per (virtual) stage; None: even; "proportional"
    batch_split: str | tuple[int, ...] = "even"  # each DP replica's share of the global batch: even,
    # proportional (to its slowest XPU's peak FLOP/s) or a list, one count per replica, of micro-batches
    # summing to global_batch / micro_batch (of samples summing to batch_per_xpu x xpus in the paper's graph)
    zero: int = 0  # ZeRO stage 0-3 over each DP group (1 = Megatron's distributed optimizer)
    offload: str = "none"  # none | cpu (host DRAM, step on the CPU) | cxl (CXL Type 3, in place) | coherent (in
    # place on CXL Type 3 or a superchip CPU's memory over NVLink-C2C)
    offload_state: tuple[str, ...] = ("optimizer",)  # what offload keeps out of HBM: optimizer, parameters, activations
    spill: str | None = None  # error | allow: a pipeline stage whose state does not fit its XPUs' local memory is
    # an out-of-memory error, or spills to their extended memory; None: the platform's (error on kind: dgx,
    # where Megatron-LM and PyTorch have no spill; allow on the paper's topologies and explicit ones, the
    # paper's model, Fig. 3)
    ep: int = 1  # expert-parallel group size (MoE models; EP ranks split the data too: dp = xpus / (tp x ep x pp))
    cp: int = 1  # context-parallel group size: each rank holds sequence / cp tokens (dp = xpus / (tp x cp x ep x pp))
    cp_algorithm: str = "ring"  # ring (K/V blocks passed around the CP group, beside the attention) | all_to_all
    moe_skew: float = 1.0  # most loaded expert rank's tokens / the mean (1: balanced routing)
    compute_model: str | None = None  # peak (FLOPs / peak FLOP/s: the paper's) | roofline (the kernel model,
    # hcsim.engine.compute_model); None: roofline where the run's graph lists kernels (tp, pp, cp, a batch or a
    # framework's kernels) and every device of the platform has kernel factors, else peak (resolve_compute_model)
    compute_factors: str | None = None  # roofline factors YAML; None: platforms/compute-model.yaml
    trace_xpus: int | str | tuple[str, ...] = "per-stage"  # with an output folder: per-stage (the first XPU of
    # each pipeline stage and device type), per-device (the first XPU of each device type), a list of XPU names,
    # or the first N (0: none)
    trace_iterations: tuple[int, ...] | None = None  # None: every iteration
    stragglers: dict[str, float] = field(default_factory=dict)  # XPU name -> slowdown factor > 0: its compute
    # takes that many times as long ({xpu3: 1.5}; docs/stragglers.md); wins over straggler_spread where it names one
    straggler_spread: float = 0.0  # every XPU of the run slowed by 1 + |N(0, spread)| (half-normal), drawn with
    # random.Random(seed) in topology order; 0: none
    seed: int = 0  # the seed of the run's random draws (straggler_spread): the same seed, the same factors
    jobs: tuple[dict[str, Any], ...] | None = None  # several jobs on the one platform (docs/jobs.md): each a mapping
    # of job keys (hcsim.run.jobs.JOB_KEYS: name; xpus, a count of the next free XPUs or a list of XPU names; its
    # workload and parallelism), the scenario's value for each key it leaves out; None: one job, the scenario
    jobs_alone: bool = False  # with jobs: also run each job alone on its XPUs, to report what sharing costs it
    base: str = "."  # folder that relative spec paths are relative to

    _constraints: ClassVar[dict[str, Constraint]] = {
        "name": Text(), "platform": Text(), "workload": Text(),
        "precision": Optional(Choice(PRECISIONS), "the workload spec's"),
        "spill": Optional(Choice(SPILLS), "the platform's"),
        "xpus": Integer(minimum=1),
        "devices": Optional(Texts("device names"), "the platform spec's"),
        "coherent": Optional(Flag(), "the platform spec's"),
        "cxl_bandwidth": Optional(Number(positive=True, unit="B/s"), "the platform spec's"),
        "cxl_latency": Optional(Number(positive=True, unit="s"), "the platform spec's"),
        "collective": Optional(Text(), "the workload spec's"),
        "ring_order": Either((Choice(RING_ORDERS), Texts("XPU names"))),
        "collective_model": Choice(COLLECTIVE_MODELS),
        "step_limit": Integer(minimum=1),
        "local_access": Choice(LOCAL_ACCESSES),
        "local_collectives": Choice(LOCAL_COLLECTIVES),
        "compute_model": Optional(Choice(COMPUTE_MODELS), "roofline where the devices have kernel factors, else peak"),
        "compute_factors": Optional(Text(), "platforms/compute-model.yaml"),
        "granularity": Optional(Choice(GRANULARITIES), "the workload spec's"),
        "iterations": Integer(minimum=1),
        "platform_overrides": StringMapping(), "workload_overrides": StringMapping(),
        "tp": Integer(minimum=1), "pp": Integer(minimum=1), "virtual_stages": Integer(minimum=1),
        "dp": Optional(Integer(minimum=1), "xpus / (tp x pp)"),
        "micro_batch": Optional(Integer(minimum=1), "the workload's batch_per_xpu"),
        "global_batch": Optional(Integer(minimum=1), "dp x micro_batch"),
        "schedule": Choice(SCHEDULES), "recompute": Optional(Choice(RECOMPUTATION), "the workload's recomputation"),
        "sequence_parallel": Flag(), "layer_split": Optional(Either((Choice(("proportional",)), Integers(minimum=1))), "even"),
        "batch_split": Either((Choice(BATCH_SPLITS), Integers(minimum=1))),
        "trace_xpus": Either((Integer(minimum=0), Choice(TRACE_CHOICES), Texts("XPU names"))),
        "trace_iterations": Optional(Integers(minimum=1), "every iteration"),
        "cp": Integer(minimum=1), "cp_algorithm": Choice(CP_ALGORITHMS),
        "stragglers": NumberMapping("XPU names", positive=True), "straggler_spread": Number(minimum=0),
        "seed": Integer(minimum=0),
        "jobs": Optional(Jobs(), "one job, the scenario"), "jobs_alone": Flag(),
        "base": Text(),
    }

    def __post_init__(self) -> None:
        for key in ("devices", "ring_order", "trace_iterations", "layer_split", "batch_split"):
            if isinstance(getattr(self, key), list):
                object.__setattr__(self, key, tuple(getattr(self, key)))
        if isinstance(self.stragglers, Mapping) and not isinstance(self.stragglers, dict):
            object.__setattr__(self, "stragglers", dict(self.stragglers))
        name = self.name if isinstance(self.name, str) else "?"
        check_params(self._constraints, self, f"scenario {name!r}")
        if self.trace_iterations and max(self.trace_iterations) > self.iterations:
            raise ConfigError(f"scenario {name!r}: trace_iterations: {brief(self.trace_iterations)} names an "
                              f"iteration after the last one; the run has iterations 1 to {self.iterations}")
        if self.schedule in SCHEDULES:  # one rule for every pp, also where pp: 1 runs the data-parallel graph
            try:
                check_pipeline(self.schedule, self.pp, self.virtual_stages)
            except ConfigError as err:
                raise ConfigError(f"scenario {name!r}: {err}") from None
        if isinstance(self.compute_factors, str) and isinstance(self.base, str):
            self._check_compute_factors(name)
        if self.jobs is not None:
            from hcsim.run.jobs import check_jobs

            if isinstance(self.jobs, list):
                object.__setattr__(self, "jobs", tuple(self.jobs))
            problems = check_jobs(self.jobs, f"scenario {name!r}: jobs")
            if problems:
                raise ConfigError("\n".join(problems))
        elif self.jobs_alone is True:
            raise ConfigError(f"scenario {name!r}: jobs_alone: applies to a scenario with jobs; this one runs one "
                              f"job (no jobs key): remove jobs_alone, or list the jobs")

    def _check_compute_factors(self, name: str) -> None:
        try:
            resolve_spec(self.compute_factors, "platforms", Path(self.base))
        except ConfigError:
            path = Path(self.compute_factors)
            try:
                there = (path if path.is_absolute() else Path(self.base) / path).exists()
            except OSError:  # a name too long for the file system
                there = False
            problem = "not a regular file (a folder, device or pipe)" if there else "no such file"
            raise ConfigError(f"scenario {name!r}: compute_factors: {brief(self.compute_factors)}: {problem} "
                              f"(relative paths are read from {self.base}); give a roofline factors YAML, as "
                              f"platforms/compute-model.yaml or the output of hcsim calibrate") from None

    def platform_settings(self) -> dict[str, Any]:
        """Overrides for the platform spec, from the scenario's own keys and platform_overrides."""
        settings = dict(self.platform_overrides)
        if self.devices is not None:
            settings["devices"] = list(self.devices)
        if self.coherent is not None:
            settings["coherent"] = self.coherent
        if self.cxl_bandwidth is not None:
            settings["links.cxl.bandwidth"] = f"{self.cxl_bandwidth!r}B/s"
        if self.cxl_latency is not None:
            settings["links.cxl.latency"] = f"{self.cxl_latency!r}s"
        return settings

    @property
    def hybrid(self) -> bool:
        """Whether the run needs the hybrid-parallel graph (any parallel key beyond the paper's data parallelism)."""
        return self.tp > 1 or self.pp > 1 or self.micro_batch is not None or self.global_batch is not None \
            or self.recompute is not None or self.layer_split is not None or self.zero > 0 or self.offload != "none" \
            or self.ep > 1 or self.cp > 1

    def workload_settings(self) -> dict[str, Any]:
        settings = dict(self.workload_overrides)
        if self.collective is not None:
            settings["gradients.algorithm"] = self.collective
        if self.collective_chunks is not None:
            settings["gradients.chunks"] = self.collective_chunks
        if self.granularity is not None:
            settings["granularity"] = self.granularity
        if self.precision is not None:  # the scenario key wins over workload_overrides' training.precision
            settings["training.precision"] = self.precision
        return settings

    def origins(self, kind: str) -> dict[str, str]:
        """The dotted keys this scenario sets in its platform (`kind` "platform") or workload spec, each with
        the scenario key the user wrote: ``{"links.cxl.bandwidth": "cxl_bandwidth", "bogus":
        "platform_overrides.bogus"}``."""
        if kind == "platform":
            named = {"devices": "devices", "coherent": "coherent", "links.cxl.bandwidth": "cxl_bandwidth",
                     "links.cxl.latency": "cxl_latency"}
            settings, overrides = self.platform_settings(), "platform_overrides"
        else:
            named = {"gradients.algorithm": "collective", "gradients.chunks": "collective_chunks",
                     "granularity": "granularity", "training.precision": "precision"}
            settings, overrides = self.workload_settings(), "workload_overrides"
        own = self.platform_overrides if kind == "platform" else self.workload_overrides
        return {key: (f"{overrides}.{key}" if key in own and (key not in named or getattr(self, named[key]) is None)
                      else named.get(key, f"{overrides}.{key}")) for key in settings}

    def blame(self, err: ConfigError, spec: str | Path, kind: str) -> ConfigError:
        """`err`, raised reading the `kind` spec file `spec` with this scenario's settings, with each problem
        about a key the scenario set blamed on the scenario key the user wrote, not on the (built-in) file."""
        import re

        origins = self.origins(kind)
        spec = Path(spec)
        heads = sorted({str(spec), spec.name}, key=len, reverse=True)
        lines = []
        for line in str(err).splitlines():
            for head in heads:
                match = re.match(rf"^{re.escape(head)}: (?P<key>[\w.\[\]-]+): (?P<rest>.*)$", line)
                if match:
                    break
            origin = None
            if match:
                key = match["key"]
                origin = next((o for o in origins if key == o or key.startswith((o + ".", o + "["))
                               or o.startswith(key + ".")), None)
            if origin is None:
                lines.append(line)
                continue
            label, rest = origins[origin], match["rest"]
            if label in ("cxl_bandwidth", "cxl_latency") and rest.startswith("unknown key"):
                rest = (f"platform {spec.stem!r} has no CXL links (links.cxl); {label} applies to platforms with "
                        f"CXL links, such as paper-cxl: remove it")
            else:
                rest = f"{rest} (in {spec.name})" if label.endswith(key) else f"in {spec.name}, {key}: {rest}"
            lines.append(f"scenario {self.name!r}: {label}: {rest}")
        return ConfigError("\n".join(lines))

    def to_dict(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        if data["jobs"] is not None:
            data["jobs"] = [{k: list(v) if isinstance(v, tuple) else v for k, v in job.items()} for job in data["jobs"]]
        for key in ("devices", "trace_iterations", "ring_order", "layer_split", "batch_split", "offload_state",
                    "trace_xpus"):
            if isinstance(data[key], tuple):
                data[key] = list(data[key])
        return data

    def digest(self) -> str:
        """A hash of the inputs, recorded with results: of the keys set to other than their default, so a key
        added to hcsim with a default leaves every earlier digest (and sweep point key) unchanged. A key whose
        default changed (:data:`FORMER_DEFAULTS`) is compared with its former default: a scenario that names
        that value keeps its earlier digest, and one left to the new default gets a digest of its own."""
        defaults = Scenario(name=self.name).to_dict() | FORMER_DEFAULTS
        data = {k: v for k, v in self.to_dict().items() if k != "base" and v != defaults[k]}
        return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


# key -> its default before the default changed: compute_model was peak until it became None (the kernel model
# wherever the devices have factors); committed results that name peak keep their sweep point keys
FORMER_DEFAULTS = {"compute_model": "peak"}

SCENARIO_KEYS = tuple(f.name for f in dataclasses.fields(Scenario) if f.name != "base")


API_ORIGIN = "load_scenario's settings: "  # where a Python caller's mapping of settings is blamed


def load_scenario(path: str | Path | None = None, settings: list[str] | Mapping[str, Any] | None = None,
                  origin: str | Mapping[str, str] | None = None) -> Scenario:
    """Read a scenario YAML (or the built-in default when `path` is None), then apply `settings`.

    `settings` are ``key=value`` strings (values in YAML syntax: ``xpus=256``,
    ``cxl_bandwidth=256GB/s``, ``devices=[H100,A100]``,
    ``platform_overrides.links.pcie.latency=300ns``) or a mapping; a problem with one of them is blamed on
    `origin` + its key (``--set xpus``; a runs CSV's ``runs.csv:3: xpus``), or on ``origin[key]`` + its key
    when `origin` maps keys to where each was written. Left out: ``--set`` for ``key=value`` strings (the command
    line's), ``load_scenario's settings:`` for a mapping (a Python caller's).
    """
    if origin is None:
        origin = API_ORIGIN if isinstance(settings, Mapping) else "--set "
    if path is not None and not isinstance(path, (str, Path)):
        raise ConfigError(f"scenario: expected a YAML file path or None, got {brief(path)}")
    where = str(path) if path else "scenario"
    data = {} if path is None else load_yaml(path)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(f"{where}: a scenario is a mapping of keys to values, got {type(data).__name__}")
    given = {str(key).partition(".")[0] for key in parse_settings(settings if settings is not None else [])}
    data = apply_settings(data, settings if settings is not None else [], where)
    base = str(Path(path).resolve().parent) if path else "."
    # a value --set gave is blamed on --set, not on the file; overrides merge both, so they keep the file's name
    origins = {key: origin.get(key, "--set ") if isinstance(origin, Mapping) else origin
               for key in given - {"platform_overrides", "workload_overrides"}}
    return _from_mapping(data, where, base, origins)


def apply_settings(data: dict, settings: list[str] | Mapping[str, Any], where: str = "--set") -> dict:
    """Return `data` with ``key=value`` settings applied (dotted keys reach into the override maps)."""
    data = dict(data)
    items = parse_settings(settings)
    for key, value in items.items():
        head, _, rest = str(key).partition(".")
        if rest and head in ("platform_overrides", "workload_overrides", "stragglers"):
            current = data.get(head)
            data[head] = {**(current if isinstance(current, dict) else {}), rest: value}
        else:
            data[key] = value
    return data


_warned: set[str] = set()


def renamed(data: dict, where: str) -> dict:
    """`data` with renamed keys (:data:`RENAMED_KEYS`) under their new names and retired keys
    (:data:`RETIRED_KEYS`) that name what every run does left out, a warning once per old key; a retired key with
    any other value is a ConfigError saying why it went."""
    data = dict(data)
    for old, (kept, why) in RETIRED_KEYS.items():
        if old not in data:
            continue
        value = data.pop(old)
        if not (isinstance(value, str) and value in kept):
            raise ConfigError(f"{where}{old}: {brief(value)} is no longer available: {why}. Fix: remove the "
                              f"{old} key")
        if old not in _warned:
            _warned.add(old)
            log.warning("%s%s: retired (%s); remove the key", where, old, why)
    for old, new in RENAMED_KEYS.items():
        if old not in data:
            continue
        if new in data:
            raise ConfigError(f"{where}{old}: renamed {new}, which is given too; keep only {new}")
        if old not in _warned:
            _warned.add(old)
            log.warning("%s%s: renamed %s; the old key still works but will go (write %s: %s)",
                        where, old, new, new, brief(data[old]))
        data[new] = data.pop(old)
    return data


def _from_mapping(data: dict, where: str, base: str, origins: dict[str, str] | None = None) -> Scenario:
    data = renamed(data, f"{where}: ")
    fields = Fields(data, f"{where}: ", origins=origins)
    default = Scenario()
    c = Scenario._constraints
    values: dict[str, Any] = {"base": base}
    values["name"] = fields.string("name", default.name if where == "scenario" else Path(where).stem)
    values["platform"] = fields.string("platform", default.platform)
    raw = fields.data.get("workload")
    if (isinstance(raw, dict) and list(raw) == ["chakra"]) or (isinstance(raw, str) and raw.strip() == "chakra:"):
        fields.raw("workload")  # YAML reads a bare `chakra:` as a mapping
        fields.problems.append(f"{fields.path('workload')}: 'chakra:' names no trace; write chakra:PATH_PREFIX for the "
                               f"files PATH_PREFIX.<rank>.et (e.g. --set workload=chakra:traces/run)")
        values["workload"] = default.workload
    else:
        values["workload"] = fields.string("workload", default.workload)
    values["precision"] = fields.choice("precision", PRECISIONS, None)
    values["xpus"] = fields.number("xpus", default.xpus, kind=int, minimum=1)
    values["devices"] = _devices(fields)
    values["coherent"] = fields.flag("coherent", None) if fields.raw("coherent") is not None else None
    for key, dimension in (("cxl_bandwidth", "bandwidth"), ("cxl_latency", "time")):
        values[key] = fields.quantity(key, dimension, None) if fields.raw(key) is not None else None
    values["collective"] = _collective(fields)
    values["collective_chunks"] = fields.number("collective_chunks", None, kind=int, minimum=1)
    values["ring_order"] = _ring_order(fields)
    for key in ("collective_model", "local_access"):
        values[key] = fields.choice(key, c[key].options, getattr(default, key))
    values["granularity"] = fields.choice("granularity", GRANULARITIES, None) if fields.raw("granularity") is not None else None
    values["step_limit"] = fields.number("step_limit", default.step_limit, kind=int, minimum=1)
    values["local_collectives"] = fields.choice("local_collectives", LOCAL_COLLECTIVES,
                                                default.local_collectives)
    values["iterations"] = fields.number("iterations", default.iterations, kind=int, minimum=1)
    values["trace_xpus"] = _trace_xpus(fields, default.trace_xpus)
    values["cp_algorithm"] = fields.choice("cp_algorithm", CP_ALGORITHMS, default.cp_algorithm)
    for key in ("tp", "pp", "virtual_stages", "ep", "cp"):
        values[key] = fields.number(key, getattr(default, key), kind=int, minimum=1)
    for key in ("dp", "micro_batch", "global_batch"):
        values[key] = fields.number(key, None, kind=int, minimum=1)
    values["schedule"] = fields.choice("schedule", SCHEDULES, default.schedule)
    values["recompute"] = fields.choice("recompute", RECOMPUTATION, None)
    values["sequence_parallel"] = fields.flag("sequence_parallel", False)
    split = fields.raw("layer_split")
    if split == "even":
        split = None
    elif split is not None and split != "proportional" and not (
            isinstance(split, list) and split
            and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1 for n in split)):
        fields.problems.append(f"{fields.path('layer_split')}: expected even, proportional (decoders in proportion "
                               f"to each stage's speed) or a list of decoder counts >= 1, one per (virtual) "
                               f"pipeline stage, got {brief(split)}")
        split = None
    values["layer_split"] = tuple(split) if isinstance(split, list) else split
    values["batch_split"] = _batch_split(fields)
    values["zero"] = fields.choice("zero", ZERO_STAGES, default.zero)
    values["moe_skew"] = fields.number("moe_skew", default.moe_skew, minimum=1)
    values["offload"] = fields.choice("offload", OFFLOAD_TARGETS, default.offload)
    state = fields.raw("offload_state")
    if isinstance(state, str):
        state = [state]
    if state is not None and not (isinstance(state, list) and state and all(s in OFFLOAD_STATES for s in state)
                                  and len(set(state)) == len(state)):
        fields.problems.append(f"{fields.path('offload_state')}: expected some of {', '.join(OFFLOAD_STATES)} "
                               f"(a name or a list, each once), got {str(state)[:80]}")
        state = None
    values["offload_state"] = tuple(state) if state else default.offload_state
    values["spill"] = fields.choice("spill", SPILLS, None)
    values["compute_model"] = fields.choice("compute_model", COMPUTE_MODELS, None)
    values["compute_factors"] = fields.string("compute_factors", None)
    iterations = fields.raw("trace_iterations")
    if iterations is not None and not (isinstance(iterations, list) and iterations
                                       and c["trace_iterations"].accepts(tuple(iterations))):
        fields.problems.append(f"{fields.path('trace_iterations')}: expected a list of iteration numbers from 1, "
                               f"got {brief(iterations)}")
        iterations = None
    values["trace_iterations"] = tuple(iterations) if isinstance(iterations, list) else None
    values["stragglers"] = _stragglers(fields)
    values["straggler_spread"] = fields.number("straggler_spread", default.straggler_spread, minimum=0)
    if values["straggler_spread"] is not None and not math.isfinite(values["straggler_spread"]):
        fields.problems.append(f"{fields.path('straggler_spread')}: expected a finite number >= 0 (the standard "
                               f"deviation of the slowdowns, 0.05: about 4% slower on average), got "
                               f"{brief(values['straggler_spread'])}")
        values["straggler_spread"] = default.straggler_spread
    values["seed"] = fields.number("seed", default.seed, kind=int)
    if isinstance(values["seed"], int) and values["seed"] < 0:
        fields.problems.append(f"{fields.path('seed')}: expected an integer >= 0 (the seed of the straggler_spread "
                               f"draw), got {brief(values['seed'])}")
        values["seed"] = default.seed
    if fields.has("seed") and not fields.has("straggler_spread") and fields.raw("seed") == values["seed"]:
        say_once(log, f"{fields.path('seed')}: {values['seed']} seeds the straggler_spread draw; this run has no "
                      f"straggler_spread, so it has no effect (straggler_spread=0.05 draws with it; a serving "
                      f"workload's requests draw with serving.seed)")
    values["jobs_alone"] = fields.flag("jobs_alone", False)
    jobs = fields.raw("jobs")
    if jobs is not None:
        from hcsim.run.jobs import read_jobs

        if "xpus" in data:
            fields.problems.append(f"{fields.path('xpus')}: with jobs, each job names its XPUs (jobs[i].xpus); "
                                   f"remove the top-level xpus")
        try:
            values["jobs"] = read_jobs(jobs, data, where, base, origins or {}, _from_mapping)
        except ConfigError as err:
            fields.problems += str(err).splitlines()
    for key in ("platform_overrides", "workload_overrides"):
        value = fields.raw(key) or {}
        if not isinstance(value, dict):
            fields.problems.append(f"{fields.path(key)}: expected a mapping of dotted keys to values, got {brief(value)}")
            value = {}
        values[key] = {str(k): v for k, v in value.items()}
    fields.done()
    try:
        return Scenario(**values)
    except ConfigError as err:
        raise ConfigError(str(err).replace(f"scenario {values['name']!r}: ", f"{where}: ", 1)) from None


def _stragglers(fields: Fields) -> dict[str, float]:
    """XPU name -> slowdown factor: finite numbers > 0 (the names are checked against the run's XPUs in
    :func:`hcsim.run.stragglers.straggler_factors`)."""
    value = fields.raw("stragglers")
    if value is None:
        return {}
    if not isinstance(value, dict):
        fields.problems.append(f"{fields.path('stragglers')}: expected a mapping of XPU names to slowdown factors "
                               f"(e.g. {{xpu3: 1.5}}: xpu3's compute takes 1.5x as long), got {brief(value)}")
        return {}
    factors = {}
    for name, factor in value.items():
        if not (isinstance(factor, (int, float)) and not isinstance(factor, bool) and math.isfinite(factor)
                and factor > 0):
            fields.problems.append(f"{fields.path('stragglers')}.{name}: expected a slowdown factor, a finite number "
                                   f"> 0 (1.5: its compute takes 1.5x as long), got {brief(factor)}")
            continue
        problem = check_range(factor, "slowdown", f"{fields.path('stragglers')}.{name}")
        if problem:
            fields.problems.append(problem)
            continue
        factors[str(name)] = float(factor)
    return factors


def _collective(fields: Fields) -> str | None:
    """An all-reduce algorithm: a registered name, or "package.module:Class" (checked where it is imported)."""
    from hcsim.engine.collectives import algorithms

    name = fields.string("collective", None)
    if name is None or ":" in name:
        return name
    return fields.choice("collective", algorithms()["all_reduce"], None)


def _ring_order(fields: Fields) -> str | tuple[str, ...]:
    value = fields.raw("ring_order")
    if isinstance(value, list) and value and all(isinstance(x, str) for x in value):
        return tuple(value)
    if value is None or value in RING_ORDERS:
        return value or "topology"
    fields.problems.append(f"{fields.path('ring_order')}: expected {' or '.join(RING_ORDERS)} or a list of XPU "
                           f"names, got {brief(value)}")
    return "topology"


def _trace_xpus(fields: Fields, default: int | str) -> int | str | tuple[str, ...]:
    value = fields.raw("trace_xpus")
    if value is None:
        return default
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return tuple(value)
    if value in TRACE_CHOICES:
        return value
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    fields.problems.append(f"{fields.path('trace_xpus')}: expected a number of XPUs (the first ones), a list of XPU "
                           f"names, or one of {', '.join(TRACE_CHOICES)}; got {value!r}")
    return default


def _batch_split(fields: Fields) -> str | tuple[int, ...]:
    value = fields.raw("batch_split")
    if value is None or value in BATCH_SPLITS:
        return value or "even"
    if isinstance(value, list) and value and all(isinstance(n, int) and not isinstance(n, bool) and n >= 1
                                                 for n in value):
        return tuple(value)
    fields.problems.append(f"{fields.path('batch_split')}: expected {' or '.join(BATCH_SPLITS)}, or a list of "
                           f"positive integers, one per DP replica (micro-batches summing to global_batch / "
                           f"micro_batch; samples summing to batch_per_xpu x xpus in the paper's data-parallel "
                           f"graph), got {brief(value)}")
    return "even"


def _devices(fields: Fields):
    value = fields.raw("devices")
    if value is None:
        return None
    if isinstance(value, str):
        value = [value]
    if not (isinstance(value, list) and value and all(isinstance(v, str) and v for v in value)):
        fields.problems.append(f"{fields.path('devices')}: expected a device name or a list of them (one per rack), "
                               f"got {brief(value)}")
        return None
    return tuple(value)
