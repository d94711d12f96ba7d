"""The workload layer: workload graphs (paper Table 3), model tables, training graphs, memory placement.

Pure: specs in, ``networkx`` graphs out; never imports simgrid.
"""

from hcsim.workload.graph import (COLLECTIVES, PRECISIONS, add_comm, add_compute, add_dependency, load_workload,
                                  new_workload, save_workload, validate_workload)
from hcsim.workload.skeleton import skeleton_graph

__all__ = ["COLLECTIVES", "PRECISIONS", "new_workload", "add_compute", "add_comm", "add_dependency",
           "validate_workload", "save_workload", "load_workload", "skeleton_graph"]
