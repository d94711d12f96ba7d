"""Measure the kernels hcsim's kernel model is fitted to, on your GPU, into one CSV for `hcsim calibrate`.

Runs where PyTorch with CUDA is installed (never in CI; hcsim itself does not need PyTorch); about 2-4
minutes on an H100. The rows and columns are those of the shared measurements
(experiments/calibration/measurements/README.md): BF16 GEMMs over transformer shapes and squares, causal
flash attention forward and backward by sequence and head dimension, copy and elementwise bandwidth by size,
the Hugging Face RMSNorm and LayerNorm, the FP32 cross-entropy, fused AdamW, FP8 GEMMs; then (the fourth set)
Transformer Engine's FP8 GEMMs beside BF16 ones over Megatron-LM's layer shapes timed back to back, the eager
kernels of a Hugging Face layer profiled alone, gradient clipping and zeroing, decode attention, and a GEMM's rate
by what runs around it (clocks under the power limit). Unless a family says otherwise, each figure is the median
of 10 launches timed one at a time with CUDA events after 3 warm-ups.

    python benchmarks/gpu_kernels.py -o my-gpu-kernels.csv
    hcsim calibrate my-gpu-kernels.csv --device H100 -o my-gpu.yaml
    hcsim simulate --set compute_model=roofline --set compute_factors=my-gpu.yaml ...
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys
import time

COLUMNS = ("kind", "m", "n", "k", "batch", "elements", "dtype", "seconds", "flops", "bytes", "tflops", "gbps", "note")
HIDDEN = (1024, 2048, 4096, 5120, 8192)


def timed(torch, run, repeats: int = 10, warmup: int = 3) -> float:
    """Median seconds of `run()` over `repeats` launches, each timed alone with CUDA events."""
    for _ in range(warmup):
        run()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3)
    return statistics.median(times)


def row(kind, seconds, *, flops=0.0, size=0.0, dtype="bf16", note="", **shape):
    out = dict.fromkeys(COLUMNS, 0)
    out.update(kind=kind, dtype=dtype, seconds=seconds, flops=flops, bytes=size, note=note,
               tflops=flops / seconds / 1e12, gbps=size / seconds / 1e9, **shape)
    return out


def gemms(torch):
    shapes = [(d, d, d) for d in (256, 512, 1024, 2048, 4096, 8192, 16384)]
    shapes += [(m, n, k) for m in (512, 2048, 4096, 8192, 16384) for h in HIDDEN
               for n, k in ((3 * h, h), (h, h), (4 * h, h), (h, 4 * h))]
    for m, n, k in shapes:
        a = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        yield row("gemm", timed(torch, lambda: a @ b), flops=2.0 * m * n * k, size=2.0 * (m * k + k * n + m * n),
                  m=m, n=n, k=k, batch=1)


def attention(torch):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    functional = torch.nn.functional
    for heads, d in ((16, 64), (32, 128)):
        for s in (512, 1024, 2048, 4096, 8192):
            b = 16384 // s
            q, k, v = (torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            grad = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16)
            with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
                forward = timed(torch, lambda: functional.scaled_dot_product_attention(q, k, v, is_causal=True))
                both = timed(torch, lambda: functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                             .backward(grad))
            flops = 4.0 * b * heads * s * s * d / 2  # causal: half the scores
            yield row("attn_fwd", forward, flops=flops, m=s, n=heads, k=d, batch=b)
            yield row("attn_bwd", both - forward, flops=2.5 * flops, m=s, n=heads, k=d, batch=b)


def bandwidth(torch):
    src = torch.empty(2**30, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    yield row("copy", timed(torch, lambda: dst.copy_(src)), size=2.0 * 2**30, dtype="u8", m=2**30)
    a, b = (torch.randn(2**28, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    yield row("add", timed(torch, lambda: a + b), size=3.0 * 2 * 2**28, m=2**28)
    del src, dst, a, b
    silu = torch.nn.functional.silu
    for elements in (2**10, 2**14, 2**17, 2**20, 2**22, 2**24, 2**26, 2**28):
        x, y = (torch.randn(elements, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        x32 = x.float()
        for kind, run, size, dtype in (("add_bf16", lambda: x + y, 6, "bf16"), ("silu_bf16", lambda: silu(x), 4, "bf16"),
                                       ("cast_bf16_to_fp32", lambda: x.float(), 6, "bf16"),
                                       ("cast_fp32_to_bf16", lambda: x32.bfloat16(), 6, "fp32")):
            yield row(kind, timed(torch, run), size=float(size * elements), dtype=dtype, elements=elements)


def norms(torch):
    functional = torch.nn.functional
    for tokens in (2048, 8192, 32768):
        for hidden in (1024, 4096, 8192):
            x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            weight = torch.ones(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            bias = torch.zeros(hidden, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            grad = torch.randn_like(x)

            def rmsnorm():  # transformers' LlamaRMSNorm.forward, as written there
                h = x.to(torch.float32)
                variance = h.pow(2).mean(-1, keepdim=True)
                h = h * torch.rsqrt(variance + 1e-6)
                return weight * h.to(x.dtype)

            def layernorm():
                return functional.layer_norm(x, (hidden,), weight, bias)

            note, n = f"tokens={tokens} hidden={hidden}", tokens * hidden
            for kind, run in (("rmsnorm_hf", rmsnorm), ("layernorm", layernorm)):
                yield row(f"{kind}_fwd", timed(torch, run), size=4.0 * n, elements=n, note=note)
                yield row(f"{kind}_fwd_bwd", timed(torch, lambda: run().backward(grad)), elements=n, note=note)


def cross_entropy(torch):
    functional = torch.nn.functional
    for tokens, vocabulary in ((2048, 32000), (2048, 50257), (2048, 128256), (8192, 32000), (8192, 50257),
                               (8192, 128256), (16384, 32000), (16384, 50257)):
        logits = torch.randn(tokens, vocabulary, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        labels = torch.randint(0, vocabulary, (tokens,), device="cuda")
        seconds = timed(torch, lambda: functional.cross_entropy(logits.float(), labels).backward())
        yield row("cross_entropy_fp32_fwd_bwd", seconds, elements=tokens * vocabulary,
                  note=f"tokens={tokens} vocab={vocabulary}")
        del logits


def adamw(torch):
    for parameters in (10**7, 10**8, 10**9):
        weights = [torch.nn.Parameter(torch.randn(parameters // 10, device="cuda")) for _ in range(10)]
        for w in weights:
            w.grad = torch.randn_like(w)
        optimizer = torch.optim.AdamW(weights, fused=True)
        yield row("adamw_fused_fp32_step", timed(torch, optimizer.step), size=28.0 * parameters, dtype="fp32",
                  elements=parameters, note="bytes: read p,g,m,v 16 + write p,m,v 12")
        del weights, optimizer


def fp8(torch):
    if not hasattr(torch, "float8_e4m3fn") or torch.cuda.get_device_capability() < (8, 9):
        return
    one = torch.ones((), device="cuda")
    for m, n, k in ((4096, 4096, 4096), (8192, 8192, 8192), (8192, 12288, 4096), (16384, 4096, 16384),
                    (2048, 4096, 4096)):
        a = torch.randn(m, k, device="cuda").to(torch.float8_e4m3fn)
        b = torch.randn(n, k, device="cuda").to(torch.float8_e4m3fn).t()
        a16, b16 = a.to(torch.bfloat16), b.to(torch.bfloat16)
        note = f"m={m} n={n} k={k}"
        for kind, run, dtype in (("gemm_fp8_e4m3", lambda: torch._scaled_mm(a, b, one, one, out_dtype=torch.bfloat16),
                                  "fp8"), ("gemm_bf16", lambda: a16 @ b16, "bf16")):
            yield row(kind, timed(torch, run), flops=2.0 * m * n * k, dtype=dtype, elements=m * n, note=note)


def linear_gemms(torch):
    """nn.Linear's three GEMMs (forward x·Wᵀ, input gradient g·W, weight gradient gᵀ·x) as PyTorch lays them out,
    over an output layer whose width (a vocabulary) is or is not a multiple of 8 elements: an unaligned leading
    dimension sends cuBLAS to slower kernels. m, n, k are those of C (m x n) = A (m x k) B (k x n)."""
    for tokens in (2048, 8192):
        for hidden in (768, 2560, 4096):
            for vocabulary in (50257, 32001, 50304):
                x = torch.randn(tokens, hidden, device="cuda", dtype=torch.bfloat16)
                w = torch.randn(vocabulary, hidden, device="cuda", dtype=torch.bfloat16)
                g = torch.randn(tokens, vocabulary, device="cuda", dtype=torch.bfloat16)
                for note, run, (m, n, k) in (("forward", lambda: x @ w.t(), (tokens, vocabulary, hidden)),
                                             ("dgrad", lambda: g @ w, (tokens, hidden, vocabulary)),
                                             ("wgrad", lambda: g.t() @ x, (vocabulary, hidden, tokens))):
                    yield row("gemm_linear", timed(torch, run), flops=2.0 * m * n * k,
                              size=2.0 * (m * k + k * n + m * n), m=m, n=n, k=k, batch=1, note=note)
                del x, w, g


def attention_default(torch):
    """Causal sdpa on the backend PyTorch picks itself (as transformers calls it), without and with dropout 0.1
    (GPT-2 trains with attention dropout): attn_fwd_default / attn_bwd_default, *_dropout."""
    functional = torch.nn.functional
    for heads, d in ((12, 64), (32, 128)):
        for s in (512, 1024, 2048, 4096):
            b = 16384 // s
            q, k, v = (torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True)
                       for _ in range(3))
            grad = torch.randn(b, heads, s, d, device="cuda", dtype=torch.bfloat16)
            flops = 4.0 * b * heads * s * s * d / 2
            for suffix, p in (("default", 0.0), ("dropout", 0.1)):
                def run():
                    return functional.scaled_dot_product_attention(q, k, v, is_causal=True, dropout_p=p)
                forward = timed(torch, run)
                both = timed(torch, lambda: run().backward(grad))
                yield row(f"attn_fwd_{suffix}", forward, flops=flops, m=s, n=heads, k=d, batch=b)
                yield row(f"attn_bwd_{suffix}", both - forward, flops=2.5 * flops, m=s, n=heads, k=d, batch=b)


def mixed_elementwise(torch):
    """Elementwise kernels over operands of two dtypes (an FP32 residual plus a BF16 branch, autocast's FP32
    results times BF16 inputs), which PyTorch runs unvectorised, and the strided copy that makes a transposed
    BF16 tensor contiguous (a head split or merge, a KV-cache concatenation)."""
    for elements in (2**20, 2**22, 2**24, 2**26, 2**28):
        x32 = torch.randn(elements, device="cuda")
        y16 = torch.randn(elements, device="cuda", dtype=torch.bfloat16)
        yield row("add_fp32_bf16", timed(torch, lambda: x32 + y16), size=10.0 * elements, dtype="mixed",
                  elements=elements)
        yield row("mul_bf16_fp32", timed(torch, lambda: y16 * x32), size=10.0 * elements, dtype="mixed",
                  elements=elements)
        del x32, y16
    for b, s, heads, d in ((8, 1024, 12, 64), (4, 1024, 32, 80), (4, 2048, 32, 64), (4, 2048, 8, 64),
                           (16, 2048, 32, 128)):
        t = torch.randn(b, s, heads, d, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
        n = b * s * heads * d
        yield row("copy_transposed_bf16", timed(torch, lambda: t.contiguous()), size=4.0 * n, elements=n,
                  note=f"b={b} s={s} heads={heads} d={d}")


def kernel_note(i: int, name: str) -> str:
    """A profiled kernel's position and CUDA name as a row's note holds them (a comma would split the CSV cell)."""
    return f"kernel={i} {name[:60].replace(',', ';')}"


def back_to_back(torch, run, repeats: int = 5, budget: float = 2e-3) -> float:
    """Median seconds of one `run()` launched back to back (as a training step issues its kernels: the host runs
    ahead, so no launch gap is timed), over `repeats` timings of enough launches to fill `budget` seconds."""
    seconds = timed(torch, run, repeats=3, warmup=2)
    launches = max(1, min(50, round(budget / max(seconds, 1e-6))))
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(launches):
            run()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1e3 / launches)
    return statistics.median(times)


def kernel_times(torch, run, repeats: int = 5) -> list[tuple[str, float]]:
    """The kernels one `run()` launches, in order: (name, median device seconds over `repeats` profiled runs)."""
    from torch.profiler import ProfilerActivity, profile

    for _ in range(3):
        run()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(repeats):
            run()
        torch.cuda.synchronize()
    kernels = sorted((e for e in prof.events() if e.device_type.name == "CUDA"), key=lambda e: e.time_range.start)
    per = len(kernels) // repeats
    return [(kernels[i].name, statistics.median((kernels[i + r * per].time_range.end
                                                 - kernels[i + r * per].time_range.start) / 1e6
                                                for r in range(repeats))) for i in range(per)]


# Megatron-LM models' linear layers as tensor parallelism splits them: hidden, fused QKV width, FFN width, gated,
# the tensor-parallel sizes their recipes use
TRANSFORMERS = {"llama3-8b": (4096, 6144, 14336, True, (1, 2, 4, 8)),
                "llama3-70b": (8192, 10240, 28672, True, (1, 2, 4, 8)),
                "nemotron4-15b": (6144, 8192, 24576, False, (1, 2, 4, 8)),
                "gpt3-175b": (12288, 36864, 49152, False, (4, 8)), "llama3-405b": (16384, 18432, 53248, True, (8,))}


def fp8_linear_gemms(torch):
    """Transformer Engine's FP8 GEMMs of a linear layer beside Megatron-LM's BF16 ones, per pass: TE runs every FP8
    GEMM "TN" (both operands K-major, its cast-transposes make them so) with E4M3 activations and weights, E5M2
    gradients (the HYBRID format), per-tensor scales, BF16 output; the forward with fast accumulation, the two
    gradient GEMMs with split accumulation (transformer_engine/common/recipe: use_split_accumulator). The BF16 GEMMs
    as PyTorch lays them out (forward x·Wᵀ, dgrad g·W, wgrad gᵀ·x). Shapes: the QKV, projection, FC1 and FC2
    GEMMs of TRANSFORMERS at tensor parallelism 1-8 over 2048-8192 tokens a micro-batch. m, n, k as C = A B."""
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2
    one = torch.ones((), device="cuda")
    shapes = set()
    for hidden, qkv, ffn, gated, sizes in TRANSFORMERS.values():
        for tp in sizes:
            for tokens in (2048, 4096, 8192):
                for out, into in ((qkv // tp, hidden), (hidden, hidden // tp),  # QKV, projection, FC1, FC2
                                  ((2 if gated else 1) * ffn // tp, hidden), (hidden, ffn // tp)):
                    for gemm, (m, n, k) in (("fprop", (tokens, out, into)), ("dgrad", (tokens, into, out)),
                                            ("wgrad", (out, into, tokens))):
                        shapes.add((m, n, k, gemm))
    for m, n, k, gemm in sorted(shapes):
        a8 = torch.randn(m, k, device="cuda").to(e4m3 if gemm == "fprop" else e5m2)
        b8 = torch.randn(n, k, device="cuda").to(e4m3)  # K-major: B = b8ᵀ
        fast = gemm == "fprop"

        def scaled():
            return torch._scaled_mm(a8, b8.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=fast)
        note = f"{gemm} fast_accum={int(fast)} a={str(a8.dtype).removeprefix('torch.float8_')}"
        try:
            seconds = back_to_back(torch, scaled)
        except RuntimeError as error:  # an E5M2 operand this cuBLAS refuses: time it as E4M3
            a8 = a8.to(torch.bfloat16).to(e4m3)
            note += f" refused: {str(error)[:50].replace(',', ';')}"
            seconds = back_to_back(torch, scaled)
        flops = 2.0 * m * n * k
        yield row("gemm_fp8_tn", seconds, flops=flops, dtype="fp8", m=m, n=n, k=k, batch=1,
                  size=1.0 * (m * k + k * n) + 2.0 * m * n, note=note)
        del a8, b8
        a = torch.randn(k, m, device="cuda", dtype=torch.bfloat16) if gemm == "wgrad" else \
            torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
        b = torch.randn(n, k, device="cuda", dtype=torch.bfloat16) if gemm == "fprop" else \
            torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        run = {"fprop": lambda: a @ b.t(), "dgrad": lambda: a @ b, "wgrad": lambda: a.t() @ b}[gemm]
        yield row("gemm_bf16_linear", back_to_back(torch, run), flops=flops, m=m, n=n, k=k, batch=1,
                  size=2.0 * (m * k + k * n + m * n), note=gemm)
        del a, b


def eager_pieces(torch):
    """Kernels of a Hugging Face decoder layer in eager mode under BF16 autocast that the fast-path rows above do
    not measure, each profiled alone (kind eager_<piece>, one row per kernel launched, note its position and CUDA
    name): RMSNorm's FP32 pieces (square, row mean, the broadcast product by rsqrt, the FP32 weight times the BF16
    result), rotary's products of BF16 heads (a transposed view) by FP32 cos/sin broadcast over heads and its
    rotate_half (neg, cat), a concatenation of a transposed view (the key/value cache), FP32 residual adds, and
    the FP32 log-softmax over a vocabulary. elements: of the piece's largest tensor; bytes: each kernel's reads and
    writes (operands counted as read, broadcast ones at their own size)."""
    f32, b16 = torch.float32, torch.bfloat16
    for tokens, hidden, heads, d in ((8192, 768, 12, 64), (8192, 2048, 32, 64), (8192, 4096, 32, 128),
                                     (4096, 2048, 8, 64)):
        b, s = tokens // 2048 or 1, min(tokens, 2048)
        x = torch.randn(tokens, hidden, device="cuda", dtype=f32)
        xb = x.to(b16)
        r = torch.randn(tokens, 1, device="cuda", dtype=f32)
        w = torch.randn(hidden, device="cuda", dtype=f32)
        q = torch.randn(b, s, heads, d, device="cuda", dtype=b16).transpose(1, 2)
        cos = torch.randn(b, s, d, device="cuda", dtype=f32).unsqueeze(1)
        qf = torch.randn(b, heads, s, d, device="cuda", dtype=f32)
        empty = torch.tensor([], device="cuda", dtype=b16)
        n, nq = tokens * hidden, tokens * heads * d
        pieces = {  # each piece's kernels and the bytes each reads and writes
            "square_fp32": (lambda: x.pow(2), (8 * n,)), "row_mean_fp32": (lambda: x.mean(-1, keepdim=True),
                                                                          (4 * n + 4 * tokens,)),
            "row_product_fp32": (lambda: x * r, (8 * n + 4 * tokens,)),
            "weight_product_mixed": (lambda: w * xb, (6 * n + 4 * hidden,)), "add_fp32": (lambda: x + x, (12 * n,)),
            "rope_product": (lambda: q * cos, (6 * nq,)),
            "rotate_half": (lambda: torch.cat((-q[..., d // 2:], q[..., :d // 2]), dim=-1), (2 * nq, 4 * nq)),
            "cat_transposed": (lambda: torch.cat([empty, q], dim=-2), (4 * nq,)), "cast_bf16": (lambda: qf.to(b16),
                                                                                                (6 * nq,))}
        shape = f"tokens={tokens} hidden={hidden} heads={heads} d={d}"
        for piece, (run, sizes) in pieces.items():
            for i, (name, seconds) in enumerate(kernel_times(torch, run)):
                yield row(f"eager_{piece}", seconds, size=float(sizes[i]) if i < len(sizes) else 0.0,
                          elements=tokens * max(hidden, heads * d), note=f"{shape} {kernel_note(i, name)}")
        del x, xb, r, w, q, cos, qf
    for tokens, vocabulary in ((8192, 50257), (8192, 128256)):
        logits = torch.randn(tokens, vocabulary, device="cuda", dtype=f32)
        for i, (name, seconds) in enumerate(kernel_times(torch, lambda: torch.log_softmax(logits, -1))):
            yield row("eager_log_softmax_fp32", seconds, size=8.0 * tokens * vocabulary, elements=tokens * vocabulary,
                      note=f"tokens={tokens} vocab={vocabulary} {kernel_note(i, name)}")
        del logits


def optimizer_extras(torch):
    """What a training loop runs beside AdamW(fused=True).step(): torch.nn.utils.clip_grad_norm_ (foreach norms,
    their total, the clip coefficient, foreach scaling) and zero_grad(set_to_none=False)'s foreach zeroing, over
    FP32 gradients of Llama-like tensors (one per weight matrix); each launch profiled (note: kernel and name)."""
    for parameters, hidden in ((1.2e9, 2048), (8e9, 4096)):
        count = int(parameters // (3 * hidden * hidden))
        grads = [torch.randn(3 * hidden, hidden, device="cuda") for _ in range(count)]
        weights = [torch.nn.Parameter(torch.empty_like(g)) for g in grads]
        for p, g in zip(weights, grads):
            p.grad = g
        n = sum(g.numel() for g in grads)
        for piece, run in (("clip_grad_norm", lambda: torch.nn.utils.clip_grad_norm_(weights, 1.0, foreach=True)),
                           ("zero_grad_foreach", lambda: torch._foreach_zero_(grads))):
            for i, (name, seconds) in enumerate(kernel_times(torch, run, repeats=3)):
                yield row(f"optimizer_{piece}", seconds, dtype="fp32", elements=n, size=4.0 * n,
                          note=f"tensors={count} {kernel_note(i, name)}")
        del grads, weights


def decode_attention(torch):
    """Decode attention as a serving engine runs it: one query token a sequence over its cached keys and values
    (sdpa, grouped-query heads 32 x 128 over 8 key/value heads, BF16), by batch and cached length; bytes: the
    K/V cache read."""
    functional = torch.nn.functional
    for batch in (1, 8, 32, 128):
        for cached in (512, 2048, 8192, 32768):
            if batch * cached > 2**20:
                continue
            q = torch.randn(batch, 32, 1, 128, device="cuda", dtype=torch.bfloat16)
            k, v = (torch.randn(batch, 8, cached, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
            seconds = back_to_back(torch, lambda: functional.scaled_dot_product_attention(q, k, v, enable_gqa=True))
            yield row("attn_decode", seconds, flops=4.0 * batch * 32 * cached * 128, m=cached, n=32, k=128,
                      batch=batch, size=2.0 * 2 * batch * 8 * cached * 128, note="kv_heads=8")
            del q, k, v


def gemm_duty(torch):
    """A GEMM's own kernel time by what runs around it (clocks under the power limit): alone with the GPU idle
    between launches, back to back with itself, and alternating with a memory-bound copy taking about as long, a
    third or a tenth of it (as a training step interleaves GEMMs with elementwise kernels). Each kernel's device
    time from the profiler; seconds: the median GEMM over 40 of them; note: the setting and the copy's bytes."""
    src = torch.empty(2**31, device="cuda", dtype=torch.uint8)
    dst = torch.empty_like(src)
    one = torch.ones((), device="cuda")
    for dtype, (m, n, k) in (("bf16", (8192, 8192, 8192)), ("fp8", (8192, 8192, 8192)), ("bf16", (4096, 4096, 4096)),
                             ("bf16", (8192, 28672, 4096))):
        a16, b16 = torch.randn(m, k, device="cuda", dtype=torch.bfloat16), torch.randn(n, k, device="cuda",
                                                                                       dtype=torch.bfloat16)
        a8, b8 = a16.to(torch.float8_e4m3fn), b16.to(torch.float8_e4m3fn)
        gemm = (lambda: a16 @ b16.t()) if dtype == "bf16" else \
            (lambda: torch._scaled_mm(a8, b8.t(), one, one, out_dtype=torch.bfloat16, use_fast_accum=True))
        alone = timed(torch, gemm, repeats=3, warmup=2)
        for setting, share in (("alone", None), ("back_to_back", 0.0), ("with_copy_1x", 1.0), ("with_copy_0.3x", 0.3),
                               ("with_copy_0.1x", 0.1)):
            size = 0 if not share else int(alone * share * 2.5e12)  # a copy of about share x the GEMM's time
            def run():
                for _ in range(40):
                    gemm()
                    if size:
                        dst[:size].copy_(src[:size])
                    elif share is None:  # the GPU idle as long again before the next launch
                        torch.cuda.synchronize()
                        time.sleep(alone)
            kernels = kernel_times(torch, run, repeats=1)
            named = [(t, name) for name, t in kernels
                     if not any(w in name.lower() for w in ("copy", "memcpy", "memset"))]
            longest = max(named)[1]  # the GEMM's kernel (cuBLAS may launch a small one beside it)
            gemms = sorted(t for t, name in named if name == longest)
            yield row("gemm_duty", statistics.median(gemms), flops=2.0 * m * n * k, dtype=dtype, m=m, n=n, k=k,
                      batch=1, note=f"{setting} copy_bytes={size} kernels={len(gemms)}")
        del a16, b16, a8, b8


