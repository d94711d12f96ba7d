"""Profile the kernels one training step of a Hugging Face model launches on your GPU, to set beside hcsim's
kernel inventory (`training.kernels: pytorch-eager`, hcsim.workload.ops) with `benchmarks/step_kernels.py`.

Runs where PyTorch with CUDA and transformers are installed (never in CI; hcsim does not need them). The model is
built from its config with random weights (nothing is downloaded) and trained as the shared measurements describe
(experiments/calibration/measurements/README.md): eager mode, attn_implementation="sdpa", torch.autocast(bfloat16)
over FP32 weights, loss over the whole vocabulary with the logits upcast to FP32, AdamW(fused=True),
zero_grad(set_to_none=True), per-layer activation checkpointing with --checkpointing.

One step after three warm-ups is profiled with torch.profiler, with the GPU synchronized between forward, backward
and the optimizer step so that every kernel falls in its phase. Writes one row per kernel launch (phase, order,
name, device microseconds) and prints the kernel count and device time per phase, the host's time per phase, and
the step's peak memory (torch.cuda.max_memory_allocated / reserved). Kernel counts and per-kernel times are what
hcsim's inventory is checked against; the step time is printed for reference, not for fitting.

    python benchmarks/gpu_step_kernels.py --model gpt2 --batch 8 --sequence 1024 -o gpt2-kernels.csv
    python benchmarks/gpu_step_kernels.py --model llama3.2-1b --batch 4 --sequence 2048 --checkpointing -o l.csv
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
import time

PHASES = ("forward", "backward", "optimizer")
MODELS = {  # released configs, as hcsim's workloads/gpt2-hf.yaml and llama3.2-1b-hf.yaml describe them
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {}),
    "gpt2-2.7b": ("GPT2Config", "GPT2LMHeadModel", {"n_embd": 2560, "n_layer": 32, "n_head": 32}),
    "llama3.2-1b": ("LlamaConfig", "LlamaForCausalLM", {
        "hidden_size": 2048, "intermediate_size": 8192, "num_hidden_layers": 16, "num_attention_heads": 32,
        "num_key_value_heads": 8, "vocab_size": 128256, "tie_word_embeddings": True,
        "max_position_embeddings": 131072, "rope_theta": 500000.0}),
}


def build(model: str, sequence: int):
    import torch
    import transformers
    config_name, model_name, overrides = MODELS[model]
    config = getattr(transformers, config_name)(**overrides)
    if model.startswith("gpt2"):
        config.n_positions = max(config.n_positions, sequence)
    net = getattr(transformers, model_name)._from_config(config, attn_implementation="sdpa")
    return net.to("cuda").train(), torch.optim.AdamW(net.parameters(), lr=1e-4, fused=True)


def step(torch, net, optimizer, ids, sync=False, host=None):
    """One training step; with `sync` the GPU is waited for after each phase (named by a profiler range), and
    `host` gets each phase's seconds."""
    from torch.profiler import record_function

    def phase(name, run):
        start = time.perf_counter()
        with record_function(name):
            out = run()
            if sync:
                torch.cuda.synchronize()
        if host is not None:
            host[name] = time.perf_counter() - start
        return out

    def forward():
        with torch.autocast("cuda", dtype=torch.bfloat16):
            return net(input_ids=ids, labels=ids).loss

    loss = phase("forward", forward)
    phase("backward", loss.backward)
    phase("optimizer", lambda: (optimizer.step(), optimizer.zero_grad(set_to_none=True)))
    torch.cuda.synchronize()


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", choices=sorted(MODELS), required=True)
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--sequence", type=int, required=True)
    parser.add_argument("--checkpointing", action="store_true", help="gradient_checkpointing_enable()")
    parser.add_argument("--steps", type=int, default=5, help="timed steps after the profiled one (default 5)")
    parser.add_argument("-o", "--out", required=True, help="CSV of the profiled step's kernels")
    args = parser.parse_args(argv)
    import torch
    from torch.profiler import ProfilerActivity, profile

    net, optimizer = build(args.model, args.sequence)
    if args.checkpointing:
        net.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    vocab = net.config.vocab_size
    ids = torch.randint(0, vocab, (args.batch, args.sequence), device="cuda")
    for _ in range(3):
        step(torch, net, optimizer, ids)
    torch.cuda.reset_peak_memory_stats()
    host = {}
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        step(torch, net, optimizer, ids, sync=True, host=host)
    peak = torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved()
    rows = kernel_rows(prof)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=["phase", "order", "name", "device_us", "start_us"])
        writer.writeheader()
        writer.writerows(rows)
    times = []
    for _ in range(args.steps):
        start = time.perf_counter()
        step(torch, net, optimizer, ids)
        times.append(time.perf_counter() - start)
    summary = {
        "model": args.model, "batch": args.batch, "sequence": args.sequence, "checkpointing": args.checkpointing,
        "device": torch.cuda.get_device_name(), "torch": torch.__version__,
        "parameters": sum(p.numel() for p in net.parameters()),
        "peak_allocated_GiB": peak[0] / 2**30, "peak_reserved_GiB": peak[1] / 2**30,
        "step_s_median": sorted(times)[len(times) // 2],
        "phases": {phase: {"kernels": sum(r["phase"] == phase for r in rows),
                           "device_ms": sum(r["device_us"] for r in rows if r["phase"] == phase) / 1e3,
                           "host_ms_synced": host.get(phase, 0.0) * 1e3}
                   for phase in PHASES},
    }
    print(json.dumps(summary, indent=1))
    with open(args.out.removesuffix(".csv") + ".json", "w") as f:
        json.dump(summary, f, indent=1)
    return 0


def kernel_rows(prof) -> list[dict]:
    """The profiled step's GPU kernels in start order, each in the phase whose range (on the host, which waited
    for the GPU between phases) holds its start."""
    events = prof.events()
    ranges = sorted((e.time_range.start, e.name) for e in events
                    if e.name in PHASES and e.device_type.name == "CPU")
    kernels = sorted((e for e in events if e.device_type.name == "CUDA" and e.name not in PHASES),
                     key=lambda e: e.time_range.start)
    step_start = kernels[0].time_range.start if kernels else 0
    rows = []
    for i, e in enumerate(kernels):
        phase = phase_of(e.time_range.start, ranges)
        rows.append({"phase": phase, "order": i, "name": e.name,
                     "device_us": e.time_range.end - e.time_range.start,
                     "start_us": e.time_range.start - step_start})
    return rows


def phase_of(start, ranges) -> str:
    phase = ranges[0][1] if ranges else "?"
    for begin, name in ranges:
        if start >= begin:
            phase = name
    return phase


if __name__ == "__main__":
    sys.exit(main())
