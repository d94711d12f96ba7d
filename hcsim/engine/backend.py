"""The only module that drives SimGrid: executions, transfers and delays with callbacks.

SimGrid 4.1's Python API has completion callbacks on Tasks only, not on plain
activities, and every simcall from a Python actor is an OS-thread switch
(~100 us). So the executor runs no actor at all: it fires Tasks (ExecTask,
CommTask) and reacts to their completion callbacks, which run in SimGrid's
maestro. Tasks are pooled and reused, one firing at a time each, and never
linked with successors (SimGrid's join bookkeeping has pitfalls: DESIGN.md);
dependencies are the executor's business.

Delays (the latency the aggregated collective model adds) are executions on
a "clock" host of speed 1 FLOP/s with more cores than concurrent delays, so
each takes exactly its length.
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable
from pathlib import Path

from hcsim.engine.simgrid_loader import load

__all__ = ["Backend", "SimgridBackend", "SIMGRID_CONFIG"]

log = logging.getLogger(__name__)

# CM02 with TCP-gamma 0 and no cross-traffic: one transfer alone costs latency + size/bandwidth (paper eq. 2).
SIMGRID_CONFIG = ("network/model:CM02", "network/TCP-gamma:0", "network/crosstraffic:0")
CLOCK_HOST = "hcsim:clock"
CLOCK_CORES = 1 << 20  # more than the delays that can ever run at once


class Backend:
    """What the executor needs from a simulation kernel."""

    activities: int

    def now(self) -> float: ...
    def execute(self, host: str, flops: float, then: Callable[[], None]) -> None: ...
    def transfer(self, src: str, dst: str, size: float, then: Callable[[], None]) -> None: ...
    def delay(self, seconds: float, then: Callable[[], None]) -> None: ...
    def run(self) -> None: ...


class SimgridBackend(Backend):
    """Runs activities on SimGrid; create it once per process (one SimGrid Engine per process, ever)."""

    def __init__(self, platform_xml: str | Path):
        simgrid = load()
        self.sg = simgrid
        self.engine = simgrid.Engine(["hcsim", "--log=root.thres:warning", "--log=xbt_cfg.thres:warning"])
        for setting in SIMGRID_CONFIG:
            self.engine.set_config(setting)
        self.engine.load_platform(str(platform_xml))
        clock = self.engine.netzone_root.add_host(CLOCK_HOST, 1.0)
        clock.core_count = CLOCK_CORES
        clock.seal()
        self.engine.netzone_root.seal()
        # SimGrid 4.1's Host.by_name searches the zones' host maps one by one, O(zones) per call (40,960 hosts
        # x 18,433 zones on a 16,384-GPU DGX platform); all_hosts walks the zones once
        self.hosts: dict[str, object] = {host.name: host for host in self.engine.all_hosts}
        self.free: dict[object, list] = defaultdict(list)  # key -> idle (task, slot for its callback)
        self.time = 0.0  # the clock, read once per completion: no simulated time passes inside a callback
        # The Python property `Task.amount` cannot be assigned in 4.1 (its setter wants an instance
        # name too); call the setter with SimGrid's default instance name.
        self._set_amount = simgrid.Task.amount.fset
        self.tasks: list = []  # every task stays referenced: SimGrid keys some state by raw pointer
        self.activities = 0

    def now(self) -> float:
        return self.time

    def execute(self, host: str, flops: float, then: Callable[[], None]) -> None:
        self._fire(("exec", host), flops, then)

    def transfer(self, src: str, dst: str, size: float, then: Callable[[], None]) -> None:
        self._fire(("comm", src, dst), size, then)

    def delay(self, seconds: float, then: Callable[[], None]) -> None:
        self._fire(("exec", CLOCK_HOST), seconds, then)

    def _fire(self, key: tuple, amount: float, then: Callable[[], None]) -> None:
        pool = self.free[key]
        task, slot = pool.pop() if pool else self._new_task(key)
        self._set_amount(task, amount, "instance_0")
        slot[0] = then
        self.activities += 1
        task.enqueue_firings(1)

    def _new_task(self, key: tuple) -> tuple[object, list]:
        name = f"t{len(self.tasks)}"
        if key[0] == "exec":
            task = self.sg.ExecTask.init(name, 0.0, self.hosts[key[1]])
        else:
            task = self.sg.CommTask.init(name, 0.0, self.hosts[key[1]], self.hosts[key[2]])
        pool, slot, engine = self.free[key], [None], self.engine

        def done(_task):
            self.time = engine.clock
            then = slot[0]
            pool.append((task, slot))
            then()

        task.on_this_completion_cb(done)
        self.tasks.append(task)
        return task, slot

    def run(self) -> None:
        self.engine.run()
