"""Measure the kernels hcsim's kernel model is fitted to, on your GPU, into one CSV for `hcsim calibrate`.

Runs where PyTorch with CUDA is installed (never in CI; hcsim itself does not need PyTorch); about 2-4
minutes on an H100. The rows and columns are those of the shared measurements
(experiments/calibration/measurements/README.md): BF16 GEMMs over transformer shapes and squares, causal
flash attention forward and backward by sequence and head dimension, copy and elementwise bandwidth by size,
the Hugging Face RMSNorm and LayerNorm, the FP32 cross-entropy, fused AdamW, FP8 GEMMs. Each figure is the
median of 10 launches timed one at a time with CUDA events after 3 warm-ups.

    python benchmarks/gpu_kernels.py -o my-gpu-kernels.csv
    hcsim calibrate my-gpu-kernels.csv --device H100 -o my-gpu.yaml
    hcsim simulate --set compute_model=roofline --set compute_factors=my-gpu.yaml ...
"""

from __future__ import annotations

import argparse
import csv
import statistics
import sys

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


FAMILIES = (bandwidth, gemms, attention, norms, cross_entropy, adamw, fp8, linear_gemms, attention_default,
            mixed_elementwise)


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
            handle.flush()
            torch.cuda.empty_cache()
            print(f"  {family.__name__} done", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
