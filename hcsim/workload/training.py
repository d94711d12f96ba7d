"""The data-parallel training graph of paper Fig. 7.

One iteration on every XPU: forward through decoders 1..L, backward through
L..1, a gradient all-reduce per bucket as soon as the bucket's backward is
done (overlapping the rest of the backward pass), an optimizer step once every
all-reduce has ended, and the back edge optimizer -> first forward vertex
(``skip_first_iteration``) that makes the next iteration wait for the update.

Vertex names (decoders numbered from 1, zero-padded to the width of L)::

    d01.fwd.linear_q   d01.bwd.linear_q     (granularity "layer": one per table row)
    d01.fwd            d01.bwd              (granularity "decoder": one fused vertex per pass)
    allreduce.d01.linear_q | allreduce.d01 | allreduce.model   (bucket layer | decoder | model)
    optimizer

With a ``batch_split`` (:mod:`hcsim.workload.split`; ``batches`` here, samples per XPU) the XPUs that
process the same number of samples share a chain of compute vertices whose names start with
``b{samples}.`` (``b6.d01.fwd.linear_q``), its FLOPs and bytes the decoder table's at that batch; the
all-reduces and the optimizer step stay one vertex each over every XPU.

Besides the contract of :mod:`hcsim.workload.graph`, every vertex carries
``phase`` ("fwd" | "bwd" | "allreduce" | "optimizer") and ``decoder`` (1..L,
0 for the optimizer and a whole-model all-reduce), which memory placement and
reports use.
"""

from __future__ import annotations

from collections.abc import Mapping

import networkx as nx

from hcsim.errors import WorkloadError
from hcsim.workload.graph import add_comm, add_compute, add_dependency, new_workload
from hcsim.workload.layout import ParallelLayout
from hcsim.workload.model import LayerCost
from hcsim.workload.spec import WorkloadSpec

__all__ = ["build_training_graph", "decoder_parameters", "gradient_bytes"]


def decoder_parameters(spec: WorkloadSpec) -> int:
    """Parameters of one decoder block."""
    return spec.decoder_table().parameters


def gradient_bytes(spec: WorkloadSpec, parameters: int) -> float:
    """Bytes all-reduced for `parameters` gradients at the spec's precision."""
    return parameters * spec.sizes.gradient


