"""The offline what-if's actuation emulation and scoring (sim/loop/whatif.py; no processes)."""

from __future__ import annotations

import numpy as np
import pytest

from sim.loop.whatif import emulate, forwarded_counts, score


def test_a_scale_up_is_ready_lead_minutes_after_its_decision() -> None:
    t = emulate(2, [4, 4, 4, 4, 4], lead_min=3)
    assert t.ready == [2, 2, 2, 4, 4]
    assert t.warming == [2, 2, 2, 0, 0]
    assert emulate(2, [4, 4], lead_min=0).ready == [4, 4]


def test_a_scale_down_cancels_warming_replicas_first_newest_first() -> None:
    # up 2 at minute 0 (ready at 4), up 1 more at minute 1 (ready at 5), then down 2 at minute 2:
    # the newest (minute 1's) goes, then one of minute 0's; the Ready ones stay
    t = emulate(3, [5, 6, 4, 4, 4, 4], lead_min=4)
    assert t.ready == [3, 3, 3, 3, 4, 4]
    assert t.warming == [2, 3, 1, 1, 0, 0]


def test_a_scale_down_past_the_warming_ones_removes_ready_replicas_at_once() -> None:
    t = emulate(4, [6, 2, 2], lead_min=5)
    assert t.ready == [4, 2, 2] and t.warming == [2, 0, 0]


def test_every_decided_replica_holds_a_gpu() -> None:
    desired = [3, 5, 5, 2, 7, 7, 7, 4, 1, 1]
    t = emulate(3, desired, lead_min=2)
    assert [r + w for r, w in zip(t.ready, t.warming)] == desired == t.desired


def test_replica_minutes_count_from_the_decision_as_warming_gpus_are_paid() -> None:
    t = emulate(1, [3, 3, 3, 3], lead_min=2)  # Ready from minute 2; paid from minute 0
    s = score(1, t, need=[3, 3, 3, 3], forwarded_rps=[0.5, 0.5, 0.5, 0.5], capacity_rps=0.4)
    assert s.replica_minutes == 12 and s.gpu_hours == pytest.approx(12 / 60)
    assert s.under_need_minutes == 2  # 1 Ready while 3 warm up
    assert s.under_demand_minutes == 2  # 1 x 0.4 < 0.5 req/s
    assert s.scale_events == 1 and s.need_replica_minutes == 12


def test_scale_events_count_changes_of_the_decision_from_the_initial_count() -> None:
    t = emulate(2, [2, 3, 3, 2, 2, 4], lead_min=1)
    assert score(2, t, [1] * 6, [0.0] * 6, 1.0).scale_events == 3
    with pytest.raises(ValueError):
        score(2, t, [1] * 5, [0.0] * 6, 1.0)


def test_forwarded_counts_thin_the_arrivals_per_minute() -> None:
    offsets = [1.0, 2.0, 61.0] + [130.0] * 1000 + [200.0]  # the last one is past 3 minutes
    assert list(forwarded_counts(offsets, 3, 1.0, seed=0)) == [2, 1, 1000]
    assert list(forwarded_counts(offsets, 3, 0.0, seed=0)) == [0, 0, 0]
    half = forwarded_counts(offsets, 3, 0.5, seed=0)
    assert 430 < half[2] < 570 and half.dtype.kind == "i"
    assert np.array_equal(half, forwarded_counts(offsets, 3, 0.5, seed=0))  # seeded
    with pytest.raises(ValueError):
        forwarded_counts(offsets, 3, 1.5, seed=0)
