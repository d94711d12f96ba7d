"""torch.compile's saved activations: hcsim's rule against AOTAutograd's min-cut partitioner itself.

Needs PyTorch (not among hcsim's requirements, so no test runs it): on a GPT-2 and a Llama layer written out
with CUDA autocast's dtypes, AOTAutograd's partitioner as Inductor calls it (min_cut_rematerialization_partition
with compiler="inductor", Inductor's decompositions) keeps per layer what
:func:`hcsim.workload.ops.compiled_saved` says, besides the BF16 weight copies (2 B per parameter) and, on the
CPU, a copy of the attention output for the output projection; to a norm statistic (4 B per token) or two.
Checked with PyTorch 2.13 on a CPU (2026-11-28)::

    python -m venv /tmp/tv && /tmp/tv/bin/pip install torch networkx pyyaml lxml && \
        PYTHONPATH=. /tmp/tv/bin/python benchmarks/compiled_saved_check.py

Prints, per family, the partitioner's bytes per layer, hcsim's, and whether they agree within two norm
statistics (exit 1 if not).
"""

from __future__ import annotations

import sys

GPT2 = None  # set in main from the test shapes below
LLAMA = None

def check(family: str) -> tuple[int, int]:
    """Where PyTorch is installed (it is not among hcsim's requirements): AOTAutograd's min-cut partitioner, as
    Inductor calls it (min_cut_rematerialization_partition with compiler="inductor", Inductor's decompositions),
    on a GPT-2 and a Llama layer written out with CUDA autocast's dtypes, keeps per layer what
    :func:`compiled_saved` says, besides the BF16 weight copies (:func:`eager_memory`'s 2 B per parameter) and,
    on the CPU, a copy of the attention output for the output projection (CUDA's attention kernels lay their
    output out so that the projection reads it as a view); to a norm statistic (4 B per token) or two: the min
    cut may keep LayerNorm's normalized input and 1/σ instead of its input, mean and 1/σ. Checked with PyTorch
    2.13 (CPU)."""
    import functools
    import math

    import torch
    F = torch.nn.functional
    from torch._functorch.aot_autograd import aot_function
    from torch._functorch.partitioners import min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table

    from hcsim.workload.ops import compiled_saved

    bf, b, s, h, heads, kv_heads, ffn = torch.bfloat16, 2, 64, 64, 4, 2, 256
    d, llama, dropout = h // heads, family == "llama", family == "gpt2"
    shape = LLAMA if llama else GPT2
    shape = type(shape)(**{**{k: getattr(shape, k) for k in shape.__dataclass_fields__}, "hidden": h,
                           "heads": heads, "kv_heads": kv_heads if llama else heads, "ffn": ffn, "sequence": s,
                           "dropout": dropout})

    def linear(x, w, bias=None):  # F.linear / Conv1D's addmm under autocast: BF16 operands
        y = x.to(bf).reshape(-1, x.shape[-1])
        y = y @ w.to(bf) if bias is None else torch.addmm(bias.to(bf), y, w.to(bf))
        return y.reshape(*x.shape[:-1], w.shape[1])

    def gpt2(x, p, cos, sin):
        qkv = linear(F.layer_norm(x, (h,), p["ln1w"], p["ln1b"]), p["wqkv"], p["bqkv"])
        q, k, v = (t.view(b, s, heads, d).permute(0, 2, 1, 3) for t in qkv.split(h, dim=2))
        a = F.scaled_dot_product_attention(q, k, v, is_causal=True).permute(0, 2, 1, 3).reshape(b, s, h)
        a = linear(a, p["wo"], p["bo"])
        x = x + (F.dropout(a, 0.1, True) if dropout else a)
        u = linear(F.layer_norm(x, (h,), p["ln2w"], p["ln2b"]), p["wfc"], p["bfc"])
        g = 0.5 * u * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (u + 0.044715 * torch.pow(u.float(), 3.0))))
        m = linear(g, p["wproj"], p["bproj"])
        return x + (F.dropout(m, 0.1, True) if dropout else m)

    def rms(x, w):
        return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6))

    def rotary(t, cos, sin):
        return t * cos + torch.cat((-t[..., d // 2:], t[..., :d // 2]), dim=-1) * sin

    def llama_layer(x, p, cos, sin):
        n = rms(x, p["n1"])
        q, k, v = (linear(n, p[w]).view(b, s, -1, d).transpose(1, 2) for w in ("wq", "wk", "wv"))
        a = F.scaled_dot_product_attention(rotary(q, cos, sin).to(bf), rotary(k, cos, sin).to(bf), v,
                                           is_causal=True, enable_gqa=True)
        x = x + linear(a.transpose(1, 2).contiguous().reshape(b, s, h), p["wo"])
        n = rms(x, p["n2"])
        return x + linear(F.silu(linear(n, p["wg"])) * linear(n, p["wu"]), p["wd"])

    kv = kv_heads * d
    weights = dict(n1=(h,), wq=(h, h), wk=(h, kv), wv=(h, kv), wo=(h, h), n2=(h,), wg=(h, ffn), wu=(h, ffn),
                   wd=(ffn, h)) if llama else \
        dict(ln1w=(h,), ln1b=(h,), wqkv=(h, 3 * h), bqkv=(3 * h,), wo=(h, h), bo=(h,), ln2w=(h,), ln2b=(h,),
             wfc=(h, ffn), bfc=(ffn,), wproj=(ffn, h), bproj=(h,))

    def saved(layers):
        names = [(i, k) for i in range(layers) for k in weights]
        params = [torch.randn(weights[k], requires_grad=True) for _, k in names]
        angles = torch.arange(s).float()[:, None] * torch.ones(d)[None]
        kept = []

        def step(x0, cos, sin, *ps):
            x = x0 * 1.0  # the residual stream an intermediate, as after the embedding
            for i in range(layers):
                p = {k: t for (j, k), t in zip(names, ps) if j == i}
                x = (llama_layer if llama else gpt2)(x, p, cos, sin)
            return x.float().sum()

        def forward(gm, _):
            outputs = next(n for n in gm.graph.nodes if n.op == "output").args[0][1:]
            kept.extend(n.meta["val"].numel() * n.meta["val"].element_size() for n in outputs
                        if isinstance(n, torch.fx.Node) and isinstance(n.meta.get("val"), torch.Tensor))
            return gm

        run = aot_function(step, fw_compiler=forward, bw_compiler=lambda gm, _: gm,
                           partition_fn=functools.partial(min_cut_rematerialization_partition, compiler="inductor"),
                           decompositions=select_decomp_table())
        run(torch.randn(b, s, h, requires_grad=True), angles.cos()[None, None], angles.sin()[None, None],
            *params).backward()
        return sum(kept)

    per_layer = saved(3) - saved(2)
    matrices = sum(math.prod(size) for size in weights.values() if len(size) == 2)
    expected = sum(compiled_saved(shape, b).values()) + 2 * matrices + 2 * b * s * h  # the CPU's attention copy
    return per_layer, expected


def _shapes():
    """The layer families (tests/workload/test_eager_kernels.py's shapes; check() sizes them down)."""
    from hcsim.workload.model import ModelShape

    llama = ModelShape(name="llama", decoders=2, hidden=512, heads=8, kv_heads=2, ffn=1408, mlp="swiglu",
                       norm="rmsnorm", dropout=False, sequence=256, vocabulary=1000, positions="rope")
    gpt2 = ModelShape(name="gpt2", decoders=2, hidden=512, heads=8, ffn=2048, mlp="gelu", norm="layernorm",
                      dropout=True, sequence=256, vocabulary=1000, positions="learned", bias=True,
                      tied_embeddings=True)
    return gpt2, llama


def main() -> int:
    global GPT2, LLAMA
    GPT2, LLAMA = _shapes()
    failed = False
    for family in ("gpt2", "gpt2-no-dropout", "llama"):
        kept, expected = check(family)
        ok = abs(kept - expected) <= 2 * 2 * 64 * 4  # two norm statistics: batch 2 x sequence 64 x 4 B
        failed |= not ok
        print(f"{family:<16} partitioner {kept:>9,} B per layer   hcsim {int(expected):>9,} B   {'agree' if ok else 'DIFFER'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
