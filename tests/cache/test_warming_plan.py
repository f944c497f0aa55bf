"""The pure warming planner (cache/warming/plan.py): one test per rule."""

from __future__ import annotations

import math

import pytest

from cache.warming.plan import (
    WarmCandidate,
    WarmPolicy,
    allowance,
    choose,
    earlier_days,
    idle,
    peak_slot,
    slot_bounds,
    slot_of,
    wait_s,
)

P = WarmPolicy()
DAY = 86400.0
START = 20 * DAY + 12 * 3600.0  # a slot start: noon UTC on day 20
END = START + P.slot_s


def cand(key: str, count: float = 10, days: int = 3, until: float | None = None) -> WarmCandidate:
    return WarmCandidate(key, count, days, until)


# choose ---------------------------------------------------------------------------------------


def test_choose_orders_hottest_first() -> None:
    got = choose([cand("a", 3), cand("b", 9), cand("c", 5)], START, END, P)
    assert got == ["b", "c", "a"]


def test_choose_keeps_only_the_top_k_by_count() -> None:
    policy = WarmPolicy(top_k=2)
    got = choose([cand("a", 3), cand("b", 9), cand("c", 5)], START, END, policy)
    assert got == ["b", "c"]


def test_choose_skips_keys_seen_on_too_few_days() -> None:
    got = choose([cand("once", 100, days=1), cand("twice", 2, days=2)], START, END, P)
    assert got == ["twice"]


def test_choose_skips_an_entry_alive_through_the_slot() -> None:
    got = choose([cand("alive", until=END), cand("later", until=END + 1)], START, END, P)
    assert got == []


def test_choose_warms_absent_and_expiring_entries() -> None:
    got = choose([cand("absent", 5), cand("expiring", 4, until=END - 1)], START, END, P)
    assert got == ["absent", "expiring"]


def test_choose_top_k_is_taken_before_the_filters() -> None:
    # top_k is "hottest considered": a one-off key still takes a place among the considered.
    policy = WarmPolicy(top_k=1)
    assert choose([cand("hot_once", 50, days=1), cand("warm", 10)], START, END, policy) == []


def test_choose_ties_are_reproducible() -> None:
    assert choose([cand("b"), cand("a")], START, END, P) == ["a", "b"]


# peak_slot ------------------------------------------------------------------------------------


def test_peak_slot_returns_the_slot_of_the_highest_point_within_lead() -> None:
    now = START - 600
    forecast = [(now, 1.0), (now + 300, 2.0), (START + 60, 8.0), (START + 300, 6.0)]
    assert peak_slot(forecast, now, P, capacity_rps=10.0) == (START, END)


def test_peak_slot_ignores_points_beyond_lead() -> None:
    now = START - 600
    forecast = [(now, 1.0), (now + P.lead_s + 1, 9.0)]
    assert peak_slot(forecast, now, P, capacity_rps=10.0) is None


def test_peak_slot_needs_the_peak_fraction_of_capacity() -> None:
    now = START - 600
    forecast = [(now, 1.0), (START + 60, 4.9)]
    assert peak_slot(forecast, now, P, capacity_rps=10.0) is None
    assert peak_slot(forecast, now, P, capacity_rps=9.8) == (START, END)


def test_peak_slot_needs_a_rise_above_now() -> None:
    now = START - 600
    forecast = [(now, 9.0), (START + 60, 8.0)]
    assert peak_slot(forecast, now, P, capacity_rps=10.0) is None


def test_peak_slot_needs_a_rise_of_min_rise() -> None:
    now = START - 600
    flat = [(now, 6.0), (START + 60, 7.1)]  # 18 % more: less than min_rise
    assert peak_slot(flat, now, P, capacity_rps=10.0) is None
    assert peak_slot([(now, 6.0), (START + 60, 7.3)], now, P, capacity_rps=10.0) == (START, END)
    assert peak_slot(flat, now, WarmPolicy(min_rise=0.0), capacity_rps=10.0) == (START, END)


def test_peak_slot_without_capacity_or_forecast_is_none() -> None:
    now = START - 600
    assert peak_slot([(now, 1.0), (START + 60, 8.0)], now, P, capacity_rps=0.0) is None
    assert peak_slot([], now, P, capacity_rps=10.0) is None


# allowance ------------------------------------------------------------------------------------


def test_allowance_first_call_is_full() -> None:
    assert allowance(100.0, None, 0.0, P) == (1.0, 100.0)


def test_allowance_refills_at_the_budget_rate_up_to_burst() -> None:
    tokens, last = allowance(100.0, 90.0, 0.0, WarmPolicy(budget_per_min=6.0, burst=3))
    assert tokens == pytest.approx(1.0) and last == 100.0
    tokens, _ = allowance(1000.0, 90.0, 0.0, WarmPolicy(budget_per_min=6.0, burst=3))
    assert tokens == 3.0


def test_allowance_paces_generations_to_the_budget() -> None:
    policy = WarmPolicy(budget_per_min=6.0)
    tokens, last, started = 0.0, None, []
    for step in range(0, 600):  # ten minutes polled every second
        tokens, last = allowance(float(step), last, tokens, policy)
        if tokens >= 1:
            tokens -= 1
            started.append(step)
    assert started == list(range(0, 600, 10))  # the full bucket at t=0, then one per 10 s: 60
    assert all(b - a >= 10 for a, b in zip(started, started[1:]))


def test_allowance_zero_budget_refills_nothing() -> None:
    policy = WarmPolicy(budget_per_min=0.0)
    assert allowance(1e6, 0.0, 0.0, policy)[0] == 0.0
    assert wait_s(0.0, policy) == math.inf


def test_wait_s_counts_the_time_to_one_token() -> None:
    assert wait_s(0.5, WarmPolicy(budget_per_min=6.0)) == pytest.approx(5.0)
    assert wait_s(1.0, P) == 0.0


# slots, idle, validation ----------------------------------------------------------------------


def test_slots_are_day_aligned() -> None:
    assert slot_of(START + 5, 600) == (20, 72)
    assert slot_bounds(START + 5, 600) == (START, END)
    assert earlier_days(START, WarmPolicy(history_days=2)) == [(19, 72), (18, 72)]


def test_idle_compares_load_with_idle_load() -> None:
    assert idle(1, 4, P) and not idle(2, 4, P) and not idle(0, 0, P)


@pytest.mark.parametrize(
    "bad",
    [
        {"slot_s": 7},
        {"slot_s": 0},
        {"min_days_seen": 8},
        {"budget_per_min": -1},
        {"idle_load": 0},
        {"top_k": 0},
        {"min_rise": -0.1},
        {"burst": 0.5},
    ],
)
def test_policy_rejects_values_that_cannot_work(bad: dict) -> None:
    with pytest.raises(ValueError):
        WarmPolicy(**bad)


def test_fair_top_takes_candidates_round_robin_over_tenants_by_rank() -> None:
    from cache.warming.plan import fair_top

    flood = [WarmCandidate(f"b{i}", 100.0 - i, 2, None, "beta") for i in range(5)]
    mine = [WarmCandidate("a0", 3.0, 2, None, "acme"), WarmCandidate("a1", 2.0, 2, None, "acme")]
    assert [c.key for c in fair_top(flood + mine, 3)] == ["b0", "a0", "b1"]
    assert [c.key for c in fair_top(flood + mine, 10)] == ["b0", "a0", "b1", "a1", "b2", "b3", "b4"]
    assert [c.key for c in fair_top(flood, 2)] == ["b0", "b1"]  # one tenant: the hottest