def build_training_graph(spec: WorkloadSpec, xpus: list[str] | ParallelLayout, group_order=None,
                         batches: Mapping[str, int] | None = None) -> nx.DiGraph:
    """The data-parallel training graph of `spec` over `xpus` (paper Fig. 7).

    Every compute vertex is replicated on all `xpus`; every all-reduce has the
    group `xpus` (in that order, or as ``group_order(xpus)`` orders it), collective
    "all_reduce", algorithm ``spec.algorithm``, and bytes = the bucket's
    parameters x gradient bytes per element. The optimizer step does
    ``spec.optimizer_flops_per_parameter`` FLOP and reads
    ``spec.optimizer_bytes_per_parameter`` bytes per parameter of the model.

    Parameters
    ----------
    spec : the workload (:func:`hcsim.workload.load_workload_spec`).
    xpus : XPU names, at least one, no repeats; or a data-parallel ParallelLayout.
    group_order : optional callable giving a group's ranks in ring order.
    batches : optional samples per iteration of each XPU (a ``batch_split``, :mod:`hcsim.workload.split`);
        None: ``spec.batch_per_xpu`` each. XPUs with equal batches share compute vertices (one chain per
        distinct batch, its names prefixed ``b{batch}.``) whose FLOPs and bytes are the decoder table's at
        that batch; every all-reduce keeps its group, bytes and name, and each XPU joins it when its own
        chain's vertex is done.

    Returns
    -------
    networkx.DiGraph following :mod:`hcsim.workload.graph`, with graph
    attributes name, precision, samples_per_iteration (= batch per XPU),
    decoders, granularity, bucket, parameters (of the decoders), model, and the
    layout, global_samples and model_flops of :mod:`hcsim.workload.graph`.

    Raises
    ------
    WorkloadError
        if `xpus` is empty or repeats a name.
    """
    if not isinstance(xpus, ParallelLayout):
        if not xpus:
            raise WorkloadError(f"workload {spec.name!r}: no XPUs to train on")
        if len(set(xpus)) != len(xpus):
            repeated = sorted({x for x in xpus if list(xpus).count(x) > 1})
            raise WorkloadError(f"workload {spec.name!r}: XPUs listed more than once: {', '.join(repeated[:5])}")
        xpus = ParallelLayout(xpus)
    layout = xpus
    if layout.sizes["dp"] != len(layout.xpus):
        raise WorkloadError(f"workload {spec.name!r}: this graph is data parallel only; the layout is {layout!r}")
    group = tuple(group_order(layout.xpus) if group_order else layout.xpus)
    table = spec.decoder_table()
    decoders = spec.model.decoders
    batch = spec.batch_per_xpu
    width = len(str(decoders))
    classes = _batch_classes(group, batches, batch, spec.name)  # (batch, its XPUs in group order, name prefix)
    graph = new_workload(spec.name, precision=spec.precision, samples_per_iteration=batch)
    graph.graph.update(model=spec.model.name, decoders=decoders, granularity=spec.granularity, bucket=spec.bucket,
                       parameters=table.parameters * decoders, layout=layout.to_dict(),
                       global_samples=batch * len(group), tokens_per_sample=spec.model.sequence,
                       model_flops=sum(len(members) * decoders * sum(layer.fwd_flops(b) + layer.bwd_flops(b)
                                                                     for layer in table.layers)
                                       for b, members, _ in classes))
    if len(classes) > 1:
        graph.graph.update(batch_split=[batches[x] for x in layout.xpus], batch_split_unit="samples")

    def tag(d: int) -> str:
        return f"d{d:0{width}d}"

    def add_pass(d: int, phase: str, layers: tuple[LayerCost, ...], start: bool, batch: int, members: tuple,
                 prefix: str) -> list[str]:
        """Compute vertices of one pass of decoder d on `members` at `batch` samples, in execution order."""
        flops, mem = f"{phase}_flops", f"{phase}_bytes"
        if spec.granularity == "decoder":
            name = f"{prefix}{tag(d)}.{phase}"
            add_compute(graph, name, xpus=members, flops=sum(getattr(layer, flops)(batch) for layer in layers),
                        memory_bytes=sum(getattr(layer, mem)(batch) for layer in layers), start=start)
            names = [name]
        else:
            names = []
            for i, layer in enumerate(layers):
                name = f"{prefix}{tag(d)}.{phase}.{layer.name}"
                add_compute(graph, name, xpus=members, flops=getattr(layer, flops)(batch),
                            memory_bytes=getattr(layer, mem)(batch), start=start and i == 0)
                names.append(name)
        for name in names:
            graph.nodes[name].update(phase=phase, decoder=d)
        return names

    chains: list[list[str]] = [[] for _ in classes]  # per class, its vertices in execution order
    for chain, (b, members, prefix) in zip(chains, classes):
        for d in range(1, decoders + 1):
            chain += add_pass(d, "fwd", table.layers, d == 1, b, members, prefix)
    allreduces: list[str] = []
    reversed_layers = tuple(reversed(table.layers))
    for d in range(decoders, 0, -1):
        passes = []  # per class, the vertices of decoder d's backward pass
        for chain, (b, members, prefix) in zip(chains, classes):
            passes.append(add_pass(d, "bwd", reversed_layers, False, b, members, prefix))
            chain += passes[-1]
        if spec.bucket == "decoder":
            allreduces.append(_allreduce(graph, f"allreduce.{tag(d)}", group, spec, table.parameters, d,
                                         [names[-1] for names in passes]))
        elif spec.bucket == "layer":
            for i, layer in enumerate(reversed_layers):  # a fused decoder vertex computes every layer's gradient
                if layer.parameters:
                    afters = [names[i if spec.granularity == "layer" else 0] for names in passes]
                    allreduces.append(_allreduce(graph, f"allreduce.{tag(d)}.{layer.name}", group, spec,
                                                 layer.parameters, d, afters))
    for chain in chains:
        for before, after in zip(chain, chain[1:]):
            add_dependency(graph, before, after)
    if spec.bucket == "model":
        allreduces.append(_allreduce(graph, "allreduce.model", group, spec, table.parameters * decoders, 0,
                                     [chain[-1] for chain in chains]))
    if spec.in_order:
        for before, after in zip(allreduces, allreduces[1:]):
            add_dependency(graph, before, after)
    parameters = table.parameters * decoders
    add_compute(graph, "optimizer", xpus=group, flops=spec.optimizer_flops_per_parameter * parameters,
                memory_bytes=spec.optimizer_bytes_per_parameter * parameters)
    graph.nodes["optimizer"].update(phase="optimizer", decoder=0)
    # the optimizer needs every synchronised gradient (and, without all-reduces, the backward pass)
    for name in allreduces or [chain[-1] for chain in chains]:
        add_dependency(graph, name, "optimizer")
    for chain in chains:
        add_dependency(graph, "optimizer", chain[0], skip_first_iteration=True)
    return graph


def _batch_classes(group: tuple[str, ...], batches: Mapping[str, int] | None, batch: int, name: str
                   ) -> list[tuple[int, tuple[str, ...], str]]:
    """The XPUs by samples per iteration: (batch, its XPUs in group order, vertex name prefix), in order of
    each batch's first XPU; one class (`batch`, every XPU, no prefix) when all batches are equal."""
    if batches is None:
        return [(batch, group, "")]
    wrong = [x for x in group if isinstance(batches.get(x), bool) or not isinstance(batches.get(x), int)
             or batches[x] < 1]
    if wrong:
        raise WorkloadError(f"workload {name!r}: batches: XPU {wrong[0]!r} has {batches.get(wrong[0])!r} samples; "
                            f"valid: a positive integer for every XPU of the graph")
    counts = list(dict.fromkeys(batches[x] for x in group))
    if len(counts) == 1:
        return [(counts[0], group, "")]
    return [(b, tuple(x for x in group if batches[x] == b), f"b{b}.") for b in counts]


def _allreduce(graph: nx.DiGraph, name: str, group: tuple, spec: WorkloadSpec, parameters: int, decoder: int,
               after: list[str]) -> str:
    """Add the all-reduce of `parameters` gradients; each XPU joins it when its own vertex of `after` has ended."""
    add_comm(graph, name, xpus=group, bytes=gradient_bytes(spec, parameters), collective="all_reduce",
             algorithm=spec.algorithm, chunks=spec.chunks)
    graph.nodes[name].update(phase="allreduce", decoder=decoder)
    for vertex in after:
        add_dependency(graph, vertex, name)
    return name
