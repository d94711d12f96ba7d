"""Bad input on the surfaces this wave added: serving keys (``kind: serving`` workloads), the coherent platforms
(gh200, gb200-nvl72, cxl-pool) and their keys, stragglers / straggler_spread / seed, ``training.fp8_recipe`` and
``hcsim plan --time``. Each bad value, given by ``--set``, an override, a spec file, a scenario file or a sweep
axis, ends in one message of hcsim.errors' template naming the file or flag, the key and what would be valid:
exit 2, no traceback, nothing simulated (a tripwire stands in for the engine, the serving scheduler and the
sweep's point processes, so a value that slipped through fails here at once instead of running).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from hcsim.cli import main
from hcsim.config import REPO_ROOT
from hcsim.errors import MESSAGE_TEMPLATE

SERVING = ["simulate", "--set", "workload=llama3-70b-serving", "--set", "platform=paper-cxl", "--set", "xpus=8",
           "--set", "tp=8", "--set", "devices=[H100]"]
GH200 = ["simulate", "--set", "platform=gh200", "--set", "xpus=16"]
GB200 = ["simulate", "--set", "platform=gb200-nvl72", "--set", "xpus=144"]
POOL = ["simulate", "--set", "platform=cxl-pool", "--set", "xpus=16"]
TRAIN = ["simulate", "--set", "xpus=8"]
FP8 = ["simulate", "--set", "workload=llama3-8b", "--set", "platform=dgx-h100", "--set", "xpus=8", "--set", "tp=8",
       "--set", "precision=fp8"]
PLAN = ["plan", "llama2-7b", "--xpus", "8", "--global-batch", "8"]
SERVING_FILE = r"llama3-70b-serving\.yaml: "


def serving(key: str, value) -> list[str]:
    return SERVING + ["--set", f"workload_overrides.serving.{key}={value}"]


def override(base: list[str], key: str, value) -> list[str]:
    return base + ["--set", f"{key}={value}"]


# name -> (argv, where the message points, what it says is valid)
CASES = {
    # serving keys, as overrides of the built-in serving workload
    "serving-rate-negative": (serving("rate", -1), SERVING_FILE + r".*serving\.rate", r"must be > 0 and <= 1e6 "
                              r"requests per second, or absent \(a fixed batch\), got -1"),
    "serving-rate-nan": (serving("rate", ".nan"), SERVING_FILE + r".*serving\.rate", r"must be > 0.*got nan"),
    "serving-rate-inf": (serving("rate", ".inf"), SERVING_FILE + r".*serving\.rate", r"must be > 0.*got inf"),
    "serving-rate-text": (serving("rate", "fast"), SERVING_FILE + r"serving\.rate", r"expected a number, got 'fast'"),
    "serving-requests-zero": (serving("requests", 0), SERVING_FILE + r"serving\.requests", r"must be >= 1, got 0"),
    "serving-requests-fraction": (serving("requests", 1.5), SERVING_FILE + r"serving\.requests",
                                  r"expected an integer, got 1\.5"),
    "serving-requests-inf": (serving("requests", ".inf"), SERVING_FILE + r"serving\.requests",
                             r"expected an integer, got inf"),
    "serving-requests-huge": (serving("requests", 10**9), SERVING_FILE + r"serving\.requests",
                              r"must be <= 1,000,000 \(hcsim\.limits\)"),
    "serving-prompt-zero": (serving("prompt", 0), SERVING_FILE + r".*serving\.prompt",
                            r"a length or \[low, high\] with 1 <= low <= high tokens, got \[0, 0\]"),
    "serving-prompt-reversed": (serving("prompt", "[8192,2048]"), SERVING_FILE + r".*serving\.prompt",
                                r"1 <= low <= high tokens, got \[8192, 2048\]"),
    "serving-prompt-three": (serving("prompt", "[1,2,3]"), SERVING_FILE + r"serving\.prompt",
                             r"expected a length in tokens or \[low, high\], got \[1, 2, 3\]"),
    "serving-prompt-nan": (serving("prompt", ".nan"), SERVING_FILE + r"serving\.prompt",
                           r"expected a length in tokens or \[low, high\], got nan"),
    "serving-prompt-beyond-context": (serving("prompt", 200000), SERVING_FILE + r".*prompt \[200000, 200000\]",
                                      r"beyond the model's sequence of 131,072.*prompt \+ output <= 131,072"),
    "serving-output-beyond-context": (serving("output", 200000), SERVING_FILE + r".*output \[200000, 200000\]",
                                      r"beyond the model's sequence of 131,072"),
    "serving-output-negative": (serving("output", -3), SERVING_FILE + r".*serving\.output",
                                r"1 <= low <= high tokens, got \[-3, -3\]"),
    "serving-max-num-seqs-zero": (serving("max_num_seqs", 0), SERVING_FILE + r"serving\.max_num_seqs",
                                  r"must be >= 1, got 0"),
    "serving-token-budget-below-seqs": (serving("max_num_batched_tokens", 1), SERVING_FILE +
                                        r".*serving\.max_num_batched_tokens 1 is less than max_num_seqs 256",
                                        r"Fix: raise max_num_batched_tokens or lower max_num_seqs"),
    "serving-token-budget-nan": (serving("max_num_batched_tokens", ".nan"), SERVING_FILE +
                                 r"serving\.max_num_batched_tokens", r"expected an integer, got nan"),
    "serving-scheduler": (serving("scheduler", "vllm-v9"), SERVING_FILE + r"serving\.scheduler",
                          r"is not one of vllm-v1, vllm-v0, sglang \(did you mean 'vllm-v1'\?\)"),
    "serving-preemption": (serving("preemption", "drop"), SERVING_FILE + r"serving\.preemption",
                           r"'drop' is not one of recompute, swap"),
    "serving-block-size": (serving("block_size", 3), SERVING_FILE + r".*serving\.block_size",
                           r"one of 8, 16, 32, 64, 128 tokens"),
    "serving-shared-prefix-too-long": (serving("shared_prefix", 10**7), SERVING_FILE + r".*serving\.shared_prefix",
                                       r"shorter than the shortest prompt \(2,048 tokens\)"),
    "serving-swap-space-bare": (serving("swap_space", 4), SERVING_FILE + r"serving\.swap_space",
                                r"4 has no unit; write it with one, for example '80GiB or 1\.5GB'"),
    "serving-step-overhead-nan": (serving("step_overhead", ".nan"), SERVING_FILE + r"serving\.step_overhead",
                                  r"nan has no unit"),
    "serving-seed-fraction": (serving("seed", 1.5), SERVING_FILE + r"serving\.seed", r"expected an integer, got 1\.5"),
    "serving-unknown-key": (serving("speed", 3), SERVING_FILE + r"serving\.speed", r"unknown key \(did you mean"),
    "serving-fp8": (SERVING + ["--set", "precision=fp8"], r"precision", r"serving runs fp16 or bf16.*Fix: "
                    r"precision=bf16, or leave it out"),
    "serving-cp": (SERVING + ["--set", "cp=2"], r"cp", r"does not apply to serving workload.*Fix: leave cp out"),
    "serving-stragglers": (SERVING + ["--set", "stragglers.xpu3=1.5"], r"stragglers",
                           r"does not apply to serving.*Fix: leave stragglers out"),
    **{f"serving-{key}": (SERVING + ["--set", f"{key}={value}"], key, r"does not apply to serving workload "
                          r"'llama3-70b-serving' \(.*\)\. Fix: leave " + key + " out")
       for key, value in (("compute_model", "peak"), ("collective_model", "step"), ("iterations", 3),
                          ("granularity", "decoder"), ("schedule", "gpipe"), ("local_collectives", "analytic"),
                          ("trace_xpus", 2), ("moe_skew", 1.5), ("collective_chunks", 4), ("step_limit", 10))},
    "serving-dp": (SERVING + ["--set", "dp=2"], r"dp", r"is not xpus / \(tp x pp\).*Fix: leave dp out"),
    "serving-file-kind-inference": (["simulate", "--set", "workload=kind-inference.yaml"],
                                    r"kind-inference\.yaml: kind", r"a serving workload is kind: serving"),
    "serving-file-section-a-list": (["simulate", "--set", "workload=serving-list.yaml"],
                                    r"serving-list\.yaml: serving", r"expected a mapping, got list"),
    "serving-file-rate-nan": (["simulate", "--set", "workload=nan-rate.yaml"], r"nan-rate\.yaml: .*serving\.rate",
                              r"must be > 0.*got nan"),
    "serving-given-to-plan-with-a-global-batch": (PLAN[:1] + ["llama3-70b-serving"] + PLAN[2:], r"--global-batch",
                                                  r"does not apply to serving workload 'llama3-70b-serving'.*Fix: "
                                                  r"leave --global-batch out"),
    # the coherent platforms' keys
    "gh200-c2c-zero": (override(GH200, "platform_overrides.links.c2c.bandwidth", "0GB/s"),
                       r"platform_overrides\.links\.c2c\.bandwidth", r"must be > 0, got '0GB/s' \(in gh200\.yaml\)"),
    "gh200-c2c-no-unit": (override(GH200, "platform_overrides.links.c2c.bandwidth", 450),
                          r"platform_overrides\.links\.c2c\.bandwidth", r"450 has no unit.*'128GB/s or 200Gbit/s'"),
    "gh200-c2c-nan": (override(GH200, "platform_overrides.links.c2c.bandwidth", ".nan"),
                      r"platform_overrides\.links\.c2c\.bandwidth", r"nan has no unit"),
    "gh200-c2c-latency-negative": (override(GH200, "platform_overrides.links.c2c.latency", "-1ns"),
                                   r"platform_overrides\.links\.c2c\.latency", r"must be > 0, got '-1ns'"),
    "gh200-superchips-zero": (override(GH200, "platform_overrides.node.superchips", 0),
                              r"platform_overrides\.node\.superchips", r"must be >= 1, got 0 \(in gh200\.yaml\)"),
    "gh200-gpus-per-superchip-fraction": (override(GH200, "platform_overrides.node.gpus_per_superchip", 1.5),
                                          r"platform_overrides\.node\.gpus_per_superchip",
                                          r"expected an integer, got 1\.5"),
    "gh200-nvlink": (override(GH200, "platform_overrides.node.nvlink", "ring"), r"platform_overrides\.node\.nvlink",
                     r"'ring' is not one of switch, mesh"),
    "gh200-nic-attach": (override(GH200, "platform_overrides.node.nic_attach", "switch"),
                         r"platform_overrides\.node\.nic_attach", r"'switch' is not one of cpu, gpu"),
    "gh200-cpu": (override(GH200, "platform_overrides.node.cpu", "Graze"), r"platform_overrides\.node\.cpu",
                  r"unknown CPU 'Graze' \(did you mean 'Grace'\?\); known: Grace"),
    "gh200-unknown-key": (override(GH200, "platform_overrides.node.superchipz", 4),
                          r"platform_overrides\.node\.superchipz", r"unknown key \(did you mean 'superchips'\?\)"),
    "gh200-too-many-xpus": (["simulate", "--set", "platform=gh200", "--set", "xpus=2000"], r"xpus",
                            r"2000 XPUs asked for, but platform 'gh200' has 1024"),
    "gh200-device": (override(GH200, "devices", "[GH300]"), r"devices",
                     r"unknown device 'GH300' \(did you mean 'GH200'\?\); known: .*GB200, GH200"),
    "gh200-cxl-bandwidth": (override(GH200, "cxl_bandwidth", "64GB/s"), r"cxl_bandwidth",
                            r"platform 'gh200' has no CXL links.*remove it"),
    "serving-without-factors": (["simulate", "--set", "workload=llama3-70b-serving", "--set", "platform=paper-cxl",
                                 "--set", "devices=[MI300X]", "--set", "xpus=8", "--set", "tp=4"],
                                r"compute-model\.yaml: devices",
                                r"no roofline factors for device 'MI300X'.*or run with compute_model: peak"),
    "gh200-file-negative-c2c": (["simulate", "--set", "platform=gh-bad.yaml", "--set", "xpus=16"],
                                r"gh-bad\.yaml: links\.c2c\.bandwidth", r"must be > 0, got '-450GB/s'"),
    "gh200-file-without-c2c": (["simulate", "--set", "platform=gh-nolinks.yaml", "--set", "xpus=16"],
                               r"gh-nolinks\.yaml: links\.c2c", r"is required \(bandwidth and latency"),
    "gh200-file-no-devices": (["simulate", "--set", "platform=gh-devempty.yaml", "--set", "xpus=16"],
                              r"gh-devempty\.yaml: devices", r"expected a non-empty list of device names"),
    "gb200-too-many-xpus": (["simulate", "--set", "platform=gb200-nvl72", "--set", "xpus=100000"], r"xpus",
                            r"100000 XPUs asked for, but platform 'gb200-nvl72' has 576"),
    "gb200-xpus-split-superchip": (["simulate", "--set", "platform=gb200-nvl72", "--set", "xpus=3"], r"xpus",
                                   r"3 XPUs would split a superchip of platform 'gb200-nvl72', whose superchips hold "
                                   r"2 GPUs each.*valid: a multiple of 2, nearest 2 or 4"),
    "gb200-xpus-one": (["simulate", "--set", "platform=gb200-nvl72", "--set", "xpus=1"], r"xpus",
                       r"hold 2 GPUs each.*nearest 2$"),
    "gb200-serving-split-superchip": (SERVING[:3] + ["--set", "platform=gb200-nvl72", "--set", "xpus=3", "--set",
                                                     "tp=1"], r"xpus", r"split a superchip.*nearest 2 or 4"),
    "gb200-plan-split-superchip": (PLAN[:2] + ["--xpus", "3", "--global-batch", "6", "--set", "platform=gb200-nvl72"],
                                   r"--xpus", r"split a superchip.*nearest 2 or 4"),
    "gh200-two-per-superchip-odd": (["simulate", "--set", "platform=gh200", "--set", "xpus=5", "--set",
                                     "platform_overrides.node.gpus_per_superchip=2"], r"xpus",
                                    r"whose superchips hold 2 GPUs each.*nearest 4 or 6"),
    "gb200-jobs-count-splits-superchip": (["simulate", "jobs-split.yaml"], r"jobs-split\.yaml: jobs\[0\]\.xpus",
                                          r"3 XPUs would split a superchip.*hold 2 GPUs each.*nearest 2 or 4"),
    "gb200-jobs-count-by-set": (["simulate", "jobs-split.yaml", "--set", "jobs=[{name: a, xpus: 1}]"],
                                r"jobs-split\.yaml \(with --set\): jobs\[0\]\.xpus", r"1 XPUs would split.*nearest 2$"),
    "gb200-jobs-names-split-superchip": (["simulate", "jobs-split-names.yaml"],
                                         r"jobs-split-names\.yaml: jobs\[0\]\.xpus",
                                         r"would split a superchip.*valid: whole superchips: add xpu1$"),
    "jobs-two-serving-jobs": (["simulate", "jobs-serving.yaml"], r"jobs-serving\.yaml: jobs\[1\]\.workload",
                              r"'llama3-70b-serving' serves, and so does jobs\[0\]'s; a run takes one serving job"),
    "serving-trace-a-folder": (["simulate", "--set", "workload=trace-folder.yaml", "--set", "platform=dgx-h100",
                                "--set", "xpus=1"], r"trace-folder\.yaml: serving\.trace 'traces'",
                               r"traces is a folder; give the trace's file \(\.csv or \.jsonl\)"),
    "gb200-c2c-inf": (override(GB200, "platform_overrides.links.c2c.bandwidth", ".inf"),
                      r"platform_overrides\.links\.c2c\.bandwidth", r"inf has no unit"),
    "gb200-superchips-negative": (override(GB200, "platform_overrides.node.superchips", -36),
                                  r"platform_overrides\.node\.superchips", r"must be >= 1, got -36"),
    "gb200-switch-radix": (override(GB200, "platform_overrides.fabric.switch_radix", 1),
                           r"platform_overrides\.fabric\.switch_radix", r"must be >= 4, got 1"),
    "gb200-topology": (override(GB200, "platform_overrides.fabric.topology", "torus"),
                       r"platform_overrides\.fabric\.topology", r"'torus' is not one of fat_tree, rail_optimized"),
    "gb200-file-kind": (["simulate", "--set", "platform=gb-kind.yaml", "--set", "xpus=16"], r"gb-kind\.yaml: kind",
                        r"'superchips' is not one of paper, dgx, superchip, cxl_pool \(did you mean 'superchip'\?\)"),
    "cxl-pool-capacity-zero": (override(POOL, "platform_overrides.pool.capacity_per_host", "0TB"),
                               r"platform_overrides\.pool\.capacity_per_host", r"must be > 0, got '0TB'"),
    "cxl-pool-capacity-text": (override(POOL, "platform_overrides.pool.capacity_per_host", "big"),
                               r"platform_overrides\.pool\.capacity_per_host",
                               r"cannot read 'big' as a size; write it as '80GiB or 1\.5GB'"),
    "cxl-pool-capacity-no-unit": (override(POOL, "platform_overrides.pool.capacity_per_host", 512),
                                  r"platform_overrides\.pool\.capacity_per_host", r"512 has no unit"),
    "cxl-pool-hosts-fraction": (override(POOL, "platform_overrides.pool.hosts", 2.5), r"platform_overrides\.pool\.hosts",
                                r"expected an integer, got 2\.5"),
    "cxl-pool-device-ports-zero": (override(POOL, "platform_overrides.pool.device_ports", 0),
                                   r"platform_overrides\.pool\.device_ports", r"must be >= 1, got 0"),
    "cxl-pool-unknown-key": (override(POOL, "platform_overrides.pool.size", "1TB"), r"platform_overrides\.pool\.size",
                             r"unknown key; valid keys: capacity_per_host, cpu_ports, device_ports, hosts"),
    "cxl-pool-too-small": (override(POOL, "cxl_bandwidth", "64GB/s"), r"memory 'pool0\.mem'",
                           r"holds 4\.096 TB, less than the 4\.498 TB .*Fix: a larger memory \(a CXL pool: "
                           r"pool\.capacity_per_host\)"),
    "cxl-pool-bandwidth-zero": (override(POOL, "cxl_bandwidth", "0GB/s"), r"--set cxl_bandwidth",
                                r"must be > 0, got '0GB/s'"),
    "cxl-pool-latency-nan": (override(POOL, "cxl_latency", ".nan"), r"--set cxl_latency", r"nan has no unit"),
    "cxl-pool-file-hosts-nan": (["simulate", "--set", "platform=pool-nan.yaml", "--set", "xpus=16"],
                                r"pool-nan\.yaml: pool\.hosts", r"expected an integer, got nan"),
    # stragglers, straggler_spread, seed
    "stragglers-unknown-xpu": (override(TRAIN, "stragglers.xpu99", 1.5), r"stragglers",
                               r"'xpu99' is not among this run's 8 XPUs \(xpu0\.\.xpu7\)"),
    "stragglers-number-as-name": (override(TRAIN, "stragglers", "{3: 1.5}"), r"stragglers",
                                  r"'3' is not among this run's 8 XPUs"),
    "stragglers-zero": (override(TRAIN, "stragglers.xpu3", 0), r"--set stragglers\.xpu3",
                        r"expected a slowdown factor, a finite number > 0 .*got 0"),
    "stragglers-negative": (override(TRAIN, "stragglers.xpu3", -1), r"--set stragglers\.xpu3", r"> 0 .*got -1"),
    "stragglers-nan": (override(TRAIN, "stragglers.xpu3", ".nan"), r"--set stragglers\.xpu3", r"> 0 .*got nan"),
    "stragglers-inf": (override(TRAIN, "stragglers.xpu3", ".inf"), r"--set stragglers\.xpu3", r"> 0 .*got inf"),
    "stragglers-text": (override(TRAIN, "stragglers.xpu3", "slow"), r"--set stragglers\.xpu3", r"> 0 .*got 'slow'"),
    "stragglers-boolean": (override(TRAIN, "stragglers.xpu3", "true"), r"--set stragglers\.xpu3", r"> 0 .*got True"),
    "stragglers-vanishing": (override(TRAIN, "stragglers.xpu3", "1.0e-300"), r"--set stragglers\.xpu3",
                             r"1e-300x is outside the physical range of a slowdown, 0\.01x to 100x"),
    "stragglers-million": (override(TRAIN, "stragglers.xpu3", "1000000.0"), r"--set stragglers\.xpu3",
                           r"1e\+06x is outside the physical range of a slowdown"),
    "stragglers-exponent-text": (override(TRAIN, "stragglers.xpu3", "1e308"), r"--set stragglers\.xpu3",
                                 r"got '1e308' \(text to YAML, which reads exponent notation as a number only with a "
                                 r"dot and a signed exponent: write 1\.0e\+308\)"),
    "xpus-exponent-text": (override(TRAIN, "xpus", "1e3"), r"--set xpus",
                           r"got '1e3' \(text to YAML.*write 1\.0e\+3, or 1000\)"),
    "stragglers-a-list": (override(TRAIN, "stragglers", "[1,2]"), r"--set stragglers",
                          r"expected a mapping of XPU names to slowdown factors \(e\.g\. \{xpu3: 1\.5\}"),
    "stragglers-file-inf": (["simulate", "stragglers-inf.yaml"], r"stragglers-inf\.yaml: stragglers\.xpu3",
                            r"a finite number > 0 .*got inf"),
    "stragglers-sweep-axis": (["sweep", "stragglers-axis.yaml", "--out", "results/a"],
                              r"stragglers-axis\.yaml: point 1 \(stragglers\.xpu3=0\): stragglers\.xpu3",
                              r"a finite number > 0 .*got 0"),
    "spread-negative": (override(TRAIN, "straggler_spread", -0.1), r"--set straggler_spread", r"must be >= 0, got -0\.1"),
    "spread-inf": (override(TRAIN, "straggler_spread", ".inf"), r"--set straggler_spread",
                   r"expected a finite number >= 0 \(the standard deviation of the slowdowns"),
    "spread-nan": (override(TRAIN, "straggler_spread", ".nan"), r"--set straggler_spread",
                   r"expected a finite number >= 0"),
    "spread-text": (override(TRAIN, "straggler_spread", "wide"), r"--set straggler_spread",
                    r"expected a number, got 'wide'"),
    "spread-sweep-axis": (["sweep", "spread-axis.yaml", "--out", "results/b"],
                          r"spread-axis\.yaml: point 1 \(straggler_spread=-1\): straggler_spread", r"must be >= 0"),
    "seed-fraction": (override(TRAIN, "seed", 1.5), r"--set seed", r"expected an integer, got 1\.5"),
    "seed-text": (override(TRAIN, "seed", "abc"), r"--set seed", r"expected an integer, got 'abc'"),
    "seed-nan": (override(TRAIN, "seed", ".nan"), r"--set seed", r"expected an integer, got nan"),
    "seed-boolean": (override(TRAIN, "seed", "true"), r"--set seed", r"expected an integer, got True"),
    "seed-file-nan": (["simulate", "seed-nan.yaml"], r"seed-nan\.yaml: seed", r"expected an integer, got nan"),
    "seed-negative": (override(TRAIN, "seed", -1), r"--set seed",
                      r"expected an integer >= 0 \(the seed of the straggler_spread draw\), got -1"),
    "seed-file-negative": (["simulate", "seed-negative.yaml"], r"seed-negative\.yaml: seed",
                           r"expected an integer >= 0 .*got -3"),
    # training.fp8_recipe
    "fp8-recipe-unknown": (override(FP8, "workload_overrides.training.fp8_recipe", "tensorwise"),
                           r"workload_overrides\.training\.fp8_recipe",
                           r"'tensorwise' is not one of delayed, current \(in llama3-8b\.yaml\)"),
    "fp8-recipe-case": (override(FP8, "workload_overrides.training.fp8_recipe", "Delayed"),
                        r"workload_overrides\.training\.fp8_recipe", r"\(did you mean 'delayed'\?\)"),
    "fp8-recipe-number": (override(FP8, "workload_overrides.training.fp8_recipe", 1),
                          r"workload_overrides\.training\.fp8_recipe", r"1 is not one of delayed, current"),
    "fp8-recipe-null": (override(FP8, "workload_overrides.training.fp8_recipe", "null"),
                        r"workload_overrides\.training\.fp8_recipe", r"None is not one of delayed, current"),
    "fp8-recipe-list": (override(FP8, "workload_overrides.training.fp8_recipe", "[delayed]"),
                        r"workload_overrides\.training\.fp8_recipe", r"\['delayed'\] is not one of delayed, current"),
    "fp8-recipe-file": (FP8[:2] + ["workload=fp8-recipe.yaml"] + FP8[3:], r"fp8-recipe\.yaml: training\.fp8_recipe",
                        r"'blockwise' is not one of delayed, current"),
    "fp8-on-a100": (["simulate", "--set", "workload=llama3-8b", "--set", "platform=dgx-a100", "--set", "xpus=8",
                     "--set", "tp=8", "--set", "precision=fp8"], r"scenario 'default': precision: fp8: device 'A100'",
                    r"has no fp8 peak FLOP/s; it has fp32, tf32, bf16, fp16"),
    "plan-fp8-on-a100": (PLAN + ["--set", "platform=dgx-a100", "--set", "precision=fp8"],
                         r"precision: fp8: device 'A100'", r"has no fp8 peak FLOP/s; it has fp32, tf32, bf16, fp16"),
    "plan-set-a-layout-no-plan-has": (PLAN + ["--set", "tp=3"], r"--set tp",
                                      r"no configuration of this plan has tp 3; valid here: 1, 2, 4, 8, or leave tp "
                                      r"out to search it"),
    # hcsim plan --time
    "plan-time-zero": (PLAN + ["--time", "0"], r"--time", r"must be > 0 seconds"),
    "plan-time-negative": (PLAN + ["--time=-5"], r"--time", r"must be > 0 seconds"),
    "plan-time-nan": (PLAN + ["--time", "nan"], r"--time", r"must be > 0 seconds.*got nan"),
    "plan-time-inf": (PLAN + ["--time", "inf"], r"--time", r"must be > 0 seconds.*got inf"),
    "plan-time-negative-unit": (PLAN + ["--time=-1min"], r"--time", r"must be > 0 seconds.*got -60"),
}

# argparse refuses these before hcsim runs: its own "hcsim plan: error: argument --time: ..." line, exit 2
ARGPARSE_CASES = {
    "plan-time-text": (PLAN + ["--time", "soon"], r"expected a time budget in seconds \(300\) or with its unit "
                       r"\(10min, 1h\), got 'soon'"),
    "plan-time-empty": (PLAN + ["--time", ""], r"expected a time budget in seconds.*got ''"),
    "plan-time-wrong-unit": (PLAN + ["--time", "5GB"], r"expected a time budget in seconds.*got '5GB'"),
}


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    folder = tmp_path_factory.mktemp("surfaces")
    serving = (REPO_ROOT / "workloads" / "llama3-70b-serving.yaml").read_text()
    gh200 = (REPO_ROOT / "platforms" / "gh200.yaml").read_text()
    llama3 = (REPO_ROOT / "workloads" / "llama3-8b.yaml").read_text()
    files = {
        "kind-inference.yaml": serving.replace("kind: serving", "kind: inference"),
        "serving-list.yaml": re.sub(r"(?ms)^serving:.*", "serving: [1, 2]\n", serving),
        "nan-rate.yaml": re.sub(r"(?m)^  rate: 4\b", "  rate: .nan", serving),
        "gh-bad.yaml": gh200.replace("c2c: {bandwidth: 450GB/s", "c2c: {bandwidth: -450GB/s"),
        "gh-nolinks.yaml": re.sub(r"(?m)^  c2c: .*\n", "", gh200),
        "gh-devempty.yaml": gh200.replace("devices: [GH200]", "devices: []"),
        "gb-kind.yaml": (REPO_ROOT / "platforms" / "gb200-nvl72.yaml").read_text().replace("kind: superchip",
                                                                                           "kind: superchips"),
        "pool-nan.yaml": re.sub(r"(?m)^  hosts: 8\b", "  hosts: .nan", (REPO_ROOT / "platforms" / "cxl-pool.yaml")
                                .read_text()),
        "fp8-recipe.yaml": re.sub(r"(?m)^training:\n", "training:\n  fp8_recipe: blockwise\n", llama3, count=1),
        "jobs-split.yaml": "platform: gb200-nvl72\njobs:\n  - {name: a, xpus: 3}\n  - {name: b, xpus: 2}\n",
        "jobs-split-names.yaml": "platform: gb200-nvl72\njobs:\n  - {name: a, xpus: [xpu0, xpu2, xpu3]}\n"
                                 "  - {name: b, xpus: 2}\n",
        "jobs-serving.yaml": "platform: dgx-h100\njobs:\n  - {name: a, xpus: 8, workload: llama3-70b-serving, tp: 8}\n"
                             "  - {name: b, xpus: 8, workload: llama3-70b-serving, tp: 8}\n",
        "trace-folder.yaml": re.sub(r"(?ms)^serving:.*", "serving:\n  trace: traces\n", serving),
        "stragglers-inf.yaml": "xpus: 8\nstragglers: {xpu3: .inf}\n",
        "seed-nan.yaml": "xpus: 8\nstraggler_spread: 0.05\nseed: .nan\n",
        "seed-negative.yaml": "xpus: 8\nstraggler_spread: 0.05\nseed: -3\n",
        "stragglers-axis.yaml": "name: s\nbase: {iterations: 1, granularity: decoder, xpus: 4}\n"
                                "axes:\n  stragglers.xpu3: [1.5, 0]\n",
        "spread-axis.yaml": "name: s2\nbase: {iterations: 1, granularity: decoder, xpus: 4}\n"
                            "axes:\n  straggler_spread: [0, -1]\n",
    }
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "traces").mkdir()
    for name in ("kind-inference.yaml", "serving-list.yaml", "nan-rate.yaml", "gh-bad.yaml", "gh-nolinks.yaml",
                 "gh-devempty.yaml", "gb-kind.yaml", "pool-nan.yaml", "fp8-recipe.yaml"):
        assert (folder / name).read_text() != "", name
    assert "fp8_recipe: blockwise" in files["fp8-recipe.yaml"] and "rate: .nan" in files["nan-rate.yaml"]
    assert "hosts: .nan" in files["pool-nan.yaml"] and "c2c:" not in files["gh-nolinks.yaml"].split("links:")[1]
    return folder


@pytest.fixture(autouse=True)
def nothing_runs(monkeypatch, workspace):
    """A tripwire instead of the engine, the serving scheduler and the sweep's point processes."""
    def tripwire(*args, **kwargs):
        raise AssertionError("a bad input reached the simulation")

    monkeypatch.setattr("hcsim.engine.api.run", tripwire)
    monkeypatch.setattr("hcsim.run.serving._Scheduler.run", tripwire)
    monkeypatch.setattr("hcsim.study.points.run_point", tripwire)
    monkeypatch.delenv("HCSIM_NO_LIMITS", raising=False)
    monkeypatch.chdir(workspace)


