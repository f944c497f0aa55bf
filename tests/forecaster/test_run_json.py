"""The --json document says what a reader needs to check the decision: the planner's capacity,
headroom and bounds, the demand's real unit, and which missing buckets are only the time before
anything was counted (the demo's 14-day window held ~20,000 of them: issue 10, item 8)."""

from __future__ import annotations

import math

import numpy as np

from forecaster import ForecasterSettings, Traffic, run_once


class Fixed:
    name = "fixed"

    def __init__(self, traffic: Traffic) -> None:
        self._traffic = traffic

    def fetch(self, now: float | None = None) -> Traffic:
        return self._traffic


def _traffic(with_misses: bool) -> Traffic:
    requests = np.full(200, np.nan)
    requests[150:] = 2.0  # the first 150 minutes: nobody counted yet
    requests[170:172] = np.nan  # two minutes lost while counting
    misses = requests * 0.5 if with_misses else None
    return Traffic(28_000_000 * 60.0, 60.0, requests, misses, name="t")


def _settings() -> ForecasterSettings:
    return ForecasterSettings(
        redis_url="redis://127.0.0.1:1/0",
        capacity_per_replica=0.4,
        headroom=0.2,
        upper_headroom=0.1,
        min_replicas=1,
        max_replicas=9,
        warmup_s=120.0,
        time_budget_s=1.0,
    )


def test_series_separates_the_buckets_before_the_first_count_and_names_misses() -> None:
    doc = run_once(_settings(), Fixed(_traffic(with_misses=True))).to_json()
    series = doc["series"]
    assert series["buckets"] == 200 and series["missing_buckets"] == 152
    assert series["missing_before_first"] == 150
    assert series["demand_unit"] == "cache misses/s"
    plain = run_once(_settings(), Fixed(_traffic(with_misses=False))).to_json()["series"]
    assert plain["demand_unit"] == "requests/s"


def test_json_carries_the_planner_settings_that_make_each_step_checkable() -> None:
    doc = run_once(_settings(), Fixed(_traffic(with_misses=True))).to_json()
    planner = doc["planner"]
    assert planner["capacity_per_replica"] == 0.4 and planner["headroom"] == 0.2
    assert planner["upper_headroom"] == 0.1 and planner["min_replicas"] == 1 and planner["max_replicas"] == 9
    assert planner["lead_time_s"] >= 120.0 and planner["decision_interval_s"] > 0
    for step in doc["plan"]:
        need = max(math.ceil(step["forecast"] * 1.2 / 0.4 - 1e-6), math.ceil(step["upper"] * 1.1 / 0.4 - 1e-6))
        assert step["replicas"] == max(1, min(9, need)), step


def test_printed_series_line_says_how_many_missing_buckets_precede_the_first_count(capsys) -> None:  # type: ignore[no-untyped-def]
    from forecaster.cli import print_plan

    print_plan(run_once(_settings(), Fixed(_traffic(with_misses=True))))
    first = capsys.readouterr().out.splitlines()[0]
    assert "200 buckets of 60 s, 152 missing (150 of them before the first counted bucket)" in first
    assert first.endswith("demand in cache misses/s")