def eager_casts(torch):
    """BF16 -> FP32 and FP32 -> BF16 casts of (8192, width) tensors, the width a multiple of 8 or not (an unpadded
    vocabulary), plain (`.float()`, `.bfloat16()`) and as autocast runs one into an op on its FP32 list (GPT-2's GELU:
    `torch.pow` of a BF16 GEMM output); each kernel profiled alone (note: width, how, kernel, name; bytes 6 an
    element)."""
    for width in (3072, 8192, 50257, 50304, 128256):
        x = torch.randn(8192, width, device="cuda", dtype=torch.bfloat16)
        x32 = x.float()

        def autocast_pow():
            with torch.autocast("cuda", dtype=torch.bfloat16):
                return torch.pow(x, 3.0)
        for how, run in (("up", x.float), ("down", x32.bfloat16), ("autocast_pow", autocast_pow)):
            kernels = kernel_times(torch, run)
            casts = sum("copy" in name for name, _ in kernels)  # past 2^31 bytes a cast is split into launches
            for i, (name, seconds) in enumerate(kernels):
                share = 6.0 / casts if "copy" in name else 8.0 / (len(kernels) - casts)  # pow: FP32 in and out
                yield row(f"cast_{how}", seconds, size=share * x.numel(), elements=x.numel(),
                          note=f"width={width} {kernel_note(i, name)}")
        del x, x32


