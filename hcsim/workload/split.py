"""Heterogeneity-aware data parallelism: how much of the global batch each data-parallel replica runs.

The scenario key ``batch_split`` says how a job's batch is shared among its
data-parallel replicas:

- ``even`` (the default): every replica runs the same number (the paper's and
  Megatron-LM's synchronous data parallelism; on a mixed cluster the fast
  replicas wait for the slow ones in the gradient all-reduce);
- ``proportional``: replica r gets a share in proportion to its speed s_r, the
  peak FLOP/s at the training precision of its slowest XPU
  (:func:`hcsim.platform.devices.peak_flops`), rounded to whole units by
  :func:`largest_remainder` so that the shares sum to the total exactly;
- an explicit list: one positive integer per replica, summing to the total.

The unit is the micro-batch in the hybrid-parallel graph (the total is
m·dp = global_batch / micro_batch) and the sample in the paper's
data-parallel graph, where each XPU is a replica (the total is
batch_per_xpu x XPUs). The gradient all-reduce is the same whatever the split:
every replica holds the whole model's gradients (the shares weigh the data, not
the parameters).

Rounding bound: with shares n_r from :func:`largest_remainder`, |n_r - N·s_r/S| < 1
(S = Σ s), so replica r's compute time n_r·w/s_r (w FLOP per unit) is within one of
its own units' time, w/s_r, of the common ideal N·w/S.

>>> largest_remainder(8, [3.0, 1.0])
(6, 2)
>>> largest_remainder(10, [3.0, 1.0])  # 7.5 and 2.5: the tie goes to the first replica
(8, 2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from hcsim.errors import ConfigError, brief
from hcsim.units import format_quantity

__all__ = ["BATCH_SPLITS", "largest_remainder", "resolve_batch_split", "check_batch_split"]

BATCH_SPLITS = ("even", "proportional")  # or an explicit list of counts, one per DP replica


def largest_remainder(total: int, weights: Sequence[float]) -> tuple[int, ...]:
    """`total` whole units split in proportion to `weights` (each > 0): every part gets the floor of its exact
    share N·w_i/Σw, and the units left over go one each to the parts with the largest fractional remainders
    (Hamilton's method; equal remainders: the lower index first), so the parts sum to `total` exactly."""
    whole = sum(weights)
    exact = [total * w / whole for w in weights]
    parts = [math.floor(e) for e in exact]
    left = total - sum(parts)
    for i in sorted(range(len(weights)), key=lambda i: (parts[i] - exact[i], i))[:left]:
        parts[i] += 1
    return tuple(parts)


def check_batch_split(counts: Sequence[int], replicas: int, total: int, unit: str, total_text: str) -> None:
    """Raise ConfigError unless `counts` has one positive integer per replica and sums to `total`.

    `unit` names what a count counts ("micro-batches", "samples"); `total_text` says where the total comes from
    (``global_batch / micro_batch = 16 / 2``)."""
    valid = f"valid: a list of {replicas} positive integers (one per DP replica) summing to {total} {unit} " \
            f"({total_text}), or even, or proportional"
    if len(counts) != replicas:
        raise ConfigError(f"batch_split: {brief(list(counts))} gives {len(counts)} DP replicas, the run has "
                          f"{replicas}; {valid}")
    bad = [c for c in counts if isinstance(c, bool) or not isinstance(c, int) or c < 1]
    if bad:
        raise ConfigError(f"batch_split: {brief(list(counts))} has {brief(bad[0])}, not a positive integer "
                          f"(every replica runs at least one of its {unit}); {valid}")
    if sum(counts) != total:
        raise ConfigError(f"batch_split: {brief(list(counts))} sums to {sum(counts)} {unit}, the run has "
                          f"{total}; {valid}")


def resolve_batch_split(split: str | Sequence[int], speeds: Sequence[float], total: int, unit: str,
                        total_text: str, names: Sequence[str] = ()) -> tuple[int, ...] | None:
    """The units per replica of `split` (None for an even split), the replicas having `speeds` (FLOP/s).

    `names` (optional, one per replica) describe the replicas in errors, e.g. by their slowest XPU's device.

    Raises
    ------
    ConfigError
        for an explicit list of the wrong length, sum or values (:func:`check_batch_split`), or a
        proportional split that leaves a replica no unit at all.
    """
    if split == "even":
        return None
    if split == "proportional":
        counts = largest_remainder(total, speeds)
        if min(counts) < 1:
            r = counts.index(0)
            who = f" ({names[r]}, {format_quantity(speeds[r], 'FLOP/s')})" if names else ""
            raise ConfigError(f"batch_split: proportional gives DP replica {r}{who} none of the {total} {unit} "
                              f"({total_text}); valid: a larger batch, an explicit list of positive counts, or even")
        return counts
    if isinstance(split, str):
        raise ConfigError(f"batch_split: {split!r} is not one of {', '.join(BATCH_SPLITS)} nor a list of counts")
    check_batch_split(split, len(speeds), total, unit, total_text)
    return tuple(split)
