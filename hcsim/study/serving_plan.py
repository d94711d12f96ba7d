"""Planning a serving deployment: the layout of a serving workload with the most goodput under its SLOs (`hcsim
plan` given a ``kind: serving`` workload).

:func:`serving_candidates` enumerates tp (a power of two dividing the heads, the KV heads and the FFN, within a
server) x pp (a power of two, at most the decoders) x replicas (within the XPU budget) x split: co-located, or
P prefill and D decode replicas (P + D = replicas, each at least 1). A configuration that does not fit (the
serving run's own checks: weights and a step's activations leave no KV block, or a request's cache does not fit
a replica) is never simulated. Each of the others gets an upper bound on its goodput
(:func:`hcsim.run.serving.serving_bounds`: the requests that could meet the SLO alone on a replica, over a
lower bound on the makespan), and :class:`ServingSearch` simulates them best bound first until no
configuration left can change the pick.

The pick (:func:`pick`): the goodputs within `tolerance` (1 %) of the best tie (a finite request set's goodput
is its count over the makespan, which the last requests' tail moves by a little), and of those the fewest XPUs,
then the lowest p90 time to first token, then the most goodput wins.

Pure: bounds and results in, candidates out; the caller simulates.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from hcsim.errors import ConfigError

__all__ = ["ServingCandidate", "serving_candidates", "ServingSearch", "pick", "TOLERANCE", "MAX_LAYOUTS"]

TOLERANCE = 0.01  # goodputs within 1 % of the best tie
MAX_LAYOUTS = 5_000  # layouts a plan bounds at most (each is checked and bounded in ~10 ms)


@dataclass(frozen=True, order=True, kw_only=True)
class ServingCandidate:
    """One serving layout: `replicas` replicas of tp x pp XPUs, co-located (prefill = decode = 0) or `prefill`
    replicas that only prefill (the first ones) and `decode` that only decode."""

    tp: int
    pp: int
    replicas: int
    prefill: int = 0
    decode: int = 0

    def __post_init__(self) -> None:
        if min(self.tp, self.pp, self.replicas) < 1:
            raise ConfigError(f"serving plan: tp, pp and replicas must be >= 1, got {self}")
        if (self.prefill or self.decode) and (min(self.prefill, self.decode) < 1
                                              or self.prefill + self.decode != self.replicas):
            raise ConfigError(f"serving plan: prefill {self.prefill} + decode {self.decode} must be the "
                              f"{self.replicas} replicas, each at least 1")

    @property
    def xpus(self) -> int:
        return self.tp * self.pp * self.replicas

    @property
    def split(self) -> str:
        return f"{self.prefill}P+{self.decode}D" if self.prefill else "co-located"

    def label(self) -> str:
        return f"tp{self.tp} pp{self.pp} x{self.replicas} {self.split}"

    def settings(self, overrides: dict) -> dict:
        """Scenario keys that run this layout, the workload's `overrides` (the scenario's) kept."""
        split = {"serving.disaggregation": {"prefill": self.prefill, "decode": self.decode}} if self.prefill else {}
        return {"tp": self.tp, "pp": self.pp, "xpus": self.xpus, "workload_overrides": {**overrides, **split}}

    def columns(self) -> dict:
        return {"tp": self.tp, "pp": self.pp, "replicas": self.replicas, "prefill": self.prefill,
                "decode": self.decode, "xpus": self.xpus}


def serving_candidates(model, budget: int, server_size: int, split: tuple[int, int] | None = None,
                       requests: int | None = None, fixed: dict | None = None) -> list[ServingCandidate]:
    """Every layout of `model` on at most `budget` XPUs, TP groups within a server of `server_size`, with at most
    `requests` replicas (more would leave one idle); `split` (prefill, decode), when the workload fixes one, and
    `fixed` ({"tp": 4}, {"pp": 1}: given by --set) keep only the layouts with those values. ConfigError beyond
    MAX_LAYOUTS of them, or when no layout has a fixed value.

    >>> from hcsim.workload.model import ModelShape
    >>> m = ModelShape(name="m", decoders=2, hidden=64, heads=2, ffn=256, sequence=512)
    >>> [c.label() for c in serving_candidates(m, 2, 8)]  # doctest: +NORMALIZE_WHITESPACE
    ['tp1 pp1 x1 co-located', 'tp1 pp1 x2 co-located', 'tp1 pp1 x2 1P+1D', 'tp1 pp2 x1 co-located',
     'tp2 pp1 x1 co-located']
    """
    kv = model.kv_heads or model.heads
    shapes = [(tp, pp) for tp in _powers(min(server_size, budget))
              if not (model.heads % tp or kv % tp or model.expert_hidden % tp)
              for pp in _powers(budget // tp) if pp <= model.decoders]
    for i, key in enumerate(("tp", "pp")):
        if fixed and key in fixed:
            kept = [shape for shape in shapes if shape[i] == fixed[key]]
            if not kept:
                valid = ", ".join(map(str, sorted({shape[i] for shape in shapes})))
                raise ConfigError(f"--set {key}: no serving layout on at most {budget} XPUs has {key} {fixed[key]}; "
                                  f"valid here: {valid}, or leave {key} out to search it")
            shapes = kept
    found = []
    for tp, pp in shapes:
        for replicas in range(1, min(budget // (tp * pp), requests or budget) + 1):
            splits = [(0, 0)] + [(p, replicas - p) for p in range(1, replicas)]
            found += [ServingCandidate(tp=tp, pp=pp, replicas=replicas, prefill=p, decode=d) for p, d in splits
                      if split is None or (p, d) == split]
            if len(found) > MAX_LAYOUTS:
                raise ConfigError(f"--xpus {budget}: more than {MAX_LAYOUTS:,} serving layouts to bound (tp x pp x "
                                  f"replicas x prefill/decode split); valid: fewer XPUs, or fix tp and pp with --set "
                                  f"tp=N --set pp=N, or the split with serving.disaggregation")
    return found


def _powers(limit: int) -> list[int]:
    return [2 ** k for k in range(int(math.log2(limit)) + 1)] if limit >= 1 else []


@dataclass(frozen=True)
class _Outcome:
    goodput: float
    ttft_p90: float


def pick(results: dict, tolerance: float = TOLERANCE):
    """The pick of `results` (candidate -> (goodput requests/s, p90 TTFT s); failed ones left out): among those
    within `tolerance` of the best goodput, the fewest XPUs, then the lowest p90 TTFT, then the most goodput, then
    the label; None when `results` is empty.

    >>> a, b = ServingCandidate(tp=1, pp=1, replicas=2), ServingCandidate(tp=1, pp=1, replicas=1)
    >>> pick({a: (10.0, 0.1), b: (9.95, 0.2)}) == b  # within 1 %: the fewer XPUs
    True
    >>> pick({a: (10.0, 0.1), b: (9.0, 0.2)}) == a
    True
    """
    if not results:
        return None
    best = max(goodput for goodput, _ in results.values())
    tied = [c for c, (goodput, _) in results.items() if goodput >= (1 - tolerance) * best]
    return min(tied, key=lambda c: (c.xpus, results[c][1], -results[c][0], c.label()))


class ServingSearch:
    """Which serving layouts to simulate, best goodput bound first, and when more simulation cannot change the
    pick (:func:`pick`).

    With `bounds` (candidate -> upper bound on its goodput) and the pick p so far of best goodput G*, a layout c
    not simulated yet can still change the pick only if its bound reaches the tie band, ≥ (1 - tolerance)·G*,
    and either it has no more XPUs than p, or its bound is above G_p / (1 - tolerance) (it could push p out of
    the band); the search is finished when none can. A layout whose bound is 0 (no request can meet the SLO even
    alone) is never simulated: its goodput is 0. Then the pick is the exhaustive search's pick, as long as every
    bound holds (the tests check it on every simulated layout).

    >>> a, b, c = (ServingCandidate(tp=1, pp=1, replicas=n) for n in (1, 2, 4))
    >>> search = ServingSearch({a: 5.0, b: 9.0, c: 10.0})
    >>> search.next(1)
    [ServingCandidate(tp=1, pp=1, replicas=4, prefill=0, decode=0)]
    >>> search.record(c, 8.0, 0.1); search.next(2)  # b may tie with fewer XPUs; a cannot reach 8 x 0.99
    [ServingCandidate(tp=1, pp=1, replicas=2, prefill=0, decode=0)]
    >>> search.record(b, 7.99, 0.2); search.finished(), search.pick() == b
    ('no layout left can change the pick', True)
    """

    def __init__(self, bounds: dict, tolerance: float = TOLERANCE, every: bool = False):
        if not 0 <= tolerance < 1:
            raise ConfigError(f"serving plan: the tie tolerance must be in [0, 1), got {tolerance!r}")
        self.estimates = bounds  # (the name the plan's runner reads: candidate -> its bound)
        self.tolerance = tolerance
        self.every = every  # simulate every layout that may meet the SLO, whatever the bounds say (--all)
        self.simulated: dict = {}  # candidate -> (goodput, p90 TTFT), None: failed
        self._order = {c: i for i, c in enumerate(sorted(bounds, key=lambda c: (-bounds[c], c.xpus, c)))}

    def record(self, candidate, goodput: float | None, ttft_p90: float | None = None) -> None:
        """`candidate`'s simulated goodput (requests/s) and p90 time to first token (s); None: it failed."""
        self.simulated[candidate] = None if goodput is None else (goodput, ttft_p90)

    def results(self) -> dict:
        return {c: r for c, r in self.simulated.items() if r is not None}

    def pick(self):
        return pick(self.results(), self.tolerance)

    def useful(self, candidate) -> bool:
        """Whether simulating `candidate` may change the pick (class docstring)."""
        bound = self.estimates[candidate]
        if candidate in self.simulated or bound <= 0:
            return False
        chosen = self.pick()
        if chosen is None or self.every:
            return True
        results = self.results()
        best = max(goodput for goodput, _ in results.values())
        if bound < (1 - self.tolerance) * best:
            return False
        return candidate.xpus <= chosen.xpus or bound > results[chosen][0] / (1 - self.tolerance)

    def next(self, count: int) -> list:
        """Up to `count` layouts to simulate next, best bound first (then fewer XPUs); [] when finished."""
        return sorted((c for c in self.estimates if self.useful(c)), key=self._order.__getitem__)[:count]

    def finished(self) -> str | None:
        """Why simulating more cannot change the pick (None: it may)."""
        if all(c in self.simulated or self.estimates[c] <= 0 for c in self.estimates):
            return "every layout that may meet the SLO simulated"
        if not self.next(1):
            return "no layout left can change the pick"
        return None
