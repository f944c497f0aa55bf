"""The offline what-if's inputs: overrides, variants and the counters as the Redis source reads them."""

from __future__ import annotations

import numpy as np
import pytest
import typer

from tests.bench_script import load_bench

whatif = load_bench("loop_whatif")


def test_overrides_are_json_values_of_known_fields() -> None:
    got = whatif.parse_overrides(
        ["level=0.95", "rate_window_s=60", "band_scale=false", 'models=["last_value"]', "demand_unit=requests"]
    )
    assert got == {
        "level": 0.95,
        "rate_window_s": 60,
        "band_scale": False,
        "models": ["last_value"],
        "demand_unit": "requests",
    }
    for bad in ("levl=0.9", "level", "step_s=30", "daemon_interval_s=30"):
        with pytest.raises(typer.BadParameter):
            whatif.parse_overrides([bad])


def test_a_variant_splits_at_commas_that_start_a_new_key() -> None:
    assert whatif.split_variant('level=0.95,models=["last_value","ets_level"], rate_window_s=60') == [
        "level=0.95",
        'models=["last_value","ets_level"]',
        " rate_window_s=60",
    ]


def test_the_source_reads_the_minutes_before_now_padded_with_missing_ones() -> None:
    requests = np.arange(10, dtype=float)  # minutes -5 .. 4 from the segment start
    src = whatif.CounterSource(requests, requests / 2, first=-5, history_s=8 * 60)
    t = src.fetch(whatif.T0 + 2 * 60 + 1)  # in minute 2: minutes -6 .. 1, minute 2 incomplete
    assert t.start == whatif.T0 - 6 * 60 and len(t) == 8
    assert np.isnan(t.requests[0]) and list(t.requests[1:] * 60) == [0, 1, 2, 3, 4, 5, 6]
    assert list(t.misses[1:] * 60) == [0, 0.5, 1, 1.5, 2, 2.5, 3]


def test_an_unknown_model_in_a_variant_is_a_clear_error_before_any_work() -> None:
    # Regression: --variant 'models=["holt_damped"]' printed a traceback (ConfigError) after the
    # half minute of preparation; the fields were checked, the model names were not.
    with pytest.raises(typer.BadParameter, match="holt_damped"):
        whatif.check_variant("v", {"models": ["holt_damped"]}, {"capacity_per_replica": 1.0})
    with pytest.raises(typer.BadParameter, match="level"):
        whatif.check_variant("v", {"level": 2.0}, {"capacity_per_replica": 1.0})
    whatif.check_variant("v", {"models": ["last_value", "ets_level"]}, {"capacity_per_replica": 1.0})