@pytest.mark.parametrize("name", CASES)
def test_a_bad_value_on_a_new_surface_ends_in_one_message_naming_the_key_and_what_is_valid(name, capsys):
    argv, where, valid = CASES[name]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("hcsim: error: "), err
    message = err.removeprefix("hcsim: error: ").rstrip("\n")
    assert "Traceback" not in message and "\n" not in message, message  # one line
    assert MESSAGE_TEMPLATE.match(message), f"not 'WHERE: PROBLEM': {message!r}"
    assert re.search(where, message) and re.search(valid, message), message


@pytest.mark.parametrize("name", ARGPARSE_CASES)
def test_a_bad_time_budget_is_refused_by_the_parser_saying_what_is_valid(name, capsys):
    argv, valid = ARGPARSE_CASES[name]
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2 and "Traceback" not in err
    assert re.search(r"hcsim plan: error: argument --time: " + valid, err), err


def test_a_time_budget_with_its_unit_is_read_in_seconds():
    from hcsim.cli.plan import _seconds

    assert (_seconds("300"), _seconds("10min"), _seconds("1h"), _seconds("90s"), _seconds("1e3")) == \
        (300.0, 600.0, 3600.0, 90.0, 1000.0)


def test_an_fp8_recipe_given_for_a_run_that_is_not_fp8_is_said_once(monkeypatch, caplog):
    """A recipe the run does not use (precision bf16) changes nothing: said, not ignored; once per process."""
    import logging

    import hcsim.errors as errors
    import hcsim.workload.spec as spec

    monkeypatch.setattr(errors, "_SAID", set())
    with caplog.at_level(logging.WARNING, logger="hcsim.workload.spec"):
        for _ in range(2):
            spec.load_workload_spec("llama3-8b", {"training.fp8_recipe": "current", "training.precision": "bf16"})
        spec.load_workload_spec("llama3-8b", {"training.fp8_recipe": "current", "training.precision": "fp8"})
        spec.load_workload_spec("llama3-8b", {"training.precision": "bf16"})
    said = [r.getMessage() for r in caplog.records]
    assert said == [f"{REPO_ROOT / 'workloads' / 'llama3-8b.yaml'}: training.fp8_recipe: 'current' applies to precision "
                    "fp8; this run trains in bf16, so it has no effect (precision=fp8 uses it)"], said


