"""What a run takes and gives: :class:`RunOptions`, :class:`RunResult` and the communication kinds.

The engine's modules share these; everything above the engine reaches them, and the run itself, through
:mod:`hcsim.engine.api` (which re-exports them), so the engine's own modules never import the front door.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

from hcsim.engine.compute_model import lowest_clocks
from hcsim.params import Choice, Constraint, Flag, Integer, check_params

__all__ = ["RunOptions", "RunResult", "COMM_KINDS", "COMM_KIND", "COLLECTIVE_MODELS",
           "LOCAL_ACCESSES", "LOCAL_COLLECTIVES"]

# The kinds exposed communication is split by, in the breakdown, the trace's tracks and the core's clocks
COMM_KINDS = ("tp", "cp", "pp", "dp", "ep", "offload", "other")
# what a communication vertex's phase counts as in the breakdown (a kind of COMM_KINDS)
COMM_KIND = {"tp": "tp", "cp": "cp", "p2p": "pp", "allreduce": "dp", "zero": "dp", "ep": "ep", "offload": "offload"}

COLLECTIVE_MODELS = ("step", "flow", "auto")  # RunOptions.collective_model
LOCAL_ACCESSES = ("analytic", "simulated")  # RunOptions.local_access
LOCAL_COLLECTIVES = ("simulated", "analytic")  # RunOptions.local_collectives


@dataclass(frozen=True, kw_only=True)
class RunOptions:
    """How to run: iterations, coherence, the collective and compute models, and tracing.

    Each option's constraint is declared once (``_constraints``) and checked
    when the options are built: a misspelled choice raises ConfigError.
    """

    iterations: int = 1
    coherent: bool = True
    # "step": every transfer of a collective's schedule; "flow": its phases as aggregated flows;
    # "auto": step up to step_limit ranks, flow above
    collective_model: str = "auto"
    step_limit: int = 64  # auto: step-exact collectives up to this many ranks, flow above
    # "analytic": a read from the XPU's own HBM beside its computation is one activity, the longer
    # of the two; exact when the XPU runs one compute vertex at a time (its HBM link is private).
    # "simulated": both activities, always.
    local_access: str = "analytic"
    # "analytic": a collective whose group sits in one server is one delay, its flow phases' closed form on
    # uncontended routes (no transfer is simulated; its bytes still load the links); exact when nothing
    # else uses those links meanwhile, as with tensor parallelism on a server's XPU switch.
    local_collectives: str = "simulated"
    # None: the peak model (FLOPs / FLOP/s, transfers at line rate); a ComputeModel: the roofline
    # model of hcsim.engine.compute_model for compute vertices with ops and for collectives
    compute_model: object | None = None
    trace_xpus: frozenset[str] | None = None  # None: trace nothing
    trace_iterations: frozenset[int] | None = None  # None: every iteration

    _constraints: ClassVar[dict[str, Constraint]] = {
        "iterations": Integer(minimum=1), "coherent": Flag(), "collective_model": Choice(COLLECTIVE_MODELS),
        "step_limit": Integer(minimum=1), "local_access": Choice(LOCAL_ACCESSES),
        "local_collectives": Choice(LOCAL_COLLECTIVES),
    }

    def __post_init__(self) -> None:
        check_params(self._constraints, self, "RunOptions")


@dataclass
class RunResult:
    """Plain-data outcome of one run."""

    iteration_ends: list[float]
    activities: int
    busy: dict[str, list[float]]  # xpu -> [compute s, memory stall s]
    wall_time_s: float
    trace: object | None = None  # a hcsim.engine.trace.TraceRecorder
    collective_fidelity: dict[str, str] = field(default_factory=dict)
    link_bytes: dict[tuple[str, str], float] = field(default_factory=dict)  # (u, v) link direction -> bytes
    # xpu -> seconds per measured iteration (2.. when there are several, else 1): compute_s, memory_stall_s,
    # comm_s and idle_s, which add up to the iteration time; comm_KIND_s per kind of COMM_KINDS (they add up
    # to comm_s); idle_peers_s (waiting in a collective for its peers) and idle_bubble_s (the rest of idle_s);
    # recompute_s (the part of compute_s that recomputes activations)
    xpu_times: dict[str, dict[str, float]] = field(default_factory=dict)
    engine: str = "core"  # the engine that ran (the C++ core on SimGrid's S4U API)
    # per job (the workload graph's ``jobs``; one job otherwise), its own iteration ends (s)
    job_iteration_ends: list[list[float]] = field(default_factory=list)
    # per job, device -> the fraction of their clock its compute-bound GEMMs kept under the device's power limit,
    # where below 1: hcsim.engine.rules.WorkloadRules.gemm_clock
    job_gemm_clocks: list[dict[str, float]] = field(default_factory=list)

    @property
    def gemm_clocks(self) -> dict[str, float]:
        """Device -> the lowest of the jobs' GEMM clocks (job_gemm_clocks) where below 1: the run's."""
        return lowest_clocks(pair for clocks in self.job_gemm_clocks for pair in clocks.items())
