"""`hcsim calibrate`: kernel-model factors of a GPU from its measured kernels.

    hcsim calibrate my-gpu-kernels.csv --device H100 -o factors.yaml
    hcsim simulate --set compute_model=roofline --set compute_factors=factors.yaml ...
"""

from __future__ import annotations

import argparse
from pathlib import Path

from hcsim.cli import path_arg

__all__ = ["register"]


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "calibrate", help="fit the kernel model to kernels measured on a GPU",
        description="Fit hcsim's kernel model (GEMMs by shape with wave quantisation, flash attention by sequence "
                    "and head dimension, memory-bound kernels at a bandwidth, a per-kernel host floor) to kernel "
                    "timings measured on one GPU (benchmarks/gpu_kernels.py writes them), print the model's error "
                    "against every row, and write a compute-model YAML that `simulate` and `validate` use with "
                    "--set compute_model=roofline --set compute_factors=FILE (its devices replace the built-in ones "
                    "of the same name).",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example:\n  hcsim calibrate experiments/calibration/measurements/h100-sxm-80gb-kernels*.csv "
               "--device H100 -o h100.yaml")
    parser.add_argument("kernels", nargs="+", type=Path, metavar="KERNELS.csv", help="measured kernel CSV file(s)")
    parser.add_argument("--device", required=True,
                        help="catalog device measured (its BF16 peak and memory bandwidth scale the factors)")
    parser.add_argument("--sms", type=int, default=None,
                        help="streaming multiprocessors of the GPU (default: the datasheet's for H100, H200, A100, "
                             "V100, B200)")
    parser.add_argument("--device-catalog", type=Path, default=None,
                        help="a device YAML (platforms/devices.yaml's shape) that defines --device")
    parser.add_argument("-o", "--output", type=path_arg, required=True, help="compute-model YAML to write")
    parser.set_defaults(run=run)


def run(args) -> int:
    import yaml

    from hcsim.study.calibrate import SMS, error_table, factors_yaml, fit_device, model_errors, read_kernels
    from hcsim.config import check_output_file
    from hcsim.errors import ConfigError, OutputError
    from hcsim.platform.devices import builtin_catalog, load_catalog
    from hcsim.run.report import atomic_write

    out = check_output_file(args.output, "-o", suffixes=(".yaml", ".yml"))
    catalog = {**builtin_catalog(), **(load_catalog(args.device_catalog) if args.device_catalog else {})}
    device = catalog.get(args.device)
    if device is None:
        raise ConfigError(f"--device: {args.device!r} is not in the device catalog ({', '.join(sorted(catalog))}); "
                          f"fix: a catalog name, or --device-catalog FILE defining it")
    sms = args.sms if args.sms is not None else SMS.get(args.device)
    if sms is None or sms < 1:
        raise ConfigError(f"--sms: give the GPU's streaming-multiprocessor count (an integer >= 1) for "
                          f"{args.device!r}; hcsim knows it for {', '.join(SMS)}")
    if "bf16" not in device.peaks:
        raise ConfigError(f"--device {args.device}: the catalog gives it no bf16 peak, which the measured BF16 "
                          f"kernels are relative to")
    peak = device.peaks["bf16"]
    rows = read_kernels(args.kernels)
    calibration = fit_device(rows, name=args.device, peak=peak, memory_bandwidth=device.memory_bandwidth, sms=sms)
    factors = calibration.factors
    print(f"{args.device}: GEMM {factors.gemm_max_efficiency:.3f} of {peak / 1e12:g} TFLOP/s, pipeline fill "
          f"{factors.gemm_k_half:g} of K, FP8 {factors.fp8_gemm_speedup:.2f}x (fill "
          f"{factors.fp8_gemm_k_half or factors.gemm_k_half:g}); memory {factors.memory_efficiency:.3f} (reductions "
          f"{factors.reduction_efficiency:.3f}) of {device.memory_bandwidth / 1e12:g} TB/s; launch "
          f"{factors.launch * 1e6:.1f} us forward, {factors.backward_launch * 1e6:.1f} us backward; "
          f"{len(factors.attention_table)} attention points"
          + (f"; power limit met at {factors.power_gemm:g}x by GEMMs, {factors.power_other:g}x by other kernels "
             f"(sustained GEMMs at {factors.sustained_clock(1.0):.3f} of their clock)" if factors.power_gemm else ""))
    print(f"  {'kind':<28} {'rows':>5} {'mean |error|':>13} {'max |error|':>12}")
    errors = model_errors(rows, calibration, peak, device.memory_bandwidth)
    for kind, count, mean, worst in error_table(errors):
        print(f"  {kind:<28} {count:>5} {mean:>13.1%} {worst:>12.1%}")
    unknown: dict[str, int] = {}
    for row, error in errors:
        if error is None:
            unknown[row.kind] = unknown.get(row.kind, 0) + 1
    if unknown:  # rows of a kind hcsim does not model: neither fitted nor checked, and said so
        print("  not modelled, so not used: " + ", ".join(f"{kind or '(no kind)'} ({count} row{'s' if count > 1 else ''})"
                                                          for kind, count in sorted(unknown.items())))
    sources = [p.name for p in args.kernels]
    text = yaml.safe_dump({"devices": {args.device: factors_yaml(calibration, sources)}}, sort_keys=False,
                          width=110, default_flow_style=None)
    text = f"# hcsim calibrate {' '.join(map(str, args.kernels))} --device {args.device}\n{text}"
    try:
        atomic_write(out, text)
    except OSError as err:  # the folder went away or refuses files (/proc): keep the fit, on the terminal
        print(text, end="")
        raise OutputError(f"-o {out}: could not write the factors ({err.strerror or err}); they are printed above: "
                          f"save them to a writable path, or run again with -o in a writable folder") from None
    print(f"wrote {out}")
    return 0
