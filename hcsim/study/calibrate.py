"""Kernel-model factors of one GPU from its measured kernels (``hcsim calibrate``).

Reads kernel measurements in the columns of ``benchmarks/gpu_kernels.py`` (the shared H100 and H200 files
are in ``experiments/calibration/measurements/``): GEMMs by shape, causal flash attention by sequence and
head dimension, copies and elementwise kernels by size, each timed alone with CUDA events. Fits, in this
order, with the model :mod:`hcsim.engine.compute_model` runs (one function each, no second copy):

1. memory-bound kernels (copy, add, SiLU, casts): the per-kernel host floor ``launch`` is the median time of
   those of at most 1 MiB; then time = launch + bytes / (bandwidth x memory_efficiency), by least squares on
   the relative error of the rows taking at least 5 floors (streaming at full rate);
2. GEMMs: time = launch + 2mnk / (peak x max_efficiency x :func:`gemm_utilization`), for every pipeline fill
   ``k_half`` of a grid, the best by relative RMS error (``max_efficiency`` in closed form for each); FP8 GEMMs
   likewise, their rate over the BF16 ones' and their own fill from the two timed back to back side by side
   (``benchmarks/gpu_kernels.py --only fp8_linear_gemms``), else at the BF16 fill from FP8 rows timed alone;
3. attention: each measured row's efficiency, flops / ((time - launch) x peak), as a table by (head
   dimension, sequence), interpolated by the model;
4. where the file has them (``benchmarks/gpu_kernels.py --only linear_gemms attention_default
   mixed_elementwise``): the bandwidth of elementwise kernels over two dtypes, of up-casts to FP32 and of
   transposed copies (as in 1), that of torch.cat's kernel (its profiled device time over bytes, no floor, the
   rows beyond the L2) and of decode attention's cache read (its rows of at least 5 floors, no floor: called back
   to back, the host's work overlaps the kernel), the rate of fused AdamW's multi-tensor launches (the slope of
   time over bytes: optimizer.step()'s own host work is an intercept of its own), the rate of GEMMs with a
   dimension that is not a multiple of 8 (the mean efficiency of those rows, forward and gradient GEMMs apart),
   the slowdown dropout brings to attention (the median ratio of the dropout rows' times to the same shapes'
   without), and the power limit (``--only gemm_duty``: :func:`duty_points`, least squares on the clock a GEMM
   kept by the GEMMs' share of the GPU's time).

For a GPU we have not measured, :func:`fit_published_gemms` fits the GEMM model alone (step 2, without the
harness's floor) to a published matmul table of ``experiments/calibration/published/`` (the B200's: OpenXLA's).

Everything is per kernel; no whole training step enters a fit. Units: s, B, FLOP, FLOP/s, B/s.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass, replace
from pathlib import Path

from hcsim.engine.compute_model import DeviceFactors, gemm_utilization
from hcsim.errors import ConfigError

__all__ = ["KernelRow", "Calibration", "read_kernels", "fit_device", "factors_yaml", "model_errors", "error_table",
           "MEMORY_KINDS", "SMS", "read_published_gemms", "fit_published_gemms", "LARGE_GEMM_FLOPS"]

MIN_EFFICIENCY = 1e-6  # the least fraction of peak a fitted kernel may run at: below, a row's flops or seconds are wrong
# the streaming fit's rows: PyTorch's elementwise kernels of one dtype and its casts both ways (the up-cast is also
# fitted alone, UPCAST_KINDS: without it the streaming rate rises 6-9 %, and GEMMs at the roofline's ridge, whose
# operand traffic runs at it, come out 15-17 % fast on OpenXLA's held-out H100 table)
MEMORY_KINDS = ("copy", "add", "add_bf16", "silu_bf16", "cast_bf16_to_fp32", "cast_fp32_to_bf16")
MIXED_KINDS = ("add_fp32_bf16", "mul_bf16_fp32")  # elementwise over two dtypes (benchmarks/gpu_kernels.py)
UPCAST_KINDS = ("cast_bf16_to_fp32",)  # a BF16 tensor's .float() (hcsim.workload.ops.UPCAST)
# sdpa of one query token over a key/value cache, called back to back (--only decode_attention): the host's work
# (a floor of 27-35 us a call) overlaps the kernel, so a row takes the longer of the two
DECODE_KINDS = ("attn_decode",)
STRIDED_KINDS = ("copy_transposed_bf16",)
# FP8 GEMMs as Transformer Engine runs them beside BF16 ones, timed back to back (no launch gap timed):
# benchmarks/gpu_kernels.py --only fp8_linear_gemms
BACK_TO_BACK_GEMMS = ("gemm_fp8_tn", "gemm_bf16_linear")
# torch.cat's kernel (a transposed view into the key/value cache; rotary's two halves), the profiler's device time
# (benchmarks/gpu_kernels.py --only eager_pieces, those rows renamed)
CAT_KINDS = ("cat_transposed_bf16", "cat_halves_bf16")
# a GEMM's kernel by what runs around it: alone, back to back, between copies (benchmarks/gpu_kernels.py --only
# gemm_duty: each GEMM's alone row first, then its other settings)
DUTY_KINDS = ("gemm_duty",)
# a run this long meets the power limit: 40 4096^3 GEMMs back to back (7 ms) kept their clocks, the runs of 34 ms
# and more lost 8-14 % (experiments/calibration/measurements/h200-duty.csv)
SUSTAINED_SECONDS = 0.02
POWER_GRID = tuple(i / 100 for i in range(151))  # power over the limit, 0 to 1.5: GEMMs' at least 1, others' below
UNHARNESSED = BACK_TO_BACK_GEMMS + CAT_KINDS + DUTY_KINDS  # rows timed without the harness's floor or a launch
# the op kind of each one-kernel memory-bound row
BANDWIDTH_ROWS = {**dict.fromkeys(MEMORY_KINDS, "memory"), **dict.fromkeys(MIXED_KINDS, "mixed"),
                  **dict.fromkeys(UPCAST_KINDS, "upcast"),  # an up-cast runs at its own rate
                  **dict.fromkeys(DECODE_KINDS, "decode"),
                  **dict.fromkeys(STRIDED_KINDS, "strided"), **dict.fromkeys(CAT_KINDS, "cat")}
CACHE_RESIDENT_BYTES = 2**24  # a memory-bound kernel moving less runs from the H100's and H200's 50 MB L2
MULTI_TENSOR_KINDS = ("adamw_fused_fp32_step",)  # torch.optim.AdamW(fused=True).step(): multi_tensor_apply launches
K_HALF_GRID = tuple(range(0, 1025, 16))
FLOOR_BYTES = 2**20  # memory-bound rows this small measure the per-kernel floor alone (< 1 us of traffic)
STREAMING = 5  # memory-bound rows of at least 5 floors measure the bandwidth (mid sizes overlap floor and traffic)
REQUIRED = {"kind", "seconds"}
MIN_KERNEL_SECONDS = 1e-9  # s: below a GPU clock tick no kernel is measured


@dataclass(frozen=True, slots=True)
class KernelRow:
    """One measured kernel: kind, GEMM shape (m, n, k) or attention (m sequence, n heads, k head dimension,
    batch sequences), elements (elementwise files), seconds, FLOP and bytes as measured, note, where read."""

    kind: str
    m: int
    n: int
    k: int
    batch: int
    elements: int
    seconds: float
    flops: float
    bytes: float
    note: str
    where: str
    dtype: str = ""

    def shape(self) -> dict[str, int]:
        """m, n, k of a GEMM from its columns or from a note such as 'm=4096 n=4096 k=4096'."""
        if self.m:
            return {"m": self.m, "n": self.n, "k": self.k}
        return note_numbers(self.note)


def note_numbers(note: str) -> dict[str, int]:
    """The ``key=integer`` parts of a row's note ('m=4096 n=4096 k=4096', 'tokens=8192 hidden=4096'); other
    words are the note's prose."""
    import re

    return {key: int(value) for key, sep, value in (part.partition("=") for part in note.split())
            if sep and re.fullmatch(r"[0-9]{1,18}", value)}