def layer_mix(torch):
    """Each kernel's own time in a Megatron-like Llama-3 8B layer (BF16, 8192 tokens, TP 1: the QKV, projection, FC1
    and FC2 GEMMs, causal flash attention, the SwiGLU product and two residual-sized elementwise kernels in
    between) run 16 layers back to back, against the same kernel timed alone with the GPU idle between launches:
    the clocks a GEMM sees when GEMMs are most of what runs (note: setting, kernel position and name; seconds:
    the median over the layers)."""
    functional = torch.nn.functional
    bf16 = torch.bfloat16
    x = torch.randn(8192, 4096, device="cuda", dtype=bf16)
    weights = {name: torch.randn(n, k, device="cuda", dtype=bf16)
               for name, (n, k) in {"qkv": (6144, 4096), "proj": (4096, 4096), "fc1": (28672, 4096),
                                    "fc2": (4096, 14336)}.items()}
    q, k, v = (torch.randn(1, 32, 8192, 128, device="cuda", dtype=bf16) for _ in range(3))
    h = torch.randn(8192, 14336, device="cuda", dtype=bf16)

    def layer(pause=lambda: None):
        for run in (lambda: x @ weights["qkv"].t(),
                    lambda: functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                    lambda: x @ weights["proj"].t(), lambda: x + x, lambda: x @ weights["fc1"].t(),
                    lambda: functional.silu(h) * h, lambda: h @ weights["fc2"].t(), lambda: x + x):
            run()
            pause()

    def idle():  # the GPU idle 5 ms before the next kernel
        torch.cuda.synchronize()
        time.sleep(0.005)

    alone = kernel_times(torch, lambda: layer(idle), repeats=5)
    mixed = kernel_times(torch, lambda: [layer() for _ in range(16)], repeats=1)
    per = len(alone)
    for i, (name, seconds) in enumerate(alone):
        in_mix = statistics.median(t for n, t in mixed[i::per] if n == name)  # the same kernel in each layer
        for setting, t in (("alone", seconds), ("in_layers", in_mix)):
            yield row("layer_mix", t, note=f"{setting} {kernel_note(i, name)}")


