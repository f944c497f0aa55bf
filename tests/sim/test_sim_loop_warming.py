"""The closed loop's warming options (sim/cli.py ``warming_fields``, sim/loop/run.py
``warming_env`` and ``parse_warm_counts``, the report's line); the router side is
tests/router/test_warming_loop.py, the bench's measures tests/bench/test_loop_warming.py."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sim.cli import warming_fields
from sim.loop.config import LoopConfig
from sim.loop.run import parse_warm_counts, warming_env


def test_warming_off_is_the_default_and_sets_nothing() -> None:
    assert warming_fields("off", []) is None
    assert warming_env(LoopConfig(trace=Path("t"))) == {}


def test_warming_on_enables_every_pool_with_a_simulated_tick_and_the_runs_settings() -> None:
    fields = warming_fields("on", ["min_rise=0.1", "budget_per_min=12"])
    env = warming_env(LoopConfig(trace=Path("t"), speedup=7.0, warming=fields))
    assert json.loads(env["PROMPTEDGE_CACHE_WARMING"]) == {
        "*": {"enabled": True, "tick_s": round(15 / 7, 3), "min_rise": 0.1, "budget_per_min": 12}
    }


@pytest.mark.parametrize(
    ("mode", "sets"), [("maybe", []), ("off", ["min_rise=0"]), ("on", ["min_rise"]), ("on", ["=1"])]
)
def test_bad_warming_options_are_refused(mode: str, sets: list[str]) -> None:
    with pytest.raises(ValueError):
        warming_fields(mode, sets)


def test_warm_counters_are_read_from_the_routers_metrics() -> None:
    text = (
        "# TYPE promptedge_router_warm_generations counter\n"
        'promptedge_router_warm_generations_total{outcome="attempted",pool="m"} 5.0\n'
        'promptedge_router_warm_generations_total{outcome="stored",pool="m"} 4.0\n'
        "# TYPE promptedge_cache_warm_hits counter\n"
        'promptedge_cache_warm_hits_total{model="m"} 3.0\n'
    )
    assert parse_warm_counts(text) == {"generations": {"attempted": 5, "stored": 4}, "warm_hits": 3}


def test_the_loop_report_says_what_the_warmer_did() -> None:
    from sim.loop import render

    policy = {"slo_attainment": 1.0, "warming": {"generations": {"attempted": 3, "stored": 2}, "warm_hits": 1}}
    text = render({"policies": {"predictive": policy}})
    assert "predictive's warming: 3 warm generations, 2 stored, 1 hits on warmed entries" in text
    assert "warming" not in render({"policies": {"predictive": {"slo_attainment": 1.0}}})