# what a kind's model reads beyond seconds: columns (>= 1) or note keys (``key=integer`` >= 1)
NEEDS = {"gemm": ("shape", "m n k"), "gemm_bf16": ("shape", "m n k"), "gemm_fp8_e4m3": ("shape", "m n k"),
         "gemm_fp8_tn": ("columns", "m n k"), "gemm_bf16_linear": ("columns", "m n k"),
         "attn_fwd": ("columns", "m n k batch"), "attn_bwd": ("columns", "m n k batch"),
         "adamw_fused_fp32_step": ("columns", "elements"),
         "rmsnorm_hf_fwd": ("note", "tokens hidden"), "rmsnorm_hf_fwd_bwd": ("note", "tokens hidden"),
         "layernorm_fwd": ("note", "tokens hidden"), "layernorm_fwd_bwd": ("note", "tokens hidden"),
         "cross_entropy_fp32_fwd_bwd": ("note", "tokens vocab")}


def read_kernels(paths) -> list[KernelRow]:
    """Rows of one or more kernel CSVs (both layouts of the shared files); ConfigError naming the file,
    line and column of a bad value."""
    from hcsim.config import read_text

    rows: list[KernelRow] = []
    for path in map(Path, paths):
        text = read_text(path, 64 * 2**20, "a kernel CSV")  # a regular UTF-8 file; a spreadsheet's BOM dropped
        reader = csv.DictReader(io.StringIO(text, newline=""))  # CRLF line ends read as they are
        try:
            missing = REQUIRED - {(name or "").strip() for name in reader.fieldnames or ()}
            if missing:
                raise ConfigError(f"{path}: missing column(s) {', '.join(sorted(missing))}; a kernel CSV has "
                                  f"kind, m, n, k, batch, dtype, seconds, flops, bytes (benchmarks/gpu_kernels.py)")
            for line, data in enumerate(reader, start=2):
                rows.append(_row({(k or "").strip(): v for k, v in data.items()}, f"{path}:{line}"))
        except csv.Error as err:  # a cell beyond the csv module's field limit (131,072 characters), a stray NUL
            raise ConfigError(f"{path}:{reader.line_num + 1}: not a CSV row hcsim reads ({err}); a kernel CSV holds "
                              f"short cells: kind, m, n, k, batch, dtype, seconds, flops, bytes") from None
    if not rows:
        raise ConfigError(f"{', '.join(map(str, paths))}: no kernel rows")
    return rows