def test_a_wrong_training_value_is_an_error_without_notes_about_the_keys_beside_it(monkeypatch, caplog):
    """A spec with a wrong value ends in its error alone: the notes on keys that would have no effect (an FP8
    recipe in a BF16 run, gradients reduced after the backward pass) wait for a spec that is valid; before, a
    wrong recipe was first noted as the default ('delayed' applies to precision fp8) and then refused."""
    import logging

    import hcsim.errors as errors
    import hcsim.workload.spec as spec
    from hcsim.errors import ConfigError

    monkeypatch.setattr(errors, "_SAID", set())
    with caplog.at_level(logging.WARNING, logger="hcsim.workload.spec"):
        for wrong in ({"training.fp8_recipe": "mxfp8", "training.precision": "bf16"},
                      {"training.overlap_grad_reduce": False, "training.precision": "int4"}):
            with pytest.raises(ConfigError, match=r"training\.(fp8_recipe|precision)"):
                spec.load_workload_spec("llama3-8b", wrong)
    assert [r.getMessage() for r in caplog.records] == []


def test_gradients_reduced_after_the_backward_pass_beside_overlapped_gathers_are_said_once(monkeypatch, caplog):
    """overlap_grad_reduce false with overlap_param_gather on is a pair Megatron-LM refuses: hcsim runs it and says
    so, once; false for both (Megatron-LM's bare default) and true say nothing."""
    import logging

    import hcsim.errors as errors
    import hcsim.workload.spec as spec

    monkeypatch.setattr(errors, "_SAID", set())
    with caplog.at_level(logging.WARNING, logger="hcsim.workload.spec"):
        for _ in range(2):
            spec.load_workload_spec("llama3-8b", {"training.overlap_grad_reduce": False})
        spec.load_workload_spec("llama3-8b", {"training.overlap_grad_reduce": False,
                                              "training.overlap_param_gather": False})
        spec.load_workload_spec("llama3-8b", {"training.overlap_grad_reduce": True})
    said = [r.getMessage() for r in caplog.records]
    assert len(said) == 1 and said[0].startswith(f"{REPO_ROOT / 'workloads' / 'llama3-8b.yaml'}: "
                                                 "training.overlap_grad_reduce: false beside overlap_param_gather"), said


