"""Pipeline schedules: the order in which one pipeline stage runs its passes.

An op is a forward pass ``F``, a backward pass ``B`` (input and weight
gradients, or only the input gradient in zero-bubble schedules) or a weight-
gradient pass ``W`` of one model chunk (virtual stage) of one micro-batch. A
schedule is the op order of every stage; the training graph chains each
stage's ops in that order, and the data dependencies between stages do the
rest (hybrid-parallelism survey seed §5.1: a schedule is a set of extra
ordering edges on each device's vertices).

With p stages, m micro-batches and v chunks per stage (Narayanan et al. 2021;
Qi et al. 2023, REFERENCE.md):

- ``gpipe``: every forward, then every backward; bubble (p-1)/m of the ideal
  time, m micro-batches of activations in flight.
- ``1f1b``: p-s-1 warm-up forwards on stage s, then one forward one backward,
  then the remaining backwards; same bubble, at most p-s in flight.
- ``interleaved``: 1F1B over v chunks per stage (Megatron-LM's order, m a
  multiple of p); bubble (p-1)/(v·m).
- ``zb-h1``: 1F1B with the backward split into input gradient B and weight
  gradient W; stage s runs each W s backwards after its B (and the last s at
  the end), so later stages send input gradients upstream sooner and W's fill
  the waits; every stage then holds at most p micro-batches of activations, the
  first stage's 1F1B peak (the memory ZB-H1 keeps); bubble (p-1)(t_F + t_B - t_W)
  with t_B the input-gradient pass, from m = p on ((p-1)(t_F + t_B) - (m-1)·t_W
  below: fewer weight gradients to fill the drain).

>>> [str(op) for op in stage_order("1f1b", stages=2, micro_batches=3, stage=0)]
['F0', 'F1', 'B0', 'F2', 'B1', 'B2']
"""

from __future__ import annotations

from dataclasses import dataclass

from hcsim.errors import ConfigError

__all__ = ["SCHEDULES", "Op", "stage_order", "check_schedule"]

SCHEDULES = ("gpipe", "1f1b", "interleaved", "zb-h1")


@dataclass(frozen=True, slots=True)
class Op:
    """One pass: kind "F" | "B" | "W", of model chunk `chunk` (0-based, per stage) and micro-batch `micro_batch`."""

    kind: str
    micro_batch: int
    chunk: int = 0

    def __str__(self) -> str:
        return f"{self.kind}{self.micro_batch}" + (f".c{self.chunk}" if self.chunk else "")


def check_pipeline(schedule: str, stages: int, chunks: int) -> None:
    """Raise ConfigError if `schedule` cannot run p = `stages` with v = `chunks` at all (whatever the batch)."""
    if schedule not in SCHEDULES:
        raise ConfigError(f"schedule: {schedule!r} is not one of {', '.join(SCHEDULES)}")
    if chunks > 1 and schedule != "interleaved":
        raise ConfigError(f"virtual_stages: {chunks} needs schedule: interleaved (got {schedule!r})")
    if schedule == "interleaved" and stages == 1:
        raise ConfigError("schedule: interleaved needs pp > 1 (one stage has no pipeline bubble to interleave "
                          "into); valid: pp >= 2, or schedule: 1f1b with virtual_stages: 1")


def check_schedule(schedule: str, stages: int, micro_batches: int, chunks: int) -> None:
    """Raise ConfigError if `schedule` cannot run p = `stages`, m = `micro_batches`, v = `chunks`."""
    check_pipeline(schedule, stages, chunks)
    if schedule == "interleaved" and micro_batches % stages:
        raise ConfigError(f"schedule: interleaved needs micro-batches ({micro_batches}) to be a multiple of pp "
                          f"({stages}), as Megatron-LM does")


def stage_order(schedule: str, *, stages: int, micro_batches: int, stage: int, chunks: int = 1) -> list[Op]:
    """The ops of pipeline stage `stage` (0-based) in the order `schedule` runs them."""
    check_schedule(schedule, stages, micro_batches, chunks)
    p, m = stages, micro_batches
    if schedule == "gpipe":
        return [Op("F", j) for j in range(m)] + [Op("B", j) for j in range(m)]
    if schedule == "interleaved":
        return _interleaved(p, m, stage, chunks)
    warmup = min(p - stage - 1, m)
    order = [Op("F", j) for j in range(warmup)]
    for j in range(m - warmup):
        order += [Op("F", warmup + j), Op("B", j)]
    order += [Op("B", j) for j in range(m - warmup, m)]
    if schedule == "1f1b":
        return order
    return _defer_weight_gradients(order, lag=stage)


def _defer_weight_gradients(order: list[Op], lag: int) -> list[Op]:
    """ZB-H1: each backward B_j is followed by the W of the backward `lag` places earlier; the rest at the end."""
    out, backwards = [], []
    for op in order:
        out.append(op)
        if op.kind == "B":
            backwards.append(op)
            if len(backwards) > lag:
                out.append(Op("W", backwards[-1 - lag].micro_batch, op.chunk))
    out += [Op("W", b.micro_batch, b.chunk) for b in backwards[max(0, len(backwards) - lag):]]
    return out


def _interleaved(p: int, m: int, stage: int, v: int) -> list[Op]:
    """Megatron-LM's interleaved 1F1B (schedules.py, forward_backward_pipelining_with_interleaving)."""
    total = m * v

    def op(kind: str, k: int) -> Op:
        chunk = (k // p) % v
        return Op(kind, (k // (p * v)) * p + k % p, chunk if kind == "F" else v - 1 - chunk)

    if v == 1:  # Megatron-LM runs the plain 1F1B then
        return stage_order("1f1b", stages=p, micro_batches=m, stage=stage)
    warmup = total if m == p else min((p - stage - 1) * 2 + (v - 1) * p, total)
    order = [op("F", k) for k in range(warmup)]
    for k in range(total - warmup):
        order += [op("F", warmup + k), op("B", k)]
    return order + [op("B", k) for k in range(total - warmup, total)]
