"""ParallelLayout.slowest: the XPU each data replica or pipeline stage is paced by."""

from hcsim.workload.layout import ParallelLayout


def test_the_slowest_xpu_of_each_replica_and_stage():
    xpus = [f"x{i}" for i in range(16)]
    layout = ParallelLayout(xpus, {"tp": 2, "pp": 2, "dp": 4})  # tp innermost, pp outermost
    speed = {x: 1.0 + i % 3 for i, x in enumerate(xpus)}.__getitem__  # 1, 2, 3, 1, 2, 3, ...
    stages = layout.slowest("pp", speed)
    assert stages == ["x0", "x9"]  # the first XPU at speed 1 of x0..x7 and of x8..x15
    replicas = layout.slowest("dp", speed)
    for r, x in enumerate(replicas):
        members = [y for y in xpus if layout.coordinates(y)["dp"] == r]
        assert x in members and speed(x) == min(map(speed, members))
        assert members.index(x) == min(i for i, y in enumerate(members) if speed(y) == speed(x))
    assert len(replicas) == 4
