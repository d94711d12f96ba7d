"""`hcsim plan --time` is the whole plan's budget: enumeration and estimates count, and no batch of simulations
starts that would pass it by the longest batch so far (the first batch always runs)."""

import time
from types import SimpleNamespace

import pytest

from hcsim.cli import plan as plan_cli


class _Search:
    """Ten candidates, proposed in order, never finished early: only --time or --top stops it."""

    def __init__(self):
        self.estimates = {i: 1.0 for i in range(10)}
        self.left = list(range(10))

    def finished(self):
        return None if self.left else "every plan simulated"

    def next(self, n):
        batch, self.left = self.left[:n], self.left[n:]
        return batch

    def record(self, candidate, seconds):
        pass


@pytest.mark.parametrize("spent_before, simulated", [(0.0, 10), (300.5, 2)])
def test_time_spent_before_the_simulations_counts(monkeypatch, capsys, spent_before, simulated):
    monkeypatch.setattr(plan_cli, "_simulate",
                        lambda scenario, ranked, *args, **kwargs: [{"iteration_time_s": 1.0} for _ in ranked])
    args = SimpleNamespace(top=None, time=300.0, all=False, jobs=2, executor="local", timeout=None,
                           started=time.perf_counter() - spent_before)
    results = plan_cli._search(None, _Search(), args, journal=None)
    assert len(results) == simulated
    reason = "every plan simulated" if simulated == 10 else "--time 300 s spent"
    out = capsys.readouterr().out
    assert f"simulated {simulated} of 10 fitting plans" in out and f"({reason})" in out
