"""The workload layer: workload graphs (paper Table 3), model tables, training graphs, memory placement.

Pure: specs in, ``networkx`` graphs out; never imports simgrid.

>>> spec = load_workload_spec("llama2-13b")
>>> graph = build_training_graph(spec, ["xpu0", "xpu1"])
>>> placement = place_memory(graph, {"xpu0": 80 * 2**30, "xpu1": 80 * 2**30}, spec)
"""

from hcsim.workload.graph import (COLLECTIVES, PRECISIONS, add_comm, add_compute, add_dependency, load_workload,
                                  new_workload, save_workload, unroll_iterations, validate_workload)
from hcsim.workload.model import (Affine, DecoderTable, ElementSizes, LayerCost, ModelShape, activation_bytes,
                                  element_sizes, generate_decoder_table)
from hcsim.workload.placement import CapacityPlacement, Placement, StateBytes, place_memory, training_state
from hcsim.workload.skeleton import skeleton_graph
from hcsim.workload.spec import WorkloadSpec, load_workload_spec, parse_workload_spec
from hcsim.workload.training import build_training_graph, decoder_parameters, gradient_bytes

__all__ = [
    "COLLECTIVES", "PRECISIONS", "new_workload", "add_compute", "add_comm", "add_dependency",
    "validate_workload", "save_workload", "load_workload", "unroll_iterations", "skeleton_graph",
    "Affine", "LayerCost", "DecoderTable", "ModelShape", "ElementSizes", "element_sizes",
    "generate_decoder_table", "activation_bytes",
    "WorkloadSpec", "load_workload_spec", "parse_workload_spec",
    "build_training_graph", "decoder_parameters", "gradient_bytes",
    "StateBytes", "CapacityPlacement", "Placement", "training_state", "place_memory",
]