def _row(data: dict, where: str) -> KernelRow:
    def number(key, kind=float):
        text = (data.get(key) or "0").strip()
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(f"{where}: column {key}: expected a number, got {text[:40]!r}") from None
        if kind is int and math.isfinite(value):
            value = int(value)
        if not (math.isfinite(value) and value >= 0):
            raise ConfigError(f"{where}: column {key}: expected a finite number >= 0, got {text[:40]!r}")
        return value

    row = KernelRow(kind=(data.get("kind") or "").strip(), m=number("m", int), n=number("n", int),
                    k=number("k", int), batch=number("batch", int) or 1, elements=number("elements", int),
                    seconds=number("seconds"), flops=number("flops"), bytes=number("bytes"),
                    note=(data.get("note") or "").strip(), where=where, dtype=(data.get("dtype") or "").strip())
    if not row.seconds > 0:
        raise ConfigError(f"{where}: column seconds: a kernel takes > 0 s, got {data.get('seconds')!r}")
    if row.seconds < MIN_KERNEL_SECONDS:
        raise ConfigError(f"{where}: column seconds: {data.get('seconds')!r} is shorter than any measured kernel "
                          f"(a GPU's clock ticks are ns); give seconds >= {MIN_KERNEL_SECONDS:g}")
    from hcsim.limits import check_range

    for key, quantity in (("seconds", "duration"), ("flops", "flop"), ("bytes", "size")):
        problem = check_range(getattr(row, key), quantity, f"{where}: column {key}", data.get(key))
        if problem:
            raise ConfigError(problem)
    source, keys = NEEDS.get(row.kind, (None, ""))
    found = {"shape": row.shape, "columns": lambda: {k: getattr(row, k) for k in keys.split()},
             "note": lambda: note_numbers(row.note)}[source]() if source else {}
    missing = [k for k in keys.split() if not found.get(k, 0) >= 1]
    if missing:
        how = {"shape": "columns m, n, k >= 1, or a note 'm=4096 n=4096 k=4096'",
               "columns": f"columns {', '.join(keys.split())} >= 1",
               "note": "a note '" + " ".join(f"{k}=4096" for k in keys.split()) + "'"}[source]
        raise ConfigError(f"{where}: a {row.kind} row needs {', '.join(missing)} (>= 1): give {how}")
    return row


def _least_squares(xs: list[float], ts: list[float], intercept: float | None = None) -> tuple[float, float]:
    """(a, b) minimising sum ((a + b x) / t - 1)^2; with `intercept` given, a is fixed to it."""
    if intercept is not None:
        num = sum((x / t) * (1 - intercept / t) for x, t in zip(xs, ts))
        den = sum((x / t) ** 2 for x, t in zip(xs, ts))
        return intercept, num / den
    s11 = sum(1 / t ** 2 for t in ts)
    s12 = sum(x / t ** 2 for x, t in zip(xs, ts))
    s22 = sum((x / t) ** 2 for x, t in zip(xs, ts))
    r1 = sum(1 / t for t in ts)
    r2 = sum(x / t for x, t in zip(xs, ts))
    det = s11 * s22 - s12 * s12
    return (r1 * s22 - r2 * s12) / det, (s11 * r2 - s12 * r1) / det


def _rms(predicted, measured) -> float:
    return math.sqrt(sum((p / t - 1) ** 2 for p, t in zip(predicted, measured)) / len(measured))


@dataclass(frozen=True, slots=True)
class Calibration:
    """The fitted factors, and what the measurements' harness adds to a row and a training step does not:
    `sync` (s: the CUDA events and synchronisation around a row timed alone, beyond one kernel's issue) and
    `backward_call` (s: ``tensor.backward()``'s own start, once per row timed with its backward)."""

    factors: DeviceFactors
    sync: float
    backward_call: float