def test_a_seed_given_without_a_straggler_spread_is_said_once(monkeypatch, caplog):
    """A seed without straggler_spread draws nothing, so it changes nothing: said, not ignored, once per process
    (as training.fp8_recipe for a run that is not fp8); beside a spread, even 0 (a sweep's baseline), it is not."""
    import logging

    import hcsim.errors as errors
    import hcsim.run.scenario as scenario

    monkeypatch.setattr(errors, "_SAID", set())
    with caplog.at_level(logging.WARNING, logger="hcsim.run.scenario"):
        for _ in range(2):
            scenario.load_scenario(None, ["xpus=8", "seed=3"])
        scenario.load_scenario(None, ["xpus=8", "seed=3", "straggler_spread=0.05"])
        scenario.load_scenario(None, ["xpus=8", "seed=4", "straggler_spread=0"])
        scenario.load_scenario(None, ["xpus=8"])
    said = [r.getMessage() for r in caplog.records]
    assert said == ["--set seed: 3 seeds the straggler_spread draw; this run has no straggler_spread, so it has no "
                    "effect (straggler_spread=0.05 draws with it; a serving workload's requests draw with "
                    "serving.seed)"], said


def test_a_layout_key_given_to_plan_keeps_only_the_plans_with_its_value():
    """plan --set cp=2 --set zero=1 ranks cp 2, ZeRO-1 plans only (it dropped the user's cp and ranked the others)."""
    from hcsim.cli.plan import _fixed_by_set
    from hcsim.run.scenario import load_scenario
    from hcsim.study.plan import candidates
    from hcsim.workload import load_workload_spec

    spec = load_workload_spec(REPO_ROOT / "workloads" / "llama3-8b.yaml")
    found = candidates(spec, [f"xpu{i}" for i in range(8)], 8, 8)
    given = {"cp": 2, "zero": 1}
    kept = _fixed_by_set(found, load_scenario(None, {"xpus": 8, **given}), given)
    assert kept and all(c.parallelism.cp == 2 and c.parallelism.zero == 1 for c in kept)
    assert len(kept) == sum(c.parallelism.cp == 2 and c.parallelism.zero == 1 for c in found) < len(found)
    assert _fixed_by_set(found, load_scenario(None, {"xpus": 8}), {}) == found


def test_a_value_is_blamed_where_it_was_given_the_python_api_not_as_a_flag():
    """A Python caller's mapping of settings is blamed on load_scenario's settings (was: --set KEY, a flag the
    caller never typed); key=value strings, the command line's, on --set."""
    from hcsim.errors import ConfigError
    from hcsim.run.scenario import load_scenario

    with pytest.raises(ConfigError, match=r"^load_scenario's settings: tp: expected an integer, got 'x'$"):
        load_scenario(None, {"tp": "x"})
    with pytest.raises(ConfigError, match=r"^load_scenario's settings: stragglers\.xpu1: expected a slowdown factor"):
        load_scenario(None, {"stragglers": {"xpu1": 0}})
    with pytest.raises(ConfigError, match=r"^--set tp: expected an integer, got 'x'$"):
        load_scenario(None, ["tp=x"])