FAMILIES = (bandwidth, gemms, attention, norms, cross_entropy, adamw, fp8, linear_gemms, attention_default,
            mixed_elementwise, fp8_linear_gemms, eager_pieces, optimizer_extras, decode_attention, gemm_duty,
            eager_casts, layer_mix)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-o", "--output", default="gpu-kernels.csv", help="CSV to write (default gpu-kernels.csv)")
    parser.add_argument("--only", nargs="+", choices=[f.__name__ for f in FAMILIES], metavar="FAMILY",
                        help="measure these families only (default: all): " + ", ".join(f.__name__ for f in FAMILIES))
    args = parser.parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_kernels: needs PyTorch with CUDA (pip install torch); hcsim itself does not", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("gpu_kernels: no CUDA device visible to PyTorch", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = True
    print(f"measuring on {torch.cuda.get_device_name()} (PyTorch {torch.__version__}) into {args.output}",
          file=sys.stderr)
    with open(args.output, "w", newline="") as handle:
        writer = csv.DictWriter(handle, COLUMNS)
        writer.writeheader()
        for family in (f for f in FAMILIES if not args.only or f.__name__ in args.only):
            for measured in family(torch):
                writer.writerow(measured)
                handle.flush()  # a run stopped part-way keeps what it measured
            torch.cuda.empty_cache()
            print(f"  {family.__name__} done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