def fit_device(rows: list[KernelRow], *, name: str, peak: float, memory_bandwidth: float, sms: int) -> Calibration:
    """The kernel-model factors of device `name` (BF16 peak FLOP/s, datasheet memory bandwidth B/s, SM count)
    fitted to its measured `rows` (module docstring); ConfigError when a kind the fit needs is missing."""
    memory = [r for r in rows if r.kind in MEMORY_KINDS]
    gemms = [r for r in rows if r.kind in ("gemm", "gemm_bf16")]
    for what, found in (("memory-bound (copy, add, ...)", memory), ("gemm", gemms)):
        if len(found) < 2:
            raise ConfigError(f"calibrate {name}: needs at least 2 {what} rows, found {len(found)} "
                              f"(benchmarks/gpu_kernels.py measures them all)")
    small = sorted(r.seconds for r in memory if r.bytes <= FLOOR_BYTES)
    if not small:
        raise ConfigError(f"calibrate {name}: needs memory-bound rows of at most {FLOOR_BYTES:,} bytes (the "
                          f"per-kernel floor), found none (benchmarks/gpu_kernels.py measures them)")
    floor = small[len(small) // 2]  # the median of the kernels too small to take any time on the GPU
    try:
        streaming, reduction = _bandwidths(rows, memory, floor, memory_bandwidth)
        k_half, gemm_efficiency = _gemm_fit(gemms, floor, peak, sms)
        speedup, fp8_k_half = _fp8_fit(rows, floor, peak, sms, k_half, gemm_efficiency)
        factors = DeviceFactors(name=name, provenance="measured", gemm_max_efficiency=gemm_efficiency,
                                gemm_k_half=k_half, fp8_gemm_speedup=speedup, fp8_gemm_k_half=fp8_k_half, sms=sms,
                                memory_efficiency=streaming,
                                reduction_efficiency=reduction, kernel_overhead=0.0, launch=floor)
        calibration = _launches(rows, factors, floor, peak, memory_bandwidth)
        table = _attention_table(rows, calibration, peak)
        variants = _variants(rows, calibration, floor, peak, memory_bandwidth)
    except (ZeroDivisionError, OverflowError):  # sums that vanish or overflow: rows of a kind all alike
        raise ConfigError(f"calibrate {name}: the rows do not determine the kernel model (a least-squares fit has "
                          f"no unique solution): each kind needs rows of different sizes and times, as "
                          f"benchmarks/gpu_kernels.py measures them") from None
    return replace(calibration, factors=replace(calibration.factors, attention_table=table, **variants))


def _variants(rows, calibration: Calibration, floor: float, peak: float, bandwidth: float) -> dict[str, float]:
    """The factors of step 4 (module docstring) that `rows` measure; none when they measure none."""
    found = {}
    for key, kinds in (("mixed_efficiency", MIXED_KINDS), ("upcast_efficiency", UPCAST_KINDS),
                       ("strided_efficiency", STRIDED_KINDS)):
        measured = [r for r in rows if r.kind in kinds]
        if measured:
            found[key] = _bandwidth_efficiency(measured, floor, bandwidth)
    decodes = [r for r in rows if r.kind in DECODE_KINDS and r.seconds >= STREAMING * floor]
    if decodes:  # the kernel's own time: the host's floor overlaps it
        found["decode_efficiency"] = _bandwidth_efficiency(decodes, 0.0, bandwidth)
    cats = [r for r in rows if r.kind in CAT_KINDS and r.bytes >= CACHE_RESIDENT_BYTES]
    if cats:  # the kernel's own time: no floor
        found["cat_efficiency"] = _bandwidth_efficiency(cats, 0.0, bandwidth)
    steps = [r for r in rows if r.kind in MULTI_TENSOR_KINDS]
    if len({r.bytes for r in steps}) >= 2:  # optimizer.step()'s own host work (Python over the parameter list,
        # the step counts) is an intercept of its own, not one kernel's floor: the rate is the slope
        per_byte = _least_squares([r.bytes for r in steps], [r.seconds for r in steps])[1]
        if per_byte > 0:
            found["multi_tensor_efficiency"] = min(1.0, 1 / (per_byte * bandwidth))
    overhead = calibration.sync + calibration.factors.launch
    for key, gradient in (("gemm_unaligned_forward", False), ("gemm_unaligned_backward", True)):
        rates = [r.flops / ((r.seconds - overhead) * peak) for r in rows if r.kind == "gemm_linear"
                 and row_kernels(r)[0].kind == "gemm_unaligned" and (r.note != "forward") == gradient]
        if rates:
            found[key] = min(1.0, sum(rates) / len(rates))
    for key, kind in (("attention_dropout_forward", "attn_fwd"), ("attention_dropout_backward", "attn_bwd")):
        plain = {(r.m, r.n, r.k, r.batch): r.seconds for r in rows if r.kind == f"{kind}_default"}
        ratios = sorted(r.seconds / plain[(r.m, r.n, r.k, r.batch)] for r in rows
                        if r.kind == f"{kind}_dropout" and (r.m, r.n, r.k, r.batch) in plain)
        if ratios:
            found[key] = min(10.0, max(1.0, ratios[len(ratios) // 2]))
    return found | _power_fit(duty_points(rows, calibration.factors, bandwidth))


def duty_points(rows, factors: DeviceFactors, bandwidth: float) -> list[tuple[KernelRow, float, float | None]]:
    """Each gemm_duty row but the alone ones: the GEMMs' share of the GPU's time at the clocks they keep alone
    (the copy's bytes at the streaming rate of `factors`), and the clock the GEMM kept (its alone row's time over
    its own), None for a run too short to meet the power limit (SUSTAINED_SECONDS)."""
    points, alone = [], None
    for r in (r for r in rows if r.kind in DUTY_KINDS):
        if r.note.startswith("alone"):
            alone = r
            continue
        if alone is None or (alone.m, alone.n, alone.k, alone.dtype) != (r.m, r.n, r.k, r.dtype):
            raise ConfigError(f"{r.where}: a gemm_duty row comes after the alone row of the same GEMM (m, n, k, "
                              f"dtype), as benchmarks/gpu_kernels.py --only gemm_duty writes them")
        numbers = note_numbers(r.note)
        copy = 2.0 * numbers.get("copy_bytes", 0) / (bandwidth * factors.memory_efficiency)  # read and write
        sustained = numbers.get("kernels", 0) * (r.seconds + copy) >= SUSTAINED_SECONDS
        points.append((r, alone.seconds / (alone.seconds + copy), alone.seconds / r.seconds if sustained else None))
    return points


def _power_fit(points) -> dict[str, float]:
    """power_gemm and power_other by least squares on the clock the sustained duty rows kept
    (:meth:`DeviceFactors.sustained_clock`); none without such rows."""
    kept = [(share, clock) for _, share, clock in points if clock is not None]
    if not kept:
        return {}

    def error(gemm, other):
        f = DeviceFactors(name="fit", gemm_max_efficiency=1.0, memory_efficiency=1.0, power_gemm=gemm,
                          power_other=other)
        return math.fsum((f.sustained_clock(share) - clock) ** 2 for share, clock in kept)

    gemm, other = min(((g, o) for g in POWER_GRID if g >= 1 for o in POWER_GRID if o < 1), key=lambda p: error(*p))
    return {"power_gemm": gemm, "power_other": other}


def _bandwidth_efficiency(rows, floor: float, bandwidth: float) -> float:
    """The fraction of `bandwidth` memory-bound `rows` reach (:func:`_seconds_per_byte`), at most 1."""
    return min(1.0, 1 / (_seconds_per_byte(rows, floor) * bandwidth))


def _seconds_per_byte(rows, floor: float) -> float:
    """Seconds per byte of memory-bound `rows`, by least squares with the floor as intercept, over the rows
    long enough to stream at full rate (all of them when none is)."""
    long = [r for r in rows if r.seconds >= STREAMING * floor] or rows
    return _least_squares([r.bytes for r in long], [r.seconds for r in long], intercept=floor)[1]


def _bandwidths(rows, memory, floor: float, bandwidth: float) -> tuple[float, float]:
    """Streaming efficiency from the simple rows long enough to stream at full rate; then the norms' reducing
    kernels' efficiency from the norm rows whose kernels all stream or reduce (LayerNorm's: eager RMSNorm's
    up-cast and products run at rates fitted after), through the kernels hcsim runs for them."""
    per_byte = _seconds_per_byte(memory, floor)
    streaming = 1 / (per_byte * bandwidth)
    reducing = []
    for r in rows:
        kernels = row_kernels(r) if r.seconds >= STREAMING * floor else None
        if kernels and all(op.kind in ("memory", "reduction") for op in kernels) \
                and any(op.kind == "reduction" for op in kernels):
            reduced = sum(op.bytes for op in kernels if op.kind == "reduction")
            reducing.append((reduced, r.seconds - floor - sum(op.bytes for op in kernels if op.kind == "memory")
                             * per_byte))
    reduction = streaming
    if reducing:
        _, per_reduced = _least_squares([x for x, _ in reducing], [t for _, t in reducing], intercept=0.0)
        reduction = 1 / (per_reduced * bandwidth)
    for label, value in (("memory_efficiency", streaming), ("reduction_efficiency", reduction)):
        if not 0 < value <= 1:
            raise ConfigError(f"calibrate: the fitted {label} is {value:.3g}, outside (0, 1]: the device's datasheet "
                              f"bandwidth is below what the rows measured (wrong --device?)")
    return streaming, reduction


def _fp8_fit(rows, floor: float, peak: float, sms: int, k_half: float, efficiency: float) -> tuple[float, float]:
    """(fp8_speedup, fp8_k_half): where the rows time FP8 and BF16 GEMMs back to back side by side, each
    fitted alone (no floor: no launch gap is timed), the FP8 GEMMs' rate over the BF16 ones' and their own fill;
    else the FP8 rows timed alone at the BF16 GEMMs' fill (fp8_k_half 0: that fill); (0, 0) without FP8 rows.
    The side-by-side ratio holds where the clocks differ (a GPU held at its power limit by GEMMs back to back
    runs both slower than one timed alone)."""
    fp8, bf16 = ([r for r in rows if r.kind == kind] for kind in BACK_TO_BACK_GEMMS)
    if fp8 and bf16:
        (half, rate), (_, rate16) = (_gemm_fit(found, 0.0, peak, sms, ceiling=4.0) for found in (fp8, bf16))
        return rate / rate16, half
    alone = [r for r in rows if r.kind == "gemm_fp8_e4m3"]
    return (_gemm_fit(alone, floor, peak, sms, k_half, ceiling=4.0)[1] / efficiency, 0.0) if alone else (0.0, 0.0)


def _gemm_fit(gemms, floor: float, peak: float, sms: int, k_half: float | None = None,
              ceiling: float = 1.0) -> tuple[float, float]:
    """(k_half, max_efficiency) of the wave model with the least relative RMS error over the GEMM rows (with
    `k_half` given, the efficiency alone), relative to `peak`: FP8 GEMMs against the BF16 peak pass a `ceiling`
    above 1."""
    best = None
    for k_half in (K_HALF_GRID if k_half is None else (k_half,)):
        xs = [2.0 * (r.batch or 1) * s["m"] * s["n"] * s["k"] / gemm_utilization(s["m"], s["n"], s["k"], sms, k_half,
                                                                                  r.batch or 1)
              for r, s in ((r, r.shape()) for r in gemms)]
        ts = [r.seconds for r in gemms]
        _, per_flop = _least_squares(xs, ts, intercept=floor)
        error = _rms([floor + x * per_flop for x in xs], ts)
        if best is None or error < best[0]:
            best = (error, k_half, 1 / (per_flop * peak))
    if not 0 < best[2] <= ceiling:
        raise ConfigError(f"calibrate: the fitted GEMM max_efficiency is {best[2]:.3g}, outside (0, 1]: the device's "
                          f"datasheet peak is below what the rows measured (wrong --device?)")
    return float(best[1]), best[2]


# a GEMM this large (17 GFLOP) runs long enough that a per-kernel fixed cost is under 1 % of it: the published
# tables' rows of at least this many FLOPs measure the tensor cores, the smaller ones the launch
LARGE_GEMM_FLOPS = 2.0 ** 34


def read_published_gemms(path, column: str = "bf16_flops_per_s") -> list[tuple[int, int, int, int, float]]:
    """(b, m, n, k, FLOP/s) of each row of a published matmul table in ``experiments/calibration/published/``
    (``#`` lines are its source) that has `column`."""
    with open(path, newline="") as f:
        rows = csv.DictReader(line for line in f if not line.startswith("#"))
        return [(int(r["b"]), int(r["m"]), int(r["n"]), int(r["k"]), float(r[column])) for r in rows if r.get(column)]


def fit_published_gemms(gemms, peak: float, sms: int, k_half: float | None = None) -> tuple[float, float]:
    """(k_half, max_efficiency) of the wave model with the least relative RMS error over the large GEMMs of a
    published table ((b, m, n, k, FLOP/s), :func:`read_published_gemms`; time = 2bmnk / FLOP/s, no harness floor:
    the table records kernel times), `max_efficiency` in closed form for each k_half of the grid (with `k_half`
    given, that one alone; relative to `peak`, so above 1 for FP8 GEMMs against the BF16 peak)."""
    large = [KernelRow(kind="gemm", m=m, n=n, k=k, batch=b, elements=0, seconds=2.0 * b * m * n * k / rate,
                       flops=2.0 * b * m * n * k, bytes=0.0, note="", where="published table")
             for b, m, n, k, rate in gemms if 2.0 * b * m * n * k >= LARGE_GEMM_FLOPS]
    if len(large) < 2:
        raise ConfigError(f"calibrate: a published table needs at least 2 GEMMs of {LARGE_GEMM_FLOPS:.3g} FLOP or more, "
                          f"found {len(large)}")
    return _gemm_fit(large, 0.0, peak, sms, k_half, ceiling=math.inf)


def _attention_table(rows, calibration: Calibration, peak: float) -> tuple:
    """(head_dim, sequence, forward, backward efficiency) of each measured attention shape: its FLOPs over the
    time left after the harness's synchronisation and the kernel's issue."""
    found: dict[tuple[float, float], list[float | None]] = {}
    factors = calibration.factors
    for r in rows:
        if r.kind not in ("attn_fwd", "attn_bwd"):
            continue
        busy = r.seconds - calibration.sync - (factors.backward_launch if r.kind == "attn_bwd" else factors.launch)
        efficiency = r.flops / (busy * peak) if busy > 0 else None
        if efficiency is None or not MIN_EFFICIENCY <= efficiency <= 1:  # 1e-49 of peak is no measurement
            raise ConfigError(f"{r.where}: attention row gives an efficiency of {efficiency} of the peak "
                              f"{peak:.4g} FLOP/s, outside [{MIN_EFFICIENCY:g}, 1]: check its seconds and flops "
                              f"(causal FLOPs, as the shared files)")
        found.setdefault((float(r.k), float(r.m)), [None, None])[r.kind == "attn_bwd"] = efficiency
    return tuple((d, s, fwd, bwd) for (d, s), (fwd, bwd) in sorted(found.items()) if None not in (fwd, bwd))


def _launches(rows, factors: DeviceFactors, floor: float, peak: float, bandwidth: float) -> Calibration:
    """The host's issue interval per forward kernel, from the Hugging Face RMSNorm rows (eight eager kernels
    back to back: the floor once, then one issue per kernel while the GPU waits); then per backward kernel,
    with backward()'s own start, from the RMSNorm and LayerNorm forward-and-backward rows. A grid search on
    the relative RMS error; without such rows every kernel issues at the floor."""
    forward = [r for r in rows if r.kind == "rmsnorm_hf_fwd"]
    both = [r for r in rows if r.kind in ("rmsnorm_hf_fwd_bwd", "layernorm_fwd_bwd")]
    if not forward:
        return Calibration(factors, 0.0, 0.0)
    grid = [floor * i / 200 for i in range(1, 201)]

    def with_launch(launch, backward=0.0):
        return replace(factors, launch=launch, backward_launch=backward)

    def error(f, selected, call=0.0):
        return _rms([floor - f.launch + call + _time(f, r, peak, bandwidth) for r in selected],
                    [r.seconds for r in selected])

    launch = min(grid, key=lambda x: error(with_launch(x), forward))
    best = (error(with_launch(launch), forward), launch, 0.0)
    if both:
        best = None
        for backward in grid:
            f = with_launch(launch, backward)
            base = [floor - launch + _time(f, r, peak, bandwidth) for r in both]
            ts = [r.seconds for r in both]
            call = max(0.0, sum((1 - b / t) / t for b, t in zip(base, ts)) / sum(1 / t ** 2 for t in ts))
            e = _rms([b + call for b in base], ts)
            if best is None or e < best[0]:
                best = (e, backward, call)
    return Calibration(with_launch(launch, best[1] or launch), floor - launch, best[2])


def _time(factors: DeviceFactors, row: KernelRow, peak: float, bandwidth: float) -> float:
    from hcsim.engine.compute_model import ComputeModel

    return ComputeModel(devices={factors.name: factors}, links={}).time(row_kernels(row), factors.name, peak,
                                                                          bandwidth)


def factors_yaml(calibration: Calibration, sources: list[str]) -> dict:
    """The ``devices:`` entry of a compute-model YAML for a calibration (platforms/compute-model.yaml's shape)."""
    factors, named = calibration.factors, ", ".join(sources)
    top, gemm, attention = _variants_yaml(factors, named)
    return {
        "provenance": "measured",
        "gemm": {"max_efficiency": round(factors.gemm_max_efficiency, 4), "k_half": factors.gemm_k_half,
                 "sms": factors.sms, "fp8_speedup": round(factors.fp8_gemm_speedup, 4),
                 **({"fp8_k_half": factors.fp8_gemm_k_half} if factors.fp8_gemm_k_half else {}),
                 "source": f"hcsim calibrate: least squares on the relative error of every BF16 GEMM row of {named}; "
                           + ("fp8_speedup, fp8_k_half: the FP8 GEMMs' rate over the BF16 ones' and their fill, "
                              "the gemm_fp8_tn and gemm_bf16_linear rows (timed back to back side by side) each "
                              "fitted alone" if factors.fp8_gemm_k_half else
                              "fp8_speedup: the FP8 (e4m3) rows' rate over it, the same wave model"), **gemm},
        "memory_efficiency": round(factors.memory_efficiency, 4),
        "source_memory_efficiency": f"hcsim calibrate: copy, add, SiLU and cast rows of {named}",
        "reduction_efficiency": round(factors.reduction_efficiency, 4),
        "source_reduction_efficiency": f"hcsim calibrate: the LayerNorm rows of {named}",
        "attention": {"table": [[d, s, round(fwd, 4), round(bwd, 4)] for d, s, fwd, bwd in factors.attention_table],
                      "source": f"hcsim calibrate: [head_dim, sequence, forward, backward] efficiency of the causal "
                                f"flash attention rows of {named}", **attention},
        **top,
        "kernel_overhead": "0s",
        "launch": f"{factors.launch * 1e6:.2f}us",
        "backward_launch": f"{factors.backward_launch * 1e6:.2f}us",
        "source_launch": f"hcsim calibrate: the Hugging Face RMSNorm rows of {named} (eager kernels back to back), "
                         f"and with their backward the LayerNorm rows; the harness's own synchronisation "
                         f"({calibration.sync * 1e6:.1f} us a row) and backward() start "
                         f"({calibration.backward_call * 1e6:.1f} us) are fitted beside them and not used",
    }


def _variants_yaml(factors: DeviceFactors, named: str) -> tuple[dict, dict, dict]:
    """The YAML of the factors of step 4 that the files measured: the entry's own keys, its gemm: keys and its
    attention: keys, each merged into factors_yaml's entry."""
    top = {}
    for key, rows in (("mixed_efficiency", "add_fp32_bf16 and mul_bf16_fp32"),
                      ("upcast_efficiency", "cast_bf16_to_fp32"),
                      ("decode_efficiency", "attn_decode (of at least 5 floors, the host's overlapped)"),
                      ("strided_efficiency", "copy_transposed_bf16"),
                      ("cat_efficiency", f"cat_transposed_bf16 and cat_halves_bf16 (of at least {CACHE_RESIDENT_BYTES:,} B)"),
                      ("multi_tensor_efficiency", "adamw_fused_fp32_step")):
        if getattr(factors, key):
            top[key] = round(getattr(factors, key), 4)
            top[f"source_{key}"] = f"hcsim calibrate: the {rows} rows of {named}"
    gemm = {key: round(getattr(factors, f"gemm_{key}"), 4) for key in ("unaligned_forward", "unaligned_backward")
            if getattr(factors, f"gemm_{key}")}
    if gemm:
        gemm["source_unaligned"] = (f"hcsim calibrate: mean efficiency of the gemm_linear rows with a dimension not "
                                    f"a multiple of 8 of {named} (forward; input and weight gradients)")
    attention = {key: round(getattr(factors, f"attention_{key}"), 4) for key in ("dropout_forward", "dropout_backward")
                 if getattr(factors, f"attention_{key}")}
    if attention:
        attention["source_dropout"] = (f"hcsim calibrate: median time of the attn_*_dropout rows over the "
                                       f"attn_*_default rows of the same shapes, {named}")
    if factors.power_gemm:
        top["power"] = {"gemm": factors.power_gemm, "other": factors.power_other,
                        "source": f"hcsim calibrate: least squares on the clock a GEMM kept in the gemm_duty rows of "
                                  f"{named} run {SUSTAINED_SECONDS * 1e3:g} ms or more (its alone row's time over "
                                  f"its own), by the GEMMs' share of the GPU's time"}
    return top, gemm, attention


# ---- the model against every measured row ----------------------------------------------------------------

SMS = {"H100": 132, "H200": 132, "A100": 108, "A100-40GB": 108, "V100": 80, "B200": 148}  # datasheets' SM counts


def row_kernels(row: KernelRow) -> tuple | None:
    """The kernels hcsim's model runs for a measured row (composite rows through the PyTorch eager inventory of
    :mod:`hcsim.workload.ops`), or None for a kind it does not model."""
    from hcsim.workload import ops

    if row.kind in ("gemm", "gemm_bf16", "gemm_fp8_e4m3") + DUTY_KINDS:
        s = row.shape()
        gemm = ops._gemm("gemm", s["m"], s["n"], s["k"], 2.0, tokens="")  # a plain GEMM: every dimension counts
        return (gemm._replace(kind="gemm8"),) if row.kind == "gemm_fp8_e4m3" or row.dtype == "fp8" else (gemm,)
    if row.kind in ("gemm_linear",) + BACK_TO_BACK_GEMMS:  # the note's first word: the pass
        gemm = row.note.split()[0] if row.note else "forward"
        linear = ops._gemm("linear" + {"dgrad": ".dgrad", "wgrad": ".wgrad"}.get(gemm, ""), row.m, row.n, row.k, 2.0,
                           tokens="k" if gemm == "wgrad" else "m")
        return (linear._replace(kind="gemm8") if row.kind == "gemm_fp8_tn" else linear,)
    if row.kind.startswith(("attn_fwd", "attn_bwd")):
        b, s, heads, d = row.batch, row.m, row.n, row.k
        backward = row.kind.startswith("attn_bwd")
        flops = 2.0 * b * s * s * heads * d * (2.5 if backward else 1.0)
        name = "flash_attention" + (f"_{ops.DROPOUT}" if row.kind.endswith("dropout") else "")
        return (ops.Op(name + (".bwd" if backward else ""), "attention", flops, 4.0 * b * s * heads * d * 2, s,
                       b * heads, d),)
    if row.kind in BANDWIDTH_ROWS:
        return (ops._memory(row.kind, row.bytes, BANDWIDTH_ROWS[row.kind]),)
    if row.kind == "adamw_fused_fp32_step":  # optimizer.step() alone: no gradient clipping
        return ops.eager_optimizer_ops(row.elements, clip_grad_norm=False)
    note = note_numbers(row.note)
    if row.kind.startswith(("rmsnorm_hf", "layernorm")):
        tokens, hidden = note["tokens"], note["hidden"]
        n = tokens * hidden
        k = ops._Kernels()
        if row.kind.startswith("rmsnorm"):  # on a BF16 input: cast up, the FP32 kernels, cast back
            k.memory("cast_up", n * 6, (ops.Typed(n * 6, "memory"),), kind=ops.UPCAST)
            ops._rmsnorm(k, "rmsnorm", n, tokens)
            k.memory("cast_down", n * 6, (ops.Typed(n * 6, ops.UPCAST),))
        else:  # one fused kernel each way, on BF16
            k.memory("layernorm", 4 * n, (ops.Reduce(6 * n), ops.Reduce(4 * n)), kind="reduction")
        blocks = k.kernels(compiled=False)
        return blocks.forward + (blocks.backward if row.kind.endswith("fwd_bwd") else ())
    if row.kind == "cross_entropy_fp32_fwd_bwd":
        k = ops._Kernels()
        ops._cross_entropy(k, note["tokens"], note["vocab"])
        blocks = k.kernels(compiled=False)
        return blocks.forward + blocks.backward
    return None


def model_errors(rows: list[KernelRow], calibration: Calibration, peak: float, memory_bandwidth: float
                 ) -> list[tuple[KernelRow, float | None]]:
    """Each row with the model's signed relative error (simulated / measured - 1), None where not modelled.
    The model times a row's kernels as one instance (the host issues them, the GPU runs them), plus what the
    measurement's harness adds (:class:`Calibration`). A row is one kernel at the clocks it keeps alone; a
    sustained gemm_duty row's GEMM at the clock its share leaves it (:func:`duty_points`)."""
    out = []
    factors = calibration.factors
    clocks = {id(r): factors.sustained_clock(share) if clock is not None else 1.0
              for r, share, clock in duty_points(rows, factors, memory_bandwidth)}
    unlimited = replace(factors, power_gemm=0.0, power_other=0.0)
    alone = replace(unlimited, launch=0.0, backward_launch=0.0)  # the UNHARNESSED rows: no launch timed
    for row in rows:
        kernels = row_kernels(row)
        if kernels is None:
            out.append((row, None))
            continue
        if row.kind in UNHARNESSED:  # no harness, no launch: the kernel alone
            busy = _time(alone, row, peak, memory_bandwidth) / clocks.get(id(row), 1.0)
        elif row.kind in DECODE_KINDS:  # back to back: the host's floor or the kernel, the longer
            busy = max(factors.launch + calibration.sync, _time(alone, row, peak, memory_bandwidth))
        else:
            busy = _time(unlimited, row, peak, memory_bandwidth) + calibration.sync \
                + (calibration.backward_call if row.kind.endswith("fwd_bwd") else 0.0)
        out.append((row, busy / row.seconds - 1))
    return out


def error_table(errors) -> list[tuple[str, int, float, float]]:
    """Per kind: rows, mean absolute and max absolute relative error (kinds not modelled left out)."""
    kinds: dict[str, list[float]] = {}
    for row, error in errors:
        if error is not None:
            kinds.setdefault(row.kind, []).append(abs(error))
    return [(kind, len(e), sum(e) / len(e), max(e)) for kind, e in kinds.items()]
